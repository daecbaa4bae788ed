//! The daemon's catalogue in SQLite (`<state-dir>/catalog.db`): functions with
//! the version of their code and configuration, and the VMM processes the
//! daemon started (so that a restarted daemon can end those of its
//! predecessor). Everything a restart must not lose lives here; instances
//! themselves are rebuilt from it, never trusted across a restart.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

mod change;
mod etcd;
mod event_configs;
mod jail_uids;
mod provisioned;
mod rows;
mod tags;
#[cfg(test)]
pub mod test_etcd;
mod urls;
mod versions;

pub use change::{Change, Outcome};
pub use etcd::{ClusterConfig, ClusterError};
pub use event_configs::EventInvokeConfig;
pub use jail_uids::JailUidError;
pub use provisioned::ProvisionedRecord;
pub use tags::Tags;
pub use urls::FunctionUrl;
pub use versions::Alias;

/// One function as deployed: its current version's code and configuration.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Function {
    pub name: String,
    pub runtime: String,
    pub handler: String,
    pub memory_mib: u32,
    pub timeout_s: u32,
    pub env: BTreeMap<String, String>,
    pub description: String,
    pub role: String,
    /// SHA-256 of the zip, hex: names the stored code.
    pub code_sha256: String,
    pub code_size: u64,
    /// Bumped on every change of code or configuration; instances, zygotes
    /// and snapshots belong to one version and are never served for another.
    pub version: i64,
    pub revision_id: String,
    /// RFC 3339 time of the last change.
    pub last_modified: String,
    pub reserved_concurrency: Option<u32>,
    /// `SporeNetwork.Enabled`: each instance gets a tap in a network
    /// namespace of its own with outbound NAT (`crate::network`).
    pub network: bool,
    /// The number of a published version (`PublishVersion`), immutable;
    /// `None` for `$LATEST`. A published version keeps the `version`
    /// (revision) `$LATEST` had when it was published, so the two share
    /// instances and snapshots until `$LATEST` changes.
    pub published: Option<u32>,
}

impl Function {
    /// The version as Lambda names it: `$LATEST` or the number.
    pub fn qualifier(&self) -> String {
        self.published
            .map_or_else(|| "$LATEST".to_string(), |n| n.to_string())
    }
}

fn insert(db: &Connection, f: &Function) -> Result<bool, CatalogError> {
    let n = db.execute(
        "INSERT OR IGNORE INTO functions (name, runtime, handler, memory_mib, timeout_s,
            env_json, description, role, code_sha256, code_size, version, revision_id,
            last_modified, reserved_concurrency, network)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
        row_params(f, &env_json(&f.env)),
    )?;
    Ok(n == 1)
}

fn update(db: &Connection, f: &Function) -> Result<(), CatalogError> {
    db.execute(
        "UPDATE functions SET runtime = ?2, handler = ?3, memory_mib = ?4, timeout_s = ?5,
            env_json = ?6, description = ?7, role = ?8, code_sha256 = ?9, code_size = ?10,
            version = ?11, revision_id = ?12, last_modified = ?13, reserved_concurrency = ?14,
            network = ?15
         WHERE name = ?1",
        row_params(f, &env_json(&f.env)),
    )?;
    Ok(())
}

/// A function's rows, all of them (the caller's transaction). Its jail uid
/// is this node's and goes too: every member frees its own.
fn delete(db: &Connection, name: &str) -> Result<bool, CatalogError> {
    let n = db.execute("DELETE FROM functions WHERE name = ?1", [name])?;
    for sql in [
        "DELETE FROM versions WHERE name = ?1",
        "DELETE FROM version_counters WHERE function = ?1",
        "DELETE FROM aliases WHERE function = ?1",
        "DELETE FROM function_urls WHERE function = ?1",
        "DELETE FROM jail_uids WHERE function = ?1",
    ] {
        db.execute(sql, [name])?;
    }
    Ok(n == 1)
}

/// A VMM process the daemon started.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRecord {
    pub pid: i32,
    pub run_dir: String,
}

/// The catalogue: read from SQLite; written through SQLite alone (one
/// daemon) or through the log in etcd that every member of a cluster
/// applies to its SQLite (`--cluster`).
pub struct Catalog {
    db: std::sync::Arc<Mutex<Connection>>,
    cluster: Option<etcd::Member>,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalogue: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The cluster's etcd could not take or confirm a write: nothing can be
    /// written now (reads still answer from this node's copy).
    #[error("catalogue: {0}")]
    Cluster(String),
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS functions (
    name TEXT PRIMARY KEY,
    runtime TEXT NOT NULL,
    handler TEXT NOT NULL,
    memory_mib INTEGER NOT NULL,
    timeout_s INTEGER NOT NULL,
    env_json TEXT NOT NULL,
    description TEXT NOT NULL,
    role TEXT NOT NULL,
    code_sha256 TEXT NOT NULL,
    code_size INTEGER NOT NULL,
    version INTEGER NOT NULL,
    revision_id TEXT NOT NULL,
    last_modified TEXT NOT NULL,
    reserved_concurrency INTEGER,
    network INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL,
    number INTEGER NOT NULL,
    runtime TEXT NOT NULL,
    handler TEXT NOT NULL,
    memory_mib INTEGER NOT NULL,
    timeout_s INTEGER NOT NULL,
    env_json TEXT NOT NULL,
    description TEXT NOT NULL,
    role TEXT NOT NULL,
    code_sha256 TEXT NOT NULL,
    code_size INTEGER NOT NULL,
    version INTEGER NOT NULL,
    revision_id TEXT NOT NULL,
    last_modified TEXT NOT NULL,
    reserved_concurrency INTEGER,
    network INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, number)
);
CREATE TABLE IF NOT EXISTS version_counters (
    function TEXT PRIMARY KEY,
    last INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS aliases (
    function TEXT NOT NULL,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    description TEXT NOT NULL,
    additional_version TEXT,
    additional_weight REAL,
    revision_id TEXT NOT NULL,
    PRIMARY KEY (function, name)
);
CREATE TABLE IF NOT EXISTS function_urls (
    url_id TEXT PRIMARY KEY,
    function TEXT NOT NULL,
    qualifier TEXT NOT NULL,
    auth_type TEXT NOT NULL,
    cors_json TEXT NOT NULL,
    creation_time TEXT NOT NULL,
    last_modified_time TEXT NOT NULL,
    UNIQUE (function, qualifier)
);
CREATE TABLE IF NOT EXISTS snapshots (
    function TEXT NOT NULL,
    version INTEGER NOT NULL,
    dir TEXT NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    PRIMARY KEY (function, version)
);
CREATE TABLE IF NOT EXISTS provisioned (
    function TEXT PRIMARY KEY,
    qualifier TEXT NOT NULL,
    count INTEGER NOT NULL,
    last_modified TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS provisioned_configs (
    function TEXT NOT NULL,
    qualifier TEXT NOT NULL,
    count INTEGER NOT NULL,
    last_modified TEXT NOT NULL,
    PRIMARY KEY (function, qualifier)
);
CREATE TABLE IF NOT EXISTS event_invoke_configs (
    function TEXT PRIMARY KEY,
    max_retries INTEGER,
    max_age_s INTEGER,
    on_success TEXT,
    on_failure TEXT,
    last_modified_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS event_configs (
    function TEXT NOT NULL,
    qualifier TEXT NOT NULL,
    max_retries INTEGER,
    max_age_s INTEGER,
    on_success TEXT,
    on_failure TEXT,
    last_modified_ms INTEGER NOT NULL,
    PRIMARY KEY (function, qualifier)
);
CREATE TABLE IF NOT EXISTS processes (
    pid INTEGER NOT NULL,
    run_dir TEXT NOT NULL,
    PRIMARY KEY (pid, run_dir)
);
CREATE TABLE IF NOT EXISTS jail_uids (
    function TEXT PRIMARY KEY,
    uid INTEGER NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS tags (
    function TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    tag_value TEXT NOT NULL,
    PRIMARY KEY (function, tag_key)
);
";

/// The catalogue holds every account's configuration (environment
/// secrets among it): owner-only, made so before SQLite opens it, since
/// its journal files take the database file's mode.
fn make_private(path: &Path) {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path);
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
}

impl Catalog {
    /// Opens (creating if needed) the catalogue at `path`, in WAL mode so a
    /// daemon killed mid-write loses at most the write in flight.
    pub fn open(path: &Path) -> Result<Self, CatalogError> {
        make_private(path);
        Self::with_connection(Connection::open(path)?)
    }

    /// Opens the catalogue for its node-local records only (the guardian:
    /// VMM processes), whether a single daemon's or a cluster member's copy.
    pub fn open_local(path: &Path) -> Result<Self, CatalogError> {
        make_private(path);
        Self::prepared(Connection::open(path)?)
    }

    /// A catalogue held in memory only (tests: nothing is written).
    #[cfg(test)]
    pub fn in_memory() -> Result<Self, CatalogError> {
        Self::with_connection(Connection::open_in_memory()?)
    }

    /// Opens the catalogue at `path` as this node's copy of a cluster's
    /// (`--cluster`): catches up with the log in etcd before it returns,
    /// then follows it. A catalogue that held a single daemon's functions,
    /// or another cluster's, is refused.
    pub fn open_member(path: &Path, cluster: &ClusterConfig) -> Result<Self, CatalogError> {
        make_private(path);
        Self::member_of(Connection::open(path)?, cluster)
    }

    /// A member's copy held in memory (tests).
    #[cfg(test)]
    pub fn in_memory_member(cluster: &ClusterConfig) -> Result<Self, CatalogError> {
        Self::member_of(Connection::open_in_memory()?, cluster)
    }

    fn member_of(db: Connection, cluster: &ClusterConfig) -> Result<Self, CatalogError> {
        let mut c = Self::prepared(db)?;
        etcd::claim_copy(&c.db(), cluster)?;
        c.cluster = Some(etcd::Member::join(c.db.clone(), cluster)?);
        Ok(c)
    }

    fn with_connection(db: Connection) -> Result<Self, CatalogError> {
        let c = Self::prepared(db)?;
        etcd::refuse_member_copy(&c.db())?;
        Ok(c)
    }

    fn prepared(db: Connection) -> Result<Self, CatalogError> {
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        db.execute_batch(SCHEMA)?;
        migrate(&db)?;
        Ok(Catalog {
            db: std::sync::Arc::new(Mutex::new(db)),
            cluster: None,
        })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        crate::mutex::lock(&self.db)
    }

    /// Writes a change: applied here at once, or, in a cluster, appended to
    /// the log and returned once this node applied it (so that what the
    /// writer reads next has it).
    pub fn write(&self, change: Change) -> Result<Outcome, CatalogError> {
        match &self.cluster {
            Some(member) => member.write(change),
            None => {
                let mut db = self.db();
                let tx = db.transaction()?;
                let outcome = change.apply(&tx)?;
                tx.commit()?;
                Ok(outcome)
            }
        }
    }

    /// In a cluster: applies everything etcd holds now, so that what this
    /// node reads next is no older than this call. Nothing for a single
    /// daemon.
    pub fn sync(&self) -> Result<(), CatalogError> {
        self.cluster.as_ref().map_or(Ok(()), etcd::Member::sync)
    }

    /// In a cluster: writes a base of the log now and deletes the log
    /// before it (whatever its length); whether it did.
    #[cfg(test)]
    pub fn compact_log(&self) -> Result<bool, CatalogError> {
        self.cluster
            .as_ref()
            .map_or(Ok(false), etcd::Member::compact)
    }

    /// In a cluster: the functions other members' changes wrote, as this
    /// node applies them (each name once per change). `None` for a single
    /// daemon, or once taken.
    pub fn take_remote_changes(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        self.cluster
            .as_ref()
            .and_then(etcd::Member::take_remote_changes)
    }

    /// Inserts a new function; false if the name is taken.
    pub fn insert(&self, f: &Function) -> Result<bool, CatalogError> {
        Ok(self
            .write(Change::InsertFunction {
                function: f.clone(),
            })?
            .changed())
    }

    /// Replaces a function's row (code, configuration, version).
    pub fn update(&self, f: &Function) -> Result<(), CatalogError> {
        self.write(Change::UpdateFunction {
            function: f.clone(),
        })
        .map(drop)
    }

    pub fn get(&self, name: &str) -> Result<Option<Function>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached("SELECT * FROM functions WHERE name = ?1")?;
        Ok(st.query_row([name], row_to_function).optional()?)
    }

    pub fn list(&self) -> Result<Vec<Function>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached("SELECT * FROM functions ORDER BY name")?;
        let rows = st.query_map([], row_to_function)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Deletes a function with its published versions and aliases (one
    /// transaction); false if there was none.
    pub fn delete(&self, name: &str) -> Result<bool, CatalogError> {
        Ok(self
            .write(Change::DeleteFunction { name: name.into() })?
            .changed())
    }

    /// Whether any function's current version, or any published version,
    /// uses the code with this hash.
    pub fn code_in_use(&self, sha256: &str) -> Result<bool, CatalogError> {
        let db = self.db();
        let n: i64 = db.query_row(
            "SELECT (SELECT COUNT(*) FROM functions WHERE code_sha256 = ?1)
                  + (SELECT COUNT(*) FROM versions WHERE code_sha256 = ?1)",
            [sha256],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }

    pub fn add_process(&self, p: &ProcessRecord) -> Result<(), CatalogError> {
        self.db().execute(
            "INSERT OR REPLACE INTO processes (pid, run_dir) VALUES (?1, ?2)",
            params![p.pid, p.run_dir],
        )?;
        Ok(())
    }

    pub fn remove_process(&self, p: &ProcessRecord) -> Result<(), CatalogError> {
        self.db().execute(
            "DELETE FROM processes WHERE pid = ?1 AND run_dir = ?2",
            params![p.pid, p.run_dir],
        )?;
        Ok(())
    }

    /// Every recorded process, removing the records.
    pub fn take_processes(&self) -> Result<Vec<ProcessRecord>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare("SELECT pid, run_dir FROM processes")?;
        let rows = st
            .query_map([], |r| {
                Ok(ProcessRecord {
                    pid: r.get(0)?,
                    run_dir: r.get(1)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        db.execute("DELETE FROM processes", [])?;
        Ok(rows)
    }
}

/// A function version's snapshot on disk (the restore start path).
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotRecord {
    pub function: String,
    pub version: i64,
    /// The directory holding `vm.state`, `vm.mem` and the working set.
    pub dir: String,
}

impl Catalog {
    /// Records the snapshot of a function version (replacing an older record
    /// of the same version).
    pub fn put_snapshot(
        &self,
        s: &SnapshotRecord,
        created_unix_ms: u64,
    ) -> Result<(), CatalogError> {
        self.db().execute(
            "INSERT OR REPLACE INTO snapshots (function, version, dir, created_unix_ms)
             VALUES (?1, ?2, ?3, ?4)",
            params![s.function, s.version, s.dir, created_unix_ms as i64],
        )?;
        Ok(())
    }

    pub fn snapshot(
        &self,
        function: &str,
        version: i64,
    ) -> Result<Option<SnapshotRecord>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT function, version, dir FROM snapshots WHERE function = ?1 AND version = ?2",
        )?;
        Ok(st
            .query_row(params![function, version], row_to_snapshot)
            .optional()?)
    }

    /// Every recorded snapshot.
    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached("SELECT function, version, dir FROM snapshots")?;
        let rows = st
            .query_map([], row_to_snapshot)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn remove_snapshot(&self, function: &str, version: i64) -> Result<(), CatalogError> {
        self.db().execute(
            "DELETE FROM snapshots WHERE function = ?1 AND version = ?2",
            params![function, version],
        )?;
        Ok(())
    }
}

fn row_to_snapshot(r: &rusqlite::Row) -> rusqlite::Result<SnapshotRecord> {
    Ok(SnapshotRecord {
        function: r.get(0)?,
        version: r.get(1)?,
        dir: r.get(2)?,
    })
}

/// Columns added after the first schema: (name, definition). A catalogue
/// made by an older daemon gets them, with their defaults, when opened.
const ADDED_COLUMNS: &[(&str, &str)] = &[("network", "INTEGER NOT NULL DEFAULT 0")];

fn migrate(db: &Connection) -> Result<(), CatalogError> {
    // Provisioned concurrency was one `$LATEST` record per function
    // (`provisioned`); it is one per function and qualifier now.
    // Only when there is something to move: a daemon must start on a full
    // disk, where even an empty write transaction can fail.
    let old: i64 = db.query_row("SELECT COUNT(*) FROM provisioned", [], |r| r.get(0))?;
    if old > 0 {
        db.execute_batch(
            "BEGIN;
             INSERT OR IGNORE INTO provisioned_configs (function, qualifier, count, last_modified)
                 SELECT function, qualifier, count, last_modified FROM provisioned;
             DELETE FROM provisioned;
             COMMIT;",
        )?;
    }
    // Event invoke configuration was one per function (`$LATEST`'s); it is
    // one per function and qualifier now.
    let old: i64 = db.query_row("SELECT COUNT(*) FROM event_invoke_configs", [], |r| {
        r.get(0)
    })?;
    if old > 0 {
        db.execute_batch(
            "BEGIN;
             INSERT OR IGNORE INTO event_configs (function, qualifier, max_retries, max_age_s,
                     on_success, on_failure, last_modified_ms)
                 SELECT function, '$LATEST', max_retries, max_age_s, on_success, on_failure,
                     last_modified_ms FROM event_invoke_configs;
             DELETE FROM event_invoke_configs;
             COMMIT;",
        )?;
    }
    // `versions` holds the same columns as `functions`: both get them.
    for table in ["functions", "versions"] {
        let mut st = db.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
        let have = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        for (name, definition) in ADDED_COLUMNS {
            if !have.iter().any(|h| h == name) {
                db.execute_batch(&format!(
                    "ALTER TABLE {table} ADD COLUMN {name} {definition}"
                ))?;
            }
        }
    }
    Ok(())
}

/// A function's columns in table order (`?1`..`?15` of insert and update).
fn row_params<'a>(
    f: &'a Function,
    env_json: &'a dyn rusqlite::ToSql,
) -> [&'a dyn rusqlite::ToSql; 15] {
    [
        &f.name,
        &f.runtime,
        &f.handler,
        &f.memory_mib,
        &f.timeout_s,
        env_json,
        &f.description,
        &f.role,
        &f.code_sha256,
        // SQLite integers are signed; sizes stay far below i64::MAX.
        &f.code_size,
        &f.version,
        &f.revision_id,
        &f.last_modified,
        &f.reserved_concurrency,
        &f.network,
    ]
}

fn env_json(env: &BTreeMap<String, String>) -> String {
    serde_json::to_string(env).unwrap_or_else(|_| "{}".into())
}

fn row_to_function(r: &rusqlite::Row) -> rusqlite::Result<Function> {
    let env: String = r.get("env_json")?;
    Ok(Function {
        name: r.get("name")?,
        runtime: r.get("runtime")?,
        handler: r.get("handler")?,
        memory_mib: r.get("memory_mib")?,
        timeout_s: r.get("timeout_s")?,
        env: serde_json::from_str(&env).unwrap_or_default(),
        description: r.get("description")?,
        role: r.get("role")?,
        code_sha256: r.get("code_sha256")?,
        code_size: r.get::<_, i64>("code_size")?.max(0) as u64,
        version: r.get("version")?,
        revision_id: r.get("revision_id")?,
        last_modified: r.get("last_modified")?,
        reserved_concurrency: r.get("reserved_concurrency")?,
        network: r.get("network")?,
        published: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn sample(name: &str) -> Function {
        Function {
            name: name.into(),
            runtime: "spore-uk".into(),
            handler: "fn-echo".into(),
            memory_mib: 128,
            timeout_s: 3,
            env: BTreeMap::from([("A".into(), "b c".into())]),
            description: String::new(),
            role: "r".into(),
            code_sha256: "00".into(),
            code_size: 10,
            version: 1,
            revision_id: "rev".into(),
            last_modified: "2026-01-01T00:00:00.000+0000".into(),
            reserved_concurrency: None,
            network: false,
            published: None,
        }
    }

    #[test]
    fn functions_and_tags_are_written_alike_on_both_backends() {
        for (backend, c) in test_etcd::backends() {
            assert!(c.insert(&sample("a")).unwrap(), "{backend}");
            assert!(
                !c.insert(&sample("a")).unwrap(),
                "{backend}: a name is taken once"
            );
            let mut a = sample("a");
            a.version = 2;
            a.env.insert("K".into(), "v".into());
            c.update(&a).unwrap();
            assert_eq!(c.get("a").unwrap(), Some(a.clone()), "{backend}");
            c.replace_tags("a", &Tags::from([("k".into(), "1".into())]))
                .unwrap();
            c.add_tags("a", &Tags::from([("j".into(), "2".into())]))
                .unwrap();
            c.remove_tags("a", &["k".into()]).unwrap();
            assert_eq!(c.tags("a").unwrap().len(), 1, "{backend}");
            assert!(c.code_in_use("00").unwrap());
            assert!(c.delete("a").unwrap(), "{backend}");
            assert!(!c.delete("a").unwrap(), "{backend}");
            c.delete_tags("a").unwrap();
            assert!(c.list().unwrap().is_empty() && c.tags("a").unwrap().is_empty());
        }
    }

    #[test]
    fn an_older_catalogue_gets_the_network_column() {
        let dir = std::env::temp_dir().join(format!("spore-catalog-mig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("catalog.db");
        {
            // The schema before `network`, with one function in it.
            let db = Connection::open(&path).unwrap();
            db.execute_batch(&SCHEMA.replace(
                "reserved_concurrency INTEGER,\n    network INTEGER NOT NULL DEFAULT 0",
                "reserved_concurrency INTEGER",
            ))
            .unwrap();
            db.execute(
                "INSERT INTO functions VALUES ('old', 'spore-uk', 'h', 128, 3, '{}', '', 'r',
                    '00', 1, 1, 'rev', 't', NULL)",
                [],
            )
            .unwrap();
        }
        let c = Catalog::open(&path).unwrap();
        assert!(!c.get("old").unwrap().unwrap().network);
        let mut f = sample("net");
        f.network = true;
        assert!(c.insert(&f).unwrap());
        assert!(c.get("net").unwrap().unwrap().network);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn snapshots_are_recorded_per_version() {
        let dir = std::env::temp_dir().join(format!("spore-catalog-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Catalog::open(&dir.join("catalog.db")).unwrap();
        let rec = |v: i64| SnapshotRecord {
            function: "f".into(),
            version: v,
            dir: format!("/s/f-v{v}"),
        };
        c.put_snapshot(&rec(1), 1).unwrap();
        c.put_snapshot(&rec(2), 2).unwrap();
        assert_eq!(c.snapshot("f", 1).unwrap(), Some(rec(1)));
        assert_eq!(c.snapshot("f", 3).unwrap(), None);
        assert_eq!(c.snapshot("g", 1).unwrap(), None);
        c.remove_snapshot("f", 1).unwrap();
        assert_eq!(c.snapshots().unwrap(), vec![rec(2)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tags_are_added_removed_and_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("spore-catalog-tags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("catalog.db");
        let t = |kv: &[(&str, &str)]| -> Tags {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        {
            let c = Catalog::open(&path).unwrap();
            assert!(c.tags("f").unwrap().is_empty());
            c.replace_tags("f", &t(&[("a", "1"), ("b", "2")])).unwrap();
            c.add_tags("f", &t(&[("b", "3"), ("c", "")])).unwrap();
            c.add_tags("g", &t(&[("a", "other function")])).unwrap();
            c.remove_tags("f", &["a".into(), "absent".into()]).unwrap();
        }
        let c = Catalog::open(&path).unwrap();
        assert_eq!(c.tags("f").unwrap(), t(&[("b", "3"), ("c", "")]));
        c.replace_tags("f", &t(&[("z", "new")])).unwrap();
        assert_eq!(c.tags("f").unwrap(), t(&[("z", "new")]));
        c.delete_tags("f").unwrap();
        assert!(c.tags("f").unwrap().is_empty());
        assert_eq!(c.tags("g").unwrap(), t(&[("a", "other function")]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn functions_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("spore-catalog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("catalog.db");
        {
            let c = Catalog::open(&path).unwrap();
            assert!(c.insert(&sample("a")).unwrap());
            assert!(!c.insert(&sample("a")).unwrap(), "a name is taken once");
            let mut b = sample("b");
            b.reserved_concurrency = Some(2);
            assert!(c.insert(&b).unwrap());
            c.add_process(&ProcessRecord {
                pid: 42,
                run_dir: "/x".into(),
            })
            .unwrap();
        }
        let c = Catalog::open(&path).unwrap();
        let all = c.list().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], sample("a"));
        assert_eq!(all[1].reserved_concurrency, Some(2));
        let mut a = sample("a");
        a.version = 2;
        a.handler = "fn-upper".into();
        c.update(&a).unwrap();
        assert_eq!(c.get("a").unwrap().unwrap(), a);
        assert!(c.delete("a").unwrap());
        assert!(!c.delete("a").unwrap());
        assert_eq!(c.get("a").unwrap(), None);
        assert_eq!(
            c.take_processes().unwrap(),
            vec![ProcessRecord {
                pid: 42,
                run_dir: "/x".into()
            }]
        );
        assert!(c.take_processes().unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
