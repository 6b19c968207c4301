//! Counting semaphores, written once for the three dialects: at most `permits` live holders of
//! a name, apart from the lock of the same name.
//!
//! Three tables sit next to the lease table (see `PermitStatements`): `<table>_semaphores`
//! holds each semaphore's fence, which no statement but `forget` ever lowers or deletes;
//! `<table>_permits` holds one row per permit held (owner, fence, the count it was granted
//! under, expiry by the database's clock); `<table>_permit_queue` holds the permit waiters,
//! as `<table>_waiters` holds the lock's, so neither queue sees the other.
//!
//! **A grant is one short transaction** that first writes the semaphore row, which takes that
//! row's lock (PostgreSQL, MySQL) or the database's write lock (SQLite) until it ends, and
//! bumps the fence. Then, reading what committed before (each statement of a PostgreSQL or
//! MySQL transaction at READ COMMITTED does), it looks at the live holders, the live waiters
//! ahead and the recorded count, and either inserts the permit row (and, for a queued waiter,
//! deletes its waiter row) and commits, or rolls back, so the bump never shows. Every insert
//! into the holders or the waiters of a semaphore happens under that row's lock, so two grants
//! never both see room for one, and the count (kept in each holder and waiter row, all alike)
//! is checked and recorded atomically with the insert. Whatever writes without the lock
//! (release, expiry, a waiter leaving) only frees room, so a grant decided on an older view is
//! at worst refused, never wrongly given.
//!
//! **Server-side routines.** PostgreSQL runs the grant, the join and the release as PL/pgSQL
//! functions (`dialect/postgres/routines.rs`), MySQL and MariaDB as stored procedures where the
//! account may create them (`speedup/mysql_procedures.rs`): the same statements, one round trip,
//! and the row's lock held only while the server runs them.
//!
//! **Hand-over.** A release of a permit in a process that has a waiter for it (this process's
//! waiter nearest the head of the queue, with the ttl, token minimum and count it asked for)
//! runs the release and that waiter's grant in one transaction ([`PermitStatements::hand`]),
//! under the row's lock and with the grant's own checks: the waiter is still queued and live,
//! nobody live is queued ahead of it (a waiter of another process queued first keeps its turn),
//! a permit is free and the counts agree. The releasing client then puts the fence in the
//! waiter's registration and wakes it (`crate::wake`), and the waiter returns without a round
//! trip of its own, its lease valid from the moment the release was sent (the grant's `now` is
//! later). A handed permit is never lost: a waiter whose own attempt was under way either saw
//! it (and took it over with a newer fence) or ran before it and wrote nothing; a waiter that
//! has gone before it is handed one is given nothing and the releaser gives the permit back; a
//! waiter that times out unregisters first, then gives back what it was handed; a dropped
//! waiter's clean-up, which runs after, frees its permits. Where the dialect has no routine
//! for it (SQLite, or a MySQL account that may not create one), the same statements go one
//! by one in a transaction ([`PermitStatements::handing`]). With no waiter of the process
//! queued, the release frees the permit and wakes waiters as before. (Handing over costs one
//! transaction under the row's lock instead of two, the release's and the grant's, and the
//! woken waiter's round trip, so a busy semaphore stays fuller: `docs/design/backend-sql.md`.)
//!
//! **Retries.** A transaction retried after a lost reply (see `StatementRunner::run`) first looks
//! for a live permit of its own owner id, which the first try may have committed, and takes it over
//! with a new fence instead of granting a second (as the lock's acquire takes over a row that
//! is already ours); the holders table's key (name, owner) refuses a second row of one owner
//! anyway.
//!
//! [`PermitStatements::hand`]: crate::dialect::PermitStatements::hand
//! [`PermitStatements::handing`]: crate::dialect::PermitStatements::handing

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, FencingToken, Lease, LockName, OwnerId, PermitHolder, Released, Result,
    SemaphoreInfo, backend_support::permits_mismatch,
};

use crate::client::{Client, permit};
use crate::common::{Pending, detached, from_micros, min_token_of};
use crate::config::Speedup;
use crate::dialect::SqlDialect;
use crate::dialect::lease_row_args;
use crate::queue::{Attempt, Kind};
use crate::statement::{Args, SqlDb};
use crate::wake::{DeliveredGrant, Terms, key};

mod tx;
use tx::{Grant, Handover, Judged, grant_tx, granted_by_call, hand_tx, join_tx, judge};

/// The semaphore operations of a client.
impl<D: SqlDialect> Client<D> {
    /// Runs the grant transaction for `owner` (queued with `ticket`, if any); also how many
    /// tries it took (a retry may have followed a lost reply).
    async fn grant(
        &self,
        name: &LockName,
        owner: OwnerId,
        permits: u32,
        ttl: Duration,
        min_token: i64,
        ticket: Option<i64>,
    ) -> Result<(Grant, u32)> {
        let sql = &self.sql.permits;
        let a = Args::of(name).owner(owner).ttl(ttl).min_token(min_token);
        let a = a.permits(permits).ticket(ticket.unwrap_or(i64::MAX));
        let mut tries = 0;
        let grant = self
            .runner
            .run("acquire permit", Some(name), |mut c| {
                tries += 1;
                async move {
                    let r = match &sql.grant_call {
                        Some(call) => D::Db::reply(c.conn(), call, &a)
                            .await
                            .and_then(|reply| granted_by_call(&reply)),
                        None => {
                            grant_tx::<D::Db>(c.conn(), sql, a, permits, ticket.is_some()).await
                        }
                    };
                    (c, r)
                }
            })
            .await?;
        Ok((grant, tries))
    }

    /// One attempt at a permit (`DistributedLock::try_acquire_permit`), also a waiting
    /// acquire's first. Cancel safety as the lock's `try_acquire`: the transaction runs
    /// detached, and an armed cleanup deletes a permit row of the owner id if the future is
    /// dropped.
    pub(crate) async fn try_acquire_permit(
        self: &Arc<Self>,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let min_token = min_token_of(D::BACKEND, opts)?;
        let owner = opts.owner_or_random();
        let ttl = opts.ttl_value();
        // A waiter of this process is queued (joined, with the same count): FIFO refuses a
        // single attempt while it waits, so the store need not be asked. (Its row may have
        // left the queue a moment ago, with its grant: a refusal then is one an attempt sent
        // a moment earlier would have had.)
        let key = key(name.as_str(), true);
        if self
            .local
            .next(&key)
            .is_some_and(|next| next.terms.permits == permits)
        {
            return Ok(None);
        }
        // A refusal on this look is sound: only room can appear after it.
        if D::LOCAL_READS
            && let Judged::Blocked { .. } = self.look(name, owner, i64::MAX, permits).await?
        {
            return Ok(None);
        }
        let statement = {
            let (client, name) = (self.clone(), name.clone());
            async move {
                client
                    .grant(&name, owner, permits, ttl, min_token, None)
                    .await
            }
        };
        let give_back = || self.free_permit_later(name, owner);
        let (grant, _) = self.attempt_once(name, statement, give_back).await?;
        match grant {
            Grant::Granted(fence) => Ok(Some(permit(name, owner, fence, started, opts))),
            Grant::Blocked { .. } => Ok(None),
            Grant::Mismatch(recorded) => Err(permits_mismatch(name, recorded, permits)),
        }
    }

    /// A read-only look at `name`'s state as `owner` (queued with `ticket`, `i64::MAX` when
    /// not) sees it, without the semaphore row's lock.
    async fn look(
        &self,
        name: &LockName,
        owner: OwnerId,
        ticket: i64,
        permits: u32,
    ) -> Result<Judged> {
        let args = Args::of(name).owner(owner).ticket(ticket);
        let state = &self.sql.permits.state;
        let seen = self.runner.reply("acquire permit", state, args).await?;
        Ok(judge(&seen, permits))
    }

    /// Deletes `owner`'s permit row of `name` whatever its fence (PostgreSQL: and wakes the
    /// name's permit waiters). Whether a permit was freed.
    async fn free_permit(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let args = Args::of(name).owner(owner);
        let stmt = &self.sql.permits.release_owner;
        let freed = self.runner.reply("release", stmt, args).await?.count() > 0;
        if freed {
            self.freed(name, true);
        }
        Ok(freed)
    }

    /// Releases a permit (`DistributedLock::release` of a permit's lease). Where a waiter of
    /// this process heads this process's part of the queue, the release grants it the freed
    /// permit in the same transaction, when its own grant would have (see
    /// [`PermitStatements::hand`]), and hands it the fence: the waiter returns without a round
    /// trip of its own. Otherwise, or when it may not have it (someone of another process is
    /// ahead), the release wakes waiters as before.
    ///
    /// [`PermitStatements::hand`]: crate::dialect::PermitStatements::hand
    pub(crate) async fn release_permit(&self, lease: &Lease) -> Result<Released> {
        let name = lease.name();
        let key = key(name.as_str(), true);
        let sql = &self.sql.permits;
        let hand_over = self.speedups.contains(Speedup::HandOver);
        let Some(next) = self.local.next(&key).filter(|_| hand_over) else {
            return self.release_row(&sql.release, lease, true).await;
        };
        let Terms {
            ttl,
            min_token,
            permits,
        } = next.terms;
        let args = lease_row_args(lease).next(next.owner).ticket(next.ticket);
        let args = args.ttl(ttl).min_token(min_token).permits(permits);
        let sent = Instant::now();
        let handover = self
            .runner
            .run("release", Some(name), |mut c| async move {
                let r = match &sql.hand {
                    Some(call) => D::Db::reply(c.conn(), call, &args)
                        .await
                        .map(|reply| Handover::by_call(&reply)),
                    None => hand_tx::<D::Db>(c.conn(), sql, args, permits).await,
                };
                (c, r)
            })
            .await?;
        if !handover.freed {
            return Ok(Released::NotHeld);
        }
        let Some(fence) = handover.fence else {
            // Not handed (one of another process is ahead): the next may be granted.
            self.released(lease, true);
            return Ok(Released::Released);
        };
        let more = handover.free > 0;
        // Handed: the waiter wakes the next itself if permits are left (now the next here is
        // still that waiter). If it went away meanwhile, its clean-up may have run before the
        // grant: give the permit back here.
        if !self.local.hand(
            &key,
            next.owner,
            DeliveredGrant {
                fence,
                sent,
                more,
                ttl: None,
            },
        ) {
            self.give_back(name, next.owner, fence).await?;
        }
        Ok(Released::Released)
    }

    /// Gives back the permit with `fence` that a release handed to waiter `owner` and that it
    /// will not take (it had gone, or gave up): a fence-checked release, then the next may be
    /// granted.
    pub(crate) async fn give_back(
        &self,
        name: &LockName,
        owner: OwnerId,
        fence: i64,
    ) -> Result<()> {
        let args = Args::of(name).owner(owner).fence(fence);
        let release = &self.sql.permits.release;
        if self.runner.reply("release", release, args).await?.count() > 0 {
            self.freed(name, true);
            self.ring_head(name, owner, None, true);
        }
        Ok(())
    }

    /// [`free_permit`](Self::free_permit) as an undo that does nothing until polled.
    fn free_permit_later(self: &Arc<Self>, name: &LockName, owner: OwnerId) -> Pending<bool> {
        let (client, name) = (self.clone(), name.clone());
        Box::pin(async move { client.free_permit(&name, owner).await })
    }

    /// Joins the permit queue of `name` with `permits` (the join transaction); the ticket.
    pub(crate) async fn enqueue_permit(
        &self,
        name: &LockName,
        waiter: OwnerId,
        permits: u32,
        liveness: Duration,
    ) -> Result<i64> {
        let sql = &self.sql.permits;
        let a = Args::of(name).owner(waiter).ttl(liveness).permits(permits);
        // A live row found on a retry passed the count check when it joined.
        let joined = self
            .runner
            .join(&sql.own_ticket, a, Ok, |mut c| async move {
                let r = match &sql.join_call {
                    Some(call) => D::Db::reply(c.conn(), call, &a).await.map(|reply| {
                        let recorded = reply.col(1).unwrap_or(0);
                        reply.col(0).ok_or(u64::try_from(recorded).unwrap_or(0))
                    }),
                    None => join_tx::<D::Db>(c.conn(), sql, a, permits).await,
                };
                (c, r)
            })
            .await?;
        joined.map_err(|recorded| permits_mismatch(name, recorded, permits))
    }

    /// One queued waiter's attempt at a permit: a read-only look first (unless `woken`: a
    /// wake-up that named this waiter, which is then likely next), so that only a waiter with
    /// room and nobody ahead takes the semaphore row's lock; then the grant transaction,
    /// detached and undone (the waiter leaves the queue) if the caller is gone when it
    /// completes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn permit_attempt(
        self: &Arc<Self>,
        name: &LockName,
        waiter: OwnerId,
        ticket: i64,
        permits: u32,
        ttl: Duration,
        min_token: i64,
        woken: bool,
    ) -> Result<Attempt> {
        if !woken {
            match self.look(name, waiter, ticket, permits).await? {
                Judged::Mismatch(recorded) => {
                    return Err(permits_mismatch(name, recorded, permits));
                }
                Judged::Blocked { ahead, holder_left } => {
                    let ahead = Some(ahead);
                    return Ok(Attempt::Blocked { ahead, holder_left });
                }
                Judged::Mine | Judged::Free { .. } => {}
            }
        }
        let statement = {
            let (client, name) = (self.clone(), name.clone());
            async move {
                let grant = client.grant(&name, waiter, permits, ttl, min_token, Some(ticket));
                Ok(grant.await?.0)
            }
        };
        let needs_undo = |g: &Grant| matches!(g, Grant::Granted(_));
        let undo = self.leave_later(name, waiter, Kind::Permits(permits));
        match detached(D::BACKEND, name, statement, needs_undo, undo).await? {
            Grant::Granted(fence) => Ok(Attempt::Granted { fence, head: None }),
            Grant::Blocked { ahead, holder_left } => {
                let ahead = Some(ahead);
                Ok(Attempt::Blocked { ahead, holder_left })
            }
            Grant::Mismatch(recorded) => Err(permits_mismatch(name, recorded, permits)),
        }
    }

    /// Leaves the permit queue: deletes the waiter's rows (and expired ones of the name),
    /// frees a permit granted to it, and (PostgreSQL) wakes the other permit waiters. Whether
    /// a permit was freed.
    pub(crate) async fn leave_permits(&self, name: &LockName, waiter: OwnerId) -> Result<bool> {
        let sql = &self.sql.permits;
        let args = Args::of(name).owner(waiter);
        if let Some(leave) = &sql.leave {
            return Ok(self.runner.reply("leave queue", leave, args).await?.count() > 0);
        }
        self.runner.reply("leave queue", &sql.dequeue, args).await?;
        self.free_permit(name, waiter).await
    }

    /// `DistributedLock::inspect_semaphore`.
    pub(crate) async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        let sql = &self.sql.permits;
        let summary = self
            .runner
            .reply("inspect", &sql.summary, Args::of(name))
            .await?;
        if summary.count() == 0 {
            return Ok(None);
        }
        let holders = self.runner.holder_rows(&sql.holders, name).await?;
        let holders: Vec<PermitHolder> = holders
            .into_iter()
            .map(|(owner, fence, left)| PermitHolder {
                owner,
                token: FencingToken(u64::try_from(fence).unwrap_or(0)),
                remaining: Some(from_micros(left).unwrap_or_default()),
            })
            .collect();
        let permits = summary.col(1).and_then(|p| u32::try_from(p).ok());
        let waiters = usize::try_from(summary.col(2).unwrap_or(0)).unwrap_or(0);
        Ok(Some(SemaphoreInfo::new(
            name,
            permits,
            holders,
            Some(waiters),
        )))
    }

    /// `forget`'s part for the semaphore `name`: whether nothing of it is left.
    pub(crate) async fn forget_semaphore(&self, name: &LockName) -> Result<bool> {
        for stmt in &self.sql.permits.forget {
            self.runner.reply("forget", stmt, Args::of(name)).await?;
        }
        Ok(self.inspect_semaphore(name).await?.is_none())
    }
}

#[cfg(test)]
mod tests;
