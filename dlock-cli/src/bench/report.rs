//! What `dlock bench` reports: latency summaries and the report of each phase.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{HoldReport, Mode};

/// Latency percentiles of one measurement, in microseconds. All zero when `count` is 0.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Samples recorded.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

impl LatencySummary {
    pub(super) fn of(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        if h.is_empty() {
            return LatencySummary {
                count: 0,
                mean_us: 0.0,
                p50_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
            };
        }
        LatencySummary {
            count: h.len(),
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// Uncontended acquire+release through dlock, with the raw floor measured in the same run.
#[derive(Clone, Debug, Serialize)]
pub struct UncontendedReport {
    /// Lock name used.
    pub name: String,
    /// Pairs completed in the measured window.
    pub pairs: u64,
    /// Pairs per second.
    pub pairs_per_sec: f64,
    /// Latency of one pair (`lock` with `Wait::No` + `release`).
    pub latency: LatencySummary,
    /// Failed pairs (store errors, or the lock found held).
    pub errors: u64,
    /// The first failure's message, if any.
    pub first_error: Option<String>,
    /// The raw floor, or `None` if the backend offers none ("no floor").
    pub floor: Option<FloorReport>,
    /// The floor with the same fencing guarantee, where the raw floor hands out no token
    /// (Redis: one script doing `SET NX PX` + `INCR`); a fenced lock is judged against it.
    pub fenced_floor: Option<FloorReport>,
    /// The recipe's own store calls sent bare, where it needs more than the floor (ZooKeeper:
    /// `create`, `getChildren`, `delete`): what the recipe costs apart from the library. Not a
    /// target.
    pub recipe_floor: Option<FloorReport>,
}

/// The backend's minimal commands, measured like the uncontended pairs.
#[derive(Clone, Debug, Serialize)]
pub struct FloorReport {
    /// What one raw pair consists of.
    pub description: String,
    /// Pairs completed in the measured window.
    pub pairs: u64,
    /// Pairs per second.
    pub pairs_per_sec: f64,
    /// Latency of one raw pair.
    pub latency: LatencySummary,
    /// Failed pairs.
    pub errors: u64,
    /// dlock pairs/s ÷ floor pairs/s (1.0 means dlock costs nothing over the raw commands).
    pub ratio: f64,
    /// Rounds behind the quartiles below: a round is one 200 ms turn of dlock and the floor's
    /// next turn (0 when the run had fewer than two).
    pub rounds: usize,
    /// First quartile of the per-round ratio (dlock's pairs/s in its turn ÷ the floor's in
    /// the next).
    pub ratio_p25: Option<f64>,
    /// Third quartile of the per-round ratio.
    pub ratio_p75: Option<f64>,
    /// The floor against itself: its pairs/s over its odd-numbered turns ÷ over its even ones.
    /// Two loops that do the same work disagree by this much in this run, so a `ratio` within
    /// that distance of a target does not tell whether the target is met.
    pub self_ratio: Option<f64>,
}

/// N clients, each with its own connection, contending for one name.
#[derive(Clone, Debug, Serialize)]
pub struct ContendedReport {
    /// Lock name used.
    pub name: String,
    /// The semaphore's permits, when a semaphore was measured (`None`: the lock).
    pub permits: Option<u32>,
    /// The time-weighted mean number of holders at once over the measured window (at most
    /// the permits, or 1 for the lock), from the recorded holds.
    pub mean_holders: f64,
    /// Clients.
    pub clients: usize,
    /// Whether each client ran as a process of its own (`--processes`).
    pub processes: bool,
    /// Hold time per acquisition, milliseconds.
    pub hold_ms: f64,
    /// Lease ttl used, milliseconds.
    pub ttl_ms: u64,
    /// Acquisitions in the measured window, all clients.
    pub acquisitions: u64,
    /// Acquisitions per second.
    pub acquisitions_per_sec: f64,
    /// Time from one client starting its release to a *different* client's acquire returning
    /// (includes the release's round trip; never negative). Empty for a semaphore, where several
    /// hold at once and no one release hands over to one acquire.
    pub handoff: LatencySummary,
    /// Time from an acquire call's start to its return.
    pub wait: LatencySummary,
    /// The median wait in holds (`wait.p50_us` ÷ the hold): a FIFO queue keeps it near the
    /// number of waiters ahead, at most the clients less one.
    pub wait_p50_holds: f64,
    /// The 99th percentile wait in holds.
    pub wait_p99_holds: f64,
    /// Acquisitions per client in the measured window, by client index.
    pub per_client: Vec<u64>,
    /// Fewest acquisitions of one client.
    pub per_client_min: u64,
    /// Most acquisitions of one client.
    pub per_client_max: u64,
    /// `per_client_min / per_client_max` (1.0 is perfectly even; 0 when a client starved).
    pub fairness: f64,
    /// Clients with at least one acquisition.
    pub clients_that_acquired: usize,
    /// Times a client acquired while the lock (or every permit) was still held. Must be 0.
    pub violations: u64,
    /// Failed acquires or releases (including releases that found the lease gone).
    pub errors: u64,
    /// The first failure's message, if any.
    pub first_error: Option<String>,
    /// Median pair of the floor with the lock's guarantee (the fenced floor where there is one,
    /// else the raw floor), microseconds; `None` without a floor.
    pub floor_pair_p50_us: Option<f64>,
    /// The most acquisitions/s any lock could reach here: 1 / (hold + the floor's median pair);
    /// for a semaphore, permits times that.
    pub limit_per_sec: Option<f64>,
    /// Acquisitions/s ÷ that limit.
    pub of_limit: Option<f64>,
    /// The connections the server had open while the clients ran (PostgreSQL and
    /// MySQL/MariaDB; `None` for other stores).
    pub server_connections: Option<ConnectionsReport>,
}

/// The connections a SQL server had open during the contended phase, sampled every 100 ms
/// from a connection of the bench's own (not counted).
#[derive(Clone, Debug, Serialize)]
pub struct ConnectionsReport {
    /// Client connections already open before the clients started.
    pub before: u64,
    /// The most open at one sample.
    pub peak: u64,
    /// What the clients added at the peak, per client.
    pub per_client: f64,
    /// The server's `max_connections`.
    pub limit: u64,
    /// Whether the server was full at some sample: a connection asked for then was refused
    /// (PostgreSQL's clients retry a refusal until their timeout, so this is the only sign).
    pub reached_limit: bool,
    /// Connection attempts the server refused (for lack of room, or a failed login), where it
    /// counts them (MySQL and MariaDB).
    pub refused: Option<u64>,
}

/// Everything one `dlock bench` run measured. Field names are stable (the `--json` output).
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The URL, redacted.
    pub url: String,
    /// Backend name from its capabilities.
    pub backend: String,
    /// The backend's fairness promise (`fifo` or `unordered`).
    pub fairness: String,
    /// How the backend wakes waiters (`notify`, `pubsub`, `poll`, ...).
    pub wait_mechanism: String,
    /// Modes run.
    pub mode: Mode,
    /// Measured seconds per phase.
    pub duration_secs: f64,
    /// Warm-up seconds per phase.
    pub warmup_secs: f64,
    /// The uncontended phase, if run.
    pub uncontended: Option<UncontendedReport>,
    /// The contended phase, if run.
    pub contended: Option<ContendedReport>,
    /// The hold phase (`--mode hold`), if run.
    pub hold: Option<HoldReport>,
}

pub(super) fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 1 hour at 3 significant digits; larger values saturate.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

pub(super) fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
}

pub(super) fn per_sec(count: u64, window: Duration) -> f64 {
    count as f64 / window.as_secs_f64()
}
