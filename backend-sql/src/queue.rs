//! The fair (FIFO) waiting acquire shared by the three dialects.
//!
//! A waiting acquire first makes one plain attempt (which, like every `try_acquire`, fails while
//! any live waiter is queued for the name). If that fails it joins the queue: a row in the
//! waiters table (`<table>_waiters`) with an arrival ticket (an auto-increment key) and a
//! liveness deadline [`LIVENESS`] ahead by the database's clock, refreshed every [`REFRESH`]
//! while it waits. It then loops: an attempt in *waiter mode*, which grants the lock only if the
//! lease row is free and no live waiter with a smaller ticket is queued for the name, then a
//! sleep until a release notification (PostgreSQL) or the next poll (MySQL, SQLite).
//!
//! A waiter that crashes stops refreshing its row; once its liveness deadline passes (by the
//! database's clock) it no longer counts for anyone, and the next dequeue or enqueue on the name
//! deletes it. A waiter that stalls past its own deadline finds its row expired when it next
//! refreshes, and rejoins at the tail.
//!
//! An armed cleanup spawned at once covers every way the future can end without returning the
//! lease (dropped, failed): it deletes the waiter's rows and frees the lease row if a grant to
//! this waiter had already happened. A wait that reaches its deadline leaves the queue before it
//! returns, so a timed-out waiter is gone by the time the caller sees the timeout.

use std::future::Future;
use std::time::{Duration, Instant};

use lockcore::wait::Backoff;
use lockcore::{AcquireOptions, DistributedLock, Lease, LockName, OwnerId, Result, WaitMechanism};
use tokio::sync::{Notify, watch};

use crate::common::{CancelCleanup, detached, floor_of, spawn_cleanup, token};

/// How long a waiter row stays live after its last refresh (by the database's clock). A crashed
/// waiter holds up the queue for at most this long.
pub(crate) const LIVENESS: Duration = Duration::from_secs(3);

/// How often a waiting acquire refreshes its row's liveness: a waiter stalled for
/// `LIVENESS − REFRESH` loses its place (and rejoins at the tail).
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// With notifications, the longest a waiter sleeps before re-checking anyway (a lost
/// notification, a dead waiter ahead whose liveness ran out, a lease that expired).
pub(crate) const RECHECK: Duration = Duration::from_millis(500);

/// What one waiter-mode attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lease row is ours with this fence.
    Granted(i64),
    /// Not granted.
    Blocked {
        /// Live waiters queued ahead of us, where the dialect reports it.
        ahead: Option<u64>,
        /// Time left on the current holder's lease by the database's clock, if it is held.
        holder_left: Option<Duration>,
    },
}

/// How a waiter learns about releases.
pub(crate) struct Wake {
    /// Never notified: the sleep of dialects without notifications.
    silent: Notify,
    /// PostgreSQL: this waiter's interest in the name (woken when a release names it the head,
    /// or wakes everyone on the name).
    registration: Option<crate::postgres::Registration>,
    /// PostgreSQL: whether the listener connection is up and LISTENing.
    ready: Option<watch::Receiver<bool>>,
}

impl Wake {
    /// For dialects that poll.
    pub(crate) fn poll() -> Self {
        Wake {
            silent: Notify::new(),
            registration: None,
            ready: None,
        }
    }

    /// For PostgreSQL: notifications for one name, and the listener's state.
    pub(crate) fn notify(
        registration: crate::postgres::Registration,
        ready: watch::Receiver<bool>,
    ) -> Self {
        Wake {
            silent: Notify::new(),
            registration: Some(registration),
            ready: Some(ready),
        }
    }

    fn notify_handle(&self) -> &Notify {
        self.registration
            .as_ref()
            .map_or(&self.silent, |r| r.notify())
    }

    /// Whether a release will be notified: the listener has been LISTENing since before now.
    fn listening(&self) -> bool {
        self.ready.as_ref().is_some_and(|r| *r.borrow())
    }
}

/// A dialect's queue statements. Every method may retry its statement internally (see
/// `Core::run`), so each must be idempotent for the same inputs.
pub(crate) trait Queue: DistributedLock + Clone {
    /// The backend name, for logs.
    const BACKEND: &'static str;

    /// Subscribes `waiter` to release notifications for `name` (before the first look at the
    /// row). Where the dialect can, a release wakes only the queue's head.
    fn wake(&self, name: &LockName, waiter: OwnerId) -> Wake;

    /// Joins the queue for `name`; returns the ticket. Also deletes expired waiter rows of the
    /// name.
    fn enqueue(&self, name: &LockName, waiter: &str) -> impl Future<Output = Result<i64>> + Send;

    /// Extends the waiter's liveness; `false` if its row had expired or is gone (the waiter must
    /// rejoin).
    fn refresh(&self, name: &LockName, waiter: &str) -> impl Future<Output = Result<bool>> + Send;

    /// One waiter-mode attempt. On dialects where the grant and the dequeue are one statement
    /// (PostgreSQL), a grant has also deleted the waiter's row. The statement that may grant
    /// runs detached (`common::detached`), undone with [`cancel`](Self::cancel) if the caller
    /// is gone when it completes. A grant sets the fence to `GREATEST(fence + 1, floor)`
    /// (`floor` 0 = none, see `common::floor_of`).
    fn attempt(
        &self,
        name: &LockName,
        waiter: OwnerId,
        ticket: i64,
        ttl: Duration,
        floor: i64,
    ) -> impl Future<Output = Result<Attempt>> + Send;

    /// After a grant: deletes the waiter's rows where `attempt` did not (MySQL, SQLite).
    fn dequeue(&self, name: &LockName, waiter: &str) -> impl Future<Output = Result<()>> + Send;

    /// Leaves the queue: deletes the waiter's rows (and expired ones of the name), frees the
    /// lease row if it was granted to `waiter`, and wakes the others. Returns whether a lease
    /// was freed.
    fn cancel(&self, name: &LockName, waiter: OwnerId)
    -> impl Future<Output = Result<bool>> + Send;
}

/// Arms the cleanup that makes `waiter` leave the queue (and give back a grant it never
/// returned) if the acquire ends without the lease.
fn arm<Q: Queue>(q: &Q, name: &LockName, waiter: OwnerId) -> CancelCleanup {
    let q = q.clone();
    let name = name.clone();
    CancelCleanup::arm(move || {
        let task_name = name.clone();
        spawn_cleanup(Q::BACKEND, &name, async move {
            q.cancel(&task_name, waiter).await
        });
    })
}

/// Joins the queue, detached (see `common::detached`): a join whose caller is gone by the time
/// it completes is undone at once, rather than left to hold up the queue for its liveness.
async fn join<Q: Queue>(q: &Q, name: &LockName, waiter: OwnerId) -> Result<i64> {
    let statement = {
        let (q, name) = (q.clone(), name.clone());
        async move { q.enqueue(&name, &waiter.to_string()).await }
    };
    let undo = {
        let (q, name) = (q.clone(), name.clone());
        move || async move { q.cancel(&name, waiter).await }
    };
    detached(Q::BACKEND, name, statement, |_| true, undo).await
}

/// The fair waiting acquire (`DistributedLock::acquire_wait`) on top of a dialect's [`Queue`].
///
/// # Cancel safety
/// Dropping the future leaves no waiter row and no lease behind beyond a cleanup spawned at once
/// (see the module docs).
///
/// # Errors
/// The first store error; the waiter has then left the queue (best effort).
pub(crate) async fn acquire<Q: Queue>(
    q: &Q,
    name: &LockName,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
) -> Result<Option<Lease>> {
    let floor = floor_of(Q::BACKEND, opts)?;
    // Uncontended (or the queue is empty and the lock free): one round trip, no queue row.
    if let Some(lease) = q.try_acquire(name, opts).await? {
        return Ok(Some(lease));
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Ok(None);
    }
    let ttl = opts.ttl_value();
    // The plain attempt above used the same id if the caller chose one; it left nothing behind
    // under it (see each dialect's `try_acquire`).
    let waiter = opts.owner_or_random();
    let waiter_text = waiter.to_string();
    // Subscribe before joining, so a release after our first look still wakes us.
    let wake = q.wake(name, waiter);
    let mut cleanup = arm(q, name, waiter);
    let mut ticket = join(q, name, waiter).await?;
    let mut refreshed = Instant::now();
    let poll = Backoff::for_mechanism(WaitMechanism::Poll);
    let mut backoff = poll.clone();
    let mut last_ahead: Option<u64> = None;
    loop {
        // Enabled before the look: a release committed after it wakes the sleep below.
        let notified = wake.notify_handle().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let listening = wake.listening();

        if refreshed.elapsed() >= REFRESH {
            if !q.refresh(name, &waiter_text).await? {
                tracing::debug!(backend = Q::BACKEND, lock = %name, "waiter liveness lapsed; rejoining the queue");
                ticket = join(q, name, waiter).await?;
            }
            refreshed = Instant::now();
        }

        let started = Instant::now();
        let (ahead, holder_left) = match q.attempt(name, waiter, ticket, ttl, floor).await? {
            Attempt::Granted(fence) => {
                q.dequeue(name, &waiter_text).await?;
                cleanup.disarm();
                return Ok(Some(Lease::new(
                    name.clone(),
                    waiter,
                    token(fence),
                    started,
                    ttl,
                    opts.drift_value(),
                )));
            }
            Attempt::Blocked { ahead, holder_left } => (ahead, holder_left),
        };

        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            // Leave the queue before reporting the timeout; if that fails the armed cleanup
            // tries again in the background (and the row's liveness bounds it anyway).
            match q.cancel(name, waiter).await {
                Ok(_) => cleanup.disarm(),
                Err(e) => {
                    tracing::debug!(backend = Q::BACKEND, lock = %name, error = %e, "leaving the queue after a timeout failed; retrying in the background");
                }
            }
            return Ok(None);
        }

        // Polling: back off, but start over whenever the queue moved (we may be next).
        if ahead.is_some_and(|a| last_ahead.is_some_and(|l| a < l)) {
            backoff = poll.clone();
        }
        last_ahead = ahead;
        let step = if listening {
            RECHECK
        } else {
            backoff.next_delay()
        };
        let mut until = now + step;
        if let Some(left) = holder_left {
            until = until.min(now + left + Duration::from_millis(1));
        }
        until = until.min(refreshed + REFRESH);
        if let Some(d) = deadline {
            until = until.min(d);
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(until.into()) => {}
        }
    }
}
