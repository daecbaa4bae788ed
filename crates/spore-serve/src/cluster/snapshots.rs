//! Snapshots between nodes: a node about to boot a function cold, which
//! has no snapshot of that version, asks its peers for theirs and restores
//! it instead. Only a Full snapshot is shipped (a unikernel function's), and
//! only where the CPU and guest kernel it was made with match this node's
//! (its origin record); otherwise the node boots cold as before.
//!
//! `GET snapshot/<name>/<version>/<revision>` answers what the snapshot is
//! (its origin and file sizes); `GET snapshot/<name>/<version>/<revision>/
//! <file>` sends one file as data ranges ([`super::extents`]). The revision
//! id makes sure both nodes mean the same code and configuration.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::{extents, Node};
use crate::catalog::{Catalog, Function};
use crate::snapshots::{FunctionSnapshot, Origin, SnapshotStore};

/// How long a peer may take to say whether it holds a snapshot: a node
/// about to boot cold waits no longer than that for each.
const ASK_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a peer may take to send one file.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

/// A peer's answer to the manifest request.
#[derive(serde::Serialize, serde::Deserialize)]
struct Manifest {
    origin: Origin,
    /// File name → bytes (its apparent size: holes count).
    files: BTreeMap<String, u64>,
}

fn reply(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

/// A function key (`[ACCOUNT:]NAME`) or a revision id, as the catalogue
/// makes them.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_:".contains(&b))
}

/// Whether `name`'s version `version` here is revision `revision` (its
/// `$LATEST` or one of its published versions).
fn same_revision(catalog: &Catalog, name: &str, version: i64, revision: &str) -> bool {
    let current = catalog.get(name).ok().flatten().into_iter();
    let published = catalog.versions(name).unwrap_or_default().into_iter();
    current
        .chain(published)
        .any(|f| f.version == version && f.revision_id == revision)
}

/// Serves `rest` (the path after `snapshot/`) to another node.
pub async fn serve_snapshot(
    node: &Node,
    store: &SnapshotStore,
    catalog: &Catalog,
    headers: &hyper::HeaderMap,
    rest: &str,
) -> Response<Full<Bytes>> {
    if !node.authorised(headers) {
        return reply(
            StatusCode::FORBIDDEN,
            b"cluster key missing or wrong".to_vec(),
        );
    }
    let parts: Vec<&str> = rest.split('/').collect();
    let (name, version, revision, file) = match parts.as_slice() {
        [n, v, r] => (*n, *v, *r, None),
        [n, v, r, f] => (*n, *v, *r, Some(*f)),
        _ => return reply(StatusCode::NOT_FOUND, b"no such node API".to_vec()),
    };
    let version = match version.parse::<i64>() {
        Ok(v) if is_name(name) && is_name(revision) => v,
        _ => return reply(StatusCode::BAD_REQUEST, b"malformed snapshot path".to_vec()),
    };
    if !same_revision(catalog, name, version, revision) {
        return reply(StatusCode::NOT_FOUND, b"not that revision here".to_vec());
    }
    let (snap, origin) = match store.shippable(name, version) {
        Ok(s) => s,
        Err(why) => return reply(StatusCode::NOT_FOUND, why.into_bytes()),
    };
    match file {
        None => {
            let files = SnapshotStore::SHIPPED_FILES
                .iter()
                .filter_map(|f| {
                    let len = std::fs::metadata(snap.dir.join(f)).ok()?.len();
                    Some((f.to_string(), len))
                })
                .collect();
            let manifest = Manifest { origin, files };
            match serde_json::to_vec(&manifest) {
                Ok(body) => reply(StatusCode::OK, body),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    e.to_string().into_bytes(),
                ),
            }
        }
        Some(f) if SnapshotStore::SHIPPED_FILES.contains(&f) => {
            let path = snap.dir.join(f);
            match tokio::task::spawn_blocking(move || extents::encode(&path)).await {
                Ok(Ok((_, body))) => reply(StatusCode::OK, body),
                Ok(Err(e)) => reply(StatusCode::NOT_FOUND, e.to_string().into_bytes()),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    e.to_string().into_bytes(),
                ),
            }
        }
        Some(_) => reply(StatusCode::NOT_FOUND, b"no such snapshot file".to_vec()),
    }
}

/// What a fetch brought.
pub struct Fetched {
    pub snapshot: FunctionSnapshot,
    pub from: String,
    pub bytes: u64,
    pub elapsed: Duration,
}

/// Fetches `f`'s snapshot from the first live peer that holds one made on a
/// CPU and kernel like `here`, and makes it this node's (owned by `user`).
/// An error names what each peer answered.
pub async fn fetch_snapshot(
    node: &Node,
    store: &SnapshotStore,
    f: &Function,
    here: &Origin,
    user: Option<&crate::jail::User>,
) -> Result<Fetched, String> {
    let started = Instant::now();
    let base = format!("snapshot/{}/{}/{}", f.name, f.version, f.revision_id);
    let nodes = node.nodes().await.map_err(|e| e.to_string())?;
    let mut tried = Vec::new();
    for peer in nodes.iter().filter(|n| n.node_id != node.cluster.node_id) {
        let asked = tokio::time::timeout(
            ASK_TIMEOUT,
            super::peer_http::get(node, &peer.advertise, &base, 64 * 1024),
        )
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
        let manifest: Manifest = match asked {
            Ok((StatusCode::OK, body)) => match serde_json::from_slice(&body) {
                Ok(m) => m,
                Err(e) => {
                    tried.push(format!("{}: {e}", peer.node_id));
                    continue;
                }
            },
            Ok((status, body)) => {
                let why = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                tried.push(format!("{}: {status} {why}", peer.node_id));
                continue;
            }
            Err(e) => {
                tried.push(format!("{}: {e}", peer.node_id));
                continue;
            }
        };
        if let Some(why) = manifest.origin.mismatch(here) {
            tried.push(format!("{}: {why}", peer.node_id));
            continue;
        }
        match fetch_files(node, store, f, &peer.advertise, &base, &manifest, user).await {
            Ok((snapshot, bytes)) => {
                return Ok(Fetched {
                    snapshot,
                    from: peer.node_id.clone(),
                    bytes,
                    elapsed: started.elapsed(),
                })
            }
            Err(e) => tried.push(format!("{}: {e}", peer.node_id)),
        }
    }
    Err(if tried.is_empty() {
        "no other live node".into()
    } else {
        tried.join("; ")
    })
}

/// The largest file of a snapshot a node accepts for `f`: its memory and a
/// margin for hotplugged memory and device state.
fn largest_file(f: &Function) -> u64 {
    (u64::from(f.memory_mib) + 1024) << 20
}

async fn fetch_files(
    node: &Node,
    store: &SnapshotStore,
    f: &Function,
    addr: &str,
    base: &str,
    manifest: &Manifest,
    user: Option<&crate::jail::User>,
) -> Result<(FunctionSnapshot, u64), String> {
    for needed in ["vm.state", "vm.mem"] {
        if !manifest.files.contains_key(needed) {
            return Err(format!("the snapshot has no {needed}"));
        }
    }
    let tmp = store.import_dir(f).map_err(|e| format!("{e:#}"))?;
    let fetched = async {
        let mut bytes = 0u64;
        for (name, &size) in &manifest.files {
            if !SnapshotStore::SHIPPED_FILES.contains(&name.as_str()) {
                return Err(format!("the peer offered {name:?}"));
            }
            if size > largest_file(f) {
                return Err(format!("{name} is {size} bytes: too large for {}", f.name));
            }
            // Data plus a 16-byte header per range (at most one per page).
            let limit = size + 16 * (size / 4096 + 2);
            let limit = usize::try_from(limit).map_err(|e| e.to_string())?;
            let got = tokio::time::timeout(
                FILE_TIMEOUT,
                super::peer_http::get(node, addr, &format!("{base}/{name}"), limit),
            )
            .await
            .unwrap_or_else(|_| Err("timed out".into()))?;
            let (status, body) = got;
            if status != StatusCode::OK {
                return Err(format!("{name}: {status}"));
            }
            bytes += body.len() as u64;
            let dest = tmp.join(name);
            tokio::task::spawn_blocking(move || extents::decode(&body, size, &dest))
                .await
                .map_err(|e| e.to_string())??;
        }
        Ok(bytes)
    }
    .await;
    let bytes = match fetched {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    let snap = store.adopt(f, &tmp, user).map_err(|e| format!("{e:#}"))?;
    Ok((snap, bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn function_keys_and_revisions_are_names_paths_are_not() {
        for ok in ["f", "111111111111:f-1_x", "3f2a-9c"] {
            assert!(super::is_name(ok), "{ok}");
        }
        for bad in ["", "..", "a/b", "a b", "%2e", &"x".repeat(129)] {
            assert!(!super::is_name(bad), "{bad}");
        }
    }
}
