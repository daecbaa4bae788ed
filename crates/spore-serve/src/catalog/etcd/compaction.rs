//! Compaction of the catalogue's log in etcd. Once the log holds
//! [`COMPACT_AFTER`] entries past the last base, a member writes a *base*:
//! the shared tables of its copy at its applied index K (JSON, in chunks of
//! at most [`CHUNK`] bytes under `<prefix>catalog/chunks/<K>/`, then
//! `<prefix>catalog/base` naming K, the size and the SHA-256, in a
//! transaction that fails if another member's base came first), and
//! deletes the log entries up to K and the older base. A member whose copy
//! is behind the base (a new one, or one away while it was written) loads
//! it, replacing its shared tables in one SQLite transaction, and applies
//! the log from K + 1. What is the member's own (its snapshots, processes,
//! jail uids, how far it applied) is never in a base.

use std::collections::BTreeSet;

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{cluster_err, set_applied, ClusterConfig, Shared};
use crate::catalog::CatalogError;
use crate::mutex::lock;

/// Log entries past the base that make a member write a new base.
pub(super) const COMPACT_AFTER: u64 = 1000;
/// The largest value a base chunk is (etcd's default request limit is
/// 1.5 MiB).
const CHUNK: usize = 1 << 20;

/// The tables every member's copy holds alike: those [`super::Change`]s
/// write. Every other table is the member's own ([`LOCAL_TABLES`]).
pub(super) const SHARED_TABLES: [&str; 10] = [
    "functions",
    "versions",
    "version_counters",
    "aliases",
    "function_urls",
    "provisioned",
    "provisioned_configs",
    "event_invoke_configs",
    "event_configs",
    "tags",
];
/// A member's own tables, never in a base.
#[cfg(test)]
pub(super) const LOCAL_TABLES: [&str; 4] = ["snapshots", "processes", "jail_uids", "cluster_copy"];

/// `<prefix>catalog/base`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct BaseRecord {
    /// The log index the base holds the catalogue at.
    pub index: u64,
    pub chunks: u32,
    pub bytes: u64,
    pub sha256: String,
}

fn base_key(c: &ClusterConfig) -> String {
    format!("{}catalog/base", c.prefix)
}

fn chunk_dir(c: &ClusterConfig, index: u64) -> String {
    format!("{}catalog/chunks/{index:020}/", c.prefix)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The shared tables as JSON: per table its columns and rows.
fn dump(db: &Connection) -> Result<Vec<u8>, CatalogError> {
    let mut tables = serde_json::Map::new();
    for table in SHARED_TABLES {
        let mut st = db.prepare(&format!("SELECT * FROM {table}"))?;
        let columns: Vec<String> = st.column_names().iter().map(|c| c.to_string()).collect();
        let n = columns.len();
        let mut rows = Vec::new();
        let mut q = st.query([])?;
        while let Some(row) = q.next()? {
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                values.push(match row.get_ref(i)? {
                    ValueRef::Null => serde_json::Value::Null,
                    ValueRef::Integer(v) => v.into(),
                    ValueRef::Real(v) => v.into(),
                    ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
                    ValueRef::Blob(_) => {
                        return Err(CatalogError::Cluster(format!(
                            "table {table} holds a blob: not in a base"
                        )))
                    }
                });
            }
            rows.push(serde_json::Value::Array(values));
        }
        tables.insert(
            table.to_string(),
            serde_json::json!({ "columns": columns, "rows": rows }),
        );
    }
    serde_json::to_vec(&tables).map_err(|e| cluster_err("encoding a base", e))
}

fn function_names(db: &Connection) -> Result<BTreeSet<String>, CatalogError> {
    let mut st = db.prepare("SELECT name FROM functions")?;
    let names = st.query_map([], |r| r.get(0))?;
    Ok(names.collect::<Result<_, _>>()?)
}

/// Replaces the shared tables of `db` by the base `bytes` at `index`, in
/// one transaction; the functions it may have changed (before or after).
fn load(db: &mut Connection, bytes: &[u8], index: u64) -> Result<BTreeSet<String>, CatalogError> {
    let tables: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes).map_err(|e| cluster_err("reading a base", e))?;
    let tx = db.transaction()?;
    let mut touched = function_names(&tx)?;
    for table in SHARED_TABLES {
        tx.execute(&format!("DELETE FROM {table}"), [])?;
        let Some(t) = tables.get(table) else { continue };
        let columns: Vec<&str> = t["columns"]
            .as_array()
            .map(|c| c.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        let valid = |c: &str| c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if columns.is_empty() || !columns.iter().all(|c| valid(c)) {
            return Err(CatalogError::Cluster(format!(
                "the base's {table} has bad columns"
            )));
        }
        let sql = format!(
            "INSERT INTO {table} ({}) VALUES ({})",
            columns.join(", "),
            vec!["?"; columns.len()].join(", ")
        );
        let mut st = tx.prepare(&sql)?;
        for row in t["rows"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let values: Vec<SqlValue> = row
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|v| match v {
                    serde_json::Value::Null => SqlValue::Null,
                    serde_json::Value::Number(n) => n.as_i64().map_or_else(
                        || SqlValue::Real(n.as_f64().unwrap_or(0.0)),
                        SqlValue::Integer,
                    ),
                    serde_json::Value::String(s) => SqlValue::Text(s.clone()),
                    other => SqlValue::Text(other.to_string()),
                })
                .collect();
            if values.len() != columns.len() {
                return Err(CatalogError::Cluster(format!(
                    "the base's {table} has a bad row"
                )));
            }
            st.execute(rusqlite::params_from_iter(values))?;
        }
    }
    set_applied(&tx, index)?;
    touched.extend(function_names(&tx)?);
    tx.commit()?;
    Ok(touched)
}

/// The current base and the revision it was written at (0: none).
pub(super) async fn read_base(
    client: &mut Client,
    c: &ClusterConfig,
) -> Result<(Option<BaseRecord>, i64), CatalogError> {
    let resp = client
        .get(base_key(c), None)
        .await
        .map_err(|e| cluster_err("reading the catalogue's base in etcd", e))?;
    Ok(match resp.kvs().first() {
        Some(kv) => (
            Some(
                serde_json::from_slice(kv.value())
                    .map_err(|e| cluster_err("the catalogue's base record", e))?,
            ),
            kv.mod_revision(),
        ),
        None => (None, 0),
    })
}

/// Loads the base into the copy if the copy is behind it; whether it did.
pub(super) async fn load_if_behind(
    client: &mut Client,
    shared: &Shared,
) -> Result<bool, CatalogError> {
    let c = &shared.cluster;
    let (Some(base), _) = read_base(client, c).await? else {
        return Ok(false);
    };
    shared
        .base_index
        .store(base.index, std::sync::atomic::Ordering::Release);
    if base.index <= shared.applied.load(std::sync::atomic::Ordering::Acquire) {
        return Ok(false);
    }
    let resp = client
        .get(
            chunk_dir(c, base.index),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .map_err(|e| cluster_err("reading the catalogue's base in etcd", e))?;
    let mut bytes = Vec::with_capacity(usize::try_from(base.bytes).unwrap_or(0));
    // Keys sort as the chunks' order (six-digit numbers).
    for kv in resp.kvs() {
        bytes.extend_from_slice(kv.value());
    }
    if resp.kvs().len() != base.chunks as usize
        || bytes.len() as u64 != base.bytes
        || hex(&Sha256::digest(&bytes)) != base.sha256
    {
        return Err(CatalogError::Cluster(format!(
            "the catalogue's base at {} is incomplete or changed while read",
            base.index
        )));
    }
    let touched = load(&mut lock(&shared.db), &bytes, base.index)?;
    shared
        .applied
        .store(base.index, std::sync::atomic::Ordering::Release);
    tracing::info!(
        index = base.index,
        bytes = base.bytes,
        "cluster catalogue: loaded the base (the log before it is compacted)"
    );
    for name in touched {
        let _ = shared.remote_tx.send(name);
    }
    Ok(true)
}

/// Writes a base at this copy's applied index and deletes the log before
/// it, unless a base at least as new exists; the index written.
pub(super) async fn compact(
    client: &mut Client,
    shared: &Shared,
) -> Result<Option<u64>, CatalogError> {
    let c = &shared.cluster;
    let (old, old_revision) = read_base(client, c).await?;
    // The etcd thread applies and compacts in turn: the copy stays at
    // `index` while it is dumped.
    let index = shared.applied.load(std::sync::atomic::Ordering::Acquire);
    if old.as_ref().is_some_and(|b| b.index >= index) || index == 0 {
        return Ok(None);
    }
    let bytes = dump(&lock(&shared.db))?;
    let record = BaseRecord {
        index,
        chunks: u32::try_from(bytes.len().div_ceil(CHUNK)).unwrap_or(u32::MAX),
        bytes: bytes.len() as u64,
        sha256: hex(&Sha256::digest(&bytes)),
    };
    let dir = chunk_dir(c, index);
    for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
        client
            .put(format!("{dir}{i:06}"), chunk, None)
            .await
            .map_err(|e| cluster_err("writing the catalogue's base", e))?;
    }
    let json = serde_json::to_vec(&record).map_err(|e| cluster_err("encoding a base", e))?;
    let txn = Txn::new()
        .when([Compare::mod_revision(
            base_key(c),
            CompareOp::Equal,
            old_revision,
        )])
        .and_then([TxnOp::put(base_key(c), json, None)]);
    let won = client
        .txn(txn)
        .await
        .map_err(|e| cluster_err("writing the catalogue's base", e))?
        .succeeded();
    let prefix = Some(DeleteOptions::new().with_prefix());
    if !won {
        // Another member's base came first; ours goes unless it is the
        // same index (the same chunks, then).
        if read_base(client, c)
            .await?
            .0
            .is_none_or(|b| b.index != index)
        {
            let _ = client.delete(dir, prefix).await;
        }
        return Ok(None);
    }
    shared
        .base_index
        .store(index, std::sync::atomic::Ordering::Release);
    // Everything up to the base: the log entries, the older base.
    let before = DeleteOptions::new().with_range(c.log_key(index + 1));
    client
        .delete(c.log_dir(), Some(before))
        .await
        .map_err(|e| cluster_err("deleting the compacted log", e))?;
    if let Some(old) = old.filter(|b| b.index != index) {
        let _ = client.delete(chunk_dir(c, old.index), prefix).await;
    }
    tracing::info!(
        index,
        bytes = record.bytes,
        "cluster catalogue: log compacted into a base"
    );
    Ok(Some(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_shared_or_a_members_own() {
        let c = crate::catalog::Catalog::in_memory().unwrap();
        let db = c.db();
        let mut st = db
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .unwrap();
        let tables: Vec<String> = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for t in &tables {
            assert!(
                SHARED_TABLES.contains(&t.as_str()) || LOCAL_TABLES.contains(&t.as_str()),
                "table {t} is neither shared nor a member's own: say which"
            );
        }
    }

    #[test]
    fn a_base_loads_into_another_copy_as_it_was() {
        use crate::catalog::tests::sample;
        let a = crate::catalog::Catalog::in_memory().unwrap();
        assert!(a.insert(&sample("f")).unwrap());
        a.publish(&sample("f"), "v1").unwrap();
        a.add_tags("f", &[("team".into(), "x".into())].into_iter().collect())
            .unwrap();
        let bytes = dump(&a.db()).unwrap();
        let b = crate::catalog::Catalog::in_memory().unwrap();
        assert!(b.insert(&sample("stale")).unwrap());
        let touched = load(&mut b.db(), &bytes, 7).unwrap();
        assert_eq!(
            touched,
            ["f", "stale"].map(String::from).into_iter().collect()
        );
        assert_eq!(b.get("f").unwrap(), a.get("f").unwrap());
        assert!(b.get("stale").unwrap().is_none());
        assert_eq!(b.versions("f").unwrap(), a.versions("f").unwrap());
        assert_eq!(b.tags("f").unwrap(), a.tags("f").unwrap());
        // A base that does not parse changes nothing.
        assert!(load(&mut b.db(), b"{", 8).is_err());
        assert!(b.get("f").unwrap().is_some());
    }
}
