//! `dlock check`: the shared conformance suite against any store, as data.
//!
//! [`run`] takes a [`Target`] (for a URL: [`target_for_url`]) and runs every registry case the
//! store's capabilities admit, one after another, under a name prefix unique to the run; the
//! result ([`CheckRun`]) carries one [`Report`] per case, serialisable as JSON, so a report over
//! many stores (`dlock compare`) can reuse it. Fault scenarios need a server dlock started and
//! may break, so on a user's store they are reported as not applicable ("needs --spawn").
//! Each not-applicable case's reason is shown beside the one the suite pins for its target of
//! the same kind (`conformance_tests::pins`), or said to be unpinned there.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::pins::{self, Pins};
use conformance_tests::runner::run_case;
use conformance_tests::{Case, Outcome, Target, registry};
use lockcore::{DistributedLock, LockName};
use serde::Serialize;

pub use conformance_tests::Report;

/// What to run and how.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Only entries whose name this matches (all when `None`).
    pub cases: Option<regex::Regex>,
    /// How long one case may run before it fails.
    pub case_timeout: Duration,
    /// How many cases run at once (at least 1). Each case uses names of its own, so they do
    /// not meet in the store; more at once is faster, but timing-sensitive cases then share
    /// the machine with the others.
    pub jobs: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            cases: None,
            case_timeout: conformance_tests::CASE_TIMEOUT,
            jobs: 1,
        }
    }
}

/// A whole run: which store, its capabilities, and every case's report.
#[derive(Clone, Debug, Serialize)]
pub struct CheckRun {
    /// The target's label (for a URL: the backend's name).
    pub target: String,
    /// The store's capabilities, as `Capabilities`' `Display` says them.
    pub capabilities: String,
    /// The lock-name prefix every case's names were under.
    pub prefix: String,
    /// One report per selected case, in registry order.
    pub cases: Vec<Report>,
    /// Cases passed.
    pub passed: usize,
    /// Cases failed.
    pub failed: usize,
    /// Cases not applicable to this store.
    pub not_applicable: usize,
    /// The suite's target of the same kind as the store (by its URL:
    /// [`conformance_tests::pins::target_for_url`]), whose pinned not-applicable cells the run's
    /// are compared with; `None` when the suite has no target of that kind.
    pub pinned_as: Option<String>,
    /// For every case that was not applicable: its reason beside the pinned one
    /// ([`Pins::annotate`]), keyed by case.
    pub pin_notes: BTreeMap<String, String>,
    /// Lock names of this run still held when it ended (they were waited for up to 60 s;
    /// anything listed here outlived that).
    pub left_held: Vec<String>,
    /// Names of this run removed from the store afterwards, fence counters included.
    pub forgotten: usize,
    /// Wall time of the whole run, in seconds (the unit of each case's `seconds`): every case
    /// plus the clean-up afterwards.
    pub seconds: f64,
}

impl CheckRun {
    /// Whether every case passed or was not applicable, and nothing was left held.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.left_held.is_empty()
    }
}

/// A target for the store at `url`, connected with [`dlock::connect`], named after the
/// backend, with every lock name under `dlock-check/<random>/` (no bare names).
pub fn target_for_url(url: &str, label: &str) -> Target {
    Target::new(label, url, |url| async move { dlock::connect(&url).await })
        .prefix(format!("dlock-check/{:08x}", rand::random::<u32>()))
        .record_names()
        .bare_names(false)
}

/// The registry entries `options` selects.
pub fn selected(options: &CheckOptions) -> Vec<&'static Case> {
    registry()
        .iter()
        .filter(|c| options.cases.as_ref().is_none_or(|re| re.is_match(c.name)))
        .collect()
}

/// Runs the selected cases against `target` with a `client` already connected to it (its
/// capabilities head the run), `options.jobs` at a time, calling `progress(done, total,
/// report)` as each case ends; the reports are in registry order whatever the order of ending.
///
/// # Cancel safety
/// Dropping the future aborts the running cases; their cleanup guards release what they held.
pub async fn run(
    target: &Target,
    client: &Arc<dyn DistributedLock>,
    options: &CheckOptions,
    mut progress: impl FnMut(usize, usize, &Report),
) -> CheckRun {
    let started = Instant::now();
    let cases = selected(options);
    let mut slots: Vec<Option<Report>> = vec![None; cases.len()];
    // Dropping the set aborts every task in it, so a dropped run stops its cases.
    let mut running = tokio::task::JoinSet::new();
    let mut next = 0;
    let mut done = 0;
    while done < cases.len() {
        while next < cases.len() && running.len() < options.jobs.max(1) {
            let (target, case, limit) = (target.clone(), cases[next], options.case_timeout);
            let i = next;
            running.spawn(async move { (i, run_case(&target, case, limit).await) });
            next += 1;
        }
        match running.join_next().await {
            Some(Ok((i, report))) => {
                done += 1;
                progress(done, cases.len(), &report);
                slots[i] = Some(report);
            }
            // `run_case` catches a case's panic in a task of its own; this task only awaits it.
            Some(Err(e)) => panic!("a case runner task failed: {e}"),
            None => break,
        }
    }
    let reports: Vec<Report> = slots.into_iter().flatten().collect();
    let (left_held, forgotten) = clean_up(target, client).await;
    let (passed, failed, not_applicable) = conformance_tests::table::counts(&reports);
    let pinned_as = pins::target_for_url(&target.url().await);
    let pin_notes = reports
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::NotApplicable { reason } => Some((
                r.case.clone(),
                Pins::committed().annotate(pinned_as, &r.case, reason),
            )),
            _ => None,
        })
        .collect();
    CheckRun {
        target: target.label().to_owned(),
        capabilities: client.capabilities().to_string(),
        prefix: target.name_prefix().to_owned(),
        cases: reports,
        passed,
        failed,
        not_applicable,
        pinned_as: pinned_as.map(str::to_owned),
        pin_notes,
        left_held,
        forgotten,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Removes what the run left in the store: waits (up to 60 s) for leases that cases let run
/// out on purpose, then [`forget`](lockcore::DistributedLock::forget)s every name of the run,
/// fence counter included (the names are unique to the run, so no one relies on their tokens).
/// Returns the names still held at the end, and how many names were removed.
async fn clean_up(target: &Target, client: &Arc<dyn DistributedLock>) -> (Vec<String>, usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    // Only names under the run's own prefix: nothing else is the run's to delete.
    let prefix = format!("{}/", target.name_prefix());
    let mut left: Vec<String> = target
        .recorded_names()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    let mut forgotten = 0;
    loop {
        let mut still = Vec::new();
        for name in left {
            let Ok(lock_name) = LockName::new(&name) else {
                continue;
            };
            match client.forget(&lock_name).await {
                Ok(true) => forgotten += 1,
                Ok(false) => still.push(name),
                // Not supported, or the store failed: at least say whether it is held.
                Err(_) => {
                    if let Ok(Some(info)) = client.inspect(&lock_name).await
                        && info.is_held()
                    {
                        still.push(name);
                    }
                }
            }
        }
        if still.is_empty() || Instant::now() >= deadline {
            return (still, forgotten);
        }
        left = still;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The run as a table: one row per case (outcome, seconds, message, or reason beside the pinned
/// one), then totals.
pub fn render(run: &CheckRun) -> String {
    let mut out = conformance_tests::table::single_with(&run.cases, &run.pin_notes);
    if run.forgotten > 0 {
        out.push_str(&format!(
            "removed the run's {} lock name(s) from the store, fence counters included\n",
            run.forgotten
        ));
    }
    if !run.left_held.is_empty() {
        out.push_str(&format!(
            "still held after the run: {}\n",
            run.left_held.join(", ")
        ));
    }
    out.push_str(&format!("total {:.2}s\n", run.seconds));
    out
}

/// Whether a report is a failure (for callers that colour or count).
pub fn is_failure(report: &Report) -> bool {
    matches!(report.outcome, Outcome::Failed { .. })
}
