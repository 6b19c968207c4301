//! What the cost ladders share (`examples/cost_ladder.rs`, `tair_ladder.rs` and
//! `redlock_ladder.rs`): the least scripts that keep the backend's queue, the backend's own
//! scripts (and the Tair emulation's) to call inline, the shuffled rounds of steps, and the
//! report.
//!
//! A ladder starts from `dlock bench`'s floor and adds one guarantee per step; each step runs
//! in blocks of 200 pairs, in a new order every round, so every step sees the same machine
//! load; the report gives each step's median, mean and p90 pair and its pairs/s relative to
//! the first step's, as `dlock bench` reports a ratio.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LockName, Wait};
use redis::Script;

use backend_redis::node::script_source;
use backend_redis::tair;

/// A step's failure.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The owner id every raw step writes.
pub const OWNER: &str = "0123456789abcdef0123456789abcdef";

/// The least acquire that keeps the queue: `SET NX PX` + `INCR` of the fence counter, refused
/// while someone is queued. KEYS lock, fence, queue; ARGV owner, ttl_ms.
pub const FAIR: &str = "if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end return redis.call('INCR', KEYS[2])";

/// The least release that keeps the queue: compare-and-delete that also looks at the queue (to
/// wake its head). KEYS lock, queue; ARGV owner.
pub const FAIR_DELETE: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('DEL', KEYS[1]) if redis.call('EXISTS', KEYS[2]) == 0 then return 1 end return 2";

/// The token of a granting reply of a ladder step's acquire: a positive integer (the floors'
/// scripts), or the real fast script's `<owner id>:<token>`, whose echo must be [`OWNER`] (the
/// check the backend makes, so the step pays for it too).
///
/// # Errors
/// A reply that is not a grant, or that echoes another owner.
pub fn granted_token(reply: &redis::Value) -> Result<i64, Failure> {
    match reply {
        redis::Value::Int(t) if *t > 0 => Ok(*t),
        redis::Value::BulkString(b) => match b.split_at_checked(OWNER.len() + 1) {
            Some((echo, token)) if echo.starts_with(OWNER.as_bytes()) && echo.ends_with(b":") => {
                std::str::from_utf8(token)?
                    .parse::<i64>()
                    .map_err(Failure::from)
            }
            _ => Err(format!("not granted: {reply:?}").into()),
        },
        other => Err(format!("not granted: {other:?}").into()),
    }
}

/// The backend's own scripts, exactly as it sends them (shared helpers included), for steps
/// that call them inline from bare redis-rs.
#[derive(Clone, Debug)]
pub struct RealScripts {
    /// The fast path of a `try` acquire (`lua/try_fast.lua`): KEYS lock, fence; ARGV owner,
    /// ttl_ms, and a token minimum only when there is one.
    pub try_fast: Script,
    /// The owner- and token-checked release (`lua/release.lua`): KEYS lock, fence, queue,
    /// alive; ARGV owner, token, wakes, client id.
    pub release: Script,
    /// The release of a lock the fast path granted, while its key is plain
    /// (`lua/release_plain.lua`): KEYS lock, fence; ARGV owner, token.
    pub release_plain: Script,
    /// The fenced bench floor's acquire (`floor/lua/fenced_acquire.lua`): KEYS key, fence; ARGV value,
    /// ttl_ms.
    pub floor_fenced: Script,
    /// The bench floor's compare-and-delete (`floor/lua/delete.lua`): KEYS key; ARGV value.
    pub floor_delete: Script,
}

impl RealScripts {
    /// The scripts as the backend sends them.
    pub fn load() -> Self {
        RealScripts {
            try_fast: Script::new(node_script("try_fast.lua")),
            release: Script::new(node_script("release.lua")),
            release_plain: Script::new(node_script("release_plain.lua")),
            floor_fenced: Script::new(include_str!("floor/lua/fenced_acquire.lua")),
            floor_delete: Script::new(include_str!("floor/lua/delete.lua")),
        }
    }
}

/// The Tair emulation's own scripts, exactly as it sends them (its prelude included), for the
/// Tair ladder's steps that call them inline from bare redis-rs.
#[derive(Clone, Debug)]
pub struct TairScripts {
    /// dlock's single attempt when nobody reads or queues (`tair/lua/try_fast.lua`): KEYS
    /// hash; ARGV owner, ttl_ms, token minimum.
    pub try_fast: Script,
    /// `expireUnlock` (`tair/lua/unlock.lua`): KEYS hash, readers, queue, alive; ARGV proof,
    /// owner, whole, wakes.
    pub unlock: Script,
}

impl TairScripts {
    /// The scripts as the emulation sends them.
    pub fn load() -> Self {
        TairScripts {
            try_fast: Script::new(tair_script("try_fast.lua")),
            unlock: Script::new(tair_script("unlock.lua")),
        }
    }
}

fn node_script(file: &str) -> &'static str {
    script_source(file).unwrap_or_else(|| panic!("backend-redis has no script {file}"))
}

fn tair_script(file: &str) -> &'static str {
    tair::script_source(file).unwrap_or_else(|| panic!("the Tair emulation has no script {file}"))
}

/// Pairs per step and round.
const BLOCK: usize = 200;

/// The order the steps run in: `rounds` rounds after one warm-up round that is not recorded,
/// each round every step once in a new order, `BLOCK` pairs at a time, so that no step always
/// follows another and all see the same machine load.
///
/// ```text
/// while let Some(step) = schedule.next_step() { time one pair of `step`; schedule.record(..) }
/// ```
#[derive(Debug)]
pub struct Schedule {
    order: Vec<usize>,
    seed: u64,
    rounds: usize,
    round: usize,
    at: usize,
    done_in_block: usize,
    samples: Vec<Vec<Duration>>,
}

impl Schedule {
    /// A schedule of `steps` steps over `rounds` recorded rounds.
    pub fn new(steps: usize, rounds: usize) -> Self {
        let mut schedule = Schedule {
            order: (0..steps).collect(),
            seed: 0x9e37_79b9_7f4a_7c15,
            rounds,
            round: 0,
            at: 0,
            done_in_block: 0,
            samples: vec![Vec::new(); steps],
        };
        schedule.shuffle();
        schedule
    }

    fn shuffle(&mut self) {
        for i in (1..self.order.len()).rev() {
            // xorshift64: a fixed, dependency-free sequence of shuffles.
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            self.order.swap(i, (self.seed % (i as u64 + 1)) as usize);
        }
    }

    /// The step whose pair runs next; `None` when all rounds are done.
    pub fn next_step(&mut self) -> Option<usize> {
        if self.done_in_block == BLOCK {
            self.done_in_block = 0;
            self.at += 1;
            if self.at == self.order.len() {
                self.at = 0;
                self.round += 1;
                self.shuffle();
            }
        }
        if self.round > self.rounds || self.order.is_empty() {
            return None;
        }
        self.done_in_block += 1;
        Some(self.order[self.at])
    }

    /// Records one pair of `step` that took `took` (dropped in the warm-up round).
    pub fn record(&mut self, step: usize, took: Duration) {
        if self.round > 0 {
            self.samples[step].push(took);
        }
    }

    /// Each step's recorded pair times.
    pub fn into_samples(self) -> Vec<Vec<Duration>> {
        self.samples
    }
}

/// A ladder's own steps (those before the two of [`BackendSteps`]), as [`climb`] runs them.
pub trait Steps {
    /// One acquire + release of `step`.
    fn pair(&mut self, step: usize) -> impl Future<Output = Result<(), Failure>> + Send;
}

/// Times the pairs of the steps `labels` names as a [`Schedule`] over `rounds` rounds orders
/// them: the ladder's own (`raw`), then the last two `backend`'s, `try_acquire` + `release` and
/// `lock()` + guard `release()`; then prints the [`report`].
///
/// # Errors
/// The first pair that fails.
pub async fn climb(
    labels: &[&str],
    rounds: usize,
    raw: &mut impl Steps,
    backend: &BackendSteps,
) -> Result<(), Failure> {
    let own = labels.len().saturating_sub(2);
    let mut schedule = Schedule::new(labels.len(), rounds);
    while let Some(step) = schedule.next_step() {
        let t = Instant::now();
        if step < own {
            raw.pair(step).await?;
        } else if step == own {
            backend.backend_pair().await?;
        } else {
            backend.lockcore_pair().await?;
        }
        schedule.record(step, t.elapsed());
    }
    report(labels, schedule.into_samples());
    Ok(())
}

/// Prints each step's median, mean and p90 pair, and its pairs/s relative to the first step's
/// (total pairs over total time, as `dlock bench` reports it).
pub fn report(steps: &[&str], samples: Vec<Vec<Duration>>) {
    let width = steps.iter().map(|s| s.chars().count()).max().unwrap_or(4);
    println!(
        "{:<width$} {:>9} {:>9} {:>9} {:>9}",
        "step", "median", "mean", "p90", "÷ floor"
    );
    let mean_of =
        |v: &[Duration]| v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap_or(u32::MAX);
    let floor_mean = mean_of(&samples[0]);
    for (label, mut v) in steps.iter().zip(samples) {
        v.sort_unstable();
        let mean = mean_of(&v);
        let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
        let ratio = floor_mean.as_secs_f64() / mean.as_secs_f64();
        println!(
            "{label:<width$} {:>9.1?} {:>9.1?} {:>9.1?} {ratio:>9.3}",
            at(0.5),
            mean,
            at(0.9)
        );
    }
}

/// The two steps the single-server ladders end with: the backend's `try_acquire` + `release`
/// through `DistributedLock`, and lockcore's `lock()` + guard `release()`, each on a name of
/// its own.
pub struct BackendSteps {
    backend: Arc<dyn DistributedLock>,
    direct: LockName,
    through: LockName,
    opts: AcquireOptions,
    direct_opts: AcquireOptions,
}

impl BackendSteps {
    /// The steps on `backend`, on names starting with `prefix`.
    ///
    /// # Errors
    /// A prefix that makes no lock name.
    pub fn new(backend: Arc<dyn DistributedLock>, prefix: &str) -> Result<Self, Failure> {
        let opts = AcquireOptions::new()
            .wait(Wait::No)
            .keep_alive(KeepAlive::Off);
        Ok(BackendSteps {
            direct: LockName::new(format!("{prefix}-backend"))?,
            through: LockName::new(format!("{prefix}-lockcore"))?,
            direct_opts: opts.clone().with_defaults(&backend.defaults()),
            opts,
            backend,
        })
    }

    /// One `try_acquire` + `release` through `DistributedLock`.
    ///
    /// # Errors
    /// A store error, or the name found held.
    pub async fn backend_pair(&self) -> Result<(), Failure> {
        let lease = self.backend.try_acquire(&self.direct, &self.direct_opts);
        let lease = lease.await?.ok_or("the backend's name was held")?;
        self.backend.release(&lease).await?;
        Ok(())
    }

    /// One lockcore `lock()` + guard `release()`.
    ///
    /// # Errors
    /// A store error, or the name found held.
    pub async fn lockcore_pair(&self) -> Result<(), Failure> {
        let guard = self.backend.lock(self.through.as_str(), &self.opts).await?;
        guard.release().await?;
        Ok(())
    }
}

/// What every ladder's `main` does: reads `URL [rounds]` from the command line (the URL
/// `default_url` when none is given, or the error `usage` when there is no default; `rounds`
/// when none is given), and runs `ladder` with them in a task on a worker thread, where
/// applications make their lock calls.
///
/// # Errors
/// A missing URL without a default, rounds that are no number, and what `ladder` returns.
pub async fn run<F, Fut>(
    default_url: Option<&str>,
    usage: &str,
    rounds: usize,
    ladder: F,
) -> Result<(), Failure>
where
    F: FnOnce(String, usize) -> Fut,
    Fut: Future<Output = Result<(), Failure>> + Send + 'static,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = match (args.first(), default_url) {
        (Some(url), _) => url.clone(),
        (None, Some(url)) => url.to_owned(),
        (None, None) => return Err(usage.into()),
    };
    let rounds: usize = args.get(1).map_or(Ok(rounds), |a| a.parse())?;
    tokio::spawn(ladder(url, rounds)).await?
}
