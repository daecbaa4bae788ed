//! Firecracker's logger and metrics settings (`PUT /logger`, `PUT /metrics`,
//! the `logger` and `metrics` sections of a config file, and the
//! `firecracker --level/--log-path/--metrics-path` flags), in its JSON shapes.
//!
//! Configuration only: `crate::logger` writes the log lines and
//! `crate::metrics` the metrics.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A logger level, as Firecracker names them (case-insensitive on input).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off,
    Error,
    Warning,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// Firecracker's name of the level.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Off => "Off",
            LogLevel::Error => "Error",
            LogLevel::Warning => "Warning",
            LogLevel::Info => "Info",
            LogLevel::Debug => "Debug",
            LogLevel::Trace => "Trace",
        }
    }

    /// The level as a number: 0 (off) to 5 (trace).
    pub fn rank(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LogLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "off" => LogLevel::Off,
            "error" => LogLevel::Error,
            "warning" | "warn" => LogLevel::Warning,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => {
                return Err(format!(
                    "invalid logger level {:?}: use Error, Warning, Info, Debug, Trace or Off",
                    s.chars().take(32).collect::<String>()
                ))
            }
        })
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `PUT /logger`: where spore's log lines go and which of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    /// A file (appended to, created 0600) or a FIFO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    /// Default Info.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LogLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_level: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_log_origin: Option<bool>,
    /// Only lines from this module path (a prefix of spore's module paths,
    /// e.g. `spore_vmm::api`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// `PUT /metrics`: where the JSON-lines metrics go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// A file (appended to, created 0600) or a FIFO.
    pub metrics_path: String,
    /// Add the instance id to each line (`"id"`), as Firecracker's `emit_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emit_id: Option<bool>,
}

/// Deserializes a field whose JSON may be `null`: `null` is the field's
/// default, as if the key were absent (Firecracker's config files write
/// `"balloon": null` and the like for what is not configured).
pub fn null_is_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A Firecracker setting spore does not have yet, in a config file or a
/// body: accepted as `null` (with `Option<NotSupported>`) or as an empty
/// list (`Vec<NotSupported>`); any value is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotSupported;

impl<'de> Deserialize<'de> for NotSupported {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Err(serde::de::Error::custom(
            "this Firecracker setting is not supported by spore yet (only null or an empty list is accepted)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_case_insensitively() {
        for (s, l) in [
            ("Info", LogLevel::Info),
            ("debug", LogLevel::Debug),
            ("WARNING", LogLevel::Warning),
            ("warn", LogLevel::Warning),
            ("off", LogLevel::Off),
            ("Trace", LogLevel::Trace),
            ("error", LogLevel::Error),
        ] {
            assert_eq!(s.parse::<LogLevel>(), Ok(l));
        }
        assert!("loud".parse::<LogLevel>().is_err());
        let c: LoggerConfig =
            serde_json::from_str(r#"{"log_path":"/l","level":"debug","show_level":true}"#).unwrap();
        assert_eq!(c.level, Some(LogLevel::Debug));
        assert_eq!(
            serde_json::to_value(&c).unwrap()["level"],
            serde_json::json!("Debug")
        );
        assert!(serde_json::from_str::<LoggerConfig>(r#"{"level":"loud"}"#).is_err());
        assert!(serde_json::from_str::<LoggerConfig>(r#"{"colour":true}"#).is_err());
    }

    #[test]
    fn metrics_config_needs_a_path() {
        assert!(serde_json::from_str::<MetricsConfig>("{}").is_err());
        let m: MetricsConfig =
            serde_json::from_str(r#"{"metrics_path":"/m","emit_id":true}"#).unwrap();
        assert_eq!(m.emit_id, Some(true));
    }
}
