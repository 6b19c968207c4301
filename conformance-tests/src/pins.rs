//! The pinned not-applicable cells: every target × case of the suite that does not run, with
//! its reason, kept in [`FILE`] (`conformance-tests/not-applicable.txt`) and compared with each
//! run's reports, so that a case cannot stop running unnoticed. Whether a case applies is
//! decided at run time from the target's own declarations and its store's capabilities; a
//! backend that stopped declaring a capability would turn that case's failures into n/a and
//! leave the suite green. Against the pins, the change shows as a failure of the table step and
//! as a diff of the file.
//!
//! The file has one line per cell, `<target>::<case>: <reason>` (the cell's `cargo test` name,
//! then the reason), sorted, with `#` comments. `conformance-table --write-pins` rewrites it
//! from a run's reports ([`Pins::updated`]); [`compare`] lists how a run differs from it; `dlock
//! check` and `dlock compare` print the pinned reason beside their own ([`Pins::annotate`]).
//!
//! The reasoning is in `docs/design/conformance-tests.md`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::registry;
use crate::runner::{Outcome, Report};

/// The pin file's name, in this crate's directory.
pub const FILE: &str = "not-applicable.txt";

/// The pin file as this build was compiled with.
const COMMITTED: &str = include_str!("../not-applicable.txt");

/// The command that rewrites the file from the reports under `target/tmp` (add `--complete`
/// after a run of the whole suite; see [`Pins::updated`]).
pub const REWRITE: &str =
    "cargo run -p fencedlock-conformance --bin conformance-table -- --write-pins";

/// The committed pin file's path in the source tree.
pub fn default_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(FILE)
}

/// A reason with every run of whitespace made one space, as the file keeps it (one line).
fn normalise(reason: &str) -> String {
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The pinned cells: (target, case) → reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    cells: BTreeMap<(String, String), String>,
}

impl Pins {
    /// The pins this build was compiled with (the committed file).
    ///
    /// # Panics
    /// When the committed file does not parse (a unit test keeps it parsing).
    pub fn committed() -> &'static Pins {
        static PINS: OnceLock<Pins> = OnceLock::new();
        PINS.get_or_init(|| {
            Pins::parse(COMMITTED).unwrap_or_else(|e| panic!("conformance-tests/{FILE}: {e}"))
        })
    }

    /// Parses the file's text.
    ///
    /// # Errors
    /// A line that is not `<target>::<case>: <reason>`, or a cell listed twice (named, with its
    /// line number).
    pub fn parse(text: &str) -> Result<Pins, String> {
        let mut cells = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || {
                format!(
                    "line {}: expected `<target>::<case>: <reason>`: {line}",
                    i + 1
                )
            };
            let (cell, reason) = line.split_once(": ").ok_or_else(bad)?;
            let (target, case) = cell.split_once("::").ok_or_else(bad)?;
            let word = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
            if !word(target) || !word(case) || reason.trim().is_empty() {
                return Err(bad());
            }
            let key = (target.to_owned(), case.to_owned());
            if cells.insert(key, normalise(reason)).is_some() {
                return Err(format!("line {}: {cell} is pinned twice", i + 1));
            }
        }
        Ok(Pins { cells })
    }

    /// The n/a cells of `reports`, with their reasons.
    ///
    /// # Errors
    /// A cell reported twice (two test binaries with one target label), named.
    pub fn from_reports(reports: &[Report]) -> Result<Pins, String> {
        if let Some((target, case)) = reported_twice(reports).into_iter().next() {
            return Err(format!(
                "{target}::{case} is reported twice: two targets with the same label?"
            ));
        }
        let cells = reports
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::NotApplicable { reason } => {
                    Some(((r.target.clone(), r.case.clone()), normalise(reason)))
                }
                _ => None,
            })
            .collect();
        Ok(Pins { cells })
    }

    /// The pins after a run: for [`Scope::Complete`], exactly the run's n/a cells; for
    /// [`Scope::Reported`], the run's n/a cells plus the pins of every cell the run did not
    /// report (other test binaries' targets, cases a filter left out), less those of cases the
    /// registry no longer has.
    ///
    /// # Errors
    /// As [`Pins::from_reports`].
    pub fn updated(&self, reports: &[Report], scope: Scope) -> Result<Pins, String> {
        let mut new = Pins::from_reports(reports)?;
        if scope == Scope::Reported {
            let reported: BTreeSet<(&str, &str)> = reports
                .iter()
                .map(|r| (r.target.as_str(), r.case.as_str()))
                .collect();
            for ((target, case), reason) in &self.cells {
                if !reported.contains(&(target.as_str(), case.as_str()))
                    && registry::find(case).is_some()
                {
                    new.cells
                        .insert((target.clone(), case.clone()), reason.clone());
                }
            }
        }
        Ok(new)
    }

    /// The file's text: the header, then one sorted line per cell.
    pub fn render(&self) -> String {
        let mut out = format!(
            "# The conformance suite's not-applicable cells: one line per target x case that does not\n\
             # run, `<target>::<case>: <reason>`, sorted. The table step of scripts/test fails when a\n\
             # run's n/a cells differ from these lines. After changing a capability, a fault\n\
             # declaration or a case on purpose, run the suite and rewrite this file from its\n\
             # reports, then review the diff:\n\
             #   {REWRITE} [--complete] target/tmp\n\
             # (--complete after a run of the whole suite: it also drops targets that are gone).\n\
             # See docs/design/conformance-tests.md.\n"
        );
        for ((target, case), reason) in &self.cells {
            out.push_str(&format!("{target}::{case}: {reason}\n"));
        }
        out
    }

    /// The pinned reason of `target`'s `case`, if pinned.
    pub fn get(&self, target: &str, case: &str) -> Option<&str> {
        self.cells
            .get(&(target.to_owned(), case.to_owned()))
            .map(String::as_str)
    }

    /// `target`'s pinned cells: case → reason.
    pub fn of(&self, target: &str) -> BTreeMap<&str, &str> {
        self.cells
            .iter()
            .filter(|((t, _), _)| t == target)
            .map(|((_, c), r)| (c.as_str(), r.as_str()))
            .collect()
    }

    /// Every target with a pinned cell.
    pub fn targets(&self) -> BTreeSet<&str> {
        self.cells.keys().map(|(t, _)| t.as_str()).collect()
    }

    /// How many cells are pinned.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether no cell is pinned.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// The lines of `self` that `other` lacks or has otherwise (`-`), then those `other` adds
    /// or changes (`+`): what rewriting the file from `self` to `other` changes.
    pub fn diff(&self, other: &Pins) -> Vec<String> {
        let line = |((t, c), r): (&(String, String), &String)| format!("{t}::{c}: {r}");
        let gone = self
            .cells
            .iter()
            .filter(|(k, r)| other.cells.get(*k) != Some(*r))
            .map(|cell| format!("- {}", line(cell)));
        let added = other
            .cells
            .iter()
            .filter(|(k, r)| self.cells.get(*k) != Some(*r))
            .map(|cell| format!("+ {}", line(cell)));
        gone.chain(added).collect()
    }

    /// What `dlock check` or `dlock compare` prints for a case that was not applicable on a
    /// store of the kind of the suite's target `target` (see [`target_for_url`]; `None`: the
    /// suite has no target of that kind): the pinned reason
    /// where the suite pins the same one, else the run's reason and how it differs from the pins.
    pub fn annotate(&self, target: Option<&str>, case: &str, reason: &str) -> String {
        let Some(target) = target else {
            return format!("{reason} (not pinned: the suite has no target of this kind)");
        };
        match self.get(target, case) {
            Some(pinned) if pinned == normalise(reason) => {
                format!("{pinned} (pinned for {target})")
            }
            Some(pinned) => format!("{reason} (pinned for {target} with another reason: {pinned})"),
            None => format!("{reason} (not pinned: the suite runs it on {target})"),
        }
    }
}

/// Which pinned cells a run is judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The cells the run reported (one test binary, or a filtered run): pins of targets or
    /// cases without a report are not judged.
    Reported,
    /// The whole suite ran (`scripts/test`): every pinned target and cell must have a report.
    Complete,
}

/// One way a run differs from the pins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// Not applicable in the run, not pinned.
    NotPinned {
        /// The target.
        target: String,
        /// The case.
        case: String,
        /// The run's reason.
        reason: String,
    },
    /// Pinned, but it ran.
    Ran {
        /// The target.
        target: String,
        /// The case.
        case: String,
        /// `pass` or `FAIL`.
        outcome: &'static str,
        /// The pinned reason.
        pinned: String,
    },
    /// Not applicable for another reason than the pinned one.
    Reason {
        /// The target.
        target: String,
        /// The case.
        case: String,
        /// The run's reason.
        now: String,
        /// The pinned reason.
        pinned: String,
    },
    /// Pinned for a case the registry does not have (renamed or removed).
    UnknownCase {
        /// The target.
        target: String,
        /// The case.
        case: String,
    },
    /// A pinned target with no report at all, in a complete run.
    MissingTarget {
        /// The target.
        target: String,
    },
    /// A pinned cell of a target that reported, without a report of its own, in a complete run.
    NotReported {
        /// The target.
        target: String,
        /// The case.
        case: String,
    },
    /// A cell reported more than once.
    Twice {
        /// The target.
        target: String,
        /// The case.
        case: String,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::NotPinned {
                target,
                case,
                reason,
            } => write!(
                f,
                "{target}::{case}: not applicable in this run ({reason}), but not pinned"
            ),
            Mismatch::Ran {
                target,
                case,
                outcome,
                pinned,
            } => write!(
                f,
                "{target}::{case}: pinned not applicable ({pinned}), but it ran ({outcome})"
            ),
            Mismatch::Reason {
                target,
                case,
                now,
                pinned,
            } => write!(
                f,
                "{target}::{case}: not applicable for another reason than pinned: now ({now}), \
                 pinned ({pinned})"
            ),
            Mismatch::UnknownCase { target, case } => write!(
                f,
                "{target}::{case}: pinned, but the registry has no case {case} (renamed or removed)"
            ),
            Mismatch::MissingTarget { target } => write!(
                f,
                "{target}: pinned, but no report of this target was found (its test binary did \
                 not run, or the target is gone)"
            ),
            Mismatch::NotReported { target, case } => write!(
                f,
                "{target}::{case}: pinned, but {target} reported no outcome for it (a filtered run?)"
            ),
            Mismatch::Twice { target, case } => write!(
                f,
                "{target}::{case}: reported twice (two targets with the same label?)"
            ),
        }
    }
}

fn reported_twice(reports: &[Report]) -> Vec<(&str, &str)> {
    let mut seen = HashMap::new();
    for r in reports {
        *seen
            .entry((r.target.as_str(), r.case.as_str()))
            .or_insert(0usize) += 1;
    }
    let mut twice: Vec<_> = seen
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, _)| k)
        .collect();
    twice.sort();
    twice
}

/// How `reports` differ from `pins`, judged in `scope`: cells reported twice, then the run's
/// cells in target and case order, then pins the run has no report for.
pub fn compare(reports: &[Report], pins: &Pins, scope: Scope) -> Vec<Mismatch> {
    let mut out: Vec<Mismatch> = reported_twice(reports)
        .into_iter()
        .map(|(t, c)| Mismatch::Twice {
            target: t.to_owned(),
            case: c.to_owned(),
        })
        .collect();
    let mut reported: BTreeMap<(&str, &str), &Report> = BTreeMap::new();
    for r in reports {
        reported.insert((r.target.as_str(), r.case.as_str()), r);
    }
    for ((target, case), report) in &reported {
        let pinned = pins.get(target, case);
        let cell = |t: &str, c: &str| (t.to_owned(), c.to_owned());
        match (&report.outcome, pinned) {
            (Outcome::NotApplicable { reason }, None) => {
                let (target, case) = cell(target, case);
                out.push(Mismatch::NotPinned {
                    target,
                    case,
                    reason: normalise(reason),
                });
            }
            (Outcome::NotApplicable { reason }, Some(pinned)) if normalise(reason) != pinned => {
                let (target, case) = cell(target, case);
                out.push(Mismatch::Reason {
                    target,
                    case,
                    now: normalise(reason),
                    pinned: pinned.to_owned(),
                });
            }
            (Outcome::NotApplicable { .. }, Some(_)) | (_, None) => {}
            (ran, Some(pinned)) => {
                let (target, case) = cell(target, case);
                out.push(Mismatch::Ran {
                    target,
                    case,
                    outcome: ran.short(),
                    pinned: pinned.to_owned(),
                });
            }
        }
    }
    let reporting: BTreeSet<&str> = reports.iter().map(|r| r.target.as_str()).collect();
    for (target, case) in pins.cells.keys() {
        let (target, case) = (target.clone(), case.clone());
        if registry::find(&case).is_none() {
            out.push(Mismatch::UnknownCase { target, case });
        } else if scope == Scope::Complete
            && reporting.contains(target.as_str())
            && !reported.contains_key(&(target.as_str(), case.as_str()))
        {
            out.push(Mismatch::NotReported { target, case });
        }
    }
    if scope == Scope::Complete {
        for target in pins.targets() {
            if !reporting.contains(target) {
                out.push(Mismatch::MissingTarget {
                    target: target.to_owned(),
                });
            }
        }
    }
    out
}

/// The text that follows a list of mismatches: how to update the file, and why not blindly.
pub fn rewrite_hint(scope: Scope) -> String {
    let complete = if scope == Scope::Complete {
        " --complete"
    } else {
        ""
    };
    format!(
        "The n/a cells differ from conformance-tests/{FILE}. If the change is intended (a \
         capability, a fault declaration or a case changed on purpose), rewrite the file from \
         this run's reports and review its diff:\n  {REWRITE}{complete} target/tmp\nOtherwise a \
         case stopped running (or started) by mistake: a case that does not run hides its failures."
    )
}

/// The suite's target that a store at `url` is of the kind of, for [`Pins::annotate`]: by
/// scheme, with ZooKeeper's layout and host count, Redlock's node count, and dual's two stores.
/// `None` where the suite has no target of that kind.
pub fn target_for_url(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once("://")?;
    let (authority, query) = {
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = before_query.split('/').next().unwrap_or("");
        (authority, query)
    };
    let hosts = authority
        .rsplit('@')
        .next()
        .unwrap_or("")
        .split(',')
        .count();
    let param = |key: &str| {
        query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then(|| lockcore::percent_decode(v).ok())?
        })
    };
    Some(match scheme.to_ascii_lowercase().as_str() {
        "memory" => "memory",
        "sqlite" => "sqlite",
        "postgres" | "postgresql" => "postgres",
        "mysql" | "mariadb" => "mariadb",
        "redis" | "rediss" => "redis",
        "redis+cluster" => "redis_cluster",
        "tair" => "tair",
        "redlock" | "redlocks" => match hosts {
            3 => "redlock3",
            5 => "redlock5",
            _ => return None,
        },
        "zk" => match param("layout").as_deref() {
            Some("curator") => "zookeeper_curator",
            Some("kazoo") => "zookeeper_kazoo",
            Some("dlock") | None if hosts > 1 => "zookeeper_ensemble",
            Some("dlock") | None => "zookeeper",
            Some(_) => return None,
        },
        "dual" => {
            let first = target_for_url(&param("first")?)?;
            let second = target_for_url(&param("second")?)?;
            match (first, second) {
                ("memory", "memory") => "dual_memory",
                ("zookeeper" | "zookeeper_ensemble", "redis") => "dual_zk_redis",
                ("redis", "zookeeper" | "zookeeper_ensemble") => "dual_redis_zk",
                _ => return None,
            }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::report;

    fn na(reason: &str) -> Outcome {
        Outcome::NotApplicable {
            reason: reason.into(),
        }
    }

    const FIFO: &str = "fifo_waiters_served_in_order";
    const BASIC: &str = "basic_exclusivity";
    const RW: &str = "rw_unsupported_says_so";

    fn pins(lines: &str) -> Pins {
        Pins::parse(lines).expect("parses")
    }

    /// A run that agrees with its pins: `a` and `b` each with one n/a cell and one that ran.
    fn agreeing() -> (Vec<Report>, Pins) {
        let reports = vec![
            report("a", BASIC, Outcome::Passed),
            report("a", FIFO, na("needs FIFO fairness")),
            report("b", BASIC, Outcome::Passed),
            report("b", RW, na("needs X")),
        ];
        let pinned = pins(&format!(
            "# comment\n\na::{FIFO}: needs FIFO fairness\nb::{RW}: needs X\n"
        ));
        (reports, pinned)
    }

    #[test]
    fn a_run_that_agrees_has_no_mismatch_in_either_scope() {
        let (reports, pinned) = agreeing();
        assert_eq!(compare(&reports, &pinned, Scope::Reported), []);
        assert_eq!(compare(&reports, &pinned, Scope::Complete), []);
    }

    #[test]
    fn a_new_not_applicable_cell_fails() {
        let (mut reports, pinned) = agreeing();
        reports[0] = report("a", BASIC, na("needs something new"));
        let found = compare(&reports, &pinned, Scope::Reported);
        assert_eq!(
            found,
            [Mismatch::NotPinned {
                target: "a".into(),
                case: BASIC.into(),
                reason: "needs something new".into(),
            }]
        );
        assert!(found[0].to_string().starts_with("a::basic_exclusivity: "));
    }

    #[test]
    fn a_pinned_cell_that_ran_fails_whether_it_passed_or_failed() {
        let (mut reports, pinned) = agreeing();
        reports[1] = report("a", FIFO, Outcome::Passed);
        reports[3] = report(
            "b",
            RW,
            Outcome::Failed {
                message: "boom".into(),
            },
        );
        let found = compare(&reports, &pinned, Scope::Reported);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            matches!(&found[0], Mismatch::Ran { target, outcome: "pass", .. } if target == "a")
        );
        assert!(
            matches!(&found[1], Mismatch::Ran { target, outcome: "FAIL", .. } if target == "b")
        );
        assert!(found[1].to_string().contains("b::rw_unsupported_says_so"));
    }

    #[test]
    fn another_reason_fails_but_whitespace_does_not_count() {
        let (mut reports, pinned) = agreeing();
        reports[1] = report("a", FIFO, na("needs   FIFO\n fairness"));
        assert_eq!(compare(&reports, &pinned, Scope::Reported), []);
        reports[1] = report("a", FIFO, na("needs something else"));
        let found = compare(&reports, &pinned, Scope::Reported);
        assert_eq!(
            found,
            [Mismatch::Reason {
                target: "a".into(),
                case: FIFO.into(),
                now: "needs something else".into(),
                pinned: "needs FIFO fairness".into(),
            }]
        );
    }

    #[test]
    fn a_pin_of_a_case_the_registry_lacks_fails_in_every_scope() {
        let (reports, _) = agreeing();
        let pinned = pins(&format!(
            "a::{FIFO}: needs FIFO fairness\nb::{RW}: needs X\nc::renamed_case: gone\n"
        ));
        for scope in [Scope::Reported, Scope::Complete] {
            let found = compare(&reports, &pinned, scope);
            assert!(
                found.contains(&Mismatch::UnknownCase {
                    target: "c".into(),
                    case: "renamed_case".into()
                }),
                "{scope:?}: {found:?}"
            );
        }
    }

    #[test]
    fn a_pinned_target_without_reports_fails_only_a_complete_run() {
        let (reports, _) = agreeing();
        let pinned = pins(&format!(
            "a::{FIFO}: needs FIFO fairness\nb::{RW}: needs X\nc::{FIFO}: needs FIFO fairness\n"
        ));
        assert_eq!(compare(&reports, &pinned, Scope::Reported), []);
        assert_eq!(
            compare(&reports, &pinned, Scope::Complete),
            [Mismatch::MissingTarget { target: "c".into() }]
        );
    }

    #[test]
    fn a_pinned_cell_left_out_of_a_filtered_run_fails_only_a_complete_run() {
        let (mut reports, pinned) = agreeing();
        reports.remove(1);
        assert_eq!(compare(&reports, &pinned, Scope::Reported), []);
        assert_eq!(
            compare(&reports, &pinned, Scope::Complete),
            [Mismatch::NotReported {
                target: "a".into(),
                case: FIFO.into()
            }]
        );
    }

    #[test]
    fn a_cell_reported_twice_fails_and_cannot_be_pinned() {
        let (mut reports, pinned) = agreeing();
        reports.push(report("a", BASIC, Outcome::Passed));
        assert_eq!(
            compare(&reports, &pinned, Scope::Reported),
            [Mismatch::Twice {
                target: "a".into(),
                case: BASIC.into()
            }]
        );
        assert!(Pins::from_reports(&reports).is_err());
    }

    #[test]
    fn the_file_round_trips_sorted_and_bad_lines_are_named() {
        let text = format!("z::{BASIC}: r1\na::{FIFO}: needs  FIFO fairness\n");
        let parsed = pins(&text);
        let rendered = parsed.render();
        let lines: Vec<&str> = rendered.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "a::fifo_waiters_served_in_order: needs FIFO fairness",
                "z::basic_exclusivity: r1"
            ]
        );
        assert_eq!(Pins::parse(&rendered), Ok(parsed));
        for bad in ["a::b", "a: reason", "::c: r", "a::c: ", "a b::c: r"] {
            let err = Pins::parse(&format!("# x\n{bad}\n")).expect_err(bad);
            assert!(err.starts_with("line 2:"), "{bad}: {err}");
        }
        let err = Pins::parse("a::c: r\na::c: s\n").expect_err("twice");
        assert!(err.contains("a::c is pinned twice"), "{err}");
    }

    #[test]
    fn rewriting_from_a_partial_run_keeps_the_cells_it_did_not_report() {
        let old = pins(&format!(
            "a::{FIFO}: old reason\nc::{FIFO}: kept\nc::gone_case: dropped\n"
        ));
        let reports = vec![
            report("a", FIFO, na("new reason")),
            report("a", BASIC, Outcome::Passed),
            report("b", RW, na("needs X")),
        ];
        let partial = old.updated(&reports, Scope::Reported).unwrap();
        assert_eq!(
            partial,
            pins(&format!(
                "a::{FIFO}: new reason\nb::{RW}: needs X\nc::{FIFO}: kept\n"
            ))
        );
        assert_eq!(compare(&reports, &partial, Scope::Reported), []);
        let complete = old.updated(&reports, Scope::Complete).unwrap();
        assert_eq!(
            complete,
            pins(&format!("a::{FIFO}: new reason\nb::{RW}: needs X\n"))
        );
        assert_eq!(compare(&reports, &complete, Scope::Complete), []);
        assert_eq!(
            old.diff(&partial),
            [
                format!("- a::{FIFO}: old reason"),
                "- c::gone_case: dropped".to_owned(),
                format!("+ a::{FIFO}: new reason"),
                format!("+ b::{RW}: needs X"),
            ]
        );
    }

    #[test]
    fn the_committed_file_parses_and_is_in_its_written_form() {
        let committed = Pins::committed();
        assert!(!committed.is_empty());
        assert_eq!(
            committed.render(),
            COMMITTED,
            "conformance-tests/{FILE} is not sorted or not in the form --write-pins writes"
        );
        for (target, case) in committed.cells.keys() {
            assert!(
                registry::find(case).is_some(),
                "{target}::{case}: no such case"
            );
        }
    }

    #[test]
    fn every_kind_of_store_maps_to_a_pinned_target() {
        let pinned = Pins::committed().targets();
        let zk = "zk://127.0.0.1:2181";
        let redis = "redis://:pw@127.0.0.1:6379";
        let dual = |a: &str, b: &str| crate::spawn::dual_url(a, b);
        for (url, want) in [
            ("memory://x", Some("memory")),
            ("sqlite:///tmp/a.db", Some("sqlite")),
            ("postgresql://u:p@h/db", Some("postgres")),
            ("mysql://u:p@h/db", Some("mariadb")),
            (redis, Some("redis")),
            ("rediss://h:1", Some("redis")),
            ("redis+cluster://h:1,h:2,h:3", Some("redis_cluster")),
            ("tair://h:1", Some("tair")),
            ("redlock://h:1,h:2,h:3", Some("redlock3")),
            (
                "redlock://u:p@h:1,h:2,h:3,h:4,h:5/?ttl=1s",
                Some("redlock5"),
            ),
            ("redlock://h:1,h:2", None),
            (zk, Some("zookeeper")),
            ("zk://h:1/chroot?layout=curator", Some("zookeeper_curator")),
            (
                "zk://h:1?session_timeout=4s&layout=kazoo",
                Some("zookeeper_kazoo"),
            ),
            ("zk://h:1,h:2,h:3/c", Some("zookeeper_ensemble")),
            ("zk://h:1?layout=other", None),
            (&dual("memory://a", "memory://b"), Some("dual_memory")),
            (&dual(&format!("{zk}/c"), redis), Some("dual_zk_redis")),
            (&dual(redis, zk), Some("dual_redis_zk")),
            (&dual("sqlite:///a", redis), None),
            ("nosuch://x", None),
            ("no scheme", None),
        ] {
            assert_eq!(target_for_url(url), want, "{url}");
            if let Some(target) = want {
                assert!(pinned.contains(target), "{url} → {target}: not pinned");
            }
        }
    }

    #[test]
    fn annotate_says_how_a_reason_stands_against_the_pins() {
        let pinned = pins(&format!("a::{FIFO}: needs FIFO fairness\n"));
        assert_eq!(
            pinned.annotate(Some("a"), FIFO, "needs FIFO  fairness"),
            "needs FIFO fairness (pinned for a)"
        );
        assert_eq!(
            pinned.annotate(Some("a"), FIFO, "needs --spawn"),
            "needs --spawn (pinned for a with another reason: needs FIFO fairness)"
        );
        assert_eq!(
            pinned.annotate(Some("a"), BASIC, "needs --spawn"),
            "needs --spawn (not pinned: the suite runs it on a)"
        );
        assert_eq!(
            pinned.annotate(None, BASIC, "r"),
            "r (not pinned: the suite has no target of this kind)"
        );
    }
}
