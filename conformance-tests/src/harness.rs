//! The `cargo test` side of the suite: every registry entry × every target becomes one named
//! test (`<target>::<case>`), run through [`crate::runner`], so `cargo test` shows the same
//! outcomes `dlock check` does. A not-applicable entry is listed as ignored with its reason,
//! never left out.
//!
//! Each run also writes its reports as JSON to `<dir>/dlock-conformance/<target>.json`, and
//! prints the case × target table of this test binary, and where its not-applicable cells
//! differ from the pinned ones ([`crate::pins`]); `conformance-table` joins the files of every
//! binary into the workspace's table and fails on such a difference.

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::Target;
use crate::registry::registry;
use crate::runner::{CASE_TIMEOUT, Outcome, Report, run_case};

/// Runs the suite as a test binary's `main`: one test per registry entry × target. `dir` is
/// where the reports go (pass `env!("CARGO_TARGET_TMPDIR")`).
///
/// When the binary was started by a fault scenario as a child process
/// ([`crate::faults::holder_process_killed`]), it plays that role instead and never returns.
pub fn main(targets: Vec<Target>, dir: &str) -> ExitCode {
    if let Some(code) = crate::faults::child_main(&targets) {
        return code;
    }
    // A failed case's message carries what the library logged about its locks.
    crate::timeline::install();
    let args = Arguments::from_args();
    let reports = Arc::new(Mutex::new(Vec::<Report>::new()));
    let mut trials = Vec::new();
    for target in &targets {
        for case in registry() {
            let (target, reports) = (target.clone(), reports.clone());
            let name = format!("{}::{}", target.label(), case.name);
            trials.push(Trial::ignorable_test(name, move || {
                let report = run_on_fresh_runtime(&target, case);
                let result = match &report.outcome {
                    Outcome::Passed => Ok(Completion::Completed),
                    Outcome::NotApplicable { reason } => Ok(Completion::ignored_with(format!(
                        "not applicable: {reason}"
                    ))),
                    Outcome::Failed { message } => Err(Failed::from(message.as_str())),
                };
                reports
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(report);
                result
            }));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    let reports = std::mem::take(&mut *reports.lock().unwrap_or_else(|p| p.into_inner()));
    if !reports.is_empty() {
        write_reports(Path::new(dir), &targets, &reports);
        println!("\n{}", crate::table::matrix(&reports));
        note_pins(&reports);
    }
    conclusion.exit_code()
}

/// Says where this binary's not-applicable cells differ from the pinned ones. The test binary
/// does not fail on it (its tests passed); the table step does.
fn note_pins(reports: &[Report]) {
    use crate::pins::{Pins, Scope, compare, rewrite_hint};
    let mismatches = compare(reports, Pins::committed(), Scope::Reported);
    if !mismatches.is_empty() {
        for m in &mismatches {
            println!("PIN  {m}");
        }
        println!("{}\n", rewrite_hint(Scope::Reported));
    }
}

/// Each test gets a runtime of its own, as `#[tokio::test(flavor = "multi_thread")]` would.
fn run_on_fresh_runtime(target: &Target, case: &'static crate::Case) -> Report {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = rt.block_on(run_case(target, case, CASE_TIMEOUT));
    rt.shutdown_timeout(Duration::from_secs(2));
    report
}

fn write_reports(dir: &Path, targets: &[Target], reports: &[Report]) {
    let out = dir.join("dlock-conformance");
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("cannot create {}: {e}", out.display());
        return;
    }
    for target in targets {
        let mine: Vec<&Report> = reports
            .iter()
            .filter(|r| r.target == target.label())
            .collect();
        if mine.is_empty() {
            continue;
        }
        let path = out.join(format!("{}.json", target.label()));
        let json = serde_json::to_string_pretty(&mine).expect("reports serialise");
        if let Err(e) = std::fs::write(&path, json) {
            eprintln!("cannot write {}: {e}", path.display());
        }
    }
}
