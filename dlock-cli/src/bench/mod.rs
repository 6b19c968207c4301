//! The `dlock bench` engine: uncontended pairs against the backend's raw floor, and contention
//! between independent clients on one name. The binary only formats the [`BenchReport`].
//!
//! Latencies are recorded in HDR histograms at nanosecond resolution (3 significant digits) and
//! reported in microseconds. Nothing here asserts speed; the report is for people and scripts.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use dlock::{Error, OwnerId, Result, connect, redact};

mod client;
mod contended;
mod hold;
mod processes;
mod report;
mod uncontended;

pub use hold::HoldReport;
pub use processes::{CLIENT_ARG, CLIENT_ENV, client_child};
pub use report::{
    BenchReport, ConnectionsReport, ContendedReport, FloorReport, LatencySummary, UncontendedReport,
};

use contended::contended;
use uncontended::{floor_median, uncontended};

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
            lockcore::backend_support::check_permits(p)?;
        }
        if self.mode == Mode::Hold {
            if self.leases == 0 {
                return Err(Error::invalid_argument("leases", "must be at least 1"));
            }
            lockcore::backend_support::check_ttl(self.lease_ttl)?;
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
    let floors = if opts.mode.uncontended() || opts.mode.contended() {
        dlock_bench::floor::connect(&opts.url).await?
    } else {
        dlock_bench::Floors::default()
    };
    let uncontended = if opts.mode.uncontended() {
        Some(uncontended(opts, &backend, &floors, &prefix, progress.as_ref()).await?)
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
            None => floor_median(opts, &floors, &prefix, progress.as_ref()).await?,
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
