//! The fair (FIFO) waiting acquire shared by the three dialects, for the lock and for a
//! semaphore's permits ([`Kind`]): the same loop over the lock's statements or the
//! semaphore's (`crate::semaphore`), whose waiters queue in a table of their own.
//!
//! A waiting acquire first makes one plain attempt (which, like every `try_acquire`, fails while
//! any live waiter is queued for the name). If that fails it joins the queue: a row in the
//! waiters table (`<table>_waiters`) with an arrival ticket (an auto-increment key) and a
//! liveness deadline [`LIVENESS`] ahead by the database's clock, refreshed every [`REFRESH`]
//! while it waits. It then loops: an attempt in *waiter mode*, which grants the lock only if the
//! lease row is free and no live waiter with a smaller ticket is queued for the name, then a
//! sleep until a release notification (PostgreSQL) or the next poll (MySQL, SQLite; a release
//! made in the same process wakes the waiter there nearest the head at once, see
//! `crate::wake::local`, and one made in another process of the host rings the head's doorbell,
//! see `crate::speedup::doorbell`).
//!
//! A waiter that crashes stops refreshing its row; once its liveness deadline passes (by the
//! database's clock) it no longer counts for anyone, and the next dequeue or enqueue on the name
//! deletes it. A waiter that stalls past its own deadline finds its row expired when it next
//! refreshes, and rejoins at the tail.
//!
//! **Hand-over.** The release of a lease that was granted from the queue hands the row to the
//! queue's first live waiter in the same statement (`Statements::hand`): the row becomes that
//! waiter's with the fence bumped and the releaser's ttl, so the next holder needs no write of
//! its own, and the hand-over waits for one commit rather than two. On MySQL and SQLite the
//! release rings that waiter's doorbell, and the waiter's look finds the row its own
//! (`Attempt::HandedOver`); a waiter in another process or host finds the grant at its next look.
//! On PostgreSQL the release's notification, delivered once the hand-over has committed (and
//! been flushed), carries the grant itself (`wake::DeliveredGrant`), so the new holder sends no
//! statement at all; where it cannot use it (see `wake::Waiters::wake`), its next attempt
//! reports the row as its own (`Attempt::HandedOver` again).
//! It is handed over only to a writer (a reader's turn is its own grant) whose liveness was
//! refreshed within `dialect::HAND_FRESH`; a waiter that died in that window holds the lock
//! until the handed lease runs out, as a holder that dies does. A waiter whose ttl differs
//! from the releaser's by more than a tenth extends the row to its own before it returns, and
//! one below its token minimum takes the row again with a greater fence. Where the statement did
//! not also dequeue the new owner (MySQL), it deletes its waiter row in the background, and its
//! own release waits for that delete first (a later holder's release would otherwise hand the
//! lock to the row again, to an owner id nobody waits as). A waiter that leaves or is dropped
//! after the hand-over frees the row as its clean-up frees any grant it never returned.
//!
//! An armed cleanup spawned at once covers every way the future can end without returning the
//! lease (dropped, failed): it deletes the waiter's rows and frees the lease row if a grant to
//! this waiter had already happened. A wait that reaches its deadline leaves the queue before it
//! returns, so a timed-out waiter is gone by the time the caller sees the timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::{AcquireOptions, Error, Lease, LockName, OwnerId, Result};
use tokio::sync::futures::Notified;

use crate::client::{Client, PERMIT_QUEUED, READ_QUEUED, granted, queued};
use crate::common::{Pending, detached, from_micros, min_token_of};
use crate::config::Speedup;
use crate::dialect::{SqlDialect, lease_row_args};
use crate::speedup::doorbell::Doorbell;
use crate::statement::{Args, SqlDb};
use crate::wake::{DeliveredGrant, Join, Secret, Terms, Wake};

mod poll_interval;

use poll_interval::{PollInterval, RUNG_STEP, RUNG_STEP_MIN};

/// How long a waiter row stays live after its last refresh (by the database's clock). A crashed
/// waiter holds up the queue for at most this long.
pub(crate) const LIVENESS: Duration = Duration::from_secs(3);

/// How often a waiting acquire refreshes its row's liveness: a waiter stalled for
/// `LIVENESS − REFRESH` loses its place (and rejoins at the tail).
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// With notifications, the longest a waiter sleeps before re-checking anyway (a lost
/// notification, a dead waiter ahead whose liveness ran out, a lease that expired).
pub(crate) const RECHECK: Duration = Duration::from_millis(500);

/// What a queue waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The lock: the lease row, queued in `<table>_waiters`.
    Lock,
    /// A read hold, queued in `<table>_waiters` with the lock's waiters (see `crate::read`).
    Read,
    /// A permit of a semaphore with this count, queued in `<table>_permit_queue`.
    Permits(u32),
}

/// What one waiter-mode attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lease row is ours with this fence.
    Granted {
        fence: i64,
        /// The ticket of the live waiter left at the head of the lock's queue, where the
        /// granting statement names it (see `client::queued`).
        head: Option<i64>,
    },
    /// A release handed the lease row to us (see "Hand-over" in the module docs): it is ours
    /// with this fence, for at least `left` by the database's clock from `seen` (a look sent
    /// then, or on PostgreSQL the join that the notification names).
    HandedOver {
        fence: i64,
        left: Duration,
        seen: Instant,
        /// The ticket of the live waiter first in line behind us, if any.
        head: Option<i64>,
    },
    /// Not granted.
    Blocked {
        /// Live waiters queued ahead of us, where the dialect reports it.
        ahead: Option<u64>,
        /// Time left on the current holder's lease by the database's clock, if it is held.
        holder_left: Option<Duration>,
    },
}

impl Attempt {
    /// A live row already the waiter's, as a look sent at `seen` (or the join a hand-over's
    /// notification names) reported it: its fence, its time left, the ticket of the waiter
    /// first in line behind it. Handed over, unless there is no such row or its fence is below
    /// the caller's token `min_token` (the next grant then takes the row again with a greater one).
    fn handed_over(
        (fence, left, head): (Option<i64>, Option<Duration>, Option<i64>),
        seen: Instant,
        min_token: i64,
    ) -> Option<Attempt> {
        let (fence, left) = (fence.filter(|f| *f >= min_token)?, left?);
        Some(Attempt::HandedOver {
            fence,
            left,
            seen,
            head,
        })
    }
}

/// The queue's statements. Each may retry internally (see `StatementRunner::run`), so each must be
/// idempotent for the same inputs.
impl<D: SqlDialect> Client<D> {
    /// Joins the queue for `name`, storing `secret` in the waiter's row where the dialect hands
    /// the lock over by notification (see [`Secret`]); returns the ticket. (PostgreSQL also
    /// deletes expired waiter rows of the name.) A permit waiter joins in a transaction that
    /// checks the count.
    async fn enqueue(
        &self,
        name: &LockName,
        waiter: OwnerId,
        kind: Kind,
        secret: Secret,
    ) -> Result<i64> {
        match kind {
            Kind::Permits(permits) => {
                return self.enqueue_permit(name, waiter, permits, LIVENESS).await;
            }
            Kind::Read => return self.enqueue_read(name, waiter, LIVENESS).await,
            Kind::Lock => {}
        }
        let a = Args::of(name).owner(waiter).ttl(LIVENESS).secret(secret);
        let sql = &self.sql;
        let ticket = self
            .runner
            .join(&sql.own_ticket, a, Some, |mut c| async move {
                let r = D::Db::reply(c.conn(), &sql.enqueue, &a).await;
                (c, r.map(|r| r.value()))
            })
            .await?;
        let lost = || Error::backend(D::BACKEND, "enqueue", Some(name), false, "no ticket");
        ticket.ok_or_else(lost)
    }

    /// Extends the liveness of the waiter's row with `ticket`; `false` if it had expired or is
    /// gone (the waiter must rejoin).
    async fn refresh(
        &self,
        name: &LockName,
        waiter: OwnerId,
        ticket: i64,
        kind: Kind,
    ) -> Result<bool> {
        let args = Args::of(name).owner(waiter).ticket(ticket).ttl(LIVENESS);
        let stmt = match kind {
            Kind::Lock | Kind::Read => &self.sql.refresh,
            Kind::Permits(_) => &self.sql.permits.refresh,
        };
        // MySQL sets CLIENT_FOUND_ROWS: a matched row counts even if unchanged.
        let reply = self.runner.reply("refresh waiter", stmt, args);
        Ok(reply.await?.count() > 0)
    }

    /// One waiter-mode attempt. On dialects where the grant and the dequeue are one statement
    /// (PostgreSQL), a grant has also deleted the waiter's row. `woken`: whether a wake-up
    /// started this round (a permit waiter then skips its look). The statement that may grant
    /// runs detached (`common::detached`), undone with [`leave`](Self::leave) if the caller is
    /// gone when it completes. A grant sets the fence to `GREATEST(fence + 1, min_token)`
    /// (`min_token` 0 = none, see `common::min_token_of`).
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        self: &Arc<Self>,
        name: &LockName,
        waiter: OwnerId,
        ticket: i64,
        ttl: Duration,
        min_token: i64,
        kind: Kind,
        woken: bool,
    ) -> Result<Attempt> {
        match kind {
            Kind::Permits(permits) => {
                let attempt =
                    self.permit_attempt(name, waiter, ticket, permits, ttl, min_token, woken);
                return attempt.await;
            }
            Kind::Read => {
                return self
                    .read_attempt(name, waiter, ticket, ttl, min_token)
                    .await;
            }
            Kind::Lock => {}
        }
        let mut ahead = None;
        // Woken or not, a waiter looks: a release may have handed it the row.
        if let Some(waiter_look) = &self.sql.waiter_look {
            // Woken (rung), it was most likely handed the row: its own row is all it reads.
            if let Some(own_row_look) = self.sql.own_row_look.as_ref().filter(|_| woken) {
                let sent = Instant::now();
                let mine = self
                    .runner
                    .reply("acquire", own_row_look, Args::of(name).owner(waiter));
                let mine = mine.await?;
                let row = (mine.value(), from_micros(mine.second()), mine.col(2));
                if let Some(handed_over) = Attempt::handed_over(row, sent, min_token) {
                    return Ok(handed_over);
                }
            }
            // Look first (read-only): only the head of the queue, with the row free, takes the
            // database's write lock.
            let sent = Instant::now();
            let args = Args::of(name).owner(waiter).ticket(ticket);
            let seen = self.runner.reply("acquire", waiter_look, args).await?;
            let row = (seen.col(2), from_micros(seen.col(3)), seen.col(4));
            if let Some(handed_over) = Attempt::handed_over(row, sent, min_token) {
                return Ok(handed_over);
            }
            let holder_left = from_micros(seen.second());
            let waiting = u64::try_from(seen.count()).unwrap_or(0);
            if waiting > 0 || holder_left.is_some() {
                let ahead = Some(waiting);
                return Ok(Attempt::Blocked { ahead, holder_left });
            }
            ahead = Some(0);
        }
        let (client, name2) = (self.clone(), name.clone());
        let sent = Instant::now();
        let statement = async move {
            let args = Args::of(&name2).owner(waiter).ttl(ttl);
            let args = args.ticket(ticket).min_token(min_token);
            client
                .runner
                .reply("acquire", &client.sql.wait_acquire, args)
                .await
        };
        let undo = self.leave_later(name, waiter, kind);
        let reply = detached(D::BACKEND, name, statement, |r| r.value().is_some(), undo).await?;
        let holder_left = from_micros(reply.second());
        // Where the statement reports a live row already ours (PostgreSQL: a release handed
        // it over), columns 3 and 4 hold its fence and time left.
        let mine = Attempt::handed_over(
            (reply.col(3), from_micros(reply.col(4)), None),
            sent,
            min_token,
        );
        Ok(match (reply.value(), mine) {
            (Some(fence), _) => Attempt::Granted {
                fence,
                head: reply.col(2),
            },
            (None, Some(handed_over)) => handed_over,
            (None, None) => Attempt::Blocked { ahead, holder_left },
        })
    }

    /// The lease of a grant that a release handed to `waiter` (see "Hand-over" in the module
    /// docs): the row is ours with `fence` for `left` as of the look sent at `seen`. Where the
    /// releaser's ttl (which the handed row runs for) differs from ours by more than a tenth,
    /// the row is extended to ours first; `None` if it is no longer ours by then.
    async fn take_handed_over(
        &self,
        name: &LockName,
        waiter: OwnerId,
        fence: i64,
        left: Duration,
        seen: Instant,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let (ttl, drift) = (opts.ttl_value(), opts.drift_value());
        let lease = granted(name, waiter, fence, seen, opts);
        if left.abs_diff(ttl) <= ttl / 10 {
            return Ok(Some(
                lease.valid_no_later_than(seen + left.saturating_sub(drift)),
            ));
        }
        let started = Instant::now();
        let extend =
            self.runner
                .reply("acquire", &self.sql.extend, lease_row_args(&lease).ttl(ttl));
        Ok((extend.await?.count() == 1).then(|| lease.renewed(started, ttl)))
    }

    /// After a grant: deletes the waiter's rows where `attempt` did not (the lock on MySQL; a
    /// permit's and a reader's grant always have, and so has the lock's on PostgreSQL and
    /// SQLite: see `SqlDialect::GRANT_DEQUEUES`).
    pub(crate) async fn dequeue(&self, name: &LockName, waiter: OwnerId, kind: Kind) -> Result<()> {
        if kind != Kind::Lock {
            return Ok(());
        }
        let args = Args::of(name).owner(waiter);
        self.runner
            .reply("leave queue", &self.sql.dequeue, args)
            .await?;
        Ok(())
    }

    /// Leaves the queue: deletes the waiter's rows (and expired ones of the name), frees the
    /// lease row if it was granted to `waiter`, and wakes the others. Returns whether a lease
    /// was freed.
    async fn leave(&self, name: &LockName, waiter: OwnerId, kind: Kind) -> Result<bool> {
        let left = self.leave_queue(name, waiter, kind).await;
        // Whoever was behind may be next now.
        self.freed(name, matches!(kind, Kind::Permits(_)));
        left
    }

    /// [`leave`](Self::leave) without the wake-up.
    async fn leave_queue(&self, name: &LockName, waiter: OwnerId, kind: Kind) -> Result<bool> {
        match kind {
            Kind::Permits(_) => return self.leave_permits(name, waiter).await,
            Kind::Read => return self.leave_read(name, waiter).await,
            Kind::Lock => {}
        }
        let Some(leave) = &self.sql.leave else {
            self.dequeue(name, waiter, kind).await?;
            return self.release_owner(name, waiter).await;
        };
        let args = Args::of(name).owner(waiter);
        Ok(self.runner.reply("leave queue", leave, args).await?.count() > 0)
    }

    /// Joins the queue, detached (see `common::detached`): a join whose caller is gone by the
    /// time it completes is undone at once, rather than left to hold up the queue for its
    /// liveness.
    async fn join(
        self: &Arc<Self>,
        name: &LockName,
        waiter: OwnerId,
        kind: Kind,
        secret: Secret,
    ) -> Result<i64> {
        let (client, name2) = (self.clone(), name.clone());
        let statement = async move { client.enqueue(&name2, waiter, kind, secret).await };
        let undo = self.leave_later(name, waiter, kind);
        detached(D::BACKEND, name, statement, |_| true, undo).await
    }

    /// [`leave`](Self::leave) as an undo: a future that owns what it needs and does nothing
    /// until it is polled.
    pub(crate) fn leave_later(
        self: &Arc<Self>,
        name: &LockName,
        waiter: OwnerId,
        kind: Kind,
    ) -> Pending<bool> {
        let (client, name) = (self.clone(), name.clone());
        Box::pin(async move { client.leave(&name, waiter, kind).await })
    }
}

/// The fair waiting acquire (`DistributedLock::acquire_wait`; with [`Kind::Read`]
/// `acquire_shared_wait`, with [`Kind::Permits`] `acquire_permit_wait`) on top of a dialect's
/// queue statements: one plain attempt, then, as a [`Waiter`] in the queue, a look per round
/// and a sleep until a wake-up or the next poll, until a grant or the deadline.
///
/// # Cancel safety
/// Dropping the future leaves no waiter row and no lease behind beyond a cleanup spawned at once
/// (see the module docs).
///
/// # Errors
/// The first store error, or a permit count that differs from the one recorded for the
/// semaphore in use; the waiter has then left the queue (best effort).
pub(crate) async fn acquire<D: SqlDialect>(
    q: &Arc<Client<D>>,
    name: &LockName,
    kind: Kind,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
) -> Result<Option<Lease>> {
    let min_token = min_token_of(D::BACKEND, opts)?;
    // Uncontended (or the queue is empty and the lock free): one round trip, no queue row.
    let first = match kind {
        // (The queue's first round makes the attempt instead; never for an acquire that
        // would not wait.)
        Kind::Lock if deadline.is_none_or(|d| Instant::now() < d) && q.joins_first(name) => None,
        Kind::Lock => q.try_acquire(name, opts).await?,
        Kind::Read => q.try_acquire_read(name, opts).await?,
        Kind::Permits(permits) => q.try_acquire_permit(name, permits, opts).await?,
    };
    if let Some(lease) = first {
        return Ok(Some(lease));
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Ok(None);
    }
    let mut waiter = Waiter::join(q, name, kind, opts, deadline, min_token).await?;
    let notify = waiter.wake.notify.clone();
    loop {
        // Enabled before the look: a release committed after it wakes the sleep below.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let listening = waiter.wake.listening();

        let (started, attempt, delivered) = waiter.look().await?;
        let (ahead, holder_left) = match attempt {
            Attempt::Granted { fence, head } => {
                let lease = waiter.take_grant(fence, head, started, delivered).await?;
                return Ok(Some(lease));
            }
            Attempt::HandedOver {
                fence,
                left,
                seen,
                head,
            } => {
                let (id, opts) = (waiter.id, waiter.opts);
                let taken = q
                    .take_handed_over(name, id, fence, left, seen, opts)
                    .await?;
                if let Some(lease) = taken {
                    return Ok(Some(waiter.keep_hand_over(lease, head).await?));
                }
                (None, None)
            }
            Attempt::Blocked { ahead, holder_left } => (ahead, holder_left),
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            waiter.time_out().await?;
            return Ok(None);
        }
        let until = waiter.next_look(now, ahead, holder_left, listening);
        waiter.woken = waiter.sleep(notified, until).await;
    }
}

/// A waiting acquire once it has joined the queue: what it waits for, its place in the queue,
/// and what decides when it looks again.
struct Waiter<'a, D: SqlDialect> {
    q: &'a Arc<Client<D>>,
    name: &'a LockName,
    kind: Kind,
    opts: &'a AcquireOptions,
    deadline: Option<Instant>,
    /// The caller's token minimum, 0 for none.
    min_token: i64,
    /// The owner id it waits as (and holds as once granted).
    id: OwnerId,
    /// Whether it waits for a permit (the permit queue's wake-ups and doorbells).
    permits: bool,
    /// A permit waiter's terms, on which a release of this process may hand it a permit.
    terms: Option<Terms>,
    wake: Wake,
    /// Makes the waiter leave the queue (and give back a grant it never returned) if the
    /// acquire ends without the lease; the guard's state is that undo, not yet started.
    cleanup: CleanupGuard<Pending<bool>>,
    /// Its row's ticket in the queue.
    ticket: i64,
    /// Where the dialect polls, a release in another process of this host rings it (see
    /// `crate::speedup::doorbell`); a permit waiter's doorbell is the permit queue's.
    doorbell: Option<Doorbell>,
    /// When its row's liveness was last refreshed.
    refreshed: Instant,
    poll_interval: PollInterval,
    /// Whether a wake-up (not a timer) started this round: a release or a grant named this
    /// waiter, or it is this process's nearest to the head, so the read-only look that spares
    /// the row's lock to waiters who cannot be granted is skipped (a permit's; never the
    /// lock's, since its look is what finds a hand-over).
    woken: bool,
    /// Whether this is the first round after joining (see [`look`](Self::look)).
    joined: bool,
    /// Whether this waiter can count on a ring when the lock is released (see `RUNG_STEP`),
    /// told by its first look after joining (`None` until then).
    expects_ring: Option<bool>,
}

impl<'a, D: SqlDialect> Waiter<'a, D> {
    /// Subscribes to the wake-ups of `name` (before joining, so a release after the first look
    /// still wakes it), arms the clean-up and joins the queue.
    async fn join(
        q: &'a Arc<Client<D>>,
        name: &'a LockName,
        kind: Kind,
        opts: &'a AcquireOptions,
        deadline: Option<Instant>,
        min_token: i64,
    ) -> Result<Self> {
        // The plain attempt used the same id if the caller chose one; it left nothing behind
        // under it (see `try_acquire`).
        let id = opts.owner_or_random();
        let permits = matches!(kind, Kind::Permits(_));
        let wake = q.wake(name, id, permits);
        let undo = q.leave_later(name, id, kind);
        let cleanup = CleanupGuard::arm(D::BACKEND, name, undo, Undo::Spawn);
        let terms = match kind {
            Kind::Permits(permits) => Some(Terms {
                ttl: opts.ttl_value(),
                min_token,
                permits,
            }),
            Kind::Lock | Kind::Read => None,
        };
        let now = Instant::now();
        let mut waiter = Waiter {
            q,
            name,
            kind,
            opts,
            deadline,
            min_token,
            id,
            permits,
            terms,
            wake,
            cleanup,
            ticket: 0,
            doorbell: None,
            refreshed: now,
            poll_interval: PollInterval::new(now),
            woken: false,
            joined: true,
            expects_ring: None,
        };
        waiter.enter().await?;
        Ok(waiter)
    }

    /// Joins the queue's tail (again, once its row's liveness lapsed), recorded with when the
    /// join was sent: a release may hand it the lock and say so before the join's reply is here
    /// (see `wake::DeliveredGrant`). A new place: a new doorbell and poll interval.
    ///
    /// A join whose reply was lost (the session killed after the commit) is sent again; the
    /// retry hands back the row that try committed (`statement::rejoin`). Should a second,
    /// earlier row of the waiter stand all the same (the lost try still running when the retry
    /// looked), every look would count it ahead of the waiters behind it while this waiter
    /// counts them ahead of itself, and the queue would stand still as long as the row lived.
    /// Only the row with `ticket` is refreshed, so the other runs out within `LIVENESS`.
    async fn enter(&mut self) -> Result<()> {
        let (q, name, id) = (self.q, self.name, self.id);
        let (at, secret) = (Instant::now(), Secret::random());
        let ticket = q.join(name, id, self.kind, secret).await?;
        q.joined(
            name,
            id,
            self.permits,
            Join { ticket, at, secret },
            self.terms,
        );
        self.ticket = ticket;
        self.doorbell = q.doorbell(ticket, self.permits);
        self.refreshed = Instant::now();
        self.poll_interval = PollInterval::new(Instant::now());
        self.expects_ring = None;
        Ok(())
    }

    /// Refreshes the row's liveness once [`REFRESH`] has passed; joins again at the tail if it
    /// had lapsed.
    async fn keep_place(&mut self) -> Result<()> {
        if self.refreshed.elapsed() < REFRESH {
            return Ok(());
        }
        let (q, name) = (self.q, self.name);
        if !q.refresh(name, self.id, self.ticket, self.kind).await? {
            tracing::debug!(backend = D::BACKEND, lock = %name, "waiter liveness lapsed; rejoining the queue");
            self.enter().await?;
        }
        self.refreshed = Instant::now();
        Ok(())
    }

    /// One round's look: a grant delivered to this waiter if there is one, else (its row kept
    /// live) an attempt. When the grant it finds counts from, what it found, and the delivered
    /// grant.
    ///
    /// A release in this process may have handed this waiter a permit, granted in its own
    /// transaction from when it was sent (see `crate::semaphore`). An attempt of ours that was
    /// under way meanwhile either saw it (and took it over with a newer fence, which it
    /// returned) or ran before it and wrote nothing. Or a release elsewhere handed this waiter
    /// the lock's row and said so (PostgreSQL's `H` notification, taken only for this waiter's
    /// current join and only with the tag of the secret it stored in its row): the row is ours
    /// with that fence for at least `ttl` from `sent`. Below the caller's token minimum, the
    /// next attempt takes the row again with a greater fence.
    async fn look(&mut self) -> Result<(Instant, Attempt, Option<DeliveredGrant>)> {
        let delivered = self.wake.take_delivered();
        let found = match delivered {
            Some(h) if h.ttl.is_some() => {
                Attempt::handed_over((Some(h.fence), h.ttl, None), h.sent, self.min_token)
            }
            Some(h) => Some(Attempt::Granted {
                fence: h.fence,
                head: None,
            }),
            None => None,
        };
        let joined = std::mem::replace(&mut self.joined, false);
        if let (Some(DeliveredGrant { sent, .. }), Some(attempt)) = (delivered, found) {
            return Ok((sent, attempt, delivered));
        }
        self.keep_place().await?;
        let started = Instant::now();
        let (q, name, id, kind) = (self.q, self.name, self.id, self.kind);
        // Just joined behind a waiter of this process: no attempt can be granted before that
        // one's, whose grant or leaving wakes this one (polling dialects).
        let attempt =
            if joined && kind != Kind::Lock && q.behind_another_here(name, id, self.permits) {
                Attempt::Blocked {
                    ahead: None,
                    holder_left: None,
                }
            } else {
                let ttl = self.opts.ttl_value();
                let (ticket, min_token) = (self.ticket, self.min_token);
                q.attempt(name, id, ticket, ttl, min_token, kind, self.woken)
                    .await?
            };
        Ok((started, attempt, delivered))
    }

    /// The lease of a grant (its statement's, from `started`, or `delivered`), once the waiter
    /// has left the queue where the grant did not delete its row.
    async fn take_grant(
        self,
        fence: i64,
        head: Option<i64>,
        started: Instant,
        delivered: Option<DeliveredGrant>,
    ) -> Result<Lease> {
        let (q, name, id, kind) = (self.q, self.name, self.id, self.kind);
        if !D::GRANT_DEQUEUES {
            q.dequeue(name, id, kind).await?;
        }
        let _left = self.cleanup.disarm();
        // Readers right behind may share now, a permit may be left for the next (this waiter
        // no longer counts as queued here). After a hand-over, only if the release left one
        // free: otherwise the next's attempt, under the semaphore row's lock, could only be
        // refused.
        drop(self.wake);
        if kind != Kind::Lock && delivered.is_none_or(|h| h.more) {
            q.freed(name, self.permits);
        }
        let lease = granted(name, id, fence, started, self.opts);
        Ok(match kind {
            Kind::Lock => lease.with_handle(queued(head)),
            Kind::Read => lease.with_handle(READ_QUEUED),
            Kind::Permits(_) => lease.with_handle(PERMIT_QUEUED),
        })
    }

    /// `lease`, the lock's row that a release handed to this waiter, with `head` the waiter
    /// first in line behind it. Where the hand-over left the waiter's row (MySQL), it goes in
    /// the background, or, without that speed-up, before the acquire returns (an error then
    /// leaves the armed cleanup to free the row).
    async fn keep_hand_over(self, lease: Lease, head: Option<i64>) -> Result<Lease> {
        let (q, name, id, kind) = (self.q, self.name, self.id, self.kind);
        let later = q.speedups.contains(Speedup::BackgroundDequeue);
        if !D::HAND_DEQUEUES && !later {
            q.dequeue(name, id, kind).await?;
        }
        let _left = self.cleanup.disarm();
        drop(self.wake);
        if !D::HAND_DEQUEUES && later {
            q.dequeue_later(name, id, kind);
        }
        Ok(lease.with_handle(queued(head)))
    }

    /// At the deadline: leaves the queue before the timeout is reported; if that fails the
    /// armed cleanup tries again in the background (and the row's liveness bounds it anyway).
    async fn time_out(self) -> Result<()> {
        let (q, name, id, kind) = (self.q, self.name, self.id, self.kind);
        match q.leave(name, id, kind).await {
            Ok(_) => drop(self.cleanup.disarm()),
            Err(e) => {
                tracing::debug!(backend = D::BACKEND, lock = %name, error = %e, "leaving the queue after a timeout failed; retrying in the background")
            }
        }
        // A release here may have handed this waiter a permit after its last look. (A lock row
        // handed to it is freed by the leaving above.)
        if let Some(delivered) = self.wake.end().filter(|h| h.ttl.is_none()) {
            q.give_back(name, id, delivered.fence).await?;
        }
        Ok(())
    }

    /// When to look again after a look at `now` that found `ahead` waiters ahead and the
    /// holder's lease with `holder_left`: the step (see [`PollInterval`]; a waiter is also
    /// woken by this process's releases and grants, see `Client::freed`), cut short by the
    /// holder's expiry, the next refresh and the deadline.
    fn next_look(
        &mut self,
        now: Instant,
        ahead: Option<u64>,
        holder_left: Option<Duration>,
        listening: bool,
    ) -> Instant {
        let (kind, rings) = (self.kind, self.doorbell.is_some());
        // The lock's only: a semaphore's holders may be plain grants from before anyone
        // queued, whose releases ring nobody.
        let rung_soon = *self
            .expects_ring
            .get_or_insert_with(|| kind == Kind::Lock && rings && ahead > Some(0));
        let behind =
            kind != Kind::Lock && self.q.behind_another_here(self.name, self.id, self.permits);
        let step = if listening || behind {
            RECHECK
        } else if rung_soon {
            self.poll_interval.step(now, ahead).max(RUNG_STEP)
        } else if rings {
            // Rung when the lock is released from the queue: the looks are for the releases
            // that do not ring (see `crate::speedup::doorbell`), and need not load the store
            // as often.
            self.poll_interval.step(now, ahead).max(RUNG_STEP_MIN)
        } else {
            self.poll_interval.step(now, ahead)
        };
        let holder_gone = holder_left.map(|left| now + left + Duration::from_millis(1));
        let sooner = [holder_gone, Some(self.refreshed + REFRESH), self.deadline];
        sooner.into_iter().flatten().fold(now + step, Instant::min)
    }

    /// Sleeps until `until`, a notification (`notified`) or a ring of the doorbell; whether a
    /// wake-up, not the timer, ended it. (`&mut`: a shared borrow held across the wait would
    /// need the waiter to be `Sync`, which its clean-up is not.)
    async fn sleep(&mut self, notified: Pin<&mut Notified<'_>>, until: Instant) -> bool {
        let rung = async {
            match &self.doorbell {
                Some(doorbell) => doorbell.rung().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = notified => true,
            _ = rung => true,
            _ = tokio::time::sleep_until(until.into()) => false,
        }
    }
}
