//! A cluster node's part in what other nodes change: when the catalogue's
//! log brings another node's write, this node's instances follow it as the
//! writer's did (a function updated or deleted elsewhere ends its instances
//! here too; reserved and provisioned concurrency are set again); when the
//! node fences itself, its instances end.

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

/// An owner of a function keeps its code from the moment it is deployed
/// (fetched in the background from the node it was deployed through): the
/// code is then on at least two nodes, and survives the loss of either.
fn keep_code(node: &Arc<Node>, state_dir: &Path, f: &crate::catalog::Function) {
    let held = if crate::runtime::find(&f.runtime).is_some_and(|rt| rt.linux()) {
        crate::code::disk_path(state_dir, &f.code_sha256).exists()
    } else {
        crate::code::image_path(state_dir, &f.code_sha256, &f.handler).exists()
    };
    if held || !node.is_owner(&f.name) {
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
