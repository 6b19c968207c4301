//! The bench engine against memory:// for short durations. Speed and latency values are never
//! asserted: only that every field is measured and that mutual exclusion held.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_cli::bench::{self, BenchOptions, Mode, Phase, Progress};

fn short(url: &str, mode: Mode) -> BenchOptions {
    BenchOptions::new(url)
        .mode(mode)
        .duration(Duration::from_millis(300))
        .warmup(Duration::from_millis(50))
        .clients(4)
        .hold(Duration::from_millis(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_reports_pairs_and_the_floor() {
    let report = bench::run(&short("memory://bench-u", Mode::Uncontended))
        .await
        .unwrap();
    assert_eq!(report.backend, "memory");
    assert_eq!(report.mode, Mode::Uncontended);
    assert!(report.contended.is_none());
    let u = report.uncontended.expect("uncontended phase ran");
    assert!(u.pairs > 0);
    assert_eq!(u.errors, 0, "{:?}", u.first_error);
    assert_eq!(u.latency.count, u.pairs);
    assert!(u.pairs_per_sec > 0.0);
    assert!(u.latency.p50_us > 0.0);
    assert!(u.latency.p50_us <= u.latency.p99_us && u.latency.p99_us <= u.latency.max_us);
    let floor = u.floor.expect("memory:// has a raw floor");
    assert!(floor.pairs > 0);
    assert!(!floor.description.is_empty());
    assert!(floor.ratio > 0.0);
    let expected = u.pairs_per_sec / floor.pairs_per_sec;
    assert!((floor.ratio - expected).abs() < 1e-9);
    // 300 ms of each loop in 200 ms turns: at least one round of both, and the spread only
    // when there were two.
    match floor.rounds {
        0 => assert!(
            floor.ratio_p25.is_none() && floor.self_ratio.is_none(),
            "{floor:?}"
        ),
        _ => {
            let (p25, p75) = (floor.ratio_p25.unwrap(), floor.ratio_p75.unwrap());
            assert!(floor.rounds >= 2 && p25 > 0.0 && p25 <= p75, "{floor:?}");
            assert!(floor.self_ratio.unwrap() > 0.0, "{floor:?}");
        }
    }
}

/// A dual lock is judged against both stores' floors one after the other (its pairs make the
/// same round trips), so it reports a floor ratio and a contended limit like every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_reports_both_stores_floors_and_a_limit() {
    let url = "dual://?first=memory%3A%2F%2Fbench-d1&second=memory%3A%2F%2Fbench-d2";
    let report = bench::run(&short(url, Mode::All)).await.unwrap();
    assert_eq!(report.backend, "dual");
    let u = report.uncontended.expect("uncontended phase ran");
    for floor in [
        u.floor.expect("a raw floor"),
        u.fenced_floor.expect("a fenced floor"),
    ] {
        assert!(floor.pairs > 0 && floor.ratio > 0.0, "{floor:?}");
        assert!(
            floor.description.starts_with("first store: ")
                && floor.description.contains("; then second store: "),
            "{}",
            floor.description
        );
    }
    let c = report.contended.expect("contended phase ran");
    assert_eq!(c.violations, 0);
    assert!(c.floor_pair_p50_us.is_some_and(|p| p > 0.0));
    assert!(c.of_limit.is_some_and(|f| f > 0.0), "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_clients_take_turns_without_overlap() {
    let report = bench::run(&short("memory://bench-c", Mode::Contended))
        .await
        .unwrap();
    assert!(report.uncontended.is_none());
    let c = report.contended.expect("contended phase ran");
    assert_eq!(c.violations, 0);
    assert_eq!(c.errors, 0, "{:?}", c.first_error);
    assert_eq!(c.clients, 4);
    assert_eq!(c.per_client.len(), 4);
    assert!(c.clients_that_acquired > 1, "{:?}", c.per_client);
    assert_eq!(c.acquisitions, c.per_client.iter().sum::<u64>());
    assert_eq!(c.wait.count, c.acquisitions);
    assert!(c.handoff.count > 0, "no handoff between different clients");
    assert!(c.handoff.count <= c.acquisitions);
    assert_eq!(c.per_client_min, *c.per_client.iter().min().unwrap());
    assert_eq!(c.per_client_max, *c.per_client.iter().max().unwrap());
    assert!(c.fairness > 0.0 && c.fairness <= 1.0);
    assert!(c.ttl_ms >= 5000);
    assert!(c.acquisitions_per_sec > 0.0);
    // The limit comes from the floor's median pair, measured on its own in a contended-only run.
    let floor = c.floor_pair_p50_us.expect("memory:// has a floor");
    let limit = c.limit_per_sec.expect("a limit with a floor");
    assert!(floor > 0.0);
    let expected = 1e6 / (c.hold_ms * 1000.0 + floor);
    assert!(
        (limit - expected).abs() < 1e-6 * expected,
        "{limit} vs {expected}"
    );
    let of = c.of_limit.expect("a ratio with a limit");
    assert!((of - c.acquisitions_per_sec / limit).abs() < 1e-9, "{of}");
    let in_holds = c.wait.p50_us / (c.hold_ms * 1000.0);
    assert!((c.wait_p50_holds - in_holds).abs() < 1e-9, "{c:?}");
    assert!(c.wait_p50_holds <= c.wait_p99_holds, "{c:?}");
    assert!(c.server_connections.is_none(), "memory:// has no server");
}

/// On a database server the contended phase says how many connections its clients opened there,
/// and the server's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_clients_on_a_server_report_their_connections() {
    let pg = conformance_tests::kit::Postgres::shared()
        .await
        .expect("kit PostgreSQL");
    let report = bench::run(&short(&pg.url(), Mode::Contended))
        .await
        .unwrap();
    let c = report.contended.expect("contended phase ran");
    assert_eq!(c.errors, 0, "{:?}", c.first_error);
    let s = c
        .server_connections
        .expect("PostgreSQL's connections are sampled");
    assert!(
        s.peak >= s.before + 4 && s.per_client >= 1.0,
        "four clients hold at least a connection each: {s:?}"
    );
    assert_eq!(s.limit, 300, "the kit's max_connections");
    assert!(!s.reached_limit && s.refused.is_none(), "{s:?}");
}

#[derive(Default)]
struct Recorder {
    phases: Mutex<Vec<Phase>>,
    calls: AtomicU64,
}

impl Progress for Recorder {
    fn update(&self, phase: Phase, elapsed: Duration, total: Duration) {
        assert!(elapsed <= total);
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut phases = self.phases.lock().unwrap();
        if phases.last() != Some(&phase) {
            phases.push(phase);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_mode_runs_every_phase_and_serialises() {
    let progress = Arc::new(Recorder::default());
    let report = bench::run_with_progress(&short("memory://bench-a", Mode::All), progress.clone())
        .await
        .unwrap();
    assert!(report.uncontended.is_some() && report.contended.is_some());
    assert_eq!(
        *progress.phases.lock().unwrap(),
        vec![Phase::Uncontended, Phase::Floor, Phase::Contended]
    );
    let json = serde_json::to_value(&report).unwrap();
    for pointer in [
        "/url",
        "/backend",
        "/mode",
        "/uncontended/pairs_per_sec",
        "/uncontended/latency/p50_us",
        "/uncontended/latency/p999_us",
        "/uncontended/floor/ratio",
        "/contended/acquisitions_per_sec",
        "/contended/handoff/p99_us",
        "/contended/wait/max_us",
        "/contended/per_client_min",
        "/contended/fairness",
        "/contended/violations",
        "/contended/limit_per_sec",
        "/contended/of_limit",
    ] {
        assert!(
            json.pointer(pointer).is_some(),
            "missing {pointer} in {json}"
        );
    }
    assert_eq!(json["mode"], "all");
    assert_eq!(json["contended"]["violations"], 0);
}

#[tokio::test]
async fn bad_options_and_urls_are_errors() {
    let zero = BenchOptions::new("memory://bench-bad").duration(Duration::ZERO);
    assert!(matches!(
        bench::run(&zero).await,
        Err(dlock::Error::InvalidArgument { .. })
    ));
    let none = BenchOptions::new("memory://bench-bad").clients(0);
    assert!(bench::run(&none).await.is_err());
    let unknown = short("nope://u:hunter2@h", Mode::All);
    let err = bench::run(&unknown).await.unwrap_err();
    assert!(matches!(err, dlock::Error::UnsupportedScheme { .. }));
    assert!(!format!("{unknown:?}").contains("hunter2"));
}

/// Dropping the bench's future stops all of it: once the contended name is free, nobody from
/// the dropped run takes it again. (A client still running would, within one 1 ms hold cycle:
/// its acquire waits forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_bench_stops_its_clients() {
    use dlock::LockExt;
    let opts = short("memory://bench-drop", Mode::Contended)
        .duration(Duration::from_secs(120))
        .name("drop-test".to_owned());
    let run = bench::run(&opts);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), run)
            .await
            .is_err(),
        "a 120 s bench finished within 0.5 s"
    );
    let probe = dlock::connect("memory://bench-drop").await.unwrap();
    let name = "drop-test/contended";
    let no_wait = dlock::AcquireOptions::new().wait(dlock::Wait::No);
    // The dropped clients' guards release in the background; then the name can be had.
    let mut mine = None;
    for _ in 0..200 {
        if let Some(g) = probe.try_lock(name, &no_wait).await.unwrap() {
            mine = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mine = mine.expect("the dropped bench's clients let go of the name within 5 s");
    let token = mine.fencing_token();
    mine.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let info = probe
        .inspect(&dlock::LockName::new(name).unwrap())
        .await
        .unwrap()
        .expect("the name was used");
    assert!(
        !info.is_held(),
        "a client of the dropped bench took the lock again"
    );
    assert_eq!(
        info.token,
        Some(token),
        "the name was acquired after the drop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_bench_counts_holders_and_never_more_than_its_permits() {
    let opts = short("memory://bench-sem", Mode::All).clients(6).permits(3);
    let report = bench::run(&opts).await.unwrap();
    let u = report.uncontended.expect("uncontended phase ran");
    assert!(u.pairs > 0);
    assert_eq!(u.errors, 0, "{:?}", u.first_error);
    let c = report.contended.expect("contended phase ran");
    assert_eq!(c.permits, Some(3));
    assert_eq!(c.violations, 0);
    assert_eq!(c.errors, 0, "{:?}", c.first_error);
    assert!(c.acquisitions > 0);
    assert_eq!(
        c.handoff.count, 0,
        "no one-to-one handoff with several holders"
    );
    // Never more than the permits at once; more than one at once on average, which a
    // semaphore that behaved as a mutex could not reach.
    assert!(c.mean_holders <= 3.0 + 1e-9, "{}", c.mean_holders);
    assert!(c.mean_holders > 1.0, "{}", c.mean_holders);
    assert!(c.limit_per_sec.is_some());
    // The lock's bench says one holder at most.
    let lock = bench::run(&short("memory://bench-sem-lock", Mode::Contended))
        .await
        .unwrap()
        .contended
        .expect("contended phase ran");
    assert_eq!(lock.permits, None);
    assert!(lock.mean_holders <= 1.0 + 1e-9, "{}", lock.mean_holders);
    assert!(matches!(
        bench::run(&short("memory://x", Mode::All).permits(0)).await,
        Err(dlock::Error::InvalidArgument { .. })
    ));
}

/// `--mode hold` on memory://: every lease is acquired, kept by keep-alive through several ttls
/// and renewed in batches; nothing is lost or late, and the figures add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_mode_keeps_many_leases_and_counts_their_renewals() {
    let opts = BenchOptions::new("memory://bench-hold")
        .mode(Mode::Hold)
        .duration(Duration::from_millis(2500))
        .leases(200, Duration::from_secs(1));
    let report = bench::run(&opts).await.unwrap();
    assert!(report.uncontended.is_none() && report.contended.is_none());
    let h = report.hold.expect("hold phase ran");
    assert_eq!((h.leases, h.acquired), (200, 200));
    assert_eq!(h.lost, 0, "{h:?}");
    assert_eq!(h.errors, 0, "{:?}", h.first_error);
    assert_eq!(h.failed_renewals, 0, "{h:?}");
    assert_eq!(h.late_renewals, 0, "{h:?}");
    // Keep-alive every third of the 1 s ttl for 2.5 s: each lease is renewed several times.
    assert!(h.renewals >= 200 * 3, "{h:?}");
    assert!(
        h.renewal_calls > 0 && h.renewal_calls < h.renewals,
        "not batched: {h:?}"
    );
    let per_call = h.renewals as f64 / h.renewal_calls as f64;
    assert!((h.leases_per_call - per_call).abs() < 1e-9, "{h:?}");
    assert!(h.cpu_share.is_finite() && h.cpu_share >= 0.0, "{h:?}");

    // Bad input is refused before anything is held.
    let none = BenchOptions::new("memory://bench-hold")
        .mode(Mode::Hold)
        .leases(0, Duration::from_secs(1));
    assert!(bench::run(&none).await.is_err());
}
