//! Which uid each function's VMMs run as (`jail_uids`): one per function
//! key (so per account and function), from the daemon's `--uid-range`,
//! kept across restarts because the function's snapshots are that uid's
//! files. A deleted function's uid is free again (its files are gone).

use rusqlite::{params, OptionalExtension};

use super::{Catalog, CatalogError};

/// No uid is free in the range.
#[derive(Debug, thiserror::Error)]
#[error(
    "every uid of the jail's range {first}..{end} is taken (one per function): widen --uid-range"
)]
pub struct RangeUsedUp {
    pub first: u32,
    pub end: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum JailUidError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    UsedUp(#[from] RangeUsedUp),
}

impl Catalog {
    /// The uid of `function`, taking the lowest free one of `first..end`
    /// if it has none yet.
    pub fn jail_uid(&self, function: &str, first: u32, end: u32) -> Result<u32, JailUidError> {
        let mut db = self.db();
        let tx = db.transaction().map_err(CatalogError::from)?;
        let known: Option<u32> = tx
            .query_row(
                "SELECT uid FROM jail_uids WHERE function = ?1",
                [function],
                |r| r.get(0),
            )
            .optional()
            .map_err(CatalogError::from)?;
        if let Some(uid) = known {
            return Ok(uid);
        }
        // The lowest uid in the range with no row: `first` itself, else the
        // lowest taken uid whose successor is free.
        let free: Option<u32> = tx
            .query_row(
                "SELECT c FROM (
                    SELECT ?1 AS c
                    UNION ALL
                    SELECT uid + 1 FROM jail_uids WHERE uid >= ?1 AND uid + 1 < ?2
                 ) WHERE c NOT IN (SELECT uid FROM jail_uids) ORDER BY c LIMIT 1",
                params![first, end],
                |r| r.get(0),
            )
            .optional()
            .map_err(CatalogError::from)?;
        let uid = free
            .filter(|&u| u < end)
            .ok_or(RangeUsedUp { first, end })?;
        tx.execute(
            "INSERT INTO jail_uids (function, uid) VALUES (?1, ?2)",
            params![function, uid],
        )
        .map_err(CatalogError::from)?;
        tx.commit().map_err(CatalogError::from)?;
        Ok(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(name: &str) -> (Catalog, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("spore-jail-uids-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        (Catalog::open(&dir.join("c.db")).unwrap(), dir)
    }

    #[test]
    fn each_function_keeps_its_own_uid_and_a_deleted_ones_is_reused() {
        let (c, dir) = catalog("reuse");
        assert_eq!(c.jail_uid("a", 10, 13).unwrap(), 10);
        assert_eq!(c.jail_uid("111111111111:a", 10, 13).unwrap(), 11);
        assert_eq!(c.jail_uid("a", 10, 13).unwrap(), 10);
        assert_eq!(c.jail_uid("b", 10, 13).unwrap(), 12);
        assert!(matches!(
            c.jail_uid("c", 10, 13),
            Err(JailUidError::UsedUp(_))
        ));
        c.delete("111111111111:a").unwrap();
        assert_eq!(c.jail_uid("c", 10, 13).unwrap(), 11);
        let _ = std::fs::remove_dir_all(dir);
    }
}
