//! `dlock bench --mode hold`: what holding many leases costs one client.
//!
//! One client acquires `--leases` names (500 at a time), each with keep-alive on and the
//! `--ttl`, holds them for `--duration` while lockcore's renewer keeps them, and reports what
//! the renewals cost: renewal calls (the keep-alive's `extend_many` batches, counted through a
//! pass-through wrapper), leases renewed per call, renewals that came late (the lease had less
//! than a third of its ttl left when its extend was called), leases lost, the process's CPU
//! share while holding, and its resident memory per lease. What one call costs the store
//! depends on the backend: one pipeline on a single Redis, one per master on a Cluster, one
//! statement on PostgreSQL, one transaction of a statement per lease on MySQL and SQLite, and on
//! ZooKeeper one multi-read of up to 1 000 nodes' stats (the session keeps the nodes; the
//! extend checks that each node is still this session's).

use serde::Serialize;

/// What holding many leases cost.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct HoldReport {
    /// Leases asked for.
    pub leases: usize,
    /// Leases acquired.
    pub acquired: usize,
    /// Their ttl, milliseconds (keep-alive renews every third of it).
    pub ttl_ms: u64,
    /// Seconds taken to acquire them.
    pub acquire_secs: f64,
    /// Seconds held.
    pub held_secs: f64,
    /// Renewal calls while holding (`extend_many` batches and single `extend`s).
    pub renewal_calls: u64,
    /// Renewal calls per second.
    pub renewal_calls_per_sec: f64,
    /// Leases renewed while holding.
    pub renewals: u64,
    /// Leases renewed per second.
    pub renewals_per_sec: f64,
    /// Leases renewed per renewal call.
    pub leases_per_call: f64,
    /// Renewals called when the lease had less than a third of its ttl left.
    pub late_renewals: u64,
    /// Renewals that did not extend their lease (lost, or a store error).
    pub failed_renewals: u64,
    /// Leases no longer held at the end of the hold.
    pub lost: usize,
    /// The process's CPU time while holding ÷ the time held (1.0 = one core busy).
    pub cpu_share: f64,
    /// The process's resident memory grew by this much per lease acquired, bytes.
    pub bytes_per_lease: f64,
    /// Acquires or releases that failed.
    pub errors: u64,
    /// The first failure's message, if any.
    pub first_error: Option<String>,
}

pub(super) use measure::hold;

mod measure {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use conformance_tests::{CountingLock, Renewals};
    use tokio::task::JoinSet;

    use super::super::{BenchOptions, Phase, Progress};
    use super::HoldReport;

    /// How many leases are acquired (and released) at once.
    const CHUNK: usize = 500;
    use dlock::{AcquireOptions, DistributedLock, KeepAlive, LockExt, Result, Wait, connect};

    /// User + system CPU time of this process (`/proc/self/stat`, ticks of 1/100 s); zero where
    /// there is no procfs.
    fn cpu_time() -> Duration {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after_comm = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        // Fields 14 and 15 of stat(5) are utime and stime; after the comm they are at 11 and 12.
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
            .sum();
        Duration::from_millis(ticks * 10)
    }

    /// This process's resident memory, bytes (`/proc/self/statm`, pages of 4 KiB); zero where there
    /// is no procfs.
    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    /// Holds `opts.leases` names under `prefix` for `opts.duration` and reports the cost.
    pub(in crate::bench) async fn hold(
        opts: &BenchOptions,
        prefix: &str,
        progress: Arc<dyn Progress>,
    ) -> Result<HoldReport> {
        let counting = CountingLock::new(connect(&opts.url).await?);
        let client: Arc<dyn DistributedLock> = counting.clone();
        let lock_opts = AcquireOptions::new()
            .ttl(opts.lease_ttl)
            .keep_alive(KeepAlive::renew())
            .wait(Wait::No);
        let (mut errors, mut first_error) = (0_u64, None::<String>);
        let mut failed = |e: String| {
            errors += 1;
            first_error.get_or_insert(e);
        };

        let before = resident_bytes();
        let started = Instant::now();
        let mut guards = Vec::with_capacity(opts.leases);
        for chunk in (0..opts.leases).collect::<Vec<_>>().chunks(CHUNK) {
            let mut batch = JoinSet::new();
            for i in chunk {
                let (client, lock_opts) = (client.clone(), lock_opts.clone());
                let name = format!("{prefix}/hold/{i}");
                batch.spawn(async move { client.lock(&name, &lock_opts).await });
            }
            while let Some(joined) = batch.join_next().await {
                match joined.map_err(|e| e.to_string()) {
                    Ok(Ok(g)) => guards.push(g),
                    Ok(Err(e)) => failed(e.to_string()),
                    Err(e) => failed(e),
                }
            }
            progress.update(Phase::Hold, Duration::ZERO, opts.duration);
        }
        let acquire_secs = started.elapsed().as_secs_f64();
        let grown = resident_bytes().saturating_sub(before);

        let (renewals0, cpu0, t0) = (counting.renewals(), cpu_time(), Instant::now());
        while t0.elapsed() < opts.duration {
            let left = opts.duration.saturating_sub(t0.elapsed());
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
            progress.update(Phase::Hold, t0.elapsed().min(opts.duration), opts.duration);
        }
        let (renewals1, cpu1, held) = (counting.renewals(), cpu_time(), t0.elapsed());
        let lost = guards.iter().filter(|g| !g.is_held()).count();

        let acquired = guards.len();
        while !guards.is_empty() {
            let mut batch = JoinSet::new();
            for g in guards.drain(..guards.len().min(CHUNK)) {
                batch.spawn(g.release());
            }
            while let Some(joined) = batch.join_next().await {
                match joined.map_err(|e| e.to_string()) {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => failed(e.to_string()),
                    Err(e) => failed(e),
                }
            }
        }

        let d = Renewals {
            calls: renewals1.calls - renewals0.calls,
            renewed: renewals1.renewed - renewals0.renewed,
            failed: renewals1.failed - renewals0.failed,
            late: renewals1.late - renewals0.late,
        };
        let secs = held.as_secs_f64();
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Ok(HoldReport {
            leases: opts.leases,
            acquired,
            ttl_ms: u64::try_from(opts.lease_ttl.as_millis()).unwrap_or(u64::MAX),
            acquire_secs,
            held_secs: secs,
            renewal_calls: count(d.calls),
            renewal_calls_per_sec: d.calls as f64 / secs,
            renewals: count(d.renewed),
            renewals_per_sec: d.renewed as f64 / secs,
            leases_per_call: d.renewed as f64 / d.calls.max(1) as f64,
            late_renewals: count(d.late),
            failed_renewals: count(d.failed),
            lost,
            cpu_share: cpu1.saturating_sub(cpu0).as_secs_f64() / secs,
            bytes_per_lease: grown as f64 / acquired.max(1) as f64,
            errors,
            first_error,
        })
    }
}
