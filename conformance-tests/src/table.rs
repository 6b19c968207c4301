//! The case × backend table, rendered from [`Report`]s (never from a list kept by hand): the
//! rows are the registry's entries in order, the columns the targets that reported.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::registry::registry;
use crate::runner::{Outcome, Report};

/// Every report saved under `<dir>/dlock-conformance/*.json` (by [`crate::harness::main`]).
///
/// # Errors
/// A file that cannot be read or parsed (named in the message).
pub fn load(dir: &Path) -> Result<Vec<Report>, String> {
    let dir = dir.join("dlock-conformance");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut reports = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut some: Vec<Report> = serde_json::from_str(&text)
            .map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
        reports.append(&mut some);
    }
    Ok(reports)
}

fn targets_of(reports: &[Report]) -> Vec<&str> {
    let mut targets: Vec<&str> = Vec::new();
    for r in reports {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    targets
}

/// The case × target table with `pass` / `FAIL` / `n/a` / `-` (not run) cells, followed by
/// each failure's message and each reason for `n/a`.
pub fn matrix(reports: &[Report]) -> String {
    let targets = targets_of(reports);
    let cases: Vec<&str> = registry()
        .iter()
        .map(|c| c.name)
        .filter(|name| reports.iter().any(|r| r.case == *name))
        .collect();
    let width = cases.iter().map(|c| c.len()).max().unwrap_or(4).max(4);
    let cols: Vec<usize> = targets.iter().map(|t| t.len().max(4)).collect();
    let mut out = String::new();
    let _ = write!(out, "{:width$}", "case");
    for (t, w) in targets.iter().zip(&cols) {
        let _ = write!(out, "  {t:w$}");
    }
    out.push('\n');
    for case in &cases {
        let _ = write!(out, "{case:width$}");
        for (t, w) in targets.iter().zip(&cols) {
            let cell = reports
                .iter()
                .find(|r| r.case == *case && r.target == *t)
                .map_or("-", |r| r.outcome.short());
            let _ = write!(out, "  {cell:w$}");
        }
        out.push('\n');
    }
    let (passed, failed, na) = counts(reports);
    let _ = writeln!(
        out,
        "{passed} passed, {failed} failed, {na} not applicable, over {} target(s)",
        targets.len()
    );
    for r in reports {
        match &r.outcome {
            Outcome::Failed { message } => {
                let _ = writeln!(
                    out,
                    "FAIL {}::{}: {}",
                    r.target,
                    r.case,
                    first_line(message)
                );
            }
            Outcome::NotApplicable { reason } => {
                let _ = writeln!(out, "n/a  {}::{}: {reason}", r.target, r.case);
            }
            Outcome::Passed => {}
        }
    }
    out
}

/// One target's reports as rows: case, outcome, seconds, and the message or reason.
pub fn single(reports: &[Report]) -> String {
    single_with(reports, &BTreeMap::new())
}

/// As [`single`], with the detail of a not-applicable case taken from `notes` (case → text)
/// where it has one (the reason beside the pinned one: [`crate::pins::Pins::annotate`]).
pub fn single_with(reports: &[Report], notes: &BTreeMap<String, String>) -> String {
    let width = reports
        .iter()
        .map(|r| r.case.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = String::new();
    for r in reports {
        let detail = match &r.outcome {
            Outcome::Passed => String::new(),
            Outcome::Failed { message } => first_line(message).to_owned(),
            Outcome::NotApplicable { reason } => notes.get(&r.case).unwrap_or(reason).clone(),
        };
        let _ = writeln!(
            out,
            "{:width$}  {:4}  {:>7.2}s  {detail}",
            r.case,
            r.outcome.short(),
            r.seconds
        );
    }
    let (passed, failed, na) = counts(reports);
    let _ = writeln!(out, "{passed} passed, {failed} failed, {na} not applicable");
    out
}

/// (passed, failed, not applicable).
pub fn counts(reports: &[Report]) -> (usize, usize, usize) {
    let count = |f: fn(&Outcome) -> bool| reports.iter().filter(|r| f(&r.outcome)).count();
    (
        count(|o| matches!(o, Outcome::Passed)),
        count(|o| matches!(o, Outcome::Failed { .. })),
        count(|o| matches!(o, Outcome::NotApplicable { .. })),
    )
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A report of `case` on `target` (for this crate's unit tests).
    pub(crate) fn report(target: &str, case: &str, outcome: Outcome) -> Report {
        Report {
            target: target.into(),
            case: case.into(),
            kind: "case".into(),
            outcome,
            seconds: 0.5,
        }
    }

    #[test]
    fn matrix_shows_every_outcome_and_what_did_not_run() {
        let reports = vec![
            report("a", "basic_exclusivity", Outcome::Passed),
            report(
                "b",
                "basic_exclusivity",
                Outcome::Failed {
                    message: "b acquired a held lock\nmore".into(),
                },
            ),
            report(
                "a",
                "fifo_waiters_served_in_order",
                Outcome::NotApplicable {
                    reason: "needs FIFO fairness".into(),
                },
            ),
        ];
        let text = matrix(&reports);
        let row = |case: &str| {
            text.lines()
                .find(|l| l.starts_with(case))
                .unwrap_or_else(|| panic!("no row for {case} in\n{text}"))
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
        };
        assert_eq!(row("basic_exclusivity"), ["pass", "FAIL"]);
        assert_eq!(row("fifo_waiters_served_in_order"), ["n/a", "-"]);
        assert!(text.contains("1 passed, 1 failed, 1 not applicable, over 2 target(s)"));
        assert!(text.contains("FAIL b::basic_exclusivity: b acquired a held lock\n"));
        assert!(text.contains("n/a  a::fifo_waiters_served_in_order: needs FIFO fairness"));
    }

    #[test]
    fn reports_round_trip_through_json_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let reports = vec![
            report("m", "basic_exclusivity", Outcome::Passed),
            report(
                "m",
                "ttl_expiry_frees_lock",
                Outcome::NotApplicable { reason: "x".into() },
            ),
        ];
        std::fs::create_dir_all(dir.path().join("dlock-conformance")).unwrap();
        std::fs::write(
            dir.path().join("dlock-conformance/m.json"),
            serde_json::to_string(&reports).unwrap(),
        )
        .unwrap();
        assert_eq!(load(dir.path()).unwrap(), reports);
        assert!(single(&reports).contains("1 passed, 0 failed, 1 not applicable"));
    }
}
