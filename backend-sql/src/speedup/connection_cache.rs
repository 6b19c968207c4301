//! The connections a client keeps between statements, out of sqlx's pool (see [`ConnectionCache`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use sqlx::Database;
use sqlx::pool::PoolConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{Speedup, Speedups};

/// How many connections a client keeps out of sqlx's pool between statements, at most (see
/// [`ConnectionCache`]).
const CACHED_MAX: usize = 2;

/// How long a kept connection may sit unused before it goes back to the pool, whose idle
/// timeout then closes it.
const CACHED_IDLE: Duration = Duration::from_secs(10);

/// How long a connection may go from statement to statement without passing through the pool,
/// so that the pool's own rules (SQLite's lifetime limit) still reach it.
const CACHED_FOR: Duration = Duration::from_secs(60);

/// The connections a client keeps between statements, most recently used last.
///
/// sqlx's pool pings every connection it gets back (one more round trip, and a wake-up of the
/// server's session) to find those that a dropped future left mid-statement. `StatementConn`
/// (`crate::common`) already closes those, so a connection whose statement completed is kept
/// here for the next statement instead, and the ping is spared: on a contended lock that is
/// one round trip per statement fewer beside each hand-over (`docs/design/backend-sql.md`,
/// "Tried, and why kept or not"). A connection with something left to send (the rollback of a
/// transaction dropped unfinished) goes back to the pool, which sends it at once.
///
/// At most [`CACHED_MAX`] are kept, and always fewer than the pool's size (none of a pool of
/// one). Every statement first takes one of as many [`slot`](Self::slot)s as
/// the pool has connections, in arrival order, and holds it until its connection is kept or
/// given back: so a statement never waits in the pool while a connection sits here, and with a
/// slot it finds one here or room in the pool. One unused for [`CACHED_IDLE`] goes back to the
/// pool, which closes it once it has been idle there for its own idle timeout: a background
/// task checks while any is kept, and every statement checks too. One that has gone from
/// statement to statement for [`CACHED_FOR`] goes back too, so that the pool's own limits still
/// apply to it.
pub(crate) struct ConnectionCache<DB: Database> {
    idle: Mutex<Idle<DB>>,
    room: usize,
    /// One per connection of the pool (see [`slot`](Self::slot)).
    slots: Arc<Semaphore>,
    /// How long a connection may sit here unused ([`CACHED_IDLE`]).
    limit: Duration,
}

/// A kept connection.
struct Conn<DB: Database> {
    conn: PoolConnection<DB>,
    /// When it last came out of the pool.
    since: Instant,
    /// When it was put back here.
    at: Instant,
}

/// [`ConnectionCache`]'s state.
struct Idle<DB: Database> {
    /// ConnectionCache connections, most recently put back last.
    conns: Vec<Conn<DB>>,
    /// Whether a task that gives back the unused ones is running.
    reaping: bool,
    /// Set by [`ConnectionCache::clear`]: the pool is closing, and nothing is kept any more.
    closed: bool,
    /// Set by [`ConnectionCache::retire`]: a connection out of the pool since before this is
    /// closed when its statement ends.
    retired_before: Option<Instant>,
}

impl<DB: Database> ConnectionCache<DB> {
    /// Room for [`CACHED_MAX`] connections, and fewer than `pool_size`.
    pub(crate) fn new(pool_size: u32) -> Arc<Self> {
        Self::unused_for(pool_size, CACHED_IDLE)
    }

    /// [`new`](Self::new) where `speedups` has the connection cache, else one that keeps
    /// nothing: every statement then takes its connection from the pool and gives it back.
    pub(crate) fn for_speedups(pool_size: u32, speedups: Speedups) -> Arc<Self> {
        let cache = Self::new(pool_size);
        if !speedups.contains(Speedup::ConnectionCache) {
            cache.lock().closed = true;
        }
        cache
    }

    /// [`new`](Self::new), giving back connections unused for `limit`.
    fn unused_for(pool_size: u32, limit: Duration) -> Arc<Self> {
        let below_pool = usize::try_from(pool_size.saturating_sub(1)).unwrap_or(0);
        Arc::new(ConnectionCache {
            idle: Mutex::new(Idle {
                conns: Vec::new(),
                reaping: false,
                closed: false,
                retired_before: None,
            }),
            room: CACHED_MAX.min(below_pool),
            slots: Arc::new(Semaphore::new(
                usize::try_from(pool_size).unwrap_or(Semaphore::MAX_PERMITS),
            )),
            limit,
        })
    }

    /// A statement's turn at the connections, held until its connection is kept or given
    /// back: as many at once as the pool has connections, taken in arrival order.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait holds no slot and keeps its place for nobody.
    pub(crate) async fn slot(&self) -> OwnedSemaphorePermit {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the slots are never closed")
    }

    fn lock(&self) -> MutexGuard<'_, Idle<DB>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used kept connection and when it last came out of the pool, if any
    /// (giving back the unused ones).
    pub(crate) fn take(&self) -> Option<(PoolConnection<DB>, Instant)> {
        let (conn, unused) = {
            let mut idle = self.lock();
            let unused = idle.unused(self.limit);
            (idle.conns.pop().map(|c| (c.conn, c.since)), unused)
        };
        // Dropped outside the lock: each goes back to the pool.
        drop(unused);
        conn
    }

    /// Keeps `conn`, out of the pool since `since`, for the next statement; or gives it back
    /// to the pool when there is no room or it has been out for [`CACHED_FOR`].
    pub(crate) fn put(self: &Arc<Self>, conn: PoolConnection<DB>, since: Instant) {
        let at = Instant::now();
        let mut idle = self.lock();
        if idle.retired_before.is_some_and(|before| since < before) {
            drop(idle);
            let mut conn = conn;
            conn.close_on_drop();
            return;
        }
        if idle.closed || idle.conns.len() >= self.room || at.duration_since(since) >= CACHED_FOR {
            drop(idle);
            drop(conn);
            return;
        }
        idle.conns.push(Conn { conn, since, at });
        if !idle.reaping
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            idle.reaping = true;
            runtime.spawn(reap(Arc::downgrade(self), self.limit));
        }
    }

    /// Closes the connections out of the pool now, kept or in use, once their statements end:
    /// another connection runs the statements from now on.
    pub(crate) fn retire(&self) -> Vec<PoolConnection<DB>> {
        let mut idle = self.lock();
        idle.retired_before = Some(Instant::now());
        std::mem::take(&mut idle.conns)
            .into_iter()
            .map(|c| c.conn)
            .collect()
    }

    /// Takes out the kept connections unused for `limit`.
    pub(crate) fn take_unused(&self, limit: Duration) -> Vec<PoolConnection<DB>> {
        let unused = self.lock().unused(limit);
        unused.into_iter().map(|c| c.conn).collect()
    }

    /// Gives every kept connection back to the pool (before the pool is closed).
    /// From now on, keeps none: a statement still running when the pool is closed gives its
    /// connection back to the pool, whose close waits for it, rather than to a keeper nobody
    /// asks any more.
    pub(crate) fn clear(&self) {
        let all = {
            let mut idle = self.lock();
            idle.closed = true;
            std::mem::take(&mut idle.conns)
        };
        drop(all);
    }
}

impl<DB: Database> Drop for ConnectionCache<DB> {
    fn drop(&mut self) {
        let idle = self.idle.get_mut().unwrap_or_else(PoisonError::into_inner);
        let conns = std::mem::take(&mut idle.conns);
        if tokio::runtime::Handle::try_current().is_ok() {
            // Back to the pool.
            drop(conns);
            return;
        }
        // Outside a runtime (a client dropped after its runtime ended) the pool cannot take
        // a connection back, as that spawns a task (which would panic): each is closed here.
        for cache in conns {
            drop(cache.conn.detach());
        }
    }
}

impl<DB: Database> Idle<DB> {
    /// Takes out the connections unused for `limit`.
    fn unused(&mut self, limit: Duration) -> Vec<Conn<DB>> {
        let now = Instant::now();
        let fresh = self
            .conns
            .iter()
            .position(|c| now.duration_since(c.at) < limit)
            .unwrap_or(self.conns.len());
        self.conns.drain(..fresh).collect()
    }
}

/// Gives back kept connections once unused for their limit, while any is kept and the client
/// lives.
async fn reap<DB: Database>(cache: Weak<ConnectionCache<DB>>, limit: Duration) {
    loop {
        tokio::time::sleep(limit / 2).await;
        let Some(cache) = cache.upgrade() else {
            return;
        };
        let (unused, reaping) = {
            let mut idle = cache.lock();
            let unused = idle.unused(limit);
            if idle.conns.is_empty() {
                // Under the lock: a `put` from now on starts another task.
                idle.reaping = false;
            }
            (unused, idle.reaping)
        };
        // Dropped outside the lock: each goes back to the pool.
        drop(unused);
        if !reaping {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
