//! Runs registry entries against a [`Target`] and turns each into a [`Report`]: passed, failed
//! (with the panic's message) or not applicable (with the reason), with its duration.

use std::time::{Duration, Instant};

use crate::Ctx;
use crate::registry::{Case, Kind};
use crate::target::{Expect, Target};

/// How long a single case may run before it fails instead of hanging.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(180);

/// The result of one entry on one target.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// The case passed (for a fault scenario: the backend behaved as declared).
    Passed,
    /// The case failed; the message says what went wrong.
    Failed {
        /// The failure, as the case reported it.
        message: String,
    },
    /// The store does not offer what the case needs, or the scenario cannot be staged here.
    NotApplicable {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// `pass`, `FAIL` or `n/a`.
    pub fn short(&self) -> &'static str {
        match self {
            Outcome::Passed => "pass",
            Outcome::Failed { .. } => "FAIL",
            Outcome::NotApplicable { .. } => "n/a",
        }
    }
}

/// One entry's outcome on one target.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The target's label.
    pub target: String,
    /// The entry's name.
    pub case: String,
    /// `case` or `fault`.
    pub kind: String,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Wall time, in seconds.
    pub seconds: f64,
}

/// The message of a panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked with a non-text payload".to_owned()
    }
}

/// Why `case` does not run on `target` before anything is connected, if it does not.
fn not_applicable_up_front(target: &Target, case: &Case) -> Option<String> {
    if case.kind != Kind::Fault {
        return None;
    }
    if !target.runs_faults() {
        return Some(
            "needs --spawn: a fault scenario breaks a server dlock started itself".to_owned(),
        );
    }
    match target.expectation(case.name) {
        Some(Expect::NotApplicable(reason)) => Some(reason.to_owned()),
        // Undeclared is an error only where the scenario applies (see `outcome_of`): a store
        // without semaphores need not declare the semaphore scenarios.
        _ => None,
    }
}

/// The error for a fault scenario that applies to `target` but is not declared there.
fn undeclared(target: &Target, case: &Case) -> Option<String> {
    (case.kind == Kind::Fault && target.expectation(case.name).is_none()).then(|| {
        format!(
            "fault scenario {} is not declared for {}: add `.fault(\"{}\", Expect::…)` to its target",
            case.name,
            target.label(),
            case.name
        )
    })
}

/// Runs `case` against `target` within `limit` on the current tokio runtime and reports the
/// outcome. The case runs in a task of its own: a panic there becomes [`Outcome::Failed`] with
/// the panic's message, and a case still running at `limit` is dropped (its cleanup guards run)
/// and fails.
///
/// # Cancel safety
/// Dropping the future aborts the case's task.
pub async fn run_case(target: &Target, case: &'static Case, limit: Duration) -> Report {
    let started = Instant::now();
    let outcome = outcome_of(target, case, limit).await;
    Report {
        target: target.label().to_owned(),
        case: case.name.to_owned(),
        kind: match case.kind {
            Kind::Case => "case",
            Kind::Fault => "fault",
        }
        .to_owned(),
        outcome,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Whether `case` applies to `target`, decided as [`run_case`] decides it (the target's fault
/// declarations, then the store's capabilities against the case's [`Needs`](crate::Needs)),
/// without running it: `Ok(None)` when it would run, `Ok(Some(reason))` when it is not
/// applicable. Connects one client to read the capabilities.
///
/// # Cancel safety
/// Cancel-safe: it only connects a client and reads its capabilities.
///
/// # Errors
/// The failure message when the store is not ready or cannot be connected to within `limit`.
pub async fn applicability(
    target: &Target,
    case: &Case,
    limit: Duration,
) -> Result<Option<String>, String> {
    if let Some(reason) = not_applicable_up_front(target, case) {
        return Ok(Some(reason));
    }
    let url = tokio::time::timeout(limit, target.url())
        .await
        .map_err(|_| format!("the store was not ready within {limit:?}"))?;
    let caps = match tokio::time::timeout(limit, target.connect(&url)).await {
        Ok(Ok(client)) => client.capabilities(),
        Ok(Err(e)) => return Err(format!("cannot connect: {e}")),
        Err(_) => return Err(format!("connecting took longer than {limit:?}")),
    };
    Ok((!(case.needs.admits)(&caps)).then(|| format!("needs {}", case.needs.label)))
}

async fn outcome_of(target: &Target, case: &'static Case, limit: Duration) -> Outcome {
    match applicability(target, case, limit).await {
        Ok(None) => {}
        Ok(Some(reason)) => return Outcome::NotApplicable { reason },
        Err(message) => return Outcome::Failed { message },
    }
    if let Some(message) = undeclared(target, case) {
        return Outcome::Failed { message };
    }
    let ctx = Ctx::new(target.clone(), case.name);
    let names = ctx.names();
    let mut task = tokio::spawn((case.run)(ctx));
    let message = match tokio::time::timeout(limit, &mut task).await {
        Ok(Ok(())) => return Outcome::Passed,
        Ok(Err(e)) if e.is_panic() => panic_message(&*e.into_panic()),
        Ok(Err(e)) => format!("the case's task ended without finishing: {e}"),
        Err(_) => {
            task.abort();
            format!("did not finish within {limit:?}")
        }
    };
    Outcome::Failed {
        message: match crate::timeline::of(&names) {
            Some(lines) => format!("{message}\nwhat the library logged about its locks:\n{lines}"),
            None => message,
        },
    }
}

/// Runs every registry entry whose name `select` accepts, one after another, calling
/// `progress` after each; returns the reports in registry order.
///
/// # Cancel safety
/// Dropping the future aborts the running case; earlier reports are lost with it.
pub async fn run_all(
    target: &Target,
    select: impl Fn(&Case) -> bool,
    limit: Duration,
    mut progress: impl FnMut(&Report),
) -> Vec<Report> {
    let mut reports = Vec::new();
    for case in crate::registry::registry().iter().filter(|c| select(c)) {
        let report = run_case(target, case, limit).await;
        progress(&report);
        reports.push(report);
    }
    reports
}
