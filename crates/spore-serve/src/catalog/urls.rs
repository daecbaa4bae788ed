//! Function URLs in the catalogue (`function_urls`): which function and
//! qualifier each URL id reaches, and how it is authorised.

use rusqlite::{params, Connection, OptionalExtension};

use super::{Catalog, CatalogError, Change};

/// A function URL (`CreateFunctionUrlConfig`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FunctionUrl {
    /// 32 lowercase letters and digits: the URL's host label or path prefix.
    pub url_id: String,
    pub function: String,
    /// `$LATEST` or an alias (Lambda gives URLs to no version number).
    pub qualifier: String,
    /// `NONE` or `AWS_IAM`.
    pub auth_type: String,
    /// The `Cors` object as given (JSON), `{}` if none.
    pub cors_json: String,
    pub creation_time: String,
    pub last_modified_time: String,
}

fn row_to_url(r: &rusqlite::Row) -> rusqlite::Result<FunctionUrl> {
    Ok(FunctionUrl {
        url_id: r.get("url_id")?,
        function: r.get("function")?,
        qualifier: r.get("qualifier")?,
        auth_type: r.get("auth_type")?,
        cors_json: r.get("cors_json")?,
        creation_time: r.get("creation_time")?,
        last_modified_time: r.get("last_modified_time")?,
    })
}

impl Catalog {
    /// Creates or replaces a URL configuration (by its id).
    pub fn put_url(&self, u: &FunctionUrl) -> Result<(), CatalogError> {
        self.write(Change::PutUrl { url: u.clone() }).map(drop)
    }

    /// The URL a request's id names (the serving path: one indexed lookup).
    pub fn url_by_id(&self, url_id: &str) -> Result<Option<FunctionUrl>, CatalogError> {
        let db = self.db();
        let mut st = db.prepare_cached("SELECT * FROM function_urls WHERE url_id = ?1")?;
        Ok(st.query_row([url_id], row_to_url).optional()?)
    }

    pub fn url(
        &self,
        function: &str,
        qualifier: &str,
    ) -> Result<Option<FunctionUrl>, CatalogError> {
        let db = self.db();
        let mut st = db
            .prepare_cached("SELECT * FROM function_urls WHERE function = ?1 AND qualifier = ?2")?;
        Ok(st.query_row([function, qualifier], row_to_url).optional()?)
    }

    pub fn urls(&self, function: &str) -> Result<Vec<FunctionUrl>, CatalogError> {
        let db = self.db();
        let mut st = db
            .prepare_cached("SELECT * FROM function_urls WHERE function = ?1 ORDER BY qualifier")?;
        let rows = st.query_map([function], row_to_url)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Whether a URL configuration was deleted.
    pub fn delete_url(&self, function: &str, qualifier: &str) -> Result<bool, CatalogError> {
        Ok(self
            .write(Change::DeleteUrl {
                function: function.into(),
                qualifier: qualifier.into(),
            })?
            .changed())
    }
}

pub(super) fn put(db: &Connection, u: &FunctionUrl) -> Result<(), CatalogError> {
    db.execute(
        "INSERT OR REPLACE INTO function_urls (url_id, function, qualifier, auth_type,
            cors_json, creation_time, last_modified_time)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            u.url_id,
            u.function,
            u.qualifier,
            u.auth_type,
            u.cors_json,
            u.creation_time,
            u.last_modified_time
        ],
    )?;
    Ok(())
}
