//! The suite's own check: every mutant ([`Mutant::all`], and a few defects laid over the kit's
//! Redis for the fault scenarios) against every registry entry, a bounded number at a time, through the runner `dlock check` uses. It fails when a mutant
//! survives every case, when a case kills no mutant (but those in [`UNKILLABLE`], each with its
//! reason), and when a correct store the mutants are copies of ([`Mutant::baselines`]) fails a
//! case: a kill must be the defect's, not the base's. Prints the kill matrix.
//!
//! A failure by the runner's own time limit does not count as a kill (a case that hangs proves
//! nothing about what it asserts); a case's own bounded wait that runs out does (it is the
//! case's liveness assertion, with a margin many times what a correct store needs).

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::catalog::declare;
use conformance_tests::kit::Redis;
use conformance_tests::mutants::{Mutant, Mutated, Twist, UNKILLABLE, gaps};
use conformance_tests::spawn::SpawnName;
use conformance_tests::{Outcome, Target, registry, run_case};
use lockcore::DistributedLock;

/// Cases run at once: most of a case's time is sleeps and bounded waits, not CPU.
const AT_ONCE: usize = 8;
/// The runner's limit for one case; above every case's own bounded waits.
const LIMIT: Duration = Duration::from_secs(150);

struct Cell {
    target: String,
    baseline: bool,
    case: &'static str,
    outcome: Outcome,
    seconds: f64,
}

/// The defects laid over a real store, the kit's Redis: each with Redis's own declarations of
/// the fault scenarios, which then start private Redis servers to break.
const ON_REDIS: [Twist; 3] = [
    Twist::ValidityOverclaimed,
    Twist::ExtendSkipsStore,
    Twist::ExpiresEarly,
];

fn redis_mutant(twist: Twist) -> Target {
    let target = Target::lazy(
        &format!("mutant-redis-{twist:?}"),
        || async { Redis::shared().await.expect("kit redis-server").url() },
        move |url| async move {
            let inner = backend_redis::connect(&url).await?;
            Ok(Arc::new(Mutated::new(inner, twist)) as Arc<dyn DistributedLock>)
        },
    );
    declare(SpawnName::Redis, target)
}

fn hung(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Failed { message } if message.starts_with("did not finish within"))
}

fn main() -> ExitCode {
    let mut mutants: Vec<Target> = Mutant::all().into_iter().map(Mutant::target).collect();
    mutants.extend(ON_REDIS.map(redis_mutant));
    // A fault scenario that kills a holder process starts this program again as the holder.
    if let Some(code) = conformance_tests::faults::child_main(&mutants) {
        return code;
    }
    // `DLOCK_MUTANTS=<text>` runs only the cells whose "<target> <case>" contains the text,
    // to look at one; such a partial run does not judge the matrix.
    let only = std::env::var("DLOCK_MUTANTS").ok();
    let started = Instant::now();
    // A case's panic is its failure, and its message is in the outcome: print only the
    // panics of this program's own thread.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("main") {
            default_hook(info);
        }
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut jobs: Vec<(Target, bool)> =
        Mutant::baselines().into_iter().map(|t| (t, true)).collect();
    jobs.extend(mutants.iter().map(|m| (m.clone(), false)));
    let cells: Vec<Cell> = rt.block_on(async {
        let gate = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
        let mut set = tokio::task::JoinSet::new();
        for (target, baseline) in &jobs {
            for case in registry() {
                let cell = format!("{} {}", target.label(), case.name);
                if only.as_deref().is_some_and(|o| !cell.contains(o)) {
                    continue;
                }
                let (target, baseline, gate) = (target.clone(), *baseline, gate.clone());
                set.spawn(async move {
                    let _turn = gate.acquire_owned().await.expect("gate");
                    let report = run_case(&target, case, LIMIT).await;
                    Cell {
                        target: report.target,
                        baseline,
                        case: case.name,
                        outcome: report.outcome,
                        seconds: report.seconds,
                    }
                });
            }
        }
        let total = set.len();
        let mut cells = Vec::with_capacity(total);
        while let Some(cell) = set.join_next().await {
            let cell = cell.expect("a case task");
            if !matches!(cell.outcome, Outcome::NotApplicable { .. }) {
                println!(
                    "[{:>4}/{total} {:>5.0}s] {:<36} {:<48} {} ({:.1}s)",
                    cells.len() + 1,
                    started.elapsed().as_secs_f64(),
                    cell.target,
                    cell.case,
                    cell.outcome.short(),
                    cell.seconds
                );
            }
            cells.push(cell);
        }
        cells
    });
    rt.shutdown_timeout(Duration::from_secs(1));

    let mut problems = Vec::new();
    for c in cells.iter().filter(|c| c.baseline) {
        if let Outcome::Failed { message } = &c.outcome {
            problems.push(format!(
                "the correct store {} failed {}: {message}",
                c.target, c.case
            ));
        }
    }
    let mut kills: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut hangs = Vec::new();
    let mut messages = String::new();
    for c in cells.iter().filter(|c| !c.baseline) {
        let killed = kills.entry(c.target.clone()).or_default();
        if hung(&c.outcome) {
            hangs.push(format!("{} × {}", c.target, c.case));
        } else if let Outcome::Failed { message } = &c.outcome {
            killed.insert(c.case.to_owned());
            messages.push_str(&format!("== {} × {}\n{message}\n\n", c.target, c.case));
        }
    }
    let messages_at = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("mutant-kills.txt");
    match std::fs::write(&messages_at, messages) {
        Ok(()) => println!("why each kill failed: {}", messages_at.display()),
        Err(e) => println!("cannot write {}: {e}", messages_at.display()),
    }
    if only.is_none() {
        problems.extend(gaps(&kills));
    }

    println!("\nkill matrix (mutant: the cases that fail against it)");
    for (mutant, cases) in &kills {
        let cases: Vec<&str> = cases.iter().map(String::as_str).collect();
        println!("  {mutant} ({}): {}", cases.len(), cases.join(", "));
    }
    println!("\ncases and the mutants they kill");
    for case in registry() {
        let by: Vec<&str> = kills
            .iter()
            .filter(|(_, k)| k.contains(case.name))
            .map(|(m, _)| m.trim_start_matches("mutant-"))
            .collect();
        let note = UNKILLABLE
            .iter()
            .find(|(n, _)| *n == case.name)
            .map_or(String::new(), |(_, why)| format!(" [exempt: {why}]"));
        println!("  {} ({}): {}{note}", case.name, by.len(), by.join(", "));
    }
    if !hangs.is_empty() {
        println!(
            "\nran into the runner's {LIMIT:?} limit (not counted as kills): {}",
            hangs.join("; ")
        );
    }
    let baseline_runs = cells
        .iter()
        .filter(|c| c.baseline && c.outcome == Outcome::Passed)
        .count();
    println!(
        "\n{} mutants, {} case runs, {baseline_runs} baseline passes, in {:.0}s",
        mutants.len(),
        cells
            .iter()
            .filter(|c| !matches!(c.outcome, Outcome::NotApplicable { .. }))
            .count(),
        started.elapsed().as_secs_f64()
    );
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    let checks = mutants.len() + registry().len() + 1;
    let failed = problems.len().min(checks);
    println!("mutants: {} passed, {failed} failed", checks - failed);
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
