//! Sandbox VMMs jailed as function instances are (`crate::jail`): every VMM
//! of an account's zygote of a template (the zygote, the sandboxes cloned
//! from it, their forks, resumed sandboxes) runs as a uid of that account's
//! and template's own, in a root that shows only what it needs: spore and
//! the system's libraries, the template's kernel and image (read-only), the
//! sandboxes' directory `<state>/sbx` and, for a zygote, its bases
//! directory (to write its base).
//!
//! Who may touch what: a sandbox's directory is root's with its uid's
//! group, mode 01770 (its VMMs write their sockets, overlays and snapshots
//! there and cannot replace the daemon's record beside them); a fork
//! group's directory and a zygote's bases directory are its uid's. Other
//! accounts' and templates' VMMs run as other uids and reach none of it.

use std::path::{Path, PathBuf};

use super::{Record, TemplateSpec};
use crate::jail::{Jail, Jailed, User};

pub(super) struct SandboxJail {
    jail: Jail,
    /// What every jailed VMM reads outside the state directory.
    system: Vec<PathBuf>,
    /// `<state>/sbx`.
    sandboxes: PathBuf,
}

impl SandboxJail {
    pub fn new(jail: Jail, spore_bin: &Path, sandboxes: &Path) -> Self {
        SandboxJail {
            jail,
            system: crate::jail::system_paths(spore_bin),
            sandboxes: sandboxes.to_path_buf(),
        }
    }

    /// The user of `account`'s VMMs of template `template`.
    pub fn user(&self, account: &str, template: &str) -> anyhow::Result<User> {
        self.jail.user_of_template(account, template)
    }

    /// How a template's zygote is jailed: it reads the template's kernel
    /// and image (refused, saying what to change, where its user may
    /// not), writes its clones' directories and `bases` (its template's
    /// bases directory, made its user's here).
    pub fn zygote(&self, spec: &TemplateSpec, user: &User, bases: &Path) -> anyhow::Result<Jailed> {
        for file in [&spec.kernel, &spec.rootfs] {
            crate::jail::check_readable(file, user).map_err(anyhow::Error::msg)?;
        }
        crate::fs::create_private_dir(bases)?;
        crate::jail::own_tree(bases, user)?;
        let mut read_only = vec![spec.kernel.clone(), spec.rootfs.clone()];
        read_only.extend(self.system.iter().cloned());
        Ok(Jailed {
            user: user.clone(),
            writable: vec![self.sandboxes.clone(), bases.to_path_buf()],
            read_only,
        })
    }

    /// How a template build's VM is jailed: it reads the parent's kernel
    /// and writes the image being built, in `dir` (made its user's here).
    pub fn builder(&self, spec: &TemplateSpec, user: &User, dir: &Path) -> anyhow::Result<Jailed> {
        crate::jail::check_readable(&spec.kernel, user).map_err(anyhow::Error::msg)?;
        crate::jail::own_tree(dir, user)?;
        let mut read_only = vec![spec.kernel.clone()];
        read_only.extend(self.system.iter().cloned());
        Ok(Jailed {
            user: user.clone(),
            writable: vec![dir.to_path_buf()],
            read_only,
        })
    }

    /// How a paused sandbox's VMM is jailed when it resumes: its snapshot
    /// chain readable (a template base outside `<state>/sbx` shown on its
    /// own), the sandboxes' directory writable (its next pause, its
    /// forks). Files an unjailed daemon left in its directory become its
    /// user's first.
    pub fn resumed(
        &self,
        spec: &TemplateSpec,
        user: &User,
        rec: &Record,
        dir: &Path,
    ) -> anyhow::Result<Jailed> {
        crate::jail::check_readable(&spec.rootfs, user).map_err(anyhow::Error::msg)?;
        self.give_sandbox_dir(dir, user)?;
        if let Some(group) = &rec.vm_dir {
            crate::jail::own_tree(&self.sandboxes.join(group), user)?;
        }
        let chain = rec.chain_files(dir);
        crate::jail::give_files(&chain, user)?;
        let mut read_only = vec![spec.rootfs.clone()];
        read_only.extend(
            chain
                .into_iter()
                .filter(|f| !f.starts_with(&self.sandboxes)),
        );
        read_only.extend(self.system.iter().cloned());
        Ok(Jailed {
            user: user.clone(),
            writable: vec![self.sandboxes.clone()],
            read_only,
        })
    }

    /// A sandbox's directory made ready for its VMMs: the template's
    /// group may write it, the record stays root's; what else is in it
    /// (a paused sandbox's snapshot and overlay) is their user's.
    pub fn give_sandbox_dir(&self, dir: &Path, user: &User) -> std::io::Result<()> {
        crate::jail::share_dir_with(dir, user)?;
        let record = super::record::path(dir);
        let files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| *p != record)
            .collect();
        crate::jail::give_files(&files, user)
    }
}
