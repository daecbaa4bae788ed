//! `spore serve`: the serverless daemon (crate `spore-serve`), here only its
//! command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

#[derive(Args)]
pub struct ServeArgs {
    /// Address of the Lambda API (port 0 picks a free one; the address is
    /// printed on stdout as {"listen":"ADDR"} once serving).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Where function URLs are served (plain HTTP; port 0 picks a free one,
    /// printed as "url_listen"). Without it, function URLs can be configured
    /// but are not served.
    #[arg(long)]
    url_listen: Option<SocketAddr>,
    /// Give function URLs as http://<url-id>.lambda-url.<region>.<DOMAIN>/
    /// (a wildcard DNS name pointing at --url-listen) instead of
    /// http://<url-listen>/<url-id>/.
    #[arg(long)]
    url_domain: Option<String>,
    /// Serve E2B's sandbox API and sandbox proxy here (the e2b SDK's
    /// E2B_API_URL and E2B_SANDBOX_URL; port 0 picks a free one, printed
    /// as "sandbox_listen"). Needs at least one --sandbox-template.
    #[arg(long, requires = "sandbox_template")]
    sandbox_listen: Option<SocketAddr>,
    /// A sandbox template (TOML: name, kernel, rootfs, vcpus, memory_mib,
    /// user); repeat for more.
    #[arg(long, requires = "sandbox_listen")]
    sandbox_template: Vec<PathBuf>,
    /// Also proxy requests addressed to <port>-<sandbox-id>.<DOMAIN> (a
    /// wildcard DNS name pointing at --sandbox-listen) to that port of
    /// that sandbox.
    #[arg(long, requires = "sandbox_listen")]
    sandbox_domain: Option<String>,
    /// End an account's zygote of a template after it made no sandbox for
    /// this many seconds (its next create boots it again); 0 keeps
    /// zygotes. Default: 900 with --auth, else 0 (the one account's
    /// zygotes, booted at start, are kept).
    #[arg(long, requires = "sandbox_listen", value_name = "SECONDS")]
    sandbox_zygote_idle: Option<u64>,
    /// Where the catalogue (SQLite), code, logs and instances' sockets live.
    #[arg(long, default_value = "/var/lib/spore")]
    state_dir: PathBuf,
    /// Invocations running at once on this host; more wait, then get 429.
    #[arg(long, default_value_t = 64)]
    max_concurrency: usize,
    /// How long a request over a concurrency limit waits before its 429 (ms).
    #[arg(long, default_value_t = 200)]
    queue_wait_ms: u64,
    /// An idle instance is ended after this long unused (ms).
    #[arg(long, default_value_t = 60_000)]
    keep_alive_ms: u64,
    /// A function's zygote (the template its clones start from) is ended
    /// after this long without an invocation, once no instance of it is
    /// left: the function then holds no memory, and its next start
    /// restores its snapshot (ms; 0 keeps zygotes).
    #[arg(long, default_value_t = 600_000)]
    zygote_keep_alive_ms: u64,
    /// Host memory (PSS) all instance processes may hold (e.g. 4G),
    /// measured: instances, zygotes, clone factories, clones started
    /// ahead. Over it the least recently used idle instances are ended,
    /// then zygotes demoted to their snapshots. Default: no budget.
    #[arg(long)]
    memory_budget: Option<String>,
    /// Never clone a zygote: every start that is not warm restores the
    /// function's snapshot, or boots it.
    #[arg(long)]
    no_clones: bool,
    /// Never snapshot functions: every start that is not warm or a clone
    /// boots.
    #[arg(long)]
    no_snapshots: bool,
    /// How instances are restored from a function's snapshot: working-set
    /// (the first restore records the pages the guest touches, later ones
    /// read them up front) or lazy (every page on demand).
    #[arg(long, default_value = "working-set", value_parser = ["working-set", "lazy"])]
    restore_mode: String,
    /// How long the first working-set restore of a snapshot records the
    /// pages its guest touches (ms); recording also ends when that instance
    /// stops. Slow (emulated) hosts need longer for a whole invocation.
    #[arg(long, default_value_t = spore_serve::snapshots::WORKING_SET_RECORD_MS)]
    working_set_record_ms: u64,
    /// How Linux functions' snapshots are kept: layered (SnapFaaS: a diff
    /// on the runtime's shared base snapshot, restored as the chain) or
    /// merged (each diff merged with the base into one full snapshot of
    /// the function, as Firecracker's `rebase-snap` does; a benchmark
    /// baseline, `spore bench serve --linux`: it costs a whole memory file
    /// of disk per function).
    #[arg(long, default_value = "layered", value_parser = ["layered", "merged"])]
    linux_snapshots: String,
    /// Verify every request's SigV4 signature against the access keys in
    /// this TOML file ([[keys]] access_key_id, secret_access_key); unsigned or
    /// wrongly signed requests get 403. Default: accept any request.
    #[arg(long, value_name = "KEYS_TOML")]
    auth: Option<PathBuf>,
    /// Addresses for networked functions' instances (SporeNetwork): each
    /// instance's veth pair to the host takes one /30 of this pool, the
    /// host's end .1 (P from 14 to 30).
    #[arg(long, value_name = "A.B.C.D/P", default_value = spore_serve::network::DEFAULT_POOL)]
    net_pool: String,
    /// Networks (namespace, veth, tap, NAT) kept made ahead for the next
    /// networked instances, so that making one (~25-45 ms of ip and nft
    /// commands) is off their start's path; each holds a /30 of the pool.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(0..=256))]
    net_spares: u16,
    /// The guest kernel of Linux functions (python3, provided). Default: the
    /// newest guest/build-kernel.sh kernel in the image cache.
    #[arg(long, value_name = "VMLINUX")]
    linux_kernel: Option<PathBuf>,
    /// Where the runtime images (`spore image build`) and guest kernels are
    /// cached (default: $SPORE_CACHE, else /var/cache/spore).
    #[arg(long, value_name = "DIR")]
    image_cache: Option<PathBuf>,
    /// How long an instance may take from its start to Ready (s): a Linux
    /// guest's boot and its function's init included (nested or loaded
    /// hosts need more).
    #[arg(long, default_value_t = 30)]
    ready_timeout_s: u64,
    /// Event invocations kept at once (on disk, until they ran); beyond,
    /// Event invocations get 429.
    #[arg(long, default_value_t = spore_serve::events::DEFAULT_MAX_QUEUED)]
    event_queue_max: usize,
    /// Retries of an Event invocation whose attempt failed (Lambda's
    /// MaximumRetryAttempts, 0-2 there); a function's
    /// PutFunctionEventInvokeConfig overrides it.
    #[arg(long, default_value_t = spore_serve::events::DEFAULT_MAX_RETRIES)]
    event_retries: u32,
    /// Wait before an Event invocation's first retry (ms), doubled for each
    /// further one.
    #[arg(long, default_value_t = 60_000)]
    event_retry_delay_ms: u64,
    /// An Event invocation not run after this long (s) is dropped (logged,
    /// counted in spore_events_expired_total, recorded to the function's
    /// OnFailure destination); a function's PutFunctionEventInvokeConfig
    /// overrides it.
    #[arg(long, default_value_t = 21_600)]
    event_max_age_s: u64,
    /// Open API connections at most (also kept 1024 under the descriptor
    /// limit); a new one closes the connection idle the longest, or is
    /// refused when every one is busy.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// An API connection without a request for this long is closed (ms).
    #[arg(long, default_value_t = 60_000)]
    idle_timeout_ms: u64,
    /// A request's headers must arrive within this long, and its body may
    /// not pause longer (ms); 408 otherwise.
    #[arg(long, default_value_t = 30_000)]
    request_timeout_ms: u64,
    /// Run instance VMMs in the daemon's own cgroup instead of a cgroup
    /// each (memory, processes and CPU by MemorySize:
    /// docs/serve/operations.md#instance-cgroups); development only.
    #[arg(long)]
    no_cgroups: bool,
    /// Cgroups are the default now (kept so scripts that passed it work).
    #[arg(long, hide = true, conflicts_with = "no_cgroups")]
    cgroups: bool,
    /// Give instances their CPU share by MemorySize only as a weight when
    /// CPUs are contended, not as a cap (by default an instance, once its
    /// first invocation is under way, runs at most its share: 1,769 MB =
    /// one CPU, at least 1 ms every 10 ms).
    #[arg(long, conflicts_with = "no_cgroups")]
    no_cpu_cap: bool,
    /// Run instance VMMs as the daemon's own user instead of a uid per
    /// function (development only; jailing needs root).
    #[arg(long)]
    no_jail: bool,
    /// The ids jailed VMMs run as, `FIRST:COUNT`: FIRST is the group of
    /// files every instance may read (code, runtime bases), the rest one
    /// uid per function (docs/serve/operations.md#instance-users).
    #[arg(long, default_value = "100000:65536")]
    uid_range: spore_serve::jail::UidRange,
    /// Memory an instance's cgroup allows besides the function's
    /// MemorySize: the VMM's own (e.g. 64M).
    #[arg(long, default_value = "64M")]
    instance_memory_overhead: String,
    /// Join a cluster whose catalogue lives in etcd:
    /// etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (prefix default: spore).
    /// Every node of one cluster gives the same URL (docs/serve/cluster.md).
    #[arg(long, value_name = "etcd://HOST:PORT,...")]
    cluster: Option<String>,
    /// This node's id in the cluster: letters, digits, '-' and '_'
    /// (default: the host name).
    #[arg(long, requires = "cluster")]
    node_id: Option<String>,
    /// Where the other nodes reach this node's API (default: --listen,
    /// which must then name an address and a port).
    #[arg(long, requires = "cluster")]
    advertise: Option<SocketAddr>,
    /// A file (mode 0600) holding the key the nodes' requests to each other
    /// carry; the same on every node. Required with --cluster.
    #[arg(long, value_name = "FILE", requires = "cluster")]
    cluster_key: Option<PathBuf>,
    /// How many nodes own each function: its instances run there, and its
    /// code (and a drained node's snapshots of it) are kept there.
    #[arg(long, requires = "cluster", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    replicas: u16,
    /// Internal: run as the daemon's guardian, waiting on this descriptor
    /// (spore_serve::guardian).
    #[arg(long, hide = true)]
    guardian_fd: Option<i32>,
}

pub fn run(a: ServeArgs) -> anyhow::Result<u8> {
    if let Some(fd) = a.guardian_fd {
        let pool = spore_serve::network::NetPool::parse(&a.net_pool)?;
        spore_serve::guardian::run(&a.state_dir, pool, fd)?;
        return Ok(0);
    }
    // Absolute: jailed VMMs' roots show it at its own path.
    let spore_bin = match std::env::var_os("SPORE_BIN") {
        Some(p) => std::env::current_dir()?.join(p),
        None => std::env::current_exe().context("finding the spore binary")?,
    };
    // First: a cluster misconfigured stops the daemon before it touches anything.
    let cluster = match &a.cluster {
        Some(url) => Some(cluster_options(url, &a)?),
        None => None,
    };
    let memory_budget = match &a.memory_budget {
        Some(s) => {
            spore_vmm::config::parse_size(s).map_err(|e| anyhow::anyhow!("--memory-budget: {e}"))?
        }
        None => 0,
    };
    let state_dir = std::env::current_dir()?.join(a.state_dir);
    let overhead = spore_vmm::config::parse_size(&a.instance_memory_overhead)
        .map_err(|e| anyhow::anyhow!("--instance-memory-overhead: {e}"))?;
    let cgroups = if a.no_cgroups {
        tracing::warn!(
            "--no-cgroups: instance VMMs share the daemon's cgroup, unbounded in memory, \
             processes and CPU (for development only)"
        );
        None
    } else {
        spore_serve::cgroups::Cgroups::set_up(
            &spore_serve::network::prefix_of(&state_dir),
            overhead,
            !a.no_cpu_cap,
        )
    };
    // Absolute: the paths are given to VMMs, whose roots show them at the
    // same paths.
    let cwd = std::env::current_dir()?;
    let image_cache = cwd.join(spore_serve::images::cache_dir(a.image_cache));
    let linux_kernel = match a.linux_kernel {
        Some(k) if !k.is_file() => anyhow::bail!("--linux-kernel: no file at {}", k.display()),
        Some(k) => Some(cwd.join(k)),
        None => spore_serve::images::newest_kernel(&image_cache),
    };
    if let Some(d) = &a.url_domain {
        let ok = !d.is_empty()
            && d.len() <= 200
            && d.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !ok {
            anyhow::bail!(
                "--url-domain {d:?}: a DNS name of lowercase letters, digits, dots and hyphens"
            );
        }
    }
    let sandboxes = match a.sandbox_listen {
        Some(listen) => {
            let mut templates = Vec::new();
            for t in &a.sandbox_template {
                let spec = spore_serve::sandboxes::TemplateSpec::load(&cwd.join(t))?;
                if templates
                    .iter()
                    .any(|s: &spore_serve::sandboxes::TemplateSpec| s.name == spec.name)
                {
                    anyhow::bail!(
                        "--sandbox-template: two templates are named {:?}",
                        spec.name
                    );
                }
                templates.push(spec);
            }
            Some(spore_serve::sandboxes::SandboxConfig {
                listen,
                templates,
                domain: a.sandbox_domain,
                zygote_idle: match a.sandbox_zygote_idle {
                    Some(0) => None,
                    Some(s) => Some(std::time::Duration::from_secs(s)),
                    None => a
                        .auth
                        .is_some()
                        .then_some(spore_serve::sandboxes::DEFAULT_ZYGOTE_IDLE),
                },
            })
        }
        None => None,
    };
    spore_serve::run(spore_serve::ServeConfig {
        sandboxes,
        cluster,
        listen: a.listen,
        url_listen: a.url_listen,
        url_domain: a.url_domain,
        auth_keys: a.auth,
        connections: spore_serve::server::ConnLimits {
            max_connections: a.max_connections.max(1),
            idle_timeout: Duration::from_millis(a.idle_timeout_ms.max(1)),
            request_timeout: Duration::from_millis(a.request_timeout_ms.max(1)),
        },
        events: spore_serve::events::EventsConfig {
            max_queued: a.event_queue_max.max(1),
            max_retries: a.event_retries,
            max_age: Duration::from_secs(a.event_max_age_s.max(1)),
            retry_delay: Duration::from_millis(a.event_retry_delay_ms),
        },
        instances: spore_serve::InstancesConfig {
            spore_bin,
            state_dir,
            max_concurrency: a.max_concurrency,
            queue_wait: Duration::from_millis(a.queue_wait_ms),
            keep_alive: Duration::from_millis(a.keep_alive_ms),
            zygote_keep_alive: Duration::from_millis(a.zygote_keep_alive_ms),
            memory_budget,
            no_clones: a.no_clones,
            no_snapshots: a.no_snapshots,
            restore_mode: spore_serve::snapshots::RestoreMode::parse(&a.restore_mode)
                .context("--restore-mode")?,
            working_set_record_ms: a.working_set_record_ms,
            linux_snapshots: spore_serve::snapshots::LinuxSnapshots::parse(&a.linux_snapshots)
                .context("--linux-snapshots")?,
            net_pool: spore_serve::network::NetPool::parse(&a.net_pool)?,
            net_spares: usize::from(a.net_spares),
            linux_kernel,
            image_cache,
            ready_limit: Duration::from_secs(a.ready_timeout_s.max(1)),
            cgroups,
            jail: (!a.no_jail).then_some(a.uid_range),
        },
    })?;
    Ok(0)
}

/// `--cluster` with its companions, checked before anything starts.
fn cluster_options(url: &str, a: &ServeArgs) -> anyhow::Result<spore_serve::cluster::NodeOptions> {
    let node_id = match &a.node_id {
        Some(id) => id.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .context("--node-id: none given and no host name")?,
    };
    let cluster = spore_serve::catalog::ClusterConfig::parse(url, &node_id)?;
    let advertise = match a.advertise {
        Some(addr) => addr,
        None if a.listen.ip().is_unspecified() || a.listen.port() == 0 => anyhow::bail!(
            "--cluster: --listen {} is no address other nodes can reach: give --advertise",
            a.listen
        ),
        None => a.listen,
    };
    let key_file = a.cluster_key.clone().context(
        "--cluster needs --cluster-key FILE (the key nodes' requests to each other carry)",
    )?;
    Ok(spore_serve::cluster::NodeOptions {
        cluster,
        advertise,
        key_file,
        replicas: usize::from(a.replicas),
    })
}
