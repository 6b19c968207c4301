//! Read-write locks' shared side, written once for the three dialects. The exclusive side is the
//! lock itself: a writer is any holder of the lease row, through the mutex's own statements.
//!
//! **Readers hold the lease row together.** While readers hold a name, its lease row's owner is
//! [`READERS_OWNER`](crate::dialect::READERS_OWNER) and its `expires_at` the latest live
//! reader's, so every writer statement (the mutex's acquire, which takes a row only when it is
//! free or expired) sees the row held, unchanged. Each reader is a row of `<table>_readers`
//! (name, owner, fence, expires_at); its lease is released and extended there, and the lease
//! row follows: the last reader to go frees it, and a reader's extension raises its expiry.
//!
//! **Every reader state change is one short transaction** that first writes the lease row
//! ([`SqlDialect::lease_bump`] for a grant, which also bumps the fence: a reader's token comes from
//! the name's one fence, above the writer's before it; a no-op update for release, extend and
//! leave), which takes that row's lock (PostgreSQL, MySQL) or the database's write lock (SQLite)
//! until it ends, so the mutex's statement and the reader transactions take turns on that row.
//! Then, reading what committed before (READ COMMITTED on PostgreSQL and MySQL), it decides, and
//! rolls back what it wrote when it grants nothing.
//!
//! **One queue, arrival order.** Readers queue in the lock's waiter table with the writers, so
//! tickets order both; a queued reader leaves a mark in the readers table (a row without fence).
//! A writer waits for everyone queued ahead of it (its statements count every live waiter row);
//! a reader waits only for writers ahead of it (waiter rows without a mark), and for a live
//! writer's lease. A reader's `try` is refused while any writer is queued, so a stream of
//! readers cannot starve a writer.
//!
//! **Retries.** A grant retried after a lost reply (see `StatementRunner::run`) finds the first
//! try's hold of the same owner id and takes it over with a new fence, as the semaphore's grant
//! does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{AcquireOptions, Lease, LockName, OwnerId, Released, Result};

use crate::client::{Client, reader};
use crate::common::{Pending, detached, from_micros, min_token_of};
use crate::dialect::{ReadStatements, SqlDialect, lease_row_args};
use crate::queue::Attempt;
use crate::statement::{Args, Reply, SqlDb, begin};

/// What a look at a name (the `state` statement) says about a read hold for us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Judged {
    /// A writer holds, or writers are queued ahead of us: not now.
    Blocked {
        ahead: u64,
        holder_left: Option<Duration>,
    },
    /// Free, or held by readers (or our own hold from a first try): a hold for us.
    Free,
}

/// What a reader's grant transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grant {
    /// A hold with this fence is ours.
    Granted(i64),
    /// Not granted (see [`Judged::Blocked`]).
    Blocked {
        ahead: u64,
        holder_left: Option<Duration>,
    },
}

impl crate::client::Outcome for (Grant, u32) {
    fn granted(&self) -> bool {
        matches!(self.0, Grant::Granted(_))
    }
    fn tries(&self) -> u32 {
        self.1
    }
}

/// Reads the `state` statement's row (see `ReadStatements::state`).
fn judge(state: &Reply) -> Judged {
    let mine = state.col(2).is_some();
    let writer = state.col(0).unwrap_or(0) > 0;
    let ahead = u64::try_from(state.col(1).unwrap_or(0)).unwrap_or(0);
    if mine || (!writer && ahead == 0) {
        return Judged::Free;
    }
    let holder_left = if writer {
        from_micros(state.col(3))
    } else {
        None
    };
    Judged::Blocked { ahead, holder_left }
}

/// The grant transaction on `conn` for `$owner` (queued with `$ticket` when `queued`, which
/// also leaves the queue on a grant): the fence of the new hold, or why not.
async fn grant_tx<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &ReadStatements,
    a: Args<'_>,
    queued: bool,
) -> sqlx::Result<Grant> {
    let mut tx = begin::<DB>(conn, sql.begin.as_ref()).await?;
    let fence = DB::reply(&mut *tx, &sql.bump, &a).await?.value();
    let state = DB::reply(&mut *tx, &sql.state, &a).await?;
    if let Judged::Blocked { ahead, holder_left } = judge(&state) {
        // Nothing written but the bump, which is undone.
        tx.rollback().await?;
        return Ok(Grant::Blocked { ahead, holder_left });
    }
    let fence = fence.ok_or(sqlx::Error::RowNotFound)?;
    DB::reply(&mut *tx, &sql.gc, &a).await?;
    // Our own hold from a first try (or our mark, when queued) gives way to the new hold.
    DB::reply(&mut *tx, &sql.drop_owner, &a).await?;
    DB::reply(&mut *tx, &sql.insert_hold, &a.fence(fence)).await?;
    // The lease row's expiry after the hold's, from a later clock reading: no hold outlives
    // the row that keeps writers out (see `no_reader_outlives_the_readers_lease_row`).
    DB::reply(&mut *tx, &sql.hold, &a).await?;
    if queued {
        DB::reply(&mut *tx, &sql.dequeue, &a).await?;
        // Readers queued right behind us may share now.
        if let Some(notify) = &sql.notify {
            DB::reply(&mut *tx, notify, &a).await?;
        }
    }
    tx.commit().await?;
    Ok(Grant::Granted(fence))
}

/// Ends `$owner`'s hold on `conn`, in one transaction under the lease row's lock: with `fence`
/// only that live hold (a release), without it whatever the owner left (a hold whatever its
/// fence, a mark, waiter rows: leaving the queue). Then the lease row follows the holds that are
/// left, and is freed (and its waiters woken) when none is. Whether a hold was deleted.
async fn end_tx<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &ReadStatements,
    a: Args<'_>,
    checked: bool,
) -> sqlx::Result<bool> {
    let mut tx = begin::<DB>(conn, sql.begin.as_ref()).await?;
    DB::reply(&mut *tx, &sql.lock, &a).await?;
    let gone = if checked {
        DB::reply(&mut *tx, &sql.release, &a).await?.count() > 0
    } else {
        DB::reply(&mut *tx, &sql.dequeue, &a).await?;
        DB::reply(&mut *tx, &sql.drop_owner, &a).await?.count() > 0
    };
    if gone {
        DB::reply(&mut *tx, &sql.settle, &a).await?;
        if let Some(notify) = &sql.notify {
            let state = DB::reply(&mut *tx, &sql.state, &a.ticket(i64::MAX)).await?;
            let held = state.col(0).unwrap_or(0) + state.col(4).unwrap_or(0);
            if held == 0 {
                DB::reply(&mut *tx, notify, &a).await?;
            }
        }
    }
    tx.commit().await?;
    Ok(gone)
}

/// Extends `$owner`'s live hold with `$fence` to `$ttl` from now, and the readers' lease row
/// with it, in one transaction under the row's lock. Whether the hold was live.
async fn extend_tx<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &ReadStatements,
    a: Args<'_>,
) -> sqlx::Result<bool> {
    let mut tx = begin::<DB>(conn, sql.begin.as_ref()).await?;
    DB::reply(&mut *tx, &sql.lock, &a).await?;
    // MySQL sets CLIENT_FOUND_ROWS: a matched row counts even if unchanged.
    let live = DB::reply(&mut *tx, &sql.extend, &a).await?.count() == 1;
    if live {
        DB::reply(&mut *tx, &sql.extend_row, &a).await?;
    }
    tx.commit().await?;
    Ok(live)
}

/// The join transaction on `conn`: `$owner`'s mark, then its waiter row; the ticket.
async fn join_tx<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &ReadStatements,
    enqueue: &crate::statement::Stmt,
    a: Args<'_>,
) -> sqlx::Result<i64> {
    let mut tx = begin::<DB>(conn, sql.begin.as_ref()).await?;
    if let Some(relaxed) = &sql.relaxed {
        DB::plain(&mut *tx, relaxed).await?;
    }
    DB::reply(&mut *tx, &sql.drop_owner, &a).await?;
    DB::reply(&mut *tx, &sql.mark, &a).await?;
    let ticket = DB::reply(&mut *tx, enqueue, &a).await?.value();
    tx.commit().await?;
    ticket.ok_or(sqlx::Error::RowNotFound)
}

/// The reader operations of a client.
impl<D: SqlDialect> Client<D> {
    /// Runs the grant transaction for `owner` (queued with `ticket`, if any); also how many
    /// tries it took (a retry may have followed a lost reply).
    async fn grant_read(
        &self,
        name: &LockName,
        owner: OwnerId,
        ttl: Duration,
        min_token: i64,
        ticket: Option<i64>,
    ) -> Result<(Grant, u32)> {
        let sql = &self.sql.reads;
        let a = Args::of(name).owner(owner).ttl(ttl).min_token(min_token);
        let a = a.ticket(ticket.unwrap_or(i64::MAX));
        let mut tries = 0;
        let grant = self
            .runner
            .run("acquire read", Some(name), |mut c| {
                tries += 1;
                async move {
                    let r = grant_tx::<D::Db>(c.conn(), sql, a, ticket.is_some()).await;
                    (c, r)
                }
            })
            .await?;
        Ok((grant, tries))
    }

    /// One attempt at a read hold (`DistributedLock::try_acquire_shared`), also a waiting
    /// acquire's first. Cancel safety as the lock's `try_acquire`: the transaction runs
    /// detached, and an armed cleanup ends a hold of the owner id if the future is dropped.
    pub(crate) async fn try_acquire_read(
        self: &Arc<Self>,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let min_token = min_token_of(D::BACKEND, opts)?;
        let owner = opts.owner_or_random();
        let ttl = opts.ttl_value();
        let statement = {
            let (client, name) = (self.clone(), name.clone());
            async move { client.grant_read(&name, owner, ttl, min_token, None).await }
        };
        let give_back = || self.leave_read_later(name, owner);
        let (grant, _) = self.attempt_once(name, statement, give_back).await?;
        Ok(match grant {
            Grant::Granted(fence) => Some(reader(name, owner, fence, started, opts)),
            Grant::Blocked { .. } => None,
        })
    }

    /// Joins the queue as a reader (the join transaction); the ticket.
    pub(crate) async fn enqueue_read(
        &self,
        name: &LockName,
        waiter: OwnerId,
        liveness: Duration,
    ) -> Result<i64> {
        let (sql, enqueue) = (&self.sql.reads, &self.sql.enqueue);
        let a = Args::of(name).owner(waiter).ttl(liveness);
        // The mark commits with the row, so a live row found on a retry means both are there.
        self.runner
            .join(
                &self.sql.own_ticket,
                a,
                std::convert::identity,
                |mut c| async move {
                    let r = join_tx::<D::Db>(c.conn(), sql, enqueue, a).await;
                    (c, r)
                },
            )
            .await
    }

    /// One queued reader's attempt: a read-only look first, so that only a reader nobody is
    /// ahead of takes the lease row's lock; then the grant transaction, detached and undone
    /// (the reader leaves) if the caller is gone when it completes.
    pub(crate) async fn read_attempt(
        self: &Arc<Self>,
        name: &LockName,
        waiter: OwnerId,
        ticket: i64,
        ttl: Duration,
        min_token: i64,
    ) -> Result<Attempt> {
        let args = Args::of(name).owner(waiter).ticket(ticket);
        let seen = self
            .runner
            .reply("acquire read", &self.sql.reads.state, args)
            .await?;
        if let Judged::Blocked { ahead, holder_left } = judge(&seen) {
            let ahead = Some(ahead);
            return Ok(Attempt::Blocked { ahead, holder_left });
        }
        let statement = {
            let (client, name) = (self.clone(), name.clone());
            async move {
                let grant = client.grant_read(&name, waiter, ttl, min_token, Some(ticket));
                Ok(grant.await?.0)
            }
        };
        let undo = self.leave_read_later(name, waiter);
        let needs_undo = |g: &Grant| matches!(g, Grant::Granted(_));
        Ok(
            match detached(D::BACKEND, name, statement, needs_undo, undo).await? {
                Grant::Granted(fence) => Attempt::Granted { fence, head: None },
                Grant::Blocked { ahead, holder_left } => Attempt::Blocked {
                    ahead: Some(ahead),
                    holder_left,
                },
            },
        )
    }

    /// Leaves as a reader: deletes the owner's waiter rows, mark and hold (whatever its fence),
    /// and frees the lease row if that was the last hold. Whether a hold was deleted.
    pub(crate) async fn leave_read(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let sql = &self.sql.reads;
        let a = Args::of(name).owner(owner);
        self.runner
            .run("leave queue", Some(name), |mut c| async move {
                let r = end_tx::<D::Db>(c.conn(), sql, a, false).await;
                (c, r)
            })
            .await
    }

    /// [`leave_read`](Self::leave_read) as an undo that does nothing until polled.
    pub(crate) fn leave_read_later(
        self: &Arc<Self>,
        name: &LockName,
        owner: OwnerId,
    ) -> Pending<bool> {
        let (client, name) = (self.clone(), name.clone());
        Box::pin(async move { client.leave_read(&name, owner).await })
    }

    /// Releases a reader's lease (owner and fence checked; an expired hold is not released).
    pub(crate) async fn release_read(&self, lease: &Lease) -> Result<Released> {
        let sql = &self.sql.reads;
        let a = lease_row_args(lease);
        let gone = self
            .runner
            .run("release", Some(lease.name()), |mut c| async move {
                let r = end_tx::<D::Db>(c.conn(), sql, a, true).await;
                (c, r)
            })
            .await?;
        Ok(if gone {
            self.released(lease, false);
            Released::Released
        } else {
            Released::NotHeld
        })
    }

    /// Extends a reader's lease to `ttl` from now; whether it was still live.
    pub(crate) async fn extend_read(&self, lease: &Lease, ttl: Duration) -> Result<bool> {
        let sql = &self.sql.reads;
        let a = lease_row_args(lease).ttl(ttl);
        self.runner
            .run_as(
                sql.extend.priority(),
                "extend",
                Some(lease.name()),
                |mut c| async move {
                    let r = extend_tx::<D::Db>(c.conn(), sql, a).await;
                    (c, r)
                },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_reads_the_state_row_in_order() {
        // (writer holds, writers ahead, our hold's fence, µs left on the writer's lease,
        // readers hold)
        let row = |cols: [Option<i64>; 4]| {
            Reply::with_row([cols[0], cols[1], cols[2], cols[3], None, None, None])
        };
        // A free row, readers: a hold.
        assert_eq!(judge(&row([Some(0), Some(0), None, None])), Judged::Free);
        assert_eq!(judge(&row([None, None, None, None])), Judged::Free);
        // A writer queued ahead holds readers back, also while readers hold.
        assert_eq!(
            judge(&row([Some(0), Some(2), None, None])),
            Judged::Blocked {
                ahead: 2,
                holder_left: None
            }
        );
        // A live writer: blocked until its lease runs out.
        assert_eq!(
            judge(&row([Some(1), Some(0), None, Some(1500)])),
            Judged::Blocked {
                ahead: 0,
                holder_left: Some(Duration::from_micros(1500))
            }
        );
        // Our own hold from a first try is taken over whatever is queued.
        assert_eq!(judge(&row([Some(0), Some(3), Some(7), None])), Judged::Free);
    }
}
