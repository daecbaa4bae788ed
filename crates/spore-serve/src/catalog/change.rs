//! Every write to the shared part of the catalogue, as a value: what a
//! single daemon applies to its SQLite at once, and what a cluster member
//! appends to the log in etcd for every member to apply in the same order
//! (`super::etcd`). Applying a change reads nothing but the database and the
//! change itself (no clock, no randomness), so every member that applies the
//! same log holds the same catalogue, outcome included (an insert of a
//! name taken is `false` everywhere).
//!
//! What is node-local (the VMM processes a daemon started, its snapshots,
//! its jail uids) is written directly, never as a change.

use rusqlite::Connection;
use serde::{Deserialize, Serialize};

use super::{
    event_configs, provisioned, rows, tags, urls, versions, Alias, CatalogError, EventInvokeConfig,
    Function, FunctionUrl, ProvisionedRecord, Tags,
};

/// One write of the shared catalogue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Change {
    InsertFunction {
        function: Function,
    },
    UpdateFunction {
        function: Function,
    },
    DeleteFunction {
        name: String,
    },
    Publish {
        function: Function,
        description: String,
    },
    DeleteVersion {
        name: String,
        number: u32,
    },
    PutAlias {
        alias: Alias,
    },
    DeleteAlias {
        function: String,
        name: String,
    },
    PutUrl {
        url: FunctionUrl,
    },
    DeleteUrl {
        function: String,
        qualifier: String,
    },
    PutEventConfig {
        config: EventInvokeConfig,
    },
    DeleteEventConfig {
        function: String,
        qualifier: String,
    },
    DeleteEventConfigs {
        function: String,
    },
    PutProvisioned {
        record: ProvisionedRecord,
    },
    DeleteProvisioned {
        function: String,
        qualifier: String,
    },
    DeleteAllProvisioned {
        function: String,
    },
    AddTags {
        function: String,
        tags: Tags,
    },
    ReplaceTags {
        function: String,
        tags: Tags,
    },
    RemoveTags {
        function: String,
        keys: Vec<String>,
    },
    DeleteTags {
        function: String,
    },
}

/// What applying a change gave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    Done,
    /// Whether a row was inserted or deleted.
    Changed(bool),
    /// The version `Publish` made or found.
    Published(Box<Function>),
}

impl Outcome {
    pub fn changed(self) -> bool {
        matches!(self, Outcome::Changed(true))
    }
}

impl Change {
    /// The function whose records this change writes (what a member
    /// re-reads after applying another member's change).
    pub fn function(&self) -> &str {
        match self {
            Change::InsertFunction { function }
            | Change::UpdateFunction { function }
            | Change::Publish { function, .. } => &function.name,
            Change::PutAlias { alias } => &alias.function,
            Change::PutUrl { url } => &url.function,
            Change::PutEventConfig { config } => &config.function,
            Change::PutProvisioned { record } => &record.function,
            Change::DeleteFunction { name } | Change::DeleteVersion { name, .. } => name,
            Change::DeleteAlias { function, .. }
            | Change::DeleteUrl { function, .. }
            | Change::DeleteEventConfig { function, .. }
            | Change::DeleteEventConfigs { function }
            | Change::DeleteProvisioned { function, .. }
            | Change::DeleteAllProvisioned { function }
            | Change::AddTags { function, .. }
            | Change::ReplaceTags { function, .. }
            | Change::RemoveTags { function, .. }
            | Change::DeleteTags { function } => function,
        }
    }

    /// Applies the change inside the caller's transaction.
    pub fn apply(&self, db: &Connection) -> Result<Outcome, CatalogError> {
        use Outcome::{Changed, Done};
        Ok(match self {
            Change::InsertFunction { function } => Changed(super::insert(db, function)?),
            Change::UpdateFunction { function } => super::update(db, function).map(|()| Done)?,
            Change::DeleteFunction { name } => Changed(super::delete(db, name)?),
            Change::Publish {
                function,
                description,
            } => Outcome::Published(Box::new(versions::publish(db, function, description)?)),
            Change::DeleteVersion { name, number } => {
                Changed(versions::delete_version(db, name, *number)?)
            }
            Change::PutAlias { alias } => versions::put_alias(db, alias).map(|()| Done)?,
            Change::DeleteAlias { function, name } => {
                Changed(versions::delete_alias(db, function, name)?)
            }
            Change::PutUrl { url } => urls::put(db, url).map(|()| Done)?,
            Change::DeleteUrl {
                function,
                qualifier,
            } => Changed(rows::delete_qualified(
                db,
                "function_urls",
                function,
                qualifier,
            )?),
            Change::PutEventConfig { config } => event_configs::put(db, config).map(|()| Done)?,
            Change::DeleteEventConfig {
                function,
                qualifier,
            } => Changed(rows::delete_qualified(
                db,
                "event_configs",
                function,
                qualifier,
            )?),
            Change::DeleteEventConfigs { function } => {
                rows::delete_of_function(db, "event_configs", function).map(|()| Done)?
            }
            Change::PutProvisioned { record } => provisioned::put(db, record).map(|()| Done)?,
            Change::DeleteProvisioned {
                function,
                qualifier,
            } => Changed(rows::delete_qualified(
                db,
                "provisioned_configs",
                function,
                qualifier,
            )?),
            Change::DeleteAllProvisioned { function } => {
                rows::delete_of_function(db, "provisioned_configs", function).map(|()| Done)?
            }
            Change::AddTags { function, tags } => tags::add(db, function, tags).map(|()| Done)?,
            Change::ReplaceTags { function, tags } => {
                tags::replace(db, function, tags).map(|()| Done)?
            }
            Change::RemoveTags { function, keys } => {
                tags::remove(db, function, keys).map(|()| Done)?
            }
            Change::DeleteTags { function } => {
                rows::delete_of_function(db, "tags", function).map(|()| Done)?
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_reads_back_as_itself() {
        let c = Change::Publish {
            function: super::super::tests::sample("f"),
            description: "d".into(),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#""op":"publish""#), "{json}");
        assert_eq!(serde_json::from_str::<Change>(&json).unwrap(), c);
        assert_eq!(c.function(), "f");
    }
}
