//! Published versions and aliases in the catalogue (`versions`,
//! `version_counters`, `aliases`): what `api::versions` serves.

use rusqlite::{params, Connection, OptionalExtension};

use super::{
    env_json, row_params, row_to_function, Catalog, CatalogError, Change, Function, Outcome,
};

/// An alias (`CreateAlias`): a name for a published version (or
/// `$LATEST`), optionally routing a share of invocations to a second one.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Alias {
    pub function: String,
    pub name: String,
    /// `$LATEST` or a version number.
    pub version: String,
    pub description: String,
    /// `RoutingConfig.AdditionalVersionWeights`: (version, weight in 0..=1).
    pub additional: Option<(String, f64)>,
    pub revision_id: String,
}

impl Catalog {
    /// Publishes `f` (the current `$LATEST`) as the next version number, or
    /// returns the newest published version when it already holds this
    /// revision (Lambda publishes nothing new then). One transaction.
    pub fn publish(&self, f: &Function, description: &str) -> Result<Function, CatalogError> {
        match self.write(Change::Publish {
            function: f.clone(),
            description: description.into(),
        })? {
            Outcome::Published(v) => Ok(*v),
            other => Err(CatalogError::Cluster(format!(
                "publishing {} gave {other:?}",
                f.name
            ))),
        }
    }

    /// A published version.
    pub fn version(&self, name: &str, number: u32) -> Result<Option<Function>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached("SELECT * FROM versions WHERE name = ?1 AND number = ?2")?;
        Ok(st
            .query_row(params![name, number], row_to_version)
            .optional()?)
    }

    /// A function's published versions, oldest first.
    pub fn versions(&self, name: &str) -> Result<Vec<Function>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached("SELECT * FROM versions WHERE name = ?1 ORDER BY number")?;
        let rows = st.query_map([name], row_to_version)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Deletes a published version; false if there was none.
    pub fn delete_version(&self, name: &str, number: u32) -> Result<bool, CatalogError> {
        Ok(self
            .write(Change::DeleteVersion {
                name: name.into(),
                number,
            })?
            .changed())
    }

    /// The revisions something can still run: `$LATEST`'s and every
    /// published version's (their instances and snapshots are kept).
    pub fn live_revisions(&self, name: &str) -> Result<Vec<i64>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT version FROM functions WHERE name = ?1
             UNION SELECT version FROM versions WHERE name = ?1",
        )?;
        let rows = st.query_map([name], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Creates or replaces an alias.
    pub fn put_alias(&self, a: &Alias) -> Result<(), CatalogError> {
        self.write(Change::PutAlias { alias: a.clone() }).map(drop)
    }

    pub fn alias(&self, function: &str, name: &str) -> Result<Option<Alias>, CatalogError> {
        Ok(self.aliases(function)?.into_iter().find(|a| a.name == name))
    }

    /// A function's aliases, by name.
    pub fn aliases(&self, function: &str) -> Result<Vec<Alias>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT function, name, version, description, additional_version,
                additional_weight, revision_id
             FROM aliases WHERE function = ?1 ORDER BY name",
        )?;
        let rows = st.query_map([function], |r| {
            let extra_version: Option<String> = r.get(4)?;
            let extra_weight: Option<f64> = r.get(5)?;
            Ok(Alias {
                function: r.get(0)?,
                name: r.get(1)?,
                version: r.get(2)?,
                description: r.get(3)?,
                additional: extra_version.zip(extra_weight),
                revision_id: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Whether an alias was deleted.
    pub fn delete_alias(&self, function: &str, name: &str) -> Result<bool, CatalogError> {
        Ok(self
            .write(Change::DeleteAlias {
                function: function.into(),
                name: name.into(),
            })?
            .changed())
    }
}

pub(super) fn publish(
    db: &Connection,
    f: &Function,
    description: &str,
) -> Result<Function, CatalogError> {
    let newest: Option<(u32, i64)> = db
        .query_row(
            "SELECT number, version FROM versions WHERE name = ?1 ORDER BY number DESC LIMIT 1",
            [&f.name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((number, revision)) = newest {
        if revision == f.version {
            let mut st =
                db.prepare_cached("SELECT * FROM versions WHERE name = ?1 AND number = ?2")?;
            let found = st
                .query_row(params![f.name, number], row_to_version)
                .optional()?;
            return Ok(found.unwrap_or_else(|| f.clone()));
        }
    }
    let last: u32 = db
        .query_row(
            "SELECT last FROM version_counters WHERE function = ?1",
            [&f.name],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0);
    let number = last.saturating_add(1);
    let mut v = f.clone();
    v.published = Some(number);
    v.reserved_concurrency = None;
    if !description.is_empty() {
        v.description = description.to_string();
    }
    let env = env_json(&v.env);
    let p = row_params(&v, &env);
    db.execute(
        "INSERT INTO versions (name, runtime, handler, memory_mib, timeout_s, env_json,
            description, role, code_sha256, code_size, version, revision_id, last_modified,
            reserved_concurrency, network, number)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        rusqlite::params_from_iter(p.iter().copied().chain([&number as &dyn rusqlite::ToSql])),
    )?;
    db.execute(
        "INSERT OR REPLACE INTO version_counters (function, last) VALUES (?1, ?2)",
        params![f.name, number],
    )?;
    Ok(v)
}

pub(super) fn delete_version(
    db: &Connection,
    name: &str,
    number: u32,
) -> Result<bool, CatalogError> {
    Ok(db.execute(
        "DELETE FROM versions WHERE name = ?1 AND number = ?2",
        params![name, number],
    )? == 1)
}

pub(super) fn put_alias(db: &Connection, a: &Alias) -> Result<(), CatalogError> {
    let (extra_version, extra_weight) = a.additional.clone().unzip();
    db.execute(
        "INSERT OR REPLACE INTO aliases (function, name, version, description,
            additional_version, additional_weight, revision_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            a.function,
            a.name,
            a.version,
            a.description,
            extra_version,
            extra_weight,
            a.revision_id
        ],
    )?;
    Ok(())
}

pub(super) fn delete_alias(
    db: &Connection,
    function: &str,
    name: &str,
) -> Result<bool, CatalogError> {
    Ok(db.execute(
        "DELETE FROM aliases WHERE function = ?1 AND name = ?2",
        [function, name],
    )? == 1)
}

fn row_to_version(r: &rusqlite::Row) -> rusqlite::Result<Function> {
    let mut f = row_to_function(r)?;
    f.published = Some(r.get("number")?);
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample;
    use super::*;

    #[test]
    fn versions_are_numbered_once_and_kept_apart_from_latest() {
        for (backend, db) in crate::catalog::test_etcd::backends() {
            eprintln!("backend: {backend}");
            let mut f = sample("f");
            db.insert(&f).unwrap();
            let v1 = db.publish(&f, "first").unwrap();
            assert_eq!((v1.published, v1.description.as_str()), (Some(1), "first"));
            // Nothing changed: the same version again.
            assert_eq!(db.publish(&f, "").unwrap().published, Some(1));
            f.version = 2;
            f.code_sha256 = "11".into();
            db.update(&f).unwrap();
            assert_eq!(db.publish(&f, "").unwrap().published, Some(2));
            assert_eq!(db.live_revisions("f").unwrap(), vec![1, 2]);
            // Version 1 keeps its code in use after $LATEST moved on.
            assert!(db.code_in_use("00").unwrap());
            assert!(db.delete_version("f", 2).unwrap());
            f.version = 3;
            db.update(&f).unwrap();
            // A deleted number is never given again.
            assert_eq!(db.publish(&f, "").unwrap().published, Some(3));
            let numbers: Vec<_> = db
                .versions("f")
                .unwrap()
                .iter()
                .map(|v| v.published)
                .collect();
            assert_eq!(numbers, [Some(1), Some(3)]);
            db.put_alias(&Alias {
                function: "f".into(),
                name: "live".into(),
                version: "1".into(),
                description: String::new(),
                additional: Some(("3".into(), 0.25)),
                revision_id: "r".into(),
            })
            .unwrap();
            assert_eq!(
                db.alias("f", "live").unwrap().unwrap().additional,
                Some(("3".into(), 0.25))
            );
            // Deleting the function deletes its versions, counter and aliases.
            assert!(db.delete("f").unwrap());
            assert!(db.versions("f").unwrap().is_empty());
            assert!(db.aliases("f").unwrap().is_empty());
            db.insert(&sample("f")).unwrap();
            assert_eq!(db.publish(&sample("f"), "").unwrap().published, Some(1));
        }
    }
}
