//! What `dlock compare` found, as data: `report.json` is this, serialised, and the Markdown,
//! HTML and terminal views are drawn from it alone.

use std::collections::BTreeMap;

use conformance_tests::{Expect, Outcome, Report};
use lockcore::{Capabilities, Expiry, Fairness, Fencing, WaitMechanism};
use serde::{Deserialize, Serialize};

use crate::bench::{ContendedReport, FloorReport, UncontendedReport};

/// The floor a backend's uncontended figures are judged against: the fenced floor where the
/// bench measures one (the minimal script that also hands out a token), else the raw one.
pub fn min_token_of(u: &UncontendedReport) -> Option<&FloorReport> {
    u.fenced_floor.as_ref().or(u.floor.as_ref())
}

/// A whole run over every backend asked for.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    /// The dlock version that ran it.
    pub dlock_version: String,
    /// When it started (RFC 3339, UTC).
    pub started: String,
    /// What it ran on: `2 cores, Debian GNU/Linux 12 (bookworm), x86_64`.
    pub machine: String,
    /// Whether it was a `--quick` run (shorter benchmarks, fewer repeats).
    pub quick: bool,
    /// Wall time of the whole run, in seconds.
    pub seconds: f64,
    /// One entry per backend, in the order asked for.
    pub backends: Vec<BackendReport>,
}

impl CompareReport {
    /// Whether every backend ran, no case failed and no fault scenario showed a violation.
    pub fn ok(&self) -> bool {
        self.backends.iter().all(BackendReport::ok)
    }

    /// What the run came to, for an exit code: a problem on a measured backend outweighs a
    /// backend that could not be measured.
    pub fn outcome(&self) -> RunOutcome {
        if self
            .backends
            .iter()
            .any(|b| b.unavailable.is_none() && !b.ok())
        {
            RunOutcome::Problems
        } else if self.backends.iter().any(|b| b.unavailable.is_some()) {
            RunOutcome::Unmeasured
        } else {
            RunOutcome::Clean
        }
    }
}

/// What a comparison came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every backend ran; every case passed; no scenario showed a violation.
    Clean,
    /// A case failed, a scenario showed a violation, a name was left held, or the benchmark
    /// could not run, on a backend that was measured.
    Problems,
    /// Nothing went wrong where measured, but a backend could not be started or reached.
    Unmeasured,
}

/// Everything measured on one backend.
#[derive(Clone, Debug, Serialize)]
pub struct BackendReport {
    /// Its name: the `--spawn` name, or for `--url` the backend's own name.
    pub name: String,
    /// `spawned` (servers dlock started and stopped), or the URL with any password redacted.
    pub source: String,
    /// Why the backend could not be measured at all (a server binary missing, a store that
    /// refused the connection); the other fields are then empty.
    pub unavailable: Option<String>,
    /// The capability sheet.
    pub sheet: Option<Sheet>,
    /// Every conformance case, in registry order.
    pub cases: Vec<Report>,
    /// Every fault scenario, in registry order, with its verdict.
    pub scenarios: Vec<Scenario>,
    /// The suite's target of the same kind (see [`crate::check::CheckRun::pinned_as`]).
    pub pinned_as: Option<String>,
    /// For every case and scenario that was not applicable: its reason beside the pinned one,
    /// keyed by entry.
    pub pin_notes: BTreeMap<String, String>,
    /// The benchmark.
    pub bench: Bench,
    /// Lock names of the run still held at its end, on a `--url` store (waited for up to 60 s).
    pub left_held: Vec<String>,
    /// Wall time spent on this backend, server start included, in seconds.
    pub seconds: f64,
}

impl BackendReport {
    /// A backend that could not be measured, for `why`.
    pub fn unavailable(name: &str, source: &str, why: String) -> Self {
        BackendReport {
            name: name.to_owned(),
            source: source.to_owned(),
            unavailable: Some(why),
            sheet: None,
            cases: Vec::new(),
            scenarios: Vec::new(),
            pinned_as: None,
            pin_notes: BTreeMap::new(),
            bench: Bench::default(),
            left_held: Vec::new(),
            seconds: 0.0,
        }
    }

    /// Whether it ran, no case failed and no scenario showed a violation.
    pub fn ok(&self) -> bool {
        self.unavailable.is_none()
            && self.left_held.is_empty()
            && !self
                .cases
                .iter()
                .any(|c| matches!(c.outcome, Outcome::Failed { .. }))
            && !self
                .scenarios
                .iter()
                .any(|s| s.verdict == Verdict::Violation)
    }

    /// Cases passed, failed and not applicable.
    pub fn case_counts(&self) -> (usize, usize, usize) {
        conformance_tests::table::counts(&self.cases)
    }

    /// How many scenarios have `verdict`.
    pub fn scenario_count(&self, verdict: Verdict) -> usize {
        self.scenarios
            .iter()
            .filter(|s| s.verdict == verdict)
            .count()
    }
}

/// What a backend promises, from the capabilities its client declares.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sheet {
    /// `strict`, `conditional` or `none`.
    pub fencing: String,
    /// For conditional fencing, the assumption it rests on.
    pub fencing_assumption: Option<String>,
    /// `ttl` (a lease ends at its ttl) or `session` (with the client's session).
    pub expiry: String,
    /// For session stores, the session timeout the server granted, in milliseconds.
    pub session_timeout_ms: Option<u64>,
    /// `fifo` or `unordered`.
    pub fairness: String,
    /// How waiters are woken: `pub/sub`, `watch`, `LISTEN/NOTIFY`, `doorbell + polling`,
    /// `polling`, `in-process`.
    pub wake_up: String,
    /// Native read-write locks.
    pub read_write: bool,
    /// Native counting semaphores.
    pub semaphore: bool,
    /// Whether two processes with the same URL share locks.
    pub shared_across_processes: bool,
}

impl Sheet {
    /// The sheet of a client's capabilities.
    pub fn of(caps: &Capabilities) -> Self {
        let (fencing, fencing_assumption) = match caps.fencing {
            Fencing::Strict => ("strict", None),
            Fencing::Conditional { assumption } => ("conditional", Some(assumption.to_owned())),
            Fencing::None => ("none", None),
        };
        Sheet {
            fencing: fencing.to_owned(),
            fencing_assumption,
            expiry: match caps.expiry {
                Expiry::Ttl => "ttl",
                Expiry::Session => "session",
            }
            .to_owned(),
            session_timeout_ms: caps.session_timeout.map(|d| d.as_millis() as u64),
            fairness: match caps.fairness {
                Fairness::Fifo => "fifo",
                Fairness::Unordered => "unordered",
            }
            .to_owned(),
            wake_up: match caps.waiting {
                WaitMechanism::Notify => "in-process",
                WaitMechanism::PubSub => "pub/sub",
                WaitMechanism::Watch => "watch",
                WaitMechanism::ListenNotify => "LISTEN/NOTIFY",
                WaitMechanism::Poll => "polling",
                WaitMechanism::Doorbell => "doorbell + polling",
            }
            .to_owned(),
            read_write: caps.native.read_write,
            semaphore: caps.native.semaphore,
            shared_across_processes: caps.shared_across_processes,
        }
    }
}

/// A fault scenario's verdict on one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No overlap, tokens grew, no stale write accepted.
    Safe,
    /// The backend is documented not to survive this safely, and the scenario saw it happen as
    /// documented.
    DocumentedUnsafe,
    /// A safety property broke where the backend is declared safe, or a documented weakness
    /// did not show as documented: a bug either way.
    Violation,
    /// The scenario cannot be staged on this backend (the reason says why).
    NotApplicable,
    /// The store was given by `--url`: breaking servers needs servers dlock started.
    NeedsSpawn,
}

impl Verdict {
    /// As the tables show it.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Safe => "safe",
            Verdict::DocumentedUnsafe => "documented unsafe",
            Verdict::Violation => "VIOLATION",
            Verdict::NotApplicable => "n/a",
            Verdict::NeedsSpawn => "needs --spawn",
        }
    }

    /// The verdict of a scenario's runner report, given how the backend declared it.
    pub fn of(outcome: &Outcome, declared: Option<Expect>, spawned: bool) -> Self {
        match outcome {
            Outcome::Passed => match declared {
                Some(Expect::DocumentedUnsafe(_)) => Verdict::DocumentedUnsafe,
                _ => Verdict::Safe,
            },
            Outcome::Failed { .. } => Verdict::Violation,
            Outcome::NotApplicable { .. } if !spawned => Verdict::NeedsSpawn,
            Outcome::NotApplicable { .. } => Verdict::NotApplicable,
        }
    }
}

/// One fault scenario on one backend.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    /// The scenario's registry name.
    pub scenario: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What the backend declares for it (the documented weakness, or why it does not apply).
    pub declared: Option<String>,
    /// The runner's message (the failure, or why it did not run).
    pub message: Option<String>,
    /// Wall time, in seconds.
    pub seconds: f64,
}

/// The benchmark's figures on one backend.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Bench {
    /// One client's acquire+release pairs, beside the backend's raw floor.
    pub uncontended: Option<UncontendedReport>,
    /// Clients contending for one name.
    pub contended: Option<ContendedReport>,
    /// 8 clients holding 10 ms each on a semaphore of 4 permits (how full a busy semaphore
    /// stays: `mean_holders` of 4), on a backend with semaphores.
    pub semaphore: Option<ContendedReport>,
    /// Why the benchmark did not run, or stopped.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_scenario_is_a_violation_and_a_passed_one_says_what_was_declared() {
        let failed = Outcome::Failed {
            message: "overlap".into(),
        };
        assert_eq!(
            Verdict::of(&failed, Some(Expect::Safe), true),
            Verdict::Violation
        );
        assert_eq!(
            Verdict::of(&Outcome::Passed, Some(Expect::DocumentedUnsafe("x")), true),
            Verdict::DocumentedUnsafe
        );
        assert_eq!(
            Verdict::of(&Outcome::Passed, Some(Expect::Safe), true),
            Verdict::Safe
        );
        let na = Outcome::NotApplicable { reason: "r".into() };
        assert_eq!(Verdict::of(&na, None, false), Verdict::NeedsSpawn);
        assert_eq!(Verdict::of(&na, None, true), Verdict::NotApplicable);
    }
}
