//! What a function's init cost the guest in memory, from `/proc/meminfo`
//! before `Configure` and at `Ready`: the pages a function's snapshot (a
//! diff on its runtime's base) must hold come from here, so the agent says
//! where they went (page cache, anonymous memory, kernel slab).

use std::collections::BTreeMap;

/// The `/proc/meminfo` fields the agent reports, in KiB.
const FIELDS: &[&str] = &["MemFree", "Cached", "AnonPages", "Slab", "PageTables"];

/// A reading of [`FIELDS`] (missing ones are left out).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MemInfo(BTreeMap<&'static str, i64>);

impl MemInfo {
    /// Reads `/proc/meminfo`; empty if it cannot be read.
    pub fn read() -> Self {
        std::fs::read_to_string("/proc/meminfo")
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    pub fn parse(text: &str) -> Self {
        let mut m = BTreeMap::new();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let Some(field) = FIELDS.iter().find(|f| **f == name) else {
                continue;
            };
            if let Some(kib) = rest.split_whitespace().next().and_then(|v| v.parse().ok()) {
                m.insert(*field, kib);
            }
        }
        Self(m)
    }

    /// `Field ±N KiB` for each field in both readings, in [`FIELDS`] order.
    pub fn delta_since(&self, before: &MemInfo) -> String {
        FIELDS
            .iter()
            .filter_map(|f| {
                let d = self.0.get(f)? - before.0.get(f)?;
                Some(format!("{f} {d:+} KiB"))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_of_known_fields() {
        let a = MemInfo::parse("MemTotal: 100 kB\nMemFree:  5000 kB\nCached: 10 kB\nSlab: 7 kB\n");
        let b = MemInfo::parse("MemFree: 4000 kB\nCached: 900 kB\nSlab: 7 kB\nAnonPages: 3 kB\n");
        assert_eq!(
            b.delta_since(&a),
            "MemFree -1000 KiB, Cached +890 KiB, Slab +0 KiB"
        );
        assert_eq!(MemInfo::parse("garbage\nMemFree: x kB").delta_since(&a), "");
    }
}
