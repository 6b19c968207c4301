//! How often a polling waiter looks again (see [`PollInterval`]).

use std::time::{Duration, Instant};

use lockcore::WaitMechanism;
use lockcore::wait::Backoff;

/// The shortest look-again step of a polling waiter.
const STEP_MIN: Duration = Duration::from_millis(1);

/// The shortest look-again step of a polling waiter with a doorbell.
pub(super) const RUNG_STEP_MIN: Duration = Duration::from_millis(4);

/// The shortest look-again step of a polling waiter with a doorbell that found others queued
/// ahead of it when it joined. While the queue is not empty no plain attempt is granted (it
/// cannot jump a live waiter), so every holder this waiter waits behind was granted from the
/// queue, and each such release rings the head (the one its grant named, or the one it looks
/// up; a read hold's release looks it up). Its looks are then only for what does not ring: a
/// holder that crashed (its expiry cuts the step short anyway), a ring that went astray, or a
/// plain holder still holding after every waiter ahead left. They are most of a polling
/// dialect's statements otherwise (about four per grant with 8 waiters), and each one slows
/// the hand-overs they wait for.
pub(super) const RUNG_STEP: Duration = Duration::from_millis(25);

/// The longest look-again step of a polling waiter.
const STEP_MAX: Duration = Duration::from_millis(100);

/// When a polling waiter looks again (MySQL and SQLite; PostgreSQL waiters are notified).
///
/// Nothing tells a waiter in another process that its turn came, so the step decides the
/// hand-over. Backing off the same way at every place in the queue (2 ms doubling to 100 ms)
/// put the waiter that had just become the head to sleep for tens of ms at the moment it was
/// next: with 8 clients in 8 processes holding 1 ms, SQLite and MariaDB handed over in about 40
/// ms (25 acquisitions/s against 500 with the clients in one process, where releases wake
/// waiters directly). Instead:
/// * **at the head**, the step is an eighth of the time spent at the head so far, from
///   [`STEP_MIN`] up to [`STEP_MAX`]: the delay after a release stays within about an eighth
///   of the hold, and a long hold costs about 8 looks per doubling of its length, then 10 a
///   second;
/// * **further back**, the step is half the time the queue took so far to move by as many
///   places as are still ahead (its pace since this waiter joined), within the same bounds: the
///   waiter looks about twice before its turn rather than at every move of the queue;
/// * before the queue has moved, or where a look does not say how many are ahead, it backs off
///   as before.
pub(super) struct PollInterval {
    joined: Instant,
    /// Waiters ahead at the first look.
    first_ahead: Option<u64>,
    /// Waiters ahead at the last look that said.
    last_ahead: Option<u64>,
    /// Since when this waiter heads the queue.
    head_since: Option<Instant>,
    backoff: Backoff,
}

impl PollInterval {
    pub(super) fn new(joined: Instant) -> Self {
        PollInterval {
            joined,
            first_ahead: None,
            last_ahead: None,
            head_since: None,
            backoff: Backoff::for_mechanism(WaitMechanism::Poll),
        }
    }

    /// The step after a look at `now` that found `ahead` waiters ahead (`None`: not said).
    pub(super) fn step(&mut self, now: Instant, ahead: Option<u64>) -> Duration {
        let Some(ahead) = ahead.or(self.last_ahead) else {
            return self.backoff.next_delay();
        };
        self.last_ahead = Some(ahead);
        let first = *self.first_ahead.get_or_insert(ahead);
        if ahead == 0 {
            let since = *self.head_since.get_or_insert(now);
            return (now.duration_since(since) / 8).clamp(STEP_MIN, STEP_MAX);
        }
        self.head_since = None;
        if first <= ahead {
            return self.backoff.next_delay();
        }
        let moved = u32::try_from(first - ahead).unwrap_or(u32::MAX);
        let per_place = now.duration_since(self.joined) / moved;
        let left = u32::try_from(ahead).unwrap_or(u32::MAX);
        (per_place.saturating_mul(left) / 2).clamp(STEP_MIN, STEP_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_looks_soon_and_less_often_the_longer_it_waits() {
        let t0 = Instant::now();
        let mut poll_interval = PollInterval::new(t0);
        assert_eq!(poll_interval.step(t0, Some(0)), STEP_MIN);
        assert_eq!(
            poll_interval.step(t0 + Duration::from_millis(80), Some(0)),
            Duration::from_millis(10)
        );
        assert_eq!(
            poll_interval.step(t0 + Duration::from_secs(60), Some(0)),
            STEP_MAX
        );
        // A look that does not say keeps the last known place.
        assert_eq!(
            poll_interval.step(t0 + Duration::from_secs(60), None),
            STEP_MAX
        );
    }

    #[test]
    fn further_back_the_step_follows_the_queues_pace() {
        let t0 = Instant::now();
        let mut poll_interval = PollInterval::new(t0);
        // Not moved yet: the backoff (at most its first step, 2 ms).
        assert!(poll_interval.step(t0, Some(5)) <= Duration::from_millis(2));
        // Moved 2 places in 20 ms (10 ms a place), 3 ahead: look in 15 ms.
        assert_eq!(
            poll_interval.step(t0 + Duration::from_millis(20), Some(3)),
            Duration::from_millis(15)
        );
        // Next: 1 ahead after 40 ms (10 ms a place): 5 ms.
        assert_eq!(
            poll_interval.step(t0 + Duration::from_millis(40), Some(1)),
            Duration::from_millis(5)
        );
        // At the head: fast again, however slow the queue was.
        assert_eq!(
            poll_interval.step(t0 + Duration::from_millis(50), Some(0)),
            STEP_MIN
        );
    }
}
