//! `spore sandbox template build NAME`: a sandbox template's image and the
//! template file `spore serve --sandbox-template` reads. `spore sandbox
//! exec`: a command in a sandbox guest, through its envd over vsock.
//!
//! Without `--spec`, NAME is a template of the repository's
//! `guest/templates/` (`base`: the `sandbox-base` recipe). With `--spec`, a
//! small TOML file says what the template adds to `base`: Debian packages,
//! files, a start command and its ready check, the VM's size. The image is
//! built by `guest/build-rootfs.sh` from a recipe written beside the cache
//! (base's recipe plus the spec's lines), cached by content like every
//! runtime image; the start command and ready check go into the template
//! file, and `spore serve` runs them in the template's zygote before it
//! snapshots it as the template base.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::Subcommand;
use serde::Deserialize;

use crate::image_cmd;

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Sandbox templates.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Run a command in a sandbox guest (a VM booted from a template's
    /// image, by spore or Firecracker) through its envd, reached by the
    /// VM's vsock socket; prints its stdout and stderr and exits with its
    /// exit code.
    Exec {
        /// The VM's vsock Unix socket (its `uds_path`).
        #[arg(long, value_name = "PATH")]
        vsock: PathBuf,
        /// The user the command runs as.
        #[arg(long, default_value = "user")]
        user: String,
        /// envd's access token, if `/init` gave it one.
        #[arg(long, value_name = "TOKEN")]
        token: Option<String>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// The command (run by `bash -l -c`).
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Build (or find cached) a template's image and write its template
    /// file (for `spore serve --sandbox-template`); prints the file's path.
    Build {
        /// The template's name (what `Sandbox.create(NAME)` names).
        name: String,
        /// What the template adds to `base` (TOML: packages, files,
        /// start_cmd, ready_cmd, vcpus, memory_mib, disk_mib, user).
        #[arg(long, value_name = "FILE")]
        spec: Option<PathBuf>,
        /// The template file to write (default: ./NAME.toml).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// The guest kernel (default: the newest in the cache).
        #[arg(long, value_name = "PATH")]
        kernel: Option<PathBuf>,
        /// spore-agent, installed as /sbin/spore-agent (default: beside spore).
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
        /// spore-envd, installed as /usr/local/bin/spore-envd (default:
        /// beside spore).
        #[arg(long, value_name = "PATH")]
        envd: Option<PathBuf>,
        /// The cache directory (default: $SPORE_CACHE, else /var/cache/spore).
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
    },
}

/// The recipe every template builds on (`guest/templates/<it>/recipe`).
const BASE_RECIPE: &str = "sandbox-base";

/// `--spec`: what a template adds to `base`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildSpec {
    /// Debian packages beyond base's.
    #[serde(default)]
    packages: Vec<String>,
    /// Files into the image: path in the image = host path (relative to
    /// the spec's directory).
    #[serde(default)]
    files: BTreeMap<String, PathBuf>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    vcpus: Option<u8>,
    memory_mib: Option<u32>,
    /// The image's file system size (base's: 2048).
    disk_mib: Option<u32>,
    /// Commands' default user (made in the image if not base's `user`).
    user: Option<String>,
}

pub fn run(cmd: SandboxCommand) -> anyhow::Result<u8> {
    match cmd {
        SandboxCommand::Template(TemplateCommand::Build {
            name,
            spec,
            out,
            kernel,
            agent,
            envd,
            cache,
        }) => build(name, spec, out, kernel, agent, envd, cache),
        SandboxCommand::Exec {
            vsock,
            user,
            token,
            timeout,
            command,
        } => exec(&vsock, &user, token.as_deref(), timeout, &command.join(" ")),
    }
}

fn exec(
    vsock: &Path,
    user: &str,
    token: Option<&str>,
    timeout: u64,
    command: &str,
) -> anyhow::Result<u8> {
    use std::io::Write as _;
    let limit = std::time::Duration::from_secs(timeout.max(1));
    let ran = spore_serve::sandboxes::envd::run_blocking(vsock, user, command, token, limit)
        .with_context(|| format!("running it through the envd behind {}", vsock.display()))?;
    std::io::stdout().write_all(&ran.stdout)?;
    std::io::stderr().write_all(&ran.stderr)?;
    // A signal (-1) or a code past 255 still fails.
    Ok(u8::try_from(ran.exit_code).unwrap_or(255))
}

#[allow(clippy::too_many_arguments)]
fn build(
    name: String,
    spec: Option<PathBuf>,
    out: Option<PathBuf>,
    kernel: Option<PathBuf>,
    agent: Option<PathBuf>,
    envd: Option<PathBuf>,
    cache: Option<PathBuf>,
) -> anyhow::Result<u8> {
    let cache = image_cmd::cache_dir(cache);
    let spec = match &spec {
        Some(path) => load_spec(path)?,
        None if name == "base" => BuildSpec::default(),
        None => bail!("template {name:?}: give its --spec (only base is built without one)"),
    };
    check_name(&name)?;
    let kernel = match kernel {
        Some(k) => k,
        None => spore_serve::images::newest_kernel(&cache).with_context(|| {
            format!(
                "no guest kernel in {} (build one with `make guest-kernel`, or give --kernel)",
                cache.display()
            )
        })?,
    };
    if !kernel.is_file() {
        bail!("kernel {} is not a file", kernel.display());
    }
    let agent = beside_spore(agent, "spore-agent")?;
    let envd = beside_spore(envd, "spore-envd")?;
    let guest = image_cmd::guest_dir()?;
    let base_recipe = guest.join("templates").join(BASE_RECIPE).join("recipe");
    // base is the repository's recipe itself; another template's recipe is
    // base's with the spec's lines after it, written beside the cache (its
    // content, not its place, is part of the image's cache key).
    let (image_name, recipe) = if name == "base" && spec.is_empty() {
        (BASE_RECIPE.to_string(), None)
    } else {
        let text = std::fs::read_to_string(&base_recipe)
            .with_context(|| format!("reading {}", base_recipe.display()))?;
        let dir = cache.join("sandbox-recipes");
        spore_serve::fs::create_private_dir(&dir)?;
        let path = dir.join(format!("{name}.recipe"));
        spore_serve::fs::write_private(&path, recipe_for(&text, &spec)?.as_bytes())?;
        (format!("sandbox-{name}"), Some(path))
    };
    let mut flags: Vec<(&str, &Path)> = vec![("--agent", &agent), ("--envd", &envd)];
    if let Some(r) = &recipe {
        flags.push(("--recipe", r));
    }
    let image = image_cmd::build(&image_name, &flags, &cache)?;
    let out = out.unwrap_or_else(|| PathBuf::from(format!("{name}.toml")));
    let file = template_file(&name, &kernel, &image, &spec)?;
    spore_serve::fs::write_private(&out, file.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    println!("{}", out.display());
    Ok(0)
}

impl BuildSpec {
    /// Whether it changes nothing of base's image.
    fn is_empty(&self) -> bool {
        self.packages.is_empty()
            && self.files.is_empty()
            && self.disk_mib.is_none()
            && self.user.as_ref().is_none_or(|u| u == "user")
    }
}

fn load_spec(path: &Path) -> anyhow::Result<BuildSpec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut spec: BuildSpec =
        toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let dir = path
        .canonicalize()
        .with_context(|| format!("resolving {}", path.display()))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    for (to, from) in &mut spec.files {
        if !to.starts_with('/')
            || to.split('/').any(|p| p == "..")
            || to.contains(char::is_whitespace)
        {
            bail!(
                "{}: files: {to:?} is not an absolute path in the image (without spaces or ..)",
                path.display()
            );
        }
        if from.is_relative() {
            *from = dir.join(&*from);
        }
        if !from.is_file() || from.to_string_lossy().contains(char::is_whitespace) {
            bail!(
                "{}: files: {} is not a file (without spaces in its path)",
                path.display(),
                from.display()
            );
        }
    }
    for p in &spec.packages {
        // Debian's package names (and an architecture qualifier).
        let ok = !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.:".contains(&b));
        if !ok {
            bail!(
                "{}: packages: {p:?} is not a Debian package name",
                path.display()
            );
        }
    }
    if let Some(u) = &spec.user {
        let ok = !u.is_empty()
            && u.len() <= 32
            && u.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !ok {
            bail!("{}: user {u:?} is not a user name", path.display());
        }
    }
    if spec.disk_mib.is_some_and(|d| !(512..=65_536).contains(&d)) {
        bail!("{}: disk_mib: 512 to 65536", path.display());
    }
    Ok(spec)
}

/// The daemon's rule for template names (`spore serve` refuses others).
fn check_name(name: &str) -> anyhow::Result<()> {
    if !spore_serve::sandboxes::template::valid_name(name) {
        bail!("template name {name:?}: 1 to 24 lower-case letters, digits, '-' or '_'");
    }
    Ok(())
}

/// `given`, else the program `name` beside this spore binary.
fn beside_spore(given: Option<PathBuf>, name: &str) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(p) => p,
        None => std::env::current_exe()
            .context("locating the spore binary")?
            .with_file_name(name),
    };
    if !path.is_file() {
        bail!(
            "{name} not found at {} (build it, or give --{})",
            path.display(),
            name.trim_start_matches("spore-")
        );
    }
    Ok(path)
}

/// base's recipe with the spec's lines after it (a later `size:` wins; the
/// words of every `packages:`, `user:` and `copy:` line count).
fn recipe_for(base: &str, spec: &BuildSpec) -> anyhow::Result<String> {
    let mut r = String::from(base);
    r.push_str("\n# Added by `spore sandbox template build` from its spec.\n");
    if !spec.packages.is_empty() {
        r.push_str(&format!("packages: {}\n", spec.packages.join(" ")));
    }
    if let Some(u) = spec.user.as_ref().filter(|u| *u != "user") {
        r.push_str(&format!("user: {u}\n"));
    }
    if let Some(d) = spec.disk_mib {
        r.push_str(&format!("size: {d}\n"));
    }
    for (to, from) in &spec.files {
        let from = from.to_str().context("a file path that is not UTF-8")?;
        r.push_str(&format!("copy: {from} {to}\n"));
    }
    Ok(r)
}

/// The template file `spore serve --sandbox-template` reads.
fn template_file(
    name: &str,
    kernel: &Path,
    image: &Path,
    spec: &BuildSpec,
) -> anyhow::Result<String> {
    let mut t = toml::Table::new();
    let s = |v: &str| toml::Value::String(v.to_string());
    let path = |p: &Path| -> anyhow::Result<toml::Value> {
        Ok(s(p
            .canonicalize()
            .with_context(|| format!("resolving {}", p.display()))?
            .to_str()
            .context("a path that is not UTF-8")?))
    };
    t.insert("name".into(), s(name));
    t.insert("kernel".into(), path(kernel)?);
    t.insert("rootfs".into(), path(image)?);
    if let Some(v) = spec.vcpus {
        t.insert("vcpus".into(), toml::Value::Integer(v.into()));
    }
    if let Some(m) = spec.memory_mib {
        t.insert("memory_mib".into(), toml::Value::Integer(m.into()));
    }
    if let Some(u) = &spec.user {
        t.insert("user".into(), s(u));
    }
    if let Some(c) = &spec.start_cmd {
        t.insert("start_cmd".into(), s(c));
    }
    if let Some(c) = &spec.ready_cmd {
        t.insert("ready_cmd".into(), s(c));
    }
    Ok(format!(
        "# Written by `spore sandbox template build {name}`.\n{}",
        toml::to_string(&t)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_specs_recipe_is_bases_plus_its_lines() {
        let spec = BuildSpec {
            packages: vec!["curl".into(), "git".into()],
            files: [(
                "/home/user/app.py".to_string(),
                PathBuf::from("/src/app.py"),
            )]
            .into(),
            disk_mib: Some(4096),
            user: Some("agent".into()),
            ..BuildSpec::default()
        };
        assert!(!spec.is_empty());
        let r = recipe_for("packages: bash\nsize: 2048\n", &spec).unwrap();
        assert!(r.starts_with("packages: bash\nsize: 2048\n"));
        for line in [
            "packages: curl git",
            "user: agent",
            "size: 4096",
            "copy: /src/app.py /home/user/app.py",
        ] {
            assert!(r.lines().any(|l| l == line), "{line} in {r}");
        }
        assert!(BuildSpec::default().is_empty());
    }

    #[test]
    fn specs_are_checked() {
        let dir = std::env::temp_dir().join(format!("spore-tplspec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("app.py"), b"print(1)").unwrap();
        let spec = dir.join("web.toml");
        let load = |text: &str| {
            std::fs::write(&spec, text).unwrap();
            load_spec(&spec)
        };
        let ok = load(
            "packages = [\"curl\"]\nstart_cmd = \"python3 /home/user/app.py\"\n[files]\n\"/home/user/app.py\" = \"app.py\"\n",
        )
        .unwrap();
        assert_eq!(
            ok.files["/home/user/app.py"],
            dir.canonicalize().unwrap().join("app.py")
        );
        for bad in [
            "packages = [\"curl; rm -rf /\"]\n",
            "[files]\n\"relative/path\" = \"app.py\"\n",
            "[files]\n\"/home/../etc/x\" = \"app.py\"\n",
            "[files]\n\"/x\" = \"missing.py\"\n",
            "user = \"Root!\"\n",
            "disk_mib = 10\n",
            "unknown = 1\n",
        ] {
            assert!(load(bad).is_err(), "{bad}");
        }
        assert!(check_name("web").is_ok());
        assert!(check_name("Web App").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_template_file_reads_back_as_the_daemon_reads_it() {
        let dir = std::env::temp_dir().join(format!("spore-tplfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (k, i) = (dir.join("vmlinux"), dir.join("rootfs.ext4"));
        std::fs::write(&k, b"k").unwrap();
        std::fs::write(&i, b"i").unwrap();
        let spec = BuildSpec {
            start_cmd: Some("python3 -m http.server 8000".into()),
            ready_cmd: Some("curl -sf localhost:8000 \"quoted\"".into()),
            memory_mib: Some(1024),
            ..BuildSpec::default()
        };
        let text = template_file("web", &k, &i, &spec).unwrap();
        let out = dir.join("web.toml");
        std::fs::write(&out, text).unwrap();
        let back = spore_serve::sandboxes::template::TemplateSpec::load(&out).unwrap();
        assert_eq!(back.name, "web");
        assert_eq!(back.memory_mib, 1024);
        assert_eq!(
            back.ready_cmd.as_deref(),
            Some("curl -sf localhost:8000 \"quoted\"")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
