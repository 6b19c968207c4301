//! `dlock check`: the binary against memory and a SQLite file, and the same code path
//! (`dlock_cli::check::run`) against deliberately broken backends, which must fail exactly the cases
//! aimed at their defect.

use std::collections::BTreeSet;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::mutants::{Defect, Toy};
use conformance_tests::{Kind, Target, registry};
use dlock::DistributedLock;
use dlock_cli::check::{CheckOptions, run};

mod common;

use common::dlock;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The capabilities of the store at `url`, as `dlock check` sees them.
fn capabilities_of(url: &str) -> lockcore::Capabilities {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(dlock::connect(url))
        .expect("connect")
        .capabilities()
}

/// Every registry entry appears once in `--json`, with an outcome and a duration; every
/// conformance case the store admits passed, the others are not applicable, and every fault
/// scenario is listed as needing --spawn.
fn assert_complete_json(o: &Output, caps: &lockcore::Capabilities) {
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    let cases = json["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), registry().len(), "{json:#}");
    for (case, entry) in cases.iter().zip(registry()) {
        assert_eq!(case["case"], entry.name);
        assert!(case["seconds"].as_f64().is_some_and(|s| s >= 0.0), "{case}");
        let want = match entry.kind {
            Kind::Case if (entry.needs.admits)(caps) => "passed",
            Kind::Case | Kind::Fault => "not_applicable",
        };
        assert_eq!(case["status"], want, "{case}");
        if entry.kind == Kind::Fault {
            assert!(
                case["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("--spawn")),
                "{case}"
            );
        }
    }
    assert_eq!(json["failed"], 0);
    assert_eq!(json["left_held"].as_array().map(Vec::len), Some(0));
    // The run's total, in the cases' unit: at least their sum (it adds the clean-up).
    let sum: f64 = cases.iter().filter_map(|c| c["seconds"].as_f64()).sum();
    assert!(
        json["seconds"].as_f64().is_some_and(|t| t >= sum),
        "the run's total seconds ({}) is missing or below the cases' sum ({sum})",
        json["seconds"]
    );
    // Every case that ran made names; all of them were removed afterwards.
    assert!(
        json["forgotten"]
            .as_u64()
            .is_some_and(|n| n >= json["passed"].as_u64().unwrap_or(0)),
        "{json:#}"
    );
}

#[test]
fn check_memory_passes_every_applicable_case() {
    let o = common::run(dlock().args(["check", "--url", "memory://check", "--json"]));
    assert_complete_json(&o, &capabilities_of("memory://check"));
}

#[test]
fn check_sqlite_file_passes_every_applicable_case_and_prints_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/check.db", dir.path().display());
    let o = common::run(dlock().args(["check", "--url", &url, "--json"]));
    assert_complete_json(&o, &capabilities_of(&url));
    let o = common::run(dlock().args(["check", "--url", &url, "--cases", "^fencing_tokens"]));
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    let table = text(&o.stdout);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(
        rows.len(),
        5,
        "two cases, the totals, the clean-up and the run's time:\n{table}"
    );
    assert!(
        rows[4].starts_with("total ") && rows[4].ends_with('s'),
        "{table}"
    );
    assert!(rows[0].starts_with("fencing_tokens_increase ") && rows[0].contains(" pass "));
    assert!(
        rows[1].starts_with("fencing_tokens_increase_across_expiry ") && rows[1].contains(" pass ")
    );
    assert_eq!(rows[2], "2 passed, 0 failed, 0 not applicable");
    assert!(
        rows[3].starts_with("removed the run's 2 lock name(s) from the store"),
        "{table}"
    );
}

/// A not-applicable row carries the reason the repository's tests pin for a store of the same
/// kind (the `memory` target here), or says how the run's reason differs from it.
#[test]
fn check_prints_the_pinned_reason_beside_each_not_applicable_row() {
    let cases = "^(rw_unsupported_says_so|client_paused_past_ttl|holder_process_killed)$";
    let o = common::run(dlock().args(["check", "--url", "memory://pins", "--cases", cases]));
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    let table = text(&o.stdout);
    let row = |case: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{case} ")))
            .unwrap_or_else(|| panic!("no row {case}:\n{table}"))
            .to_owned()
    };
    let pinned = conformance_tests::pins::Pins::committed();
    let rw = pinned
        .get("memory", "rw_unsupported_says_so")
        .expect("pinned for memory");
    assert!(
        row("rw_unsupported_says_so").ends_with(&format!("{rw} (pinned for memory)")),
        "{table}"
    );
    let killed = pinned
        .get("memory", "holder_process_killed")
        .expect("pinned for memory");
    assert!(
        row("holder_process_killed").ends_with(&format!(
            "(pinned for memory with another reason: {killed})"
        )),
        "{table}"
    );
    assert!(
        row("client_paused_past_ttl").ends_with("(not pinned: the suite runs it on memory)"),
        "{table}"
    );
    let o = common::run(dlock().args([
        "check",
        "--url",
        "memory://pins",
        "--cases",
        cases,
        "--json",
    ]));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(json["pinned_as"], "memory", "{json:#}");
    assert_eq!(
        json["pin_notes"].as_object().map(|m| m.len()),
        Some(3),
        "{json:#}"
    );
}

#[test]
fn check_refuses_bad_input_before_connecting() {
    let o = common::run(dlock().args(["check", "--url", "memory://x", "--cases", "("]));
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    let o = common::run(dlock().args([
        "check",
        "--url",
        "memory://x",
        "--cases",
        "^nothing_like_this$",
    ]));
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    let o = common::run(dlock().args(["check", "--url", ""]));
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    let o = common::run(dlock().args(["check", "--url", "nosuch://x"]));
    assert_eq!(o.status.code(), Some(78), "{}", text(&o.stderr));
}

#[test]
fn check_list_names_every_entry() {
    let o = common::run(dlock().args(["check", "--list"]));
    assert_eq!(o.status.code(), Some(0));
    let listed = text(&o.stdout);
    for entry in registry() {
        assert!(
            listed.contains(entry.name),
            "{} missing from\n{listed}",
            entry.name
        );
    }
}

/// The cases that fail when `dlock check` runs against a toy backend with `defect`.
fn failing_cases(defect: Defect) -> (BTreeSet<String>, bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let result = rt.block_on(async move {
        let target = Target::new(&format!("mutant-{defect:?}"), "", move |_| async move {
            Ok(Arc::new(Toy::new(defect)) as Arc<dyn DistributedLock>)
        })
        .record_names();
        let client: Arc<dyn DistributedLock> = Arc::new(Toy::new(defect));
        let options = CheckOptions {
            cases: None,
            case_timeout: Duration::from_secs(60),
            jobs: 1,
        };
        let run = run(&target, &client, &options, |_, _, _| {}).await;
        let failed = run
            .cases
            .iter()
            .filter(|r| dlock_cli::check::is_failure(r))
            .map(|r| r.case.clone())
            .collect();
        (failed, run.ok())
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn check_fails_exactly_the_cases_aimed_at_a_sloppy_release() {
    let (failed, ok) = failing_cases(Defect::ReleaseIgnoresOwner);
    assert!(!ok, "a run with failures must not be ok");
    assert_eq!(
        failed,
        set(&["idempotent_release", "owner_only_release"]),
        "release without an owner check"
    );
}

#[test]
fn check_fails_exactly_the_cases_aimed_at_constant_tokens() {
    let (failed, ok) = failing_cases(Defect::ConstantToken);
    assert!(!ok);
    assert_eq!(
        failed,
        set(&[
            "fencing_tokens_increase",
            "fencing_tokens_increase_across_expiry",
            "history_is_safe_under_contention",
            "mutual_exclusion_50_tasks",
            // Both also assert that the next holder's token is higher.
            "ttl_expiry_frees_lock",
            "with_lock_returns_and_releases",
        ]),
        "tokens that do not increase"
    );
}
