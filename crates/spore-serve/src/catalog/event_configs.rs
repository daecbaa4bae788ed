//! Event invoke configuration in the catalogue (`event_configs`): one per
//! function and qualifier (`$LATEST`, a version number or an alias), as
//! Lambda keeps it.

use rusqlite::{params, Connection, OptionalExtension};

use super::{Catalog, CatalogError, Change};

/// How a qualifier's `Event` invocations are retried and where their
/// records go (`PutFunctionEventInvokeConfig`). Unset fields take the
/// daemon's `--event-*` defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventInvokeConfig {
    pub function: String,
    /// `$LATEST`, a version number or an alias name.
    pub qualifier: String,
    pub max_retries: Option<u32>,
    pub max_age_s: Option<u32>,
    /// Destination ARNs (always a function of this daemon's; checked on put).
    pub on_success: Option<String>,
    pub on_failure: Option<String>,
    pub last_modified_ms: u64,
}

const COLUMNS: &str =
    "function, qualifier, max_retries, max_age_s, on_success, on_failure, last_modified_ms";

fn row_to_config(r: &rusqlite::Row) -> rusqlite::Result<EventInvokeConfig> {
    Ok(EventInvokeConfig {
        function: r.get(0)?,
        qualifier: r.get(1)?,
        max_retries: r.get(2)?,
        max_age_s: r.get(3)?,
        on_success: r.get(4)?,
        on_failure: r.get(5)?,
        last_modified_ms: u64::try_from(r.get::<_, i64>(6)?).unwrap_or(0),
    })
}

impl Catalog {
    /// Creates or replaces the configuration of its function and qualifier.
    pub fn put_event_invoke_config(&self, c: &EventInvokeConfig) -> Result<(), CatalogError> {
        self.write(Change::PutEventConfig { config: c.clone() })
            .map(drop)
    }

    pub fn event_invoke_config(
        &self,
        function: &str,
        qualifier: &str,
    ) -> Result<Option<EventInvokeConfig>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM event_configs WHERE function = ?1 AND qualifier = ?2"
        ))?;
        Ok(st
            .query_row(params![function, qualifier], row_to_config)
            .optional()?)
    }

    /// Every configuration of `function`, by qualifier.
    pub fn event_invoke_configs(
        &self,
        function: &str,
    ) -> Result<Vec<EventInvokeConfig>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM event_configs WHERE function = ?1 ORDER BY qualifier"
        ))?;
        let rows = st
            .query_map([function], row_to_config)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Whether a configuration was deleted.
    pub fn delete_event_invoke_config(
        &self,
        function: &str,
        qualifier: &str,
    ) -> Result<bool, CatalogError> {
        Ok(self
            .write(Change::DeleteEventConfig {
                function: function.into(),
                qualifier: qualifier.into(),
            })?
            .changed())
    }

    /// Deletes every configuration of `function` (the function is deleted).
    pub fn delete_event_invoke_configs(&self, function: &str) -> Result<(), CatalogError> {
        self.write(Change::DeleteEventConfigs {
            function: function.into(),
        })
        .map(drop)
    }
}

pub(super) fn put(db: &Connection, c: &EventInvokeConfig) -> Result<(), CatalogError> {
    db.execute(
        &format!(
            "INSERT OR REPLACE INTO event_configs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        ),
        params![
            c.function,
            c.qualifier,
            c.max_retries,
            c.max_age_s,
            c.on_success,
            c.on_failure,
            i64::try_from(c.last_modified_ms).unwrap_or(i64::MAX)
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(function: &str, qualifier: &str, retries: u32) -> EventInvokeConfig {
        EventInvokeConfig {
            function: function.into(),
            qualifier: qualifier.into(),
            max_retries: Some(retries),
            ..Default::default()
        }
    }

    #[test]
    fn configurations_are_per_function_and_qualifier() {
        for (backend, c) in crate::catalog::test_etcd::backends() {
            eprintln!("backend: {backend}");
            c.put_event_invoke_config(&config("f", "$LATEST", 0))
                .unwrap();
            c.put_event_invoke_config(&config("f", "live", 1)).unwrap();
            c.put_event_invoke_config(&config("f", "live", 2)).unwrap();
            c.put_event_invoke_config(&config("g", "$LATEST", 1))
                .unwrap();
            let live = c.event_invoke_config("f", "live").unwrap();
            assert_eq!(live.and_then(|l| l.max_retries), Some(2));
            assert_eq!(c.event_invoke_configs("f").unwrap().len(), 2);
            assert!(c.delete_event_invoke_config("f", "live").unwrap());
            assert!(!c.delete_event_invoke_config("f", "live").unwrap());
            c.delete_event_invoke_configs("f").unwrap();
            assert!(c.event_invoke_configs("f").unwrap().is_empty());
            assert_eq!(c.event_invoke_configs("g").unwrap().len(), 1);
        }
    }

    #[test]
    fn a_configuration_is_kept_replaced_and_deleted() {
        for (backend, db) in crate::catalog::test_etcd::backends() {
            eprintln!("backend: {backend}");
            assert_eq!(db.event_invoke_config("f", "$LATEST").unwrap(), None);
            let mut c = EventInvokeConfig {
                function: "f".into(),
                qualifier: "$LATEST".into(),
                max_retries: Some(0),
                max_age_s: None,
                on_success: None,
                on_failure: Some("arn:aws:lambda:us-east-1:000000000000:function:dlq".into()),
                last_modified_ms: 1,
            };
            db.put_event_invoke_config(&c).unwrap();
            assert_eq!(
                db.event_invoke_config("f", "$LATEST").unwrap().as_ref(),
                Some(&c)
            );
            c.max_retries = None;
            c.max_age_s = Some(60);
            db.put_event_invoke_config(&c).unwrap();
            assert_eq!(db.event_invoke_config("f", "$LATEST").unwrap(), Some(c));
            assert!(db.delete_event_invoke_config("f", "$LATEST").unwrap());
            assert!(!db.delete_event_invoke_config("f", "$LATEST").unwrap());
        }
    }

    #[test]
    fn an_older_daemons_configuration_becomes_latests() {
        let dir = std::env::temp_dir().join(format!("spore-catalog-evc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.db");
        drop(Catalog::open(&path).unwrap());
        {
            let db = rusqlite::Connection::open(&path).unwrap();
            db.execute(
                "INSERT INTO event_invoke_configs
                    (function, max_retries, max_age_s, on_success, on_failure, last_modified_ms)
                 VALUES ('f', 1, 60, NULL, NULL, 5)",
                [],
            )
            .unwrap();
        }
        let c = Catalog::open(&path).unwrap();
        let got = c.event_invoke_config("f", "$LATEST").unwrap().unwrap();
        assert_eq!((got.max_retries, got.max_age_s), (Some(1), Some(60)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
