//! The blocking-acquire helper: retries with the backend's wait hook and capped, jittered
//! exponential backoff.

use std::time::{Duration, Instant};

use crate::{AcquireOptions, DistributedLock, Lease, LockName, Result, WaitMechanism};

/// Capped exponential backoff with "equal jitter" (each delay is uniform in `[d/2, d]`).
#[derive(Clone, Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubles per step, never above `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            next: initial.min(max),
            max,
        }
    }

    /// The schedule for a waiting mechanism: short steps for polling stores, and for stores that
    /// notify a slower safety re-check that bounds the cost of a missed notification.
    pub fn for_mechanism(mechanism: WaitMechanism) -> Self {
        if mechanism.is_native() {
            Backoff::new(Duration::from_millis(50), Duration::from_millis(500))
        } else {
            Backoff::new(Duration::from_millis(2), Duration::from_millis(100))
        }
    }

    /// The next delay (jittered) and advances the schedule.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = d / 2;
        let jitter_nanos = rand::random_range(0..=half.as_nanos().max(1) as u64);
        half + Duration::from_nanos(jitter_nanos)
    }
}

/// Retries `try_acquire` until it succeeds or `deadline` passes, calling the backend's
/// [`wait_for_release`](DistributedLock::wait_for_release) between attempts with a backoff cap.
/// This is the default [`DistributedLock::acquire_wait`].
///
/// # Cancel safety
/// Holds nothing between attempts, so dropping it leaves nothing behind beyond what
/// `try_acquire` itself guarantees.
///
/// # Errors
/// The first store error from `try_acquire` or the wait hook.
pub async fn acquire_with_hook<L: DistributedLock + ?Sized>(
    lock: &L,
    name: &LockName,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
) -> Result<Option<Lease>> {
    let mut backoff = Backoff::for_mechanism(lock.capabilities().waiting);
    loop {
        if let Some(lease) = lock.try_acquire(name, opts).await? {
            return Ok(Some(lease));
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        let mut until = now + backoff.next_delay();
        if let Some(d) = deadline {
            until = until.min(d);
        }
        tracing::trace!(lock = %name, wait_ms = until.saturating_duration_since(now).as_millis() as u64, "waiting for release");
        lock.wait_for_release(name, until).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_capped_and_jittered() {
        let mut b = Backoff::new(Duration::from_millis(2), Duration::from_millis(16));
        let ds: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        assert!(ds[0] >= Duration::from_millis(1) && ds[0] <= Duration::from_millis(2));
        for d in &ds[4..] {
            assert!(
                *d >= Duration::from_millis(8) && *d <= Duration::from_millis(16),
                "{d:?}"
            );
        }
    }
}
