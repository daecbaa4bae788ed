//! Sizes as people type them on the command line (`spore run --mem 256M`,
//! `spore bench snapshot --sizes 128M,1G`, `spore serve --memory-budget`).
//! Beside the configuration because these sizes become its byte and MiB
//! fields; the `spore` command and the benchmarks both read their options
//! with it.
//!
//! A whole number with an optional unit, case-insensitive: none or `B` for
//! bytes, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB`.
//! Every unit is binary (K = 1024), as memory sizes always are in practice
//! (QEMU's `-m 1G`, Firecracker's MiB): `1GB` meaning 10^9 bytes would give a
//! guest a size no page table or memory slot lines up with.

/// Why a size did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("the size is empty; give a number with an optional unit, e.g. 256M")]
    Empty,
    #[error("size {0:?} is negative; sizes count bytes")]
    Negative(String),
    #[error("size {0:?} must be a whole number, e.g. 1536M instead of 1.5G")]
    Fraction(String),
    #[error("size {0:?} does not start with a number; e.g. 256M, 1G or 4096 (bytes)")]
    NotANumber(String),
    #[error("unknown unit {unit:?} in size {input:?}; use K, M, G or T (KiB, MiB, ... also work), or none for bytes")]
    UnknownUnit { input: String, unit: String },
    #[error("size {0:?} is too large (more than 2^64 - 1 bytes)")]
    Overflow(String),
}

/// Parses a size like `256M`, `1G`, `512MiB`, `1024K` or `4096` into bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let input = s.trim();
    if input.is_empty() {
        return Err(SizeError::Empty);
    }
    if input.starts_with('-') {
        return Err(SizeError::Negative(input.into()));
    }
    let digits_end = input
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(input.len());
    let (digits, rest) = input.split_at(digits_end);
    if digits.is_empty() {
        return Err(SizeError::NotANumber(input.into()));
    }
    if rest.starts_with('.') || rest.starts_with(',') {
        return Err(SizeError::Fraction(input.into()));
    }
    let unit = rest.trim_start();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(SizeError::UnknownUnit {
                input: input.into(),
                unit: unit.into(),
            })
        }
    };
    // Only ASCII digits remain, so the one possible parse failure is overflow.
    let number: u64 = digits
        .parse()
        .map_err(|_| SizeError::Overflow(input.into()))?;
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow(input.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;

    #[test]
    fn accepts_the_usual_spellings() {
        let table = [
            ("4096", 4096),
            ("0", 0),
            ("4096B", 4096),
            ("4096b", 4096),
            ("1024K", 1024 * K),
            ("1024k", 1024 * K),
            ("1024KB", 1024 * K),
            ("1024KiB", 1024 * K),
            ("256M", 256 * M),
            ("256m", 256 * M),
            ("256MB", 256 * M),
            ("512MiB", 512 * M),
            ("512mib", 512 * M),
            ("512MIB", 512 * M),
            ("1G", G),
            ("1g", G),
            ("1GiB", G),
            ("2T", 2 << 40),
            (" 256M ", 256 * M),
            ("256 M", 256 * M),
            ("007M", 7 * M),
            ("16777215T", 16777215 << 40),
            ("18446744073709551615", u64::MAX),
        ];
        for (s, want) in table {
            assert_eq!(parse_size(s), Ok(want), "{s:?}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        assert!(matches!(parse_size("-1"), Err(SizeError::Negative(_))));
        assert!(matches!(parse_size("-256M"), Err(SizeError::Negative(_))));
        assert!(matches!(parse_size("1.5G"), Err(SizeError::Fraction(_))));
        assert!(matches!(parse_size("1,5G"), Err(SizeError::Fraction(_))));
        for s in ["M", "G1", "abc", "+1", "½G", "٣M"] {
            assert!(
                matches!(parse_size(s), Err(SizeError::NotANumber(_))),
                "{s:?}: {:?}",
                parse_size(s)
            );
        }
        for s in [
            "1X", "1MM", "1Gib2", "1 G B", "256Mi", "1P", "1e9", "0x10", "10M\0",
        ] {
            assert!(
                matches!(parse_size(s), Err(SizeError::UnknownUnit { .. })),
                "{s:?}: {:?}",
                parse_size(s)
            );
        }
        for s in [
            "18446744073709551616",
            "99999999999999999999999999",
            "16777216T",
            "17179869184G",
        ] {
            assert!(
                matches!(parse_size(s), Err(SizeError::Overflow(_))),
                "{s:?}: {:?}",
                parse_size(s)
            );
        }
    }

    #[test]
    fn messages_are_actionable() {
        let e = parse_size("12Q").unwrap_err().to_string();
        assert!(e.contains("\"Q\"") && e.contains("M"), "{e}");
        let e = parse_size("1.5G").unwrap_err().to_string();
        assert!(e.contains("1536M"), "{e}");
    }
}
