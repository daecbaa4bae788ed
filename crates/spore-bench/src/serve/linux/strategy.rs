//! The start strategies `spore bench serve --linux` compares (which
//! daemon flags, which start path their invocations must take), and the
//! page-cache temperatures it measures them at.

/// A start strategy: which daemon, which start path its invocations take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Strategy {
    ColdBoot,
    Layered,
    LayeredWs,
    Merged,
    Clone,
    Warm,
}

impl Strategy {
    pub(super) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "cold-boot" | "cold_boot" => Strategy::ColdBoot,
            "layered" => Strategy::Layered,
            "layered-ws" | "layered_ws" => Strategy::LayeredWs,
            "merged" | "merged-full" | "merged_full" => Strategy::Merged,
            "clone" => Strategy::Clone,
            "warm" => Strategy::Warm,
            _ => return None,
        })
    }

    /// Its name in the JSON.
    pub(super) fn key(self) -> &'static str {
        match self {
            Strategy::ColdBoot => "cold_boot",
            Strategy::Layered => "layered",
            Strategy::LayeredWs => "layered_ws",
            Strategy::Merged => "merged_full",
            Strategy::Clone => "clone",
            Strategy::Warm => "warm",
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Strategy::ColdBoot => "kernel boot + runtime and function init, no snapshot",
            Strategy::Layered => "runtime base + function diff, restored lazily",
            Strategy::LayeredWs => {
                "runtime base + function diff, recorded working set read up front"
            }
            Strategy::Merged => {
                "one full snapshot per function (base and diff merged, Firecracker rebase-snap style), restored lazily"
            }
            Strategy::Clone => "clone of the function's zygote (started from the base)",
            Strategy::Warm => "reference: an idle instance that served before (no start)",
        }
    }

    /// The daemon flags beyond the common ones.
    pub(super) fn flags(self) -> &'static [&'static str] {
        match self {
            Strategy::ColdBoot => &["--keep-alive-ms", "0", "--no-snapshots", "--no-clones"],
            Strategy::Layered => &[
                "--keep-alive-ms",
                "0",
                "--no-clones",
                "--restore-mode",
                "lazy",
            ],
            Strategy::LayeredWs => &[
                "--keep-alive-ms",
                "0",
                "--no-clones",
                "--restore-mode",
                "working-set",
            ],
            Strategy::Merged => &[
                "--keep-alive-ms",
                "0",
                "--no-clones",
                "--restore-mode",
                "lazy",
                "--linux-snapshots",
                "merged",
            ],
            Strategy::Clone => &["--keep-alive-ms", "0", "--restore-mode", "lazy"],
            Strategy::Warm => &["--keep-alive-ms", "3600000", "--restore-mode", "lazy"],
        }
    }

    /// The start path (`X-Spore-Start-Path`) its invocations must take.
    pub(super) fn path(self) -> &'static str {
        match self {
            Strategy::ColdBoot => "cold",
            Strategy::Layered | Strategy::LayeredWs | Strategy::Merged => "restore",
            Strategy::Clone => "clone",
            Strategy::Warm => "warm",
        }
    }

    /// The deployed function's name: merged snapshots are another
    /// function's (its own full snapshot); the others share the layered one.
    pub(super) fn function_name(self, function: &str, mib: u32) -> String {
        match self {
            Strategy::Merged => format!("{function}-{mib}-merged"),
            _ => format!("{function}-{mib}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Temperature {
    Lukewarm,
    Cold,
}

impl Temperature {
    pub(super) fn parse(s: &str) -> Option<Self> {
        match s {
            "lukewarm" => Some(Temperature::Lukewarm),
            "cold" => Some(Temperature::Cold),
            _ => None,
        }
    }

    pub(super) fn key(self) -> &'static str {
        match self {
            Temperature::Lukewarm => "lukewarm",
            Temperature::Cold => "cold",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_and_map_to_daemons() {
        assert_eq!(Strategy::parse("layered-ws"), Some(Strategy::LayeredWs));
        assert_eq!(Strategy::parse("merged"), Some(Strategy::Merged));
        assert_eq!(Strategy::parse("hot"), None);
        assert!(Strategy::Merged.flags().contains(&"merged"));
        assert!(Strategy::ColdBoot.flags().contains(&"--no-snapshots"));
        assert!(!Strategy::Clone.flags().contains(&"--no-clones"));
        assert_eq!(Strategy::parse("warm"), Some(Strategy::Warm));
        assert!(Strategy::Warm.flags().contains(&"3600000"));
        assert_eq!(
            Strategy::Merged.function_name("lorem", 256),
            "lorem-256-merged"
        );
        assert_eq!(Strategy::LayeredWs.function_name("lorem", 256), "lorem-256");
        let mut v = vec![
            Strategy::Clone,
            Strategy::ColdBoot,
            Strategy::LayeredWs,
            Strategy::Layered,
        ];
        v.sort();
        // Layered writes the diff that the working-set and clone daemons use.
        assert_eq!(
            v,
            [
                Strategy::ColdBoot,
                Strategy::Layered,
                Strategy::LayeredWs,
                Strategy::Clone
            ]
        );
    }
}
