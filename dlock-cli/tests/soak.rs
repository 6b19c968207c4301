//! `dlock soak`: short soaks through the binary on servers it starts itself (clean runs must
//! report no anomaly and show the nemesis at work), bad input refused before anything starts,
//! and broken backends through the library, which the judge must catch.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{dlock, run, text};
use conformance_tests::mutants::{Defect, Toy};
use conformance_tests::{BoxFuture, Connect};
use dlock::DistributedLock;
use dlock_cli::soak::{FaultKind, SoakOptions, SoakReport, Store, soak};

/// Runs `dlock soak` with `args` into a temp dir; returns the exit code, the output and the
/// parsed soak.json.
fn soak_cli(args: &[&str]) -> (Option<i32>, String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dlock().arg("soak").args(args).arg("--out").arg(dir.path()));
    let json = std::fs::read_to_string(dir.path().join("soak.json"))
        .map(|t| serde_json::from_str(&t).expect("soak.json parses"))
        .unwrap_or(serde_json::Value::Null);
    (out.status.code(), text(&out), json)
}

/// The checks every clean short soak must pass: exit 0, no anomaly, clients got the lock, every
/// name was held some of the time, the nemesis applied faults of the kinds it was given.
fn assert_clean(code: Option<i32>, output: &str, json: &serde_json::Value, min_faults: u64) {
    assert_eq!(code, Some(0), "{output}");
    common::assert_no_kit_password(output);
    common::assert_no_kit_password(&json.to_string());
    assert_eq!(
        json["anomalies"].as_array().map(Vec::len),
        Some(0),
        "{output}"
    );
    assert!(json["acquisitions"].as_u64().unwrap_or(0) > 10, "{output}");
    for name in json["per_name"].as_array().expect("per_name") {
        assert!(
            name["availability"].as_f64().unwrap_or(0.0) > 0.05,
            "{output}"
        );
    }
    let faults = &json["faults"];
    assert!(
        faults["total"].as_u64().unwrap_or(0) >= min_faults,
        "{output}"
    );
    let kinds: Vec<&str> = json["fault_kinds"]
        .as_array()
        .expect("fault_kinds")
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    for (kind, n) in faults["by_kind"].as_object().expect("by_kind") {
        assert!(
            kinds.contains(&kind.as_str()),
            "{kind} was not asked for: {output}"
        );
        assert!(n.as_u64().unwrap_or(0) > 0);
    }
    assert!(output.contains("anomalies  none"), "{output}");
}

#[test]
fn bad_input_is_refused_before_anything_starts() {
    for (args, says) in [
        (
            &["--spawn", "nope"][..],
            "unknown backend `nope`: use one of sqlite",
        ),
        (
            &["--spawn", "redis", "--faults", "kill,melt"][..],
            "unknown fault `melt`",
        ),
        (
            &["--spawn", "redis", "--duration", "2s"][..],
            "--duration must be at least 5s",
        ),
        (
            &["--spawn", "redis", "--clients", "0"][..],
            "--clients must be 1 to 64",
        ),
        (
            &["--spawn", "sqlite", "--faults", "kill"][..],
            "sqlite cannot take the fault `kill`",
        ),
        (
            &["--spawn", "zk", "--no-persistence"][..],
            "zk always persists",
        ),
        (
            &["--spawn", "redis-cluster", "--faults", "delay"][..],
            "redis-cluster cannot take the fault `delay`",
        ),
    ] {
        // A short duration, so that a refusal that stopped working fails quickly instead of
        // soaking for the default ten minutes.
        let mut args = args.to_vec();
        if !args.contains(&"--duration") {
            args.extend(["--duration", "6s"]);
        }
        let (code, output, json) = soak_cli(&args);
        assert_eq!(code, Some(64), "{args:?}: {output}");
        assert!(output.contains(says), "{args:?}: {output}");
        assert!(json.is_null(), "{args:?} wrote a report");
    }
}

#[test]
fn a_short_soak_on_sqlite_pauses_clients_and_stays_safe() {
    let (code, output, json) = soak_cli(&[
        "--spawn",
        "sqlite",
        "--duration",
        "25s",
        "--clients",
        "4",
        "--names",
        "2",
        "--ttl",
        "1s",
        "--seed",
        "11",
    ]);
    assert_clean(code, &output, &json, 3);
    assert_eq!(
        json["fault_kinds"],
        serde_json::json!(["client-pause"]),
        "{output}"
    );
}

#[test]
fn a_short_soak_on_redis_with_every_fault_stays_safe() {
    let (code, output, json) = soak_cli(&[
        "--spawn",
        "redis",
        "--duration",
        "50s",
        "--clients",
        "5",
        "--names",
        "2",
        "--ttl",
        "1s",
        "--seed",
        "12",
    ]);
    assert_clean(code, &output, &json, 6);
    assert_eq!(
        json["fault_kinds"].as_array().map(Vec::len),
        Some(7),
        "{output}"
    );
}

#[test]
fn a_short_soak_on_zookeeper_expires_sessions_and_stays_safe() {
    let (code, output, json) = soak_cli(&[
        "--spawn",
        "zk",
        "--duration",
        "50s",
        "--clients",
        "4",
        "--names",
        "2",
        "--ttl",
        "2s",
        "--faults",
        "session-kill,client-pause,pause,blackhole",
        "--seed",
        "13",
    ]);
    assert_clean(code, &output, &json, 4);
}

#[test]
fn redis_without_persistence_shows_its_documented_unsafety_and_fencing_still_holds() {
    let (code, output, json) = soak_cli(&[
        "--spawn",
        "redis",
        "--no-persistence",
        "--faults",
        "kill,restart,client-pause",
        "--duration",
        "30s",
        "--clients",
        "4",
        "--names",
        "1",
        "--ttl",
        "1s",
        "--seed",
        "31",
    ]);
    // Restarted empty, the server hands out token 1 again: shown as documented, and the fenced
    // resource refuses the writes of the holders whose tokens went back; no anomaly.
    assert_eq!(code, Some(0), "{output}");
    assert_eq!(
        json["anomalies"].as_array().map(Vec::len),
        Some(0),
        "{output}"
    );
    let documented = json["documented_unsafe"]
        .as_array()
        .expect("documented_unsafe");
    assert!(
        documented.iter().any(|d| d["kind"] == "token-order"),
        "{output}"
    );
    assert!(output.contains("documented  token-order"), "{output}");
}

/// A store whose clients share one broken toy backend.
fn toy_store(defect: Defect) -> Store<'static> {
    let connect: Connect = Arc::new(
        move |_url: String| -> BoxFuture<dlock::Result<Arc<dyn DistributedLock>>> {
            Box::pin(async move { Ok(Arc::new(Toy::new(defect)) as Arc<dyn DistributedLock>) })
        },
    );
    Store {
        label: format!("mutant-{defect:?}"),
        client_urls: vec![String::new()],
        direct_url: String::new(),
        connect,
        servers: Vec::new(),
        links: &[],
        sessions: false,
        declared_unsafe: Vec::new(),
    }
}

async fn soak_toy(defect: Defect, seed: u64) -> SoakReport {
    let opts = SoakOptions {
        duration: Duration::from_secs(8),
        clients: 4,
        names: 1,
        faults: vec![FaultKind::ClientPause],
        seed,
        ttl: Duration::from_millis(500),
    };
    soak(&toy_store(defect), &opts, &|_| {})
        .await
        .expect("the soak runs")
}

fn kinds(report: &SoakReport) -> Vec<&str> {
    report.anomalies.iter().map(|a| a.kind.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_catches_a_lock_that_is_not_exclusive() {
    let report = soak_toy(Defect::NotExclusive, 21).await;
    assert!(
        kinds(&report).contains(&"overlap"),
        "{:?}",
        report.anomalies
    );
    assert!(!report.is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_catches_tokens_that_do_not_grow() {
    let report = soak_toy(Defect::ConstantToken, 22).await;
    assert!(
        kinds(&report).contains(&"token-order"),
        "{:?}",
        report.anomalies
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_catches_renewals_that_do_not_reach_the_store() {
    // Extend says yes and changes nothing: every hold longer than the ttl (about half of
    // them) ends in the store while its client still counts on it, and a waiter is granted
    // the name inside the holder's window.
    let report = soak_toy(Defect::ExtendIsNoop, 24).await;
    assert!(
        kinds(&report).contains(&"overlap"),
        "{:?}",
        report.anomalies
    );
}
