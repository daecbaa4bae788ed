//! A function's tags in the catalogue (`tags`): `TagResource`,
//! CreateFunction's `Tags`.

use std::collections::BTreeMap;

use rusqlite::{params, Connection};

use super::{Catalog, CatalogError, Change};

/// A function's tags, key → value.
pub type Tags = BTreeMap<String, String>;

impl Catalog {
    pub fn tags(&self, function: &str) -> Result<Tags, CatalogError> {
        let db = self.db();
        let mut st =
            db.prepare_cached("SELECT tag_key, tag_value FROM tags WHERE function = ?1")?;
        let rows = st
            .query_map([function], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// Adds `tags` to a function's, replacing the values of keys it has.
    /// One transaction: all are stored or none.
    pub fn add_tags(&self, function: &str, tags: &Tags) -> Result<(), CatalogError> {
        self.write(Change::AddTags {
            function: function.into(),
            tags: tags.clone(),
        })
        .map(drop)
    }

    /// A new function's tags: replaces whatever a function of that name left
    /// (a delete cut short) in the same transaction.
    pub fn replace_tags(&self, function: &str, tags: &Tags) -> Result<(), CatalogError> {
        self.write(Change::ReplaceTags {
            function: function.into(),
            tags: tags.clone(),
        })
        .map(drop)
    }

    /// Removes these keys (those the function does not have are no error).
    pub fn remove_tags(&self, function: &str, keys: &[String]) -> Result<(), CatalogError> {
        self.write(Change::RemoveTags {
            function: function.into(),
            keys: keys.to_vec(),
        })
        .map(drop)
    }

    /// Removes every tag of a function (it is being deleted).
    pub fn delete_tags(&self, function: &str) -> Result<(), CatalogError> {
        self.write(Change::DeleteTags {
            function: function.into(),
        })
        .map(drop)
    }
}

pub(super) fn add(db: &Connection, function: &str, tags: &Tags) -> Result<(), CatalogError> {
    for (k, v) in tags {
        db.execute(
            "INSERT OR REPLACE INTO tags (function, tag_key, tag_value) VALUES (?1, ?2, ?3)",
            params![function, k, v],
        )?;
    }
    Ok(())
}

pub(super) fn replace(db: &Connection, function: &str, tags: &Tags) -> Result<(), CatalogError> {
    super::rows::delete_of_function(db, "tags", function)?;
    for (k, v) in tags {
        db.execute(
            "INSERT INTO tags (function, tag_key, tag_value) VALUES (?1, ?2, ?3)",
            params![function, k, v],
        )?;
    }
    Ok(())
}

pub(super) fn remove(db: &Connection, function: &str, keys: &[String]) -> Result<(), CatalogError> {
    for k in keys {
        db.execute(
            "DELETE FROM tags WHERE function = ?1 AND tag_key = ?2",
            params![function, k],
        )?;
    }
    Ok(())
}
