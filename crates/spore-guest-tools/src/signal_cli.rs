//! Command-line parsing for `spore-signal`: turns arguments into a validated
//! [`Command`] whose argument already fits the signal encoding, so nothing
//! after parsing can truncate a value silently.

use spore_abi::signal::ARG_MASK;
use thiserror::Error;

pub const USAGE: &str = "usage: spore-signal exit CODE   (CODE 0..=255)
       spore-signal mark N      (N 0..=16777215)
       spore-signal wait USEC   (USEC 0..=16777215; prints woken|timeout)
       spore-signal fork N      (N 0..=16777215 clones, 0: the VMM's fork_count; prints
                                 the clone number in a clone, 0 in a source that goes on)
       spore-signal done        (end this clone; the VMM exits 0)
       spore-signal snapshot TAG  (TAG 0..=16777215; prints taken|restored|failed|not-configured)";

/// One signal to send.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Exit(u8),
    Mark(u32),
    Wait(u32),
    Fork(u32),
    Done,
    Snapshot(u32),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CliError {
    #[error("missing command")]
    MissingCommand,
    #[error("unknown command {0:?} (expected exit, mark, wait, snapshot, fork or done)")]
    UnknownCommand(String),
    #[error("{0} needs exactly one numeric argument")]
    WrongArgCount(&'static str),
    #[error("{what} argument {value:?} is not a number in 0..={max}")]
    BadNumber {
        what: &'static str,
        value: String,
        max: u32,
    },
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, CliError> {
    let (name, rest) = args.split_first().ok_or(CliError::MissingCommand)?;
    if name == "done" {
        return match rest {
            [] => Ok(Command::Done),
            _ => Err(CliError::WrongArgCount("done")),
        };
    }
    let (what, max) = match name.as_str() {
        "fork" => ("fork", ARG_MASK),
        "exit" => ("exit", u32::from(u8::MAX)),
        "mark" => ("mark", ARG_MASK),
        "wait" => ("wait", ARG_MASK),
        "snapshot" => ("snapshot", ARG_MASK),
        _ => return Err(CliError::UnknownCommand(name.clone())),
    };
    let [value] = rest else {
        return Err(CliError::WrongArgCount(what));
    };
    let n = value
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| CliError::BadNumber {
            what,
            value: value.clone(),
            max,
        })?;
    Ok(match what {
        // `n <= u8::MAX` was checked above.
        "exit" => Command::Exit(u8::try_from(n).unwrap_or(u8::MAX)),
        "mark" => Command::Mark(n),
        "fork" => Command::Fork(n),
        "snapshot" => Command::Snapshot(n),
        _ => Command::Wait(n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, CliError> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn valid_commands() {
        assert_eq!(p(&["exit", "0"]), Ok(Command::Exit(0)));
        assert_eq!(p(&["exit", "255"]), Ok(Command::Exit(255)));
        assert_eq!(p(&["mark", "7"]), Ok(Command::Mark(7)));
        assert_eq!(p(&["mark", "16777215"]), Ok(Command::Mark(ARG_MASK)));
        assert_eq!(p(&["wait", "1000"]), Ok(Command::Wait(1000)));
        assert_eq!(p(&["snapshot", "1"]), Ok(Command::Snapshot(1)));
        assert_eq!(
            p(&["snapshot", "16777215"]),
            Ok(Command::Snapshot(ARG_MASK))
        );
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(p(&[]), Err(CliError::MissingCommand));
        assert!(matches!(
            p(&["teleport", "1"]),
            Err(CliError::UnknownCommand(_))
        ));
        assert_eq!(p(&["fork", "3"]), Ok(Command::Fork(3)));
        assert_eq!(p(&["done"]), Ok(Command::Done));
        assert_eq!(p(&["done", "1"]), Err(CliError::WrongArgCount("done")));
        assert_eq!(p(&["exit"]), Err(CliError::WrongArgCount("exit")));
        assert_eq!(p(&["mark", "1", "2"]), Err(CliError::WrongArgCount("mark")));
        assert!(matches!(
            p(&["exit", "256"]),
            Err(CliError::BadNumber { .. })
        ));
        assert!(matches!(
            p(&["exit", "-1"]),
            Err(CliError::BadNumber { .. })
        ));
        assert!(matches!(
            p(&["mark", "16777216"]),
            Err(CliError::BadNumber { .. })
        ));
        assert!(matches!(
            p(&["wait", "1s"]),
            Err(CliError::BadNumber { .. })
        ));
        assert!(matches!(p(&["wait", ""]), Err(CliError::BadNumber { .. })));
        assert!(matches!(
            p(&["snapshot", "16777216"]),
            Err(CliError::BadNumber { .. })
        ));
        assert_eq!(p(&["snapshot"]), Err(CliError::WrongArgCount("snapshot")));
    }

    #[test]
    fn error_messages_are_actionable() {
        let e = p(&["exit", "300"]).unwrap_err().to_string();
        assert!(e.contains("0..=255"), "{e}");
    }
}
