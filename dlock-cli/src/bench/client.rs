//! What every contending client does: acquire (waiting, given up at the window's end), hold,
//! and count; shared by the clients of this process and the client processes.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::report::new_histogram;
use dlock::{AcquireOptions, DistributedLock, LockExt, Result};

/// The lock `name`, or a permit of the semaphore `name` of `permits` permits, per `opts`.
pub(super) async fn hold_one(
    backend: &Arc<dyn DistributedLock>,
    name: &str,
    permits: Option<u32>,
    opts: &AcquireOptions,
) -> Result<dlock::LockGuard> {
    use dlock::SemaphoreExt;
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
pub(super) enum Round {
    /// Acquired.
    Held(dlock::LockGuard),
    /// Failed (counted; the client paused so as not to spin on a store that fails fast).
    Failed,
    /// The window ended while it waited.
    Ended,
}

/// One waiting acquire of a contending client, given up at `end` (dropping the acquire future
/// is cancel-safe); a failure is counted in `stats`, then the client pauses 10 ms.
pub(super) async fn acquire_until(
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
pub(super) async fn hold_for(d: Duration) {
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
pub(super) const SPIN: Duration = Duration::from_micros(200);

pub(super) struct ClientStats {
    pub(super) acquisitions: u64,
    pub(super) wait: Histogram<u64>,
    pub(super) handoff: Histogram<u64>,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
}

impl ClientStats {
    pub(super) fn new() -> Self {
        ClientStats {
            acquisitions: 0,
            wait: new_histogram(),
            handoff: new_histogram(),
            errors: 0,
            first_error: None,
        }
    }

    pub(super) fn error(&mut self, e: impl fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

/// What the contended clients measured, however they ran.
pub(super) struct Tally {
    /// Acquisitions in the measured window, by client.
    pub(super) per_client: Vec<u64>,
    pub(super) wait: Histogram<u64>,
    pub(super) handoff: Histogram<u64>,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    pub(super) violations: u64,
    pub(super) mean_holders: f64,
}

impl Tally {
    pub(super) fn new(clients: usize) -> Self {
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
