//! Deleting rows of the shared tables keyed by function (and qualifier):
//! the same statements for event configurations, provisioned
//! concurrency, function URLs and tags.

use rusqlite::{params, Connection};

use super::CatalogError;

/// Deletes the row of (`function`, `qualifier`) from `table` (a table of
/// the schema keyed by those two); whether there was one.
pub(super) fn delete_qualified(
    db: &Connection,
    table: &'static str,
    function: &str,
    qualifier: &str,
) -> Result<bool, CatalogError> {
    let n = db.execute(
        &format!("DELETE FROM {table} WHERE function = ?1 AND qualifier = ?2"),
        params![function, qualifier],
    )?;
    Ok(n > 0)
}

/// Deletes every row of `function` from `table`.
pub(super) fn delete_of_function(
    db: &Connection,
    table: &'static str,
    function: &str,
) -> Result<(), CatalogError> {
    db.execute(
        &format!("DELETE FROM {table} WHERE function = ?1"),
        [function],
    )?;
    Ok(())
}
