//! Provisioned concurrency in the catalogue (`provisioned_configs`): one
//! record per function and qualifier (a version number or an alias; a
//! `$LATEST` record only as an older daemon left it).

use rusqlite::{params, Connection, OptionalExtension};

use super::{Catalog, CatalogError, Change};

/// A qualifier's provisioned concurrency (HyperFork's throughput mode).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProvisionedRecord {
    pub function: String,
    pub qualifier: String,
    pub count: u32,
    pub last_modified: String,
}

fn row_to_record(r: &rusqlite::Row) -> rusqlite::Result<ProvisionedRecord> {
    Ok(ProvisionedRecord {
        function: r.get(0)?,
        qualifier: r.get(1)?,
        count: r.get(2)?,
        last_modified: r.get(3)?,
    })
}

impl Catalog {
    /// Creates or replaces the record of its function and qualifier.
    pub fn put_provisioned(&self, p: &ProvisionedRecord) -> Result<(), CatalogError> {
        self.write(Change::PutProvisioned { record: p.clone() })
            .map(drop)
    }

    pub fn provisioned(
        &self,
        function: &str,
        qualifier: &str,
    ) -> Result<Option<ProvisionedRecord>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT function, qualifier, count, last_modified FROM provisioned_configs
             WHERE function = ?1 AND qualifier = ?2",
        )?;
        Ok(st
            .query_row(params![function, qualifier], row_to_record)
            .optional()?)
    }

    /// Every record of `function`, by qualifier.
    pub fn provisioned_of(&self, function: &str) -> Result<Vec<ProvisionedRecord>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT function, qualifier, count, last_modified FROM provisioned_configs
             WHERE function = ?1 ORDER BY qualifier",
        )?;
        let rows = st
            .query_map([function], row_to_record)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// The functions that have any record.
    pub fn provisioned_functions(&self) -> Result<Vec<String>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT DISTINCT function FROM provisioned_configs ORDER BY function",
        )?;
        let rows = st
            .query_map([], |r| r.get(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Whether a record was deleted.
    pub fn delete_provisioned(
        &self,
        function: &str,
        qualifier: &str,
    ) -> Result<bool, CatalogError> {
        Ok(self
            .write(Change::DeleteProvisioned {
                function: function.into(),
                qualifier: qualifier.into(),
            })?
            .changed())
    }

    /// Deletes every record of `function` (the function is deleted).
    pub fn delete_all_provisioned(&self, function: &str) -> Result<(), CatalogError> {
        self.write(Change::DeleteAllProvisioned {
            function: function.into(),
        })
        .map(drop)
    }
}

pub(super) fn put(db: &Connection, p: &ProvisionedRecord) -> Result<(), CatalogError> {
    db.execute(
        "INSERT OR REPLACE INTO provisioned_configs (function, qualifier, count, last_modified)
         VALUES (?1, ?2, ?3, ?4)",
        params![p.function, p.qualifier, p.count, p.last_modified],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(function: &str, qualifier: &str, count: u32) -> ProvisionedRecord {
        ProvisionedRecord {
            function: function.into(),
            qualifier: qualifier.into(),
            count,
            last_modified: "t".into(),
        }
    }

    #[test]
    fn records_are_per_function_and_qualifier() {
        for (backend, c) in crate::catalog::test_etcd::backends() {
            eprintln!("backend: {backend}");
            c.put_provisioned(&record("f", "1", 2)).unwrap();
            c.put_provisioned(&record("f", "live", 3)).unwrap();
            c.put_provisioned(&record("g", "1", 1)).unwrap();
            c.put_provisioned(&record("f", "1", 4)).unwrap();
            assert_eq!(c.provisioned("f", "1").unwrap().map(|r| r.count), Some(4));
            assert_eq!(c.provisioned_of("f").unwrap().len(), 2);
            assert_eq!(c.provisioned_functions().unwrap(), vec!["f", "g"]);
            assert!(c.delete_provisioned("f", "live").unwrap());
            assert!(!c.delete_provisioned("f", "live").unwrap());
            c.delete_all_provisioned("f").unwrap();
            assert!(c.provisioned_of("f").unwrap().is_empty());
        }
    }

    #[test]
    fn an_older_daemons_latest_record_is_kept() {
        let dir = std::env::temp_dir().join(format!("spore-catalog-prov-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.db");
        drop(Catalog::open(&path).unwrap());
        {
            let db = rusqlite::Connection::open(&path).unwrap();
            db.execute(
                "INSERT INTO provisioned (function, qualifier, count, last_modified)
                 VALUES ('f', '$LATEST', 2, 't')",
                [],
            )
            .unwrap();
        }
        let c = Catalog::open(&path).unwrap();
        assert_eq!(
            c.provisioned("f", "$LATEST").unwrap().map(|r| r.count),
            Some(2)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
