//! The `dlock bench` engine: uncontended pairs against the backend's raw floor, and contention
//! between independent clients on one name. The binary only formats the [`BenchReport`].
//!
//! Latencies are recorded in HDR histograms at nanosecond resolution (3 significant digits) and
//! reported in microseconds. Nothing here asserts speed; the report is for people and scripts.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{
    AcquireOptions, DistributedLock, Error, KeepAlive, LockExt, LockName, OwnerId, RawFloor,
    Released, Result, Wait, connect, redact,
};

mod hold;
mod processes;

pub use hold::HoldReport;
pub use processes::{CLIENT_ENV, client_child};

/// Which measurements to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One client: acquire+release pairs, and the raw floor.
    Uncontended,
    /// N clients on one name.
    Contended,
    /// Both, one after the other.
    #[default]
    All,
    /// One client holding many leases with keep-alive: what the renewals cost.
    Hold,
}

impl Mode {
    fn uncontended(self) -> bool {
        matches!(self, Mode::Uncontended | Mode::All)
    }
    fn contended(self) -> bool {
        matches!(self, Mode::Contended | Mode::All)
    }
}

impl FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "uncontended" => Ok(Mode::Uncontended),
            "contended" => Ok(Mode::Contended),
            "all" => Ok(Mode::All),
            "hold" => Ok(Mode::Hold),
            other => Err(Error::invalid_argument(
                "mode",
                format!("`{other}`: expected uncontended, contended, all or hold"),
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Uncontended => "uncontended",
            Mode::Contended => "contended",
            Mode::All => "all",
            Mode::Hold => "hold",
        })
    }
}

/// What to measure and for how long.
#[derive(Clone)]
#[non_exhaustive]
pub struct BenchOptions {
    /// Store URL (printed only redacted).
    pub url: String,
    /// Which measurements.
    pub mode: Mode,
    /// Measured time per phase (uncontended, floor, contended).
    pub duration: Duration,
    /// Unmeasured time before each phase.
    pub warmup: Duration,
    /// Clients in the contended phase, each with its own connection.
    pub clients: usize,
    /// How long each contended acquisition holds the lock.
    pub hold: Duration,
    /// Lock name prefix; default `dlock-bench/<random>` so runs on a shared store do not collide.
    pub name: Option<String>,
    /// Measure a semaphore of this many permits instead of the lock.
    pub permits: Option<u32>,
    /// Run each contended client as a process of its own (this program run again; see
    /// [`client_child`]) instead of a task of this one.
    pub processes: bool,
    /// Leases held at once in [`Mode::Hold`].
    pub leases: usize,
    /// Their ttl in [`Mode::Hold`] (keep-alive renews every third of it).
    pub lease_ttl: Duration,
}

impl fmt::Debug for BenchOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BenchOptions")
            .field("url", &redact(&self.url))
            .field("mode", &self.mode)
            .field("duration", &self.duration)
            .field("warmup", &self.warmup)
            .field("clients", &self.clients)
            .field("hold", &self.hold)
            .field("name", &self.name)
            .field("permits", &self.permits)
            .field("processes", &self.processes)
            .field("leases", &self.leases)
            .field("lease_ttl", &self.lease_ttl)
            .finish()
    }
}

impl BenchOptions {
    /// Defaults: all modes, 5 s per phase after 1 s of warm-up, 8 clients holding 1 ms.
    pub fn new(url: impl Into<String>) -> Self {
        BenchOptions {
            url: url.into(),
            mode: Mode::All,
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            clients: 8,
            hold: Duration::from_millis(1),
            name: None,
            permits: None,
            processes: false,
            leases: 1000,
            lease_ttl: Duration::from_secs(10),
        }
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
    /// Sets the measured time per phase.
    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = d;
        self
    }
    /// Sets the warm-up per phase.
    pub fn warmup(mut self, d: Duration) -> Self {
        self.warmup = d;
        self
    }
    /// Sets the number of contending clients.
    pub fn clients(mut self, n: usize) -> Self {
        self.clients = n;
        self
    }
    /// Sets the hold time per contended acquisition.
    pub fn hold(mut self, d: Duration) -> Self {
        self.hold = d;
        self
    }
    /// Sets the lock name prefix.
    pub fn name(mut self, prefix: impl Into<String>) -> Self {
        self.name = Some(prefix.into());
        self
    }
    /// Measures a semaphore of `permits` permits instead of the lock.
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }
    /// Sets how many leases [`Mode::Hold`] holds, and their ttl.
    pub fn leases(mut self, leases: usize, ttl: Duration) -> Self {
        self.leases = leases;
        self.lease_ttl = ttl;
        self
    }
    /// Runs each contended client as a process of its own: the program must call
    /// [`client_child`] first thing in its `main`, as `dlock` does.
    pub fn processes(mut self, on: bool) -> Self {
        self.processes = on;
        self
    }

    /// How many may hold at once: the permits, or 1 for the lock.
    fn holders(&self) -> usize {
        self.permits.map_or(1, |p| p as usize)
    }

    /// The lease ttl used in the contended phase: comfortably above the hold time
    /// (20 × hold, at least 5 s), so no lease expires while held.
    pub fn contended_ttl(&self) -> Duration {
        (self.hold * 20)
            .max(Duration::from_secs(5))
            .min(lockcore::MAX_TTL)
    }

    fn validate(&self) -> Result<()> {
        if self.duration.is_zero() {
            return Err(Error::invalid_argument("duration", "must be above zero"));
        }
        if self.clients == 0 {
            return Err(Error::invalid_argument("clients", "must be at least 1"));
        }
        if self.hold * 20 > lockcore::MAX_TTL {
            return Err(Error::invalid_argument("hold", "must be below 8 hours"));
        }
        if let Some(p) = self.permits {
            lockcore::check_permits(p)?;
        }
        if self.mode == Mode::Hold {
            if self.leases == 0 {
                return Err(Error::invalid_argument("leases", "must be at least 1"));
            }
            lockcore::check_ttl(self.lease_ttl)?;
        }
        if self.processes && self.url.starts_with("memory:") {
            return Err(Error::invalid_argument(
                "processes",
                "memory:// lives inside one process, so its clients cannot be processes",
            ));
        }
        Ok(())
    }
}

/// The benchmark phases, for progress reporting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// Uncontended acquire+release pairs through dlock.
    Uncontended,
    /// The backend's raw commands.
    Floor,
    /// N clients on one name.
    Contended,
    /// One client holding many leases.
    Hold,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Uncontended => "uncontended",
            Phase::Floor => "raw floor",
            Phase::Contended => "contended",
            Phase::Hold => "hold",
        })
    }
}

/// Receives progress while a benchmark runs (the binary draws a progress bar with it).
pub trait Progress: Send + Sync {
    /// `elapsed` of `total` (warm-up included) has passed in `phase`. Called every ~100 ms.
    fn update(&self, phase: Phase, elapsed: Duration, total: Duration);
}

struct NoProgress;
impl Progress for NoProgress {
    fn update(&self, _: Phase, _: Duration, _: Duration) {}
}

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
    fn of(h: &Histogram<u64>) -> Self {
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

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 1 hour at 3 significant digits; larger values saturate.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
}

fn per_sec(count: u64, window: Duration) -> f64 {
    count as f64 / window.as_secs_f64()
}

/// Runs the benchmark.
///
/// # Cancel safety
/// The measurement runs in tasks on the runtime's workers; dropping the future aborts all of
/// them. Locks they held are released in the background by their guards, and the bench's names
/// are unique per run.
///
/// # Errors
/// [`Error::InvalidArgument`] for a zero duration, zero clients or a hold time too long for a
/// ttl; connection errors from [`connect`]. Failures of individual operations
/// while running are counted in the report, not returned.
pub async fn run(opts: &BenchOptions) -> Result<BenchReport> {
    run_with_progress(opts, Arc::new(NoProgress)).await
}

/// [`run`] reporting progress to `progress`.
///
/// # Cancel safety
/// As [`run`].
///
/// # Errors
/// As [`run`].
pub async fn run_with_progress(
    opts: &BenchOptions,
    progress: Arc<dyn Progress>,
) -> Result<BenchReport> {
    opts.validate()?;
    // On a runtime worker, where applications make their lock calls, connections included.
    // Driven from the thread that called `block_on`, every reply would first have to wake that
    // thread: tens of µs per round trip, added to dlock and the floor alike, which hides what
    // dlock itself costs.
    let opts = opts.clone();
    Spawned(tokio::spawn(async move { measure(&opts, progress).await }))
        .join("run")
        .await?
}

/// A spawned part of the bench that is aborted when its handle is dropped, so dropping the
/// bench's future stops all of it.
struct Spawned<T>(tokio::task::JoinHandle<T>);

impl<T> Spawned<T> {
    async fn join(mut self, what: &'static str) -> Result<T> {
        (&mut self.0)
            .await
            .map_err(|e| Error::backend("bench", what, None, false, e.to_string()))
    }
}

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn measure(opts: &BenchOptions, progress: Arc<dyn Progress>) -> Result<BenchReport> {
    let backend = connect(&opts.url).await?;
    let caps = backend.capabilities();
    let prefix = opts
        .name
        .clone()
        .unwrap_or_else(|| format!("dlock-bench/{}", &OwnerId::random().to_string()[..12]));
    tracing::info!(url = %redact(&opts.url), backend = caps.backend, prefix, "bench starting");

    let hold = if opts.mode == Mode::Hold {
        Some(hold::hold(opts, &prefix, progress.clone()).await?)
    } else {
        None
    };
    let uncontended = if opts.mode.uncontended() {
        Some(uncontended(opts, &backend, &prefix, progress.as_ref()).await?)
    } else {
        None
    };
    let contended = if opts.mode.contended() {
        let floor_p50 = match &uncontended {
            Some(u) => u
                .fenced_floor
                .as_ref()
                .or(u.floor.as_ref())
                .map(|f| f.latency.p50_us),
            None => floor_median(opts, &backend, &prefix, progress.as_ref()).await?,
        };
        Some(contended(opts, &prefix, progress.clone(), floor_p50).await?)
    } else {
        None
    };
    Ok(BenchReport {
        url: redact(&opts.url),
        backend: caps.backend.to_owned(),
        fairness: format!("{:?}", caps.fairness).to_ascii_lowercase(),
        wait_mechanism: format!("{:?}", caps.waiting).to_ascii_lowercase(),
        mode: opts.mode,
        duration_secs: opts.duration.as_secs_f64(),
        warmup_secs: opts.warmup.as_secs_f64(),
        uncontended,
        contended,
        hold,
    })
}

/// Result of one timed loop.
struct LoopStats {
    hist: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
    /// Wall time spent measuring this loop (after warm-up).
    measured: Duration,
}

impl LoopStats {
    fn new() -> Self {
        LoopStats {
            hist: new_histogram(),
            errors: 0,
            first_error: None,
            measured: Duration::ZERO,
        }
    }

    fn outcome(&mut self, outcome: Result<()>, latency: Duration) {
        match outcome {
            Ok(()) => record(&mut self.hist, latency),
            Err(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e.to_string());
                }
            }
        }
    }
}

/// Length of one turn when two loops are interleaved.
const SLICE: Duration = Duration::from_millis(200);

/// Runs `op` back to back until `until`, recording calls that start at or after `measure_from`.
async fn run_slice<F, Fut>(op: &mut F, until: Instant, measure_from: Instant, stats: &mut LoopStats)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let slice_start = Instant::now();
    loop {
        let t0 = Instant::now();
        if t0 >= until {
            break;
        }
        let outcome = op().await;
        if t0 >= measure_from {
            stats.outcome(outcome, t0.elapsed());
        }
    }
    let from = slice_start.max(measure_from);
    stats.measured += Instant::now().saturating_duration_since(from);
}

/// Alternates `a` and each floor in [`SLICE`] turns for `warmup + duration` each, so each gets
/// about `duration` of measurement and drift on a shared machine hits all of them alike.
async fn interleaved<FA, FutA>(
    opts: &BenchOptions,
    progress: &dyn Progress,
    mut a: FA,
    floors: &[(Arc<dyn RawFloor>, LockName)],
) -> (LoopStats, Vec<LoopStats>)
where
    FA: FnMut() -> FutA,
    FutA: Future<Output = Result<()>>,
{
    let turns = 1 + floors.len() as u32;
    let total = turns * (opts.warmup + opts.duration);
    let start = Instant::now();
    let measure_from = start + turns * opts.warmup;
    let end = start + total;
    let mut sa = LoopStats::new();
    let mut sf: Vec<LoopStats> = floors.iter().map(|_| LoopStats::new()).collect();
    let mut turn = 0;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        progress.update(Phase::Uncontended, now - start, total);
        let until = (now + SLICE).min(end);
        match turn {
            0 => run_slice(&mut a, until, measure_from, &mut sa).await,
            i => {
                let (floor, name) = &floors[i - 1];
                run_slice(
                    &mut || floor.pair(name),
                    until,
                    measure_from,
                    &mut sf[i - 1],
                )
                .await;
            }
        }
        turn = (turn + 1) % turns as usize;
    }
    // The floors' share of the window ends with it.
    progress.update(Phase::Floor, total, total);
    (sa, sf)
}

/// Calls `op` back to back for `warmup + duration`, recording the latency of the calls that start
/// after the warm-up.
async fn timed_loop<F, Fut>(
    opts: &BenchOptions,
    phase: Phase,
    progress: &dyn Progress,
    mut op: F,
) -> LoopStats
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let total = opts.warmup + opts.duration;
    let start = Instant::now();
    let measure_from = start + opts.warmup;
    let end = measure_from + opts.duration;
    let mut stats = LoopStats::new();
    let mut last_tick = start;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        if t0.duration_since(last_tick) >= Duration::from_millis(100) {
            progress.update(phase, t0 - start, total);
            last_tick = t0;
        }
        let outcome = op().await;
        if t0 >= measure_from {
            stats.outcome(outcome, t0.elapsed());
        }
    }
    stats.measured = Instant::now().saturating_duration_since(measure_from);
    progress.update(phase, total, total);
    stats
}

async fn uncontended(
    opts: &BenchOptions,
    backend: &Arc<dyn DistributedLock>,
    prefix: &str,
    progress: &dyn Progress,
) -> Result<UncontendedReport> {
    let name = format!("{prefix}/uncontended");
    let lock_opts = AcquireOptions::new()
        .wait(Wait::No)
        .keep_alive(KeepAlive::Off);
    let (name_ref, opts_ref) = (name.as_str(), &lock_opts);
    let permits = opts.permits;
    let dlock_pair = || async move {
        let guard = hold_one(backend, name_ref, permits, opts_ref).await?;
        match guard.release().await? {
            Released::Released => Ok(()),
            Released::NotHeld => Err(Error::LockLost {
                backend: backend.capabilities().backend,
                name: name_ref.to_owned(),
                operation: "bench release",
            }),
        }
    };
    // With floors, the loops alternate in short turns over the same window, so the ratios are
    // not skewed by whatever else the machine did during one of them.
    let mut floors = Vec::new();
    let mut kinds = Vec::new();
    for (kind, floor) in [
        ("plain", backend.raw_floor()),
        ("fenced", backend.fenced_floor()),
        ("recipe", backend.recipe_floor()),
    ] {
        if let Some(floor) = floor {
            floors.push((floor, LockName::new(format!("{prefix}/{kind}-floor"))?));
            kinds.push(kind);
        }
    }
    let (dlock, raws) = if floors.is_empty() {
        (
            timed_loop(opts, Phase::Uncontended, progress, dlock_pair).await,
            Vec::new(),
        )
    } else {
        interleaved(opts, progress, dlock_pair, &floors).await
    };
    let pairs = dlock.hist.len();
    let pairs_per_sec = per_sec(pairs, dlock.measured);
    let mut floor = None;
    let mut fenced_floor = None;
    let mut recipe_floor = None;
    for ((kind, (f, _)), raw) in kinds.into_iter().zip(&floors).zip(raws) {
        let floor_pairs = raw.hist.len();
        let floor_per_sec = per_sec(floor_pairs, raw.measured);
        let report = FloorReport {
            description: f.description(),
            pairs: floor_pairs,
            pairs_per_sec: floor_per_sec,
            latency: LatencySummary::of(&raw.hist),
            errors: raw.errors,
            ratio: if floor_per_sec > 0.0 {
                pairs_per_sec / floor_per_sec
            } else {
                0.0
            },
        };
        match kind {
            "plain" => floor = Some(report),
            "fenced" => fenced_floor = Some(report),
            _ => recipe_floor = Some(report),
        }
    }

    Ok(UncontendedReport {
        name,
        pairs,
        pairs_per_sec,
        latency: LatencySummary::of(&dlock.hist),
        errors: dlock.errors,
        first_error: dlock.first_error,
        floor,
        fenced_floor,
        recipe_floor,
    })
}

/// The lock `name`, or a permit of the semaphore `name` of `permits` permits, per `opts`.
async fn hold_one(
    backend: &Arc<dyn DistributedLock>,
    name: &str,
    permits: Option<u32>,
    opts: &AcquireOptions,
) -> Result<crate::LockGuard> {
    use crate::SemaphoreExt;
    match permits {
        Some(n) => Ok(backend
            .semaphore(name, n)?
            .acquire(opts)
            .await?
            .into_inner()),
        None => backend.lock(name, opts).await,
    }
}

/// What one acquire of a contending client came to.
enum Round {
    /// Acquired.
    Held(crate::LockGuard),
    /// Failed (counted; the client paused so as not to spin on a store that fails fast).
    Failed,
    /// The window ended while it waited.
    Ended,
}

/// One waiting acquire of a contending client, given up at `end` (dropping the acquire future
/// is cancel-safe); a failure is counted in `stats`, then the client pauses 10 ms.
async fn acquire_until(
    backend: &Arc<dyn DistributedLock>,
    name: &str,
    permits: Option<u32>,
    opts: &AcquireOptions,
    end: Instant,
    stats: &mut ClientStats,
) -> Round {
    let acquired = tokio::select! {
        r = hold_one(backend, name, permits, opts) => r,
        _ = tokio::time::sleep_until(end.into()) => return Round::Ended,
    };
    match acquired {
        Ok(g) => Round::Held(g),
        Err(e) => {
            stats.error(e);
            tokio::time::sleep(Duration::from_millis(10)).await;
            Round::Failed
        }
    }
}

/// Holds for `d` precisely and nearly without using a CPU: a thread of the blocking pool sleeps
/// through all but the last [`SPIN`] (`nanosleep` wakes tens of µs late, tokio's timer wheel up
/// to a millisecond), then spins to the deadline. Spinning on the runtime instead (yielding for
/// the last 1.5 ms) took CPU from the store's server on a small machine while several clients
/// held at once: with 4 of 8 clients holding 10 ms, a core was busy about half the time.
async fn hold_for(d: Duration) {
    let deadline = Instant::now() + d;
    let hold = move || {
        let coarse = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(coarse.saturating_sub(SPIN));
        while Instant::now() < deadline {
            std::hint::spin_loop();
        }
    };
    if tokio::task::spawn_blocking(hold).await.is_err() {
        // The blocking pool is shutting down: the timer's hold is as good.
        tokio::time::sleep_until(deadline.into()).await;
    }
}

/// The last part of a hold that [`hold_for`] spins through rather than sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// Who had the lock last, for handoff latency.
///
/// A handoff is measured from the moment the holder starts its release (the lock is of no use to
/// anyone from then on) to the moment a *different* client's acquire returns. Measuring from the
/// release call's return instead would go negative whenever the next client's acquire returns
/// first, which happens routinely when the releasing task is scheduled late.
enum Slot {
    Free,
    Held { client: usize },
    Releasing { client: usize, at: Instant },
}

struct Shared {
    holding: AtomicUsize,
    violations: AtomicU64,
    slot: Mutex<Slot>,
    occupancy: Mutex<Occupancy>,
    measure_from: Instant,
    end: Instant,
}

/// The number of holders over time, integrated over the measured window.
struct Occupancy {
    /// Holders since `since`.
    holders: usize,
    since: Instant,
    /// Holder-seconds within the measured window so far.
    area: f64,
}

impl Shared {
    fn measuring(&self, t: Instant) -> bool {
        t >= self.measure_from && t < self.end
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The holders changed by `delta` at `now`.
    fn occupied(&self, delta: isize, now: Instant) {
        let mut o = self
            .occupancy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        o.area += self.window_overlap(o.since, now) * o.holders as f64;
        o.holders = o.holders.saturating_add_signed(delta);
        o.since = now;
    }

    /// Seconds of `[from, to]` inside the measured window.
    fn window_overlap(&self, from: Instant, to: Instant) -> f64 {
        let (from, to) = (from.max(self.measure_from), to.min(self.end));
        to.saturating_duration_since(from).as_secs_f64()
    }

    /// The time-weighted mean number of holders over the measured window.
    fn mean_holders(&self) -> f64 {
        let o = self
            .occupancy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let area = o.area + self.window_overlap(o.since, self.end) * o.holders as f64;
        area / self.end.duration_since(self.measure_from).as_secs_f64()
    }

    /// `client`'s acquire returned at `now`; the handoff latency if a different client was
    /// releasing.
    fn acquired(&self, client: usize, now: Instant) -> Option<Duration> {
        let mut slot = self.slot();
        let handoff = match *slot {
            Slot::Releasing { client: from, at } if from != client => {
                Some(now.saturating_duration_since(at))
            }
            _ => None,
        };
        *slot = Slot::Held { client };
        handoff
    }

    /// `client` starts releasing at `now`.
    fn releasing(&self, client: usize, now: Instant) {
        let mut slot = self.slot();
        if matches!(*slot, Slot::Held { client: c } if c == client) {
            *slot = Slot::Releasing { client, at: now };
        }
    }

    /// `client`'s release failed: nobody is handing over.
    fn reset(&self, client: usize) {
        let mut slot = self.slot();
        if matches!(*slot, Slot::Held { client: c } | Slot::Releasing { client: c, .. } if c == client)
        {
            *slot = Slot::Free;
        }
    }
}

struct ClientStats {
    acquisitions: u64,
    wait: Histogram<u64>,
    handoff: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl ClientStats {
    fn new() -> Self {
        ClientStats {
            acquisitions: 0,
            wait: new_histogram(),
            handoff: new_histogram(),
            errors: 0,
            first_error: None,
        }
    }

    fn error(&mut self, e: impl fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

/// The median pair of the floor with the lock's guarantee (fenced where there is one), from a
/// short run of its own, for a contended-only bench.
async fn floor_median(
    opts: &BenchOptions,
    backend: &Arc<dyn DistributedLock>,
    prefix: &str,
    progress: &dyn Progress,
) -> Result<Option<f64>> {
    let Some(floor) = backend.fenced_floor().or_else(|| backend.raw_floor()) else {
        return Ok(None);
    };
    let name = LockName::new(format!("{prefix}/limit-floor"))?;
    let short = BenchOptions {
        duration: Duration::from_secs(1),
        warmup: Duration::from_millis(200),
        ..opts.clone()
    };
    let stats = timed_loop(&short, Phase::Floor, progress, || floor.pair(&name)).await;
    Ok((!stats.hist.is_empty()).then(|| LatencySummary::of(&stats.hist).p50_us))
}

async fn contended(
    opts: &BenchOptions,
    prefix: &str,
    progress: Arc<dyn Progress>,
    floor_p50_us: Option<f64>,
) -> Result<ContendedReport> {
    let name = format!("{prefix}/contended");
    let ttl = opts.contended_ttl();
    let tally = if opts.processes {
        processes::contend(opts, &name, ttl, progress.clone()).await?
    } else {
        in_process(opts, &name, ttl, progress.clone()).await?
    };
    let total = opts.warmup + opts.duration;
    progress.update(Phase::Contended, total, total);

    let Tally {
        per_client,
        wait,
        handoff,
        errors,
        first_error,
        violations,
        mean_holders,
    } = tally;
    let acquisitions: u64 = per_client.iter().sum();
    let per_client_min = per_client.iter().copied().min().unwrap_or(0);
    let per_client_max = per_client.iter().copied().max().unwrap_or(0);
    let limit =
        floor_p50_us.map(|f| opts.holders() as f64 * 1e6 / (opts.hold.as_secs_f64() * 1e6 + f));
    Ok(ContendedReport {
        name,
        permits: opts.permits,
        mean_holders,
        clients: per_client.len(),
        processes: opts.processes,
        hold_ms: opts.hold.as_secs_f64() * 1000.0,
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        acquisitions,
        acquisitions_per_sec: per_sec(acquisitions, opts.duration),
        handoff: LatencySummary::of(&handoff),
        wait: LatencySummary::of(&wait),
        clients_that_acquired: per_client.iter().filter(|&&n| n > 0).count(),
        fairness: if per_client_max > 0 {
            per_client_min as f64 / per_client_max as f64
        } else {
            0.0
        },
        per_client,
        per_client_min,
        per_client_max,
        violations,
        errors,
        first_error,
        floor_pair_p50_us: floor_p50_us,
        limit_per_sec: limit,
        of_limit: limit.map(|l| per_sec(acquisitions, opts.duration) / l),
    })
}

/// What the contended clients measured, however they ran.
struct Tally {
    /// Acquisitions in the measured window, by client.
    per_client: Vec<u64>,
    wait: Histogram<u64>,
    handoff: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
    violations: u64,
    mean_holders: f64,
}

impl Tally {
    fn new(clients: usize) -> Self {
        Tally {
            per_client: vec![0; clients],
            wait: new_histogram(),
            handoff: new_histogram(),
            errors: 0,
            first_error: None,
            violations: 0,
            mean_holders: 0.0,
        }
    }
}

/// The contended clients as tasks of this process, each with its own connection.
async fn in_process(
    opts: &BenchOptions,
    name: &str,
    ttl: Duration,
    progress: Arc<dyn Progress>,
) -> Result<Tally> {
    let lock_opts = AcquireOptions::new()
        .ttl(ttl)
        .wait(Wait::Forever)
        .keep_alive(KeepAlive::Off);

    // Independent connections, all made before the clock starts.
    let mut clients = Vec::with_capacity(opts.clients);
    for _ in 0..opts.clients {
        clients.push(connect(&opts.url).await?);
    }

    let start = Instant::now();
    let shared = Arc::new(Shared {
        holding: AtomicUsize::new(0),
        violations: AtomicU64::new(0),
        slot: Mutex::new(Slot::Free),
        occupancy: Mutex::new(Occupancy {
            holders: 0,
            since: start,
            area: 0.0,
        }),
        measure_from: start + opts.warmup,
        end: start + opts.warmup + opts.duration,
    });
    let mut tasks = Vec::with_capacity(clients.len());
    for (id, client) in clients.into_iter().enumerate() {
        let shared = shared.clone();
        let name = name.to_owned();
        let lock_opts = lock_opts.clone();
        let (hold, permits) = (opts.hold, opts.permits);
        tasks.push(Spawned(tokio::spawn(async move {
            contend(id, client, &name, permits, &lock_opts, hold, &shared).await
        })));
    }

    let total = opts.warmup + opts.duration;
    let ticker = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(100));
        loop {
            every.tick().await;
            let elapsed = start.elapsed().min(total);
            progress.update(Phase::Contended, elapsed, total);
            if elapsed >= total {
                break;
            }
        }
    });

    let mut tally = Tally::new(0);
    for task in tasks {
        let stats = task.join("contended client").await?;
        tally.per_client.push(stats.acquisitions);
        tally.wait.add(&stats.wait).expect("same histogram bounds");
        tally
            .handoff
            .add(&stats.handoff)
            .expect("same histogram bounds");
        tally.errors += stats.errors;
        if tally.first_error.is_none() {
            tally.first_error = stats.first_error;
        }
    }
    ticker.abort();
    tally.violations = shared.violations.load(Ordering::SeqCst);
    tally.mean_holders = shared.mean_holders();
    Ok(tally)
}

/// One contending client: acquire (waiting), hold, release, until the end of the window.
async fn contend(
    id: usize,
    client: Arc<dyn DistributedLock>,
    name: &str,
    permits: Option<u32>,
    opts: &AcquireOptions,
    hold: Duration,
    shared: &Shared,
) -> ClientStats {
    let mut stats = ClientStats::new();
    let end = shared.end;
    while Instant::now() < end {
        let t0 = Instant::now();
        let guard = match acquire_until(&client, name, permits, opts, end, &mut stats).await {
            Round::Held(g) => g,
            Round::Failed => continue,
            Round::Ended => break,
        };
        let t1 = Instant::now();
        let most = permits.map_or(1, |p| p as usize);
        if shared.holding.fetch_add(1, Ordering::SeqCst) >= most {
            shared.violations.fetch_add(1, Ordering::SeqCst);
            tracing::error!(
                client = id,
                "exclusion violated: more clients hold than the lock (or semaphore) admits"
            );
        }
        shared.occupied(1, t1);
        let handoff = match permits {
            Some(_) => None,
            None => shared.acquired(id, t1),
        };
        let measured = shared.measuring(t1);
        if measured {
            stats.acquisitions += 1;
            record(&mut stats.wait, t1 - t0);
            if let Some(h) = handoff {
                record(&mut stats.handoff, h);
            }
        }
        if hold.is_zero() {
            tokio::task::yield_now().await;
        } else {
            hold_for(hold).await;
        }
        // Leave the critical section before the store can hand the lock to someone else.
        shared.holding.fetch_sub(1, Ordering::SeqCst);
        let now = Instant::now();
        shared.occupied(-1, now);
        shared.releasing(id, now);
        match guard.release().await {
            Ok(Released::Released) => {}
            Ok(Released::NotHeld) => {
                shared.reset(id);
                stats.error("release found the lease gone (ttl too short for the hold time?)");
            }
            Err(e) => {
                shared.reset(id);
                stats.error(e);
            }
        }
    }
    stats
}
