//! A cluster node's part in what other nodes change: when the catalogue's
//! log brings another node's write, this node's instances follow it as the
//! writer's did (a function updated or deleted elsewhere ends its instances
//! here too; reserved and provisioned concurrency are set again); when the
//! node fences itself, its instances end; as the membership changes, the
//! node keeps copies of the code (and a drained node's snapshots) of the
//! functions it now owns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::cluster::Node;
use crate::instances::Instances;

/// Starts both followers on the caller's runtime.
pub fn spawn(
    node: &Arc<Node>,
    catalog: &Arc<Catalog>,
    instances: &Arc<Instances>,
    state_dir: &Path,
) {
    if let Some(changes) = catalog.take_remote_changes() {
        tokio::spawn(follow_changes(
            changes,
            node.clone(),
            catalog.clone(),
            instances.clone(),
            state_dir.to_path_buf(),
        ));
    }
    let mut fence = node.fence_changes();
    let instances = instances.clone();
    tokio::spawn(async move {
        while fence.changed().await.is_ok() {
            let fenced = *fence.borrow_and_update();
            if fenced {
                instances.end_all().await;
            }
        }
    });
}

async fn follow_changes(
    mut changes: tokio::sync::mpsc::UnboundedReceiver<String>,
    node: Arc<Node>,
    catalog: Arc<Catalog>,
    instances: Arc<Instances>,
    state_dir: PathBuf,
) {
    // Each function's revision and code as this node last saw them.
    let mut seen: HashMap<String, (i64, String)> = catalog
        .list()
        .unwrap_or_default()
        .into_iter()
        .map(|f| (f.name, (f.version, f.code_sha256)))
        .collect();
    while let Some(name) = changes.recv().await {
        let now = match catalog.get(&name) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(function = %name, "cluster: reading a changed function: {e}");
                continue;
            }
        };
        let before = match &now {
            Some(f) => seen.insert(name.clone(), (f.version, f.code_sha256.clone())),
            None => seen.remove(&name),
        };
        instances.set_reserved(&name, now.as_ref().and_then(|f| f.reserved_concurrency));
        let moved = match (&before, &now) {
            (Some((v, _)), Some(f)) => *v != f.version,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if moved {
            instances.forget(&name).await;
            tracing::info!(function = %name, "changed through another node: its instances here ended");
        }
        if let Some((_, sha)) =
            before.filter(|(_, sha)| now.as_ref().is_none_or(|f| &f.code_sha256 != sha))
        {
            if !catalog.code_in_use(&sha).unwrap_or(true) {
                let _ = std::fs::remove_dir_all(crate::code::dir(&state_dir, &sha));
            }
        }
        if let Some(f) = now {
            instances.sync_provisioned(&name).await;
            keep_code(&node, &state_dir, &f);
        }
    }
}

/// How often a node looks for code and snapshots it should keep.
const REPLICATION_PERIOD: std::time::Duration = std::time::Duration::from_secs(3);
/// How long a copy that failed waits before it is tried again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Keeps copies where they belong as the membership changes: every few
/// seconds, for each function this node now owns (a node joined, left or
/// is being drained), its code if missing, and the snapshot of its current
/// revision if a node being drained holds one (so that the drained node's
/// snapshots outlive it).
pub fn spawn_replication(
    node: &Arc<Node>,
    catalog: &Arc<Catalog>,
    instances: &Arc<Instances>,
    state_dir: &Path,
) {
    let (node, catalog, instances, state_dir) = (
        node.clone(),
        catalog.clone(),
        instances.clone(),
        state_dir.to_path_buf(),
    );
    tokio::spawn(async move {
        // What could not be copied, and when: tried again after a while,
        // not every period.
        let mut failed: HashMap<String, std::time::Instant> = HashMap::new();
        loop {
            tokio::time::sleep(REPLICATION_PERIOD).await;
            if node.is_fenced() {
                continue;
            }
            failed.retain(|_, at| at.elapsed() < RETRY_AFTER);
            for f in catalog.list().unwrap_or_default() {
                if !node.is_owner(&f.name) {
                    continue;
                }
                if !has_code(&state_dir, &f) && !failed.contains_key(&f.code_sha256) {
                    let fetched = crate::cluster::fetch_code(
                        &node,
                        &state_dir,
                        &f.code_sha256,
                        &f.runtime,
                        &f.handler,
                    )
                    .await;
                    if let Err(e) = fetched {
                        tracing::warn!(function = %f.name, "keeping a copy of its code: {e}");
                        failed.insert(f.code_sha256.clone(), std::time::Instant::now());
                    }
                }
                let key = crate::cluster::revision_key(&f.name, f.version);
                if !failed.contains_key(&key)
                    && node.snapshot_on_a_draining_node(&key)
                    && !instances.keep_snapshot(&f).await
                {
                    failed.insert(key, std::time::Instant::now());
                }
            }
        }
    });
}

/// Whether `f`'s code is stored here.
fn has_code(state_dir: &Path, f: &crate::catalog::Function) -> bool {
    if crate::runtime::find(&f.runtime).is_some_and(|rt| rt.linux()) {
        crate::code::disk_path(state_dir, &f.code_sha256).exists()
    } else {
        crate::code::image_path(state_dir, &f.code_sha256, &f.handler).exists()
    }
}

/// An owner of a function keeps its code from the moment it is deployed
/// (fetched in the background from the node it was deployed through): the
/// code is then on at least two nodes, and survives the loss of either.
fn keep_code(node: &Arc<Node>, state_dir: &Path, f: &crate::catalog::Function) {
    if has_code(state_dir, f) || !node.is_owner(&f.name) {
        return;
    }
    let (node, state, f) = (node.clone(), state_dir.to_path_buf(), f.clone());
    tokio::spawn(async move {
        let fetched =
            crate::cluster::fetch_code(&node, &state, &f.code_sha256, &f.runtime, &f.handler).await;
        if let Err(e) = fetched {
            tracing::warn!(function = %f.name, "keeping a copy of its code: {e}");
        }
    });
}
