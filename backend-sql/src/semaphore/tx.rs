//! The semaphore's transactions, statement by statement where the dialect has no routine for
//! them, and how their replies read: the grant, the join and the hand-over (see the parent
//! module's docs for what each does under the semaphore row's lock).

use std::time::Duration;

use crate::common::from_micros;
use crate::dialect::PermitStatements;
use crate::statement::{Args, Reply, SqlDb, begin};

/// What a look at a semaphore (the `state` statement) says about granting `permits` to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Judged {
    /// We hold a live permit already (the first try of a retried grant committed, or a
    /// caller-chosen owner id acquires again): it is taken over with a new fence.
    Mine,
    /// The semaphore is in use with another count.
    Mismatch(u64),
    /// Full, or waiters are queued ahead of us.
    Blocked {
        ahead: u64,
        holder_left: Option<Duration>,
    },
    /// Room for us, and whether expired holder rows are left to delete.
    Free { expired: bool },
}

/// Reads the `state` statement's row (see `PermitStatements::state`).
pub(super) fn judge(state: &Reply, permits: u32) -> Judged {
    if let Some(recorded) = state.col(0).filter(|r| *r != i64::from(permits)) {
        return Judged::Mismatch(u64::try_from(recorded).unwrap_or(0));
    }
    if state.col(3).is_some() {
        return Judged::Mine;
    }
    let holders = state.col(1).unwrap_or(0);
    let ahead = u64::try_from(state.col(2).unwrap_or(0)).unwrap_or(0);
    let full = holders >= i64::from(permits);
    if ahead > 0 || full {
        let holder_left = if full {
            from_micros(state.col(4))
        } else {
            None
        };
        return Judged::Blocked { ahead, holder_left };
    }
    let expired = state.col(5).unwrap_or(0) > 0;
    Judged::Free { expired }
}

impl crate::client::Outcome for (Grant, u32) {
    fn granted(&self) -> bool {
        matches!(self.0, Grant::Granted(_))
    }
    fn tries(&self) -> u32 {
        self.1
    }
}

/// What a grant transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grant {
    /// A permit with this fence is ours.
    Granted(i64),
    /// Not granted (see [`Judged::Blocked`]).
    Blocked {
        ahead: u64,
        holder_left: Option<Duration>,
    },
    /// The semaphore is in use with this other count.
    Mismatch(u64),
}

/// The grant transaction on `conn` (see the module docs), for `$owner` (queued with `$ticket`
/// when `queued`, which also leaves the queue on a grant).
pub(super) async fn grant_tx<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &PermitStatements,
    a: Args<'_>,
    permits: u32,
    queued: bool,
) -> sqlx::Result<Grant> {
    let mut tx = begin::<DB>(conn, sql.begin.as_ref()).await?;
    let fence = DB::reply(&mut *tx, &sql.lock_bump, &a).await?.value();
    let state = DB::reply(&mut *tx, &sql.state, &a).await?;
    // (expired holder rows to delete, whether the permit is ours already)
    let (expired, mine) = match judge(&state, permits) {
        Judged::Free { expired } => (expired, false),
        Judged::Mine => (false, true),
        Judged::Mismatch(recorded) => {
            // Nothing written but the bump, which is undone.
            tx.rollback().await?;
            return Ok(Grant::Mismatch(recorded));
        }
        Judged::Blocked { ahead, holder_left } => {
            tx.rollback().await?;
            return Ok(Grant::Blocked { ahead, holder_left });
        }
    };
    let fence = fence.ok_or(sqlx::Error::RowNotFound)?;
    if expired {
        DB::reply(&mut *tx, &sql.gc, &a).await?;
    }
    // Our own live permit (a retry whose first try committed, or a chosen owner id acquiring
    // again) is taken over with the new fence and expiry, as the lock's acquire takes over a
    // row that is already ours; the old lease of it is then stale.
    let write = if mine { &sql.regrant } else { &sql.grant };
    DB::reply(&mut *tx, write, &a.fence(fence)).await?;
    if queued {
        DB::reply(&mut *tx, &sql.dequeue, &a).await?;
    }
    tx.commit().await?;
    Ok(Grant::Granted(fence))
}

/// What the grant routine's row says (see `PermitStatements::grant_call`).
pub(super) fn granted_by_call(reply: &Reply) -> sqlx::Result<Grant> {
    let count = |col| u64::try_from(reply.col(col).unwrap_or(0)).unwrap_or(0);
    match reply.col(0) {
        Some(0) => reply
            .col(1)
            .map(Grant::Granted)
            .ok_or(sqlx::Error::RowNotFound),
        Some(1) => Ok(Grant::Blocked {
            ahead: count(2),
            holder_left: from_micros(reply.col(3)),
        }),
        Some(2) => Ok(Grant::Mismatch(count(4))),
        _ => Err(sqlx::Error::RowNotFound),
    }
}

/// The join transaction on `conn`: under the semaphore row's lock, checks the count and
/// inserts `$owner`'s waiter row. The ticket, or the other count recorded.
pub(super) async fn join_tx<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &PermitStatements,
    a: Args<'_>,
    permits: u32,
) -> sqlx::Result<std::result::Result<i64, u64>> {
    let mut tx = begin::<DB>(conn, sql.begin.as_ref()).await?;
    if let Some(relaxed) = &sql.relaxed {
        DB::plain(&mut *tx, relaxed).await?;
    }
    DB::reply(&mut *tx, &sql.lock, &a).await?;
    let state = DB::reply(&mut *tx, &sql.state, &a.ticket(i64::MAX)).await?;
    if let Judged::Mismatch(recorded) = judge(&state, permits) {
        tx.rollback().await?;
        return Ok(Err(recorded));
    }
    let ticket = DB::reply(&mut *tx, &sql.enqueue, &a).await?.value();
    tx.commit().await?;
    ticket.map(Ok).ok_or(sqlx::Error::RowNotFound)
}

/// What a release that hands its permit over did (see `PermitStatements::hand`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Handover {
    /// Whether the releaser's permit was freed.
    pub(super) freed: bool,
    /// The fence granted to the next waiter, if it was.
    pub(super) fence: Option<i64>,
    /// When it was, the permits still free after.
    pub(super) free: i64,
}

impl Handover {
    /// What the hand-over routine's row says.
    pub(super) fn by_call(reply: &Reply) -> Self {
        Handover {
            freed: reply.col(0).unwrap_or(0) > 0,
            fence: reply.col(1),
            free: reply.col(2).unwrap_or(0),
        }
    }
}

/// The hand-over transaction on `conn`, statement by statement (where the dialect has no
/// routine for it): under the semaphore row's lock, the release of `$owner`'s permit with
/// `$fence`, then the grant transaction's look and writes for `$next` (queued with `$ticket`,
/// asking for `$ttl`, `$min_token` and `$permits`), when it is still queued and the look grants.
pub(super) async fn hand_tx<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &PermitStatements,
    a: Args<'_>,
    permits: u32,
) -> sqlx::Result<Handover> {
    let mut tx = begin::<DB>(conn, sql.begin.as_ref()).await?;
    DB::reply(&mut *tx, &sql.lock, &a).await?;
    if DB::reply(&mut *tx, &sql.release, &a).await?.count() == 0 {
        tx.rollback().await?;
        return Ok(Handover::default());
    }
    let next = &sql.handing;
    let state = DB::reply(&mut *tx, &next.state, &a).await?;
    let queued = state.col(6) > Some(0);
    let write = match judge(&state, permits) {
        _ if !queued => None,
        Judged::Free { expired } => Some((&next.grant, expired)),
        Judged::Mine => Some((&next.regrant, false)),
        Judged::Blocked { .. } | Judged::Mismatch(_) => None,
    };
    let freed = Handover {
        freed: true,
        ..Handover::default()
    };
    let Some((write, expired)) = write else {
        tx.commit().await?;
        return Ok(freed);
    };
    let fence = DB::reply(&mut *tx, &sql.lock_bump, &a).await?.value();
    let fence = fence.ok_or(sqlx::Error::RowNotFound)?;
    if expired {
        DB::reply(&mut *tx, &sql.gc, &a).await?;
    }
    DB::reply(&mut *tx, write, &a.fence(fence)).await?;
    DB::reply(&mut *tx, &next.dequeue, &a).await?;
    tx.commit().await?;
    let holders = state.col(1).unwrap_or(0);
    Ok(Handover {
        fence: Some(fence),
        free: i64::from(permits) - holders - 1,
        ..freed
    })
}
