//! `dlock compare`: the same conformance cases, fault scenarios and benchmark against several
//! backends, one after another, for a report that sets them side by side.
//!
//! A backend comes from one of three [`Source`]s: a `--spawn` name (servers the test kit starts
//! as children of this process and stops when the backend is done, so fault scenarios can
//! break private servers of its kind), a `--url` (a store that exists; the scenarios that need
//! server control are then reported as [`Verdict::NeedsSpawn`]), or a [`Target`] a program
//! builds itself (for example a deliberately broken backend from `conformance_tests::mutants`).
//!
//! For each backend, in one run: its capability sheet, every case of
//! `conformance_tests::registry` (passed, failed with the message, or not applicable with the
//! reason), every fault scenario with its verdict against what the backend declares in
//! `conformance_tests::catalog`, and `dlock bench` (uncontended pairs beside the backend's raw
//! floor; contended clients on one name). [`CompareReport`] holds it all; [`render`] draws
//! `report.md`, `report.html` (charts inline) and the terminal table from it.

mod chart;
mod html;
mod model;
pub mod render;
mod view;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use conformance_tests::catalog;
use conformance_tests::spawn::{SpawnName, Stack};
use conformance_tests::{Kind, Target};
use lockcore::DistributedLock;

pub use model::{
    BackendReport, Bench, CompareReport, RunOutcome, Scenario, Sheet, Verdict, min_token_of,
};

use crate::bench::{self, BenchOptions};
use crate::check::{self, CheckOptions};
use dlock::redact;

/// Where one backend of the comparison comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Servers the test kit starts (and stops when this backend is done).
    Spawn(SpawnName),
    /// An existing store; its fault scenarios are reported as needing `--spawn`.
    Url(String),
    /// A target a program built: cases and fault scenarios as the target declares them; no
    /// benchmark (it connects by URL).
    Target(Target),
}

impl Source {
    /// The name the report gives it before anything is connected.
    fn label(&self) -> String {
        match self {
            Source::Spawn(name) => name.to_string(),
            Source::Url(url) => dlock::scheme_of(url).unwrap_or_else(|_| "url".to_owned()),
            Source::Target(target) => target.label().to_owned(),
        }
    }

    fn shown(&self) -> String {
        match self {
            Source::Spawn(_) => "spawned".to_owned(),
            Source::Url(url) => redact(url),
            Source::Target(_) => "library target".to_owned(),
        }
    }
}

/// What to compare and how long to measure.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// The backends, in the order the report lists them.
    pub sources: Vec<Source>,
    /// Shorter benchmark phases (1 s instead of 5 s) and more cases at once.
    pub quick: bool,
    /// How long one case or scenario may run before it fails.
    pub case_timeout: Duration,
    /// How many cases or scenarios of one backend run at once; `None`: 2, or 4 when `quick`.
    /// 1 gives the timing-sensitive cases the machine to themselves, for a loaded machine.
    pub jobs: Option<usize>,
}

impl CompareOptions {
    /// The given backends, full length.
    pub fn new(sources: Vec<Source>) -> Self {
        CompareOptions {
            sources,
            quick: false,
            case_timeout: Duration::from_secs(120),
            jobs: None,
        }
    }

    /// How many cases or scenarios of one backend run at once.
    fn jobs(&self) -> usize {
        self.jobs.unwrap_or(if self.quick { 4 } else { 2 }).max(1)
    }

    /// The benchmark for the store at `url`: one phase's measured time, its warm-up, 8 clients
    /// holding 1 ms each (the contended figures `dlock bench` prints by default).
    fn bench(&self, url: &str) -> BenchOptions {
        // Full length is `dlock bench`'s own default (5 s a phase after 1 s of warm-up): a
        // freshly started server, ZooKeeper's JVM above all, needs the warm-up, and shorter
        // phases moved ZooKeeper's ratio to its floor between 0.64 and 0.86 from run to run.
        let mut b = BenchOptions::new(url);
        if self.quick {
            b = b
                .duration(Duration::from_secs(1))
                .warmup(Duration::from_millis(200));
        }
        b.clients(8)
            .hold(Duration::from_millis(1))
            .name(format!("dlock-compare/{:08x}", rand::random::<u32>()))
    }

    /// The semaphore benchmark for the store at `url`: 8 clients holding 10 ms each on 4
    /// permits, as long as one phase of [`CompareOptions::bench`].
    fn semaphore_bench(&self, url: &str) -> BenchOptions {
        let b = self.bench(url);
        let name = format!("{}-semaphore", b.name.clone().unwrap_or_default());
        b.mode(bench::Mode::Contended)
            .hold(Duration::from_millis(10))
            .permits(4)
            .name(name)
    }

    /// The benchmark's expected length, for the time-left estimate: four phases (uncontended,
    /// floor, contended, semaphore), each with its warm-up.
    fn bench_seconds(&self) -> f64 {
        let b = self.bench("");
        4.0 * (b.duration + b.warmup).as_secs_f64()
    }
}

/// Receives the run's [`Status`] as it changes (often: draw it, do not log every call).
pub type Progress = Arc<dyn Fn(&Status) + Send + Sync>;

/// Where a run is, for a progress line.
#[derive(Clone, Debug)]
pub struct Status {
    /// The backend being measured.
    pub backend: String,
    /// Its position (1-based) among `of`.
    pub index: usize,
    /// How many backends.
    pub of: usize,
    /// What it is doing: `starting servers`, `case 12/58 lock_many_…`, `bench contended`.
    pub phase: String,
    /// An estimate of the time left for the whole run.
    pub left: Duration,
}

/// Registry entries per backend: every case and scenario.
fn entries() -> usize {
    conformance_tests::registry().len()
}

/// Estimates the time left: the mean time per entry so far (or 0.5 s before the first) for
/// the entries left, plus a benchmark per backend left.
struct Clock {
    entries_done: usize,
    entry_seconds: f64,
    entries_total: usize,
    benches_left: usize,
    bench_seconds: f64,
}

impl Clock {
    fn left(&self, bench_elapsed: f64) -> Duration {
        let per_entry = if self.entries_done == 0 {
            0.5
        } else {
            self.entry_seconds / self.entries_done as f64
        };
        let entries = (self.entries_total - self.entries_done) as f64 * per_entry;
        let benches = (self.benches_left as f64 * self.bench_seconds - bench_elapsed).max(0.0);
        Duration::from_secs_f64(entries + benches)
    }
}

/// Runs the comparison, calling `progress` as it goes.
///
/// # Cancel safety
/// Dropping the future stops the running case or benchmark (their cleanup guards release what
/// they held) and kills every server it started.
pub async fn run(options: &CompareOptions, progress: Progress) -> CompareReport {
    let started = Instant::now();
    let when = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let of = options.sources.len();
    let mut clock = Clock {
        entries_done: 0,
        entry_seconds: 0.0,
        entries_total: of * entries(),
        benches_left: of,
        bench_seconds: options.bench_seconds(),
    };
    let mut backends = Vec::with_capacity(of);
    for (i, source) in options.sources.iter().enumerate() {
        // Two sources of one kind (a spawned redis and a redis URL) get `redis` and `redis-2`.
        let base = source.label();
        let mut label = base.clone();
        let mut n = 1;
        while backends.iter().any(|b: &BackendReport| b.name == label) {
            n += 1;
            label = format!("{base}-{n}");
        }
        let report = backend(options, source, label, i + 1, of, &mut clock, &progress).await;
        backends.push(report);
    }
    CompareReport {
        dlock_version: env!("CARGO_PKG_VERSION").to_owned(),
        started: when,
        machine: machine(),
        quick: options.quick,
        seconds: started.elapsed().as_secs_f64(),
        backends,
    }
}

/// `2 cores, Debian GNU/Linux 12 (bookworm), x86_64` (the OS's own name from
/// `/etc/os-release` where it has one, else `linux`).
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_owned());
    format!(
        "{cores} core{}, {os}, {}",
        if cores == 1 { "" } else { "s" },
        std::env::consts::ARCH
    )
}

/// In a process a fault scenario started to hold a lock from another process (the scenario
/// runs this same program again): holds it as told and returns the exit code once killed.
/// `None` in every other process. Call it first thing in `main`.
pub fn holder_child() -> Option<std::process::ExitCode> {
    let label = conformance_tests::faults::child_label()?;
    conformance_tests::faults::child_main(&[url_target(&label, "")])
}

/// Connects `dlock::connect`'s way.
fn url_target(label: &str, url: &str) -> Target {
    Target::new(label, url, |url| async move { dlock::connect(&url).await })
}

/// Measures one backend.
async fn backend(
    options: &CompareOptions,
    source: &Source,
    label: String,
    index: usize,
    of: usize,
    clock: &mut Clock,
    progress: &Progress,
) -> BackendReport {
    let started = Instant::now();
    let say = |clock: &Clock, phase: String| {
        progress(&Status {
            backend: label.clone(),
            index,
            of,
            phase,
            left: clock.left(0.0),
        })
    };
    let unavailable = |clock: &mut Clock, why: String| {
        clock.entries_total -= entries();
        clock.benches_left -= 1;
        BackendReport::unavailable(&label, &source.shown(), why)
    };
    // The stack lives until this backend is done: its servers are stopped then.
    let mut _stack = None;
    let (target, url) = match source {
        Source::Spawn(name) => {
            say(clock, "starting servers".to_owned());
            let stack = match Stack::start(*name, 0).await {
                Ok(stack) => stack,
                Err(e) => return unavailable(clock, format!("cannot start {name}: {e}")),
            };
            let url = stack.direct_url.clone();
            _stack = Some(stack);
            let target = catalog::declare(*name, url_target(name.as_str(), &url));
            (target, Some(url))
        }
        Source::Url(url) => (
            check::target_for_url(url, &label),
            Some(url.clone()).filter(|u| !u.is_empty()),
        ),
        Source::Target(target) => (target.clone(), None),
    };
    let spawned = target.can_spawn() || target.runs_faults();
    let client: Arc<dyn DistributedLock> = match target.connect(&target.url().await).await {
        Ok(client) => client,
        Err(e) => return unavailable(clock, format!("cannot connect: {e}")),
    };
    let caps = client.capabilities();
    let check_options = CheckOptions {
        cases: None,
        case_timeout: options.case_timeout,
        jobs: options.jobs(),
    };
    let entry_start = Instant::now();
    let mut last = 0.0;
    let mut run = check::run(&target, &client, &check_options, |done, total, report| {
        let now = entry_start.elapsed().as_secs_f64();
        clock.entries_done += 1;
        clock.entry_seconds += now - last;
        last = now;
        say(clock, format!("case {done}/{total} {}", report.case));
    })
    .await;
    let mut cases = Vec::new();
    let mut scenarios = Vec::new();
    for report in std::mem::take(&mut run.cases) {
        let entry = conformance_tests::registry::find(&report.case);
        if entry.is_some_and(|e| e.kind == Kind::Fault) {
            scenarios.push(scenario(&target, report, spawned));
        } else {
            cases.push(report);
        }
    }
    let bench = match url {
        Some(url) => {
            let watcher = |semaphore| {
                Arc::new(BenchProgress {
                    progress: progress.clone(),
                    backend: label.clone(),
                    index,
                    of,
                    left_before: clock.left(0.0).as_secs_f64(),
                    per_phase: options.bench_seconds() / 4.0,
                    semaphore,
                })
            };
            let mut bench =
                match bench::run_with_progress(&options.bench(&url), watcher(false)).await {
                    Ok(report) => Bench {
                        uncontended: report.uncontended,
                        contended: report.contended,
                        ..Bench::default()
                    },
                    Err(e) => Bench {
                        error: Some(format!("the benchmark could not run: {e}")),
                        ..Bench::default()
                    },
                };
            if caps.native.semaphore && bench.error.is_none() {
                let sem = options.semaphore_bench(&url);
                match bench::run_with_progress(&sem, watcher(true)).await {
                    Ok(report) => bench.semaphore = report.contended,
                    Err(e) => {
                        bench.error = Some(format!("the semaphore benchmark could not run: {e}"))
                    }
                }
            }
            bench
        }
        None => Bench {
            error: Some("not run: the benchmark connects by URL, and this target has none".into()),
            ..Bench::default()
        },
    };
    clock.benches_left -= 1;
    if matches!(source, Source::Url(_)) {
        forget_bench_names(&client, &bench).await;
    }
    BackendReport {
        name: label.clone(),
        source: source.shown(),
        unavailable: None,
        sheet: Some(Sheet::of(&caps)),
        cases,
        scenarios,
        pinned_as: run.pinned_as,
        pin_notes: run.pin_notes,
        bench,
        left_held: run.left_held,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Removes the benchmark's lock names from a store the user gave (fence counters included: the
/// names are the run's own, `dlock-compare/<random>/...`), as the cases' names are. A name that
/// cannot be forgotten stays: it is harmless, under a prefix no one else uses.
async fn forget_bench_names(client: &Arc<dyn DistributedLock>, bench: &Bench) {
    let names = [
        bench.uncontended.as_ref().map(|u| u.name.as_str()),
        bench.contended.as_ref().map(|c| c.name.as_str()),
        bench.semaphore.as_ref().map(|c| c.name.as_str()),
    ];
    for name in names.into_iter().flatten() {
        if let Ok(name) = lockcore::LockName::new(name) {
            let _ = client.forget(&name).await;
        }
    }
}

/// A scenario's report with its verdict and what the backend declares for it.
fn scenario(target: &Target, report: conformance_tests::Report, spawned: bool) -> Scenario {
    let declared = target.expectation(&report.case);
    let verdict = Verdict::of(&report.outcome, declared, spawned);
    let message = match &report.outcome {
        conformance_tests::Outcome::Passed => None,
        conformance_tests::Outcome::Failed { message } => Some(message.clone()),
        conformance_tests::Outcome::NotApplicable { reason } => Some(reason.clone()),
    };
    Scenario {
        scenario: report.case,
        verdict,
        declared: declared.and_then(|d| match d {
            conformance_tests::Expect::Safe => None,
            conformance_tests::Expect::DocumentedUnsafe(why)
            | conformance_tests::Expect::NotApplicable(why) => Some(why.to_owned()),
        }),
        message,
        seconds: report.seconds,
    }
}

/// Forwards the benchmark's progress as a status line.
struct BenchProgress {
    progress: Progress,
    backend: String,
    index: usize,
    of: usize,
    /// The run's time left when the benchmark started.
    left_before: f64,
    /// One phase's expected length, warm-up included.
    per_phase: f64,
    /// Whether this is the semaphore's run (the fourth phase), not the lock's three.
    semaphore: bool,
}

impl bench::Progress for BenchProgress {
    fn update(&self, phase: bench::Phase, elapsed: Duration, _total: Duration) {
        let before = match phase {
            _ if self.semaphore => 3.0,
            bench::Phase::Uncontended => 0.0,
            bench::Phase::Floor => 1.0,
            _ => 2.0,
        };
        let spent = before * self.per_phase + elapsed.as_secs_f64();
        (self.progress)(&Status {
            backend: self.backend.clone(),
            index: self.index,
            of: self.of,
            phase: if self.semaphore {
                "bench semaphore".to_owned()
            } else {
                format!("bench {phase}")
            },
            left: Duration::from_secs_f64((self.left_before - spent).max(0.0)),
        });
    }
}
