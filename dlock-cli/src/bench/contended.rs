//! The contended phase: independent clients on one name, in this process or as processes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::client::{ClientStats, Round, Tally, acquire_until, hold_for};
use super::processes;
use super::report::{ConnectionsReport, ContendedReport, LatencySummary, per_sec, record};
use super::{BenchOptions, Phase, Progress, Spawned};
use dlock::{AcquireOptions, DistributedLock, KeepAlive, Released, Result, Wait, connect};
use dlock_bench::server_connections::ConnectionSampler;

/// Who had the lock last, for handoff latency.
///
/// A handoff is measured from the moment the holder starts its release (the lock is of no use to
/// anyone from then on) to the moment a *different* client's acquire returns. Measuring from the
/// release call's return instead would go negative whenever the next client's acquire returns
/// first, which happens routinely when the releasing task is scheduled late.
pub(super) enum Slot {
    Free,
    Held { client: usize },
    Releasing { client: usize, at: Instant },
}

pub(super) struct Shared {
    pub(super) holding: AtomicUsize,
    pub(super) violations: AtomicU64,
    pub(super) slot: Mutex<Slot>,
    pub(super) occupancy: Mutex<Occupancy>,
    pub(super) measure_from: Instant,
    pub(super) end: Instant,
}

/// The number of holders over time, integrated over the measured window.
pub(super) struct Occupancy {
    /// Holders since `since`.
    pub(super) holders: usize,
    pub(super) since: Instant,
    /// Holder-seconds within the measured window so far.
    pub(super) area: f64,
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

pub(super) async fn contended(
    opts: &BenchOptions,
    prefix: &str,
    progress: Arc<dyn Progress>,
    floor_p50_us: Option<f64>,
) -> Result<ContendedReport> {
    let name = format!("{prefix}/contended");
    let ttl = opts.contended_ttl();
    let sampler = ConnectionSampler::start(&opts.url).await?;
    let tally = if opts.processes {
        processes::contend(opts, &name, ttl, progress.clone()).await
    } else {
        in_process(opts, &name, ttl, progress.clone()).await
    };
    let connections = match sampler {
        Some(sampler) => Some(sampler.finish().await?),
        None => None,
    };
    let tally = tally?;
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
    let clients = per_client.len();
    let wait = LatencySummary::of(&wait);
    let hold_us = opts.hold.as_secs_f64() * 1e6;
    let in_holds = |us: f64| if hold_us > 0.0 { us / hold_us } else { 0.0 };
    let limit =
        floor_p50_us.map(|f| opts.holders() as f64 * 1e6 / (opts.hold.as_secs_f64() * 1e6 + f));
    Ok(ContendedReport {
        name,
        permits: opts.permits,
        mean_holders,
        clients,
        processes: opts.processes,
        hold_ms: opts.hold.as_secs_f64() * 1000.0,
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        acquisitions,
        acquisitions_per_sec: per_sec(acquisitions, opts.duration),
        handoff: LatencySummary::of(&handoff),
        wait_p50_holds: in_holds(wait.p50_us),
        wait_p99_holds: in_holds(wait.p99_us),
        wait,
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
        server_connections: connections.map(|c| ConnectionsReport {
            before: c.before,
            peak: c.peak,
            per_client: c.added() as f64 / clients.max(1) as f64,
            limit: c.limit,
            reached_limit: c.reached_limit(),
            refused: c.refused,
        }),
    })
}

/// The contended clients as tasks of this process, each with its own connection.
pub(super) async fn in_process(
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
pub(super) async fn contend(
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
