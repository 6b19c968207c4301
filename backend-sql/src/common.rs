//! Machinery the three dialects share: running one statement with a time limit and internal
//! retries, closing connections whose statement was interrupted, finishing a granting statement
//! whose caller went away, and unit conversions.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::wait::Backoff;
use lockcore::{Error, LockName, Result};
use sqlx::error::DatabaseError;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

use crate::speedup::connection_cache::ConnectionCache;
use crate::speedup::sqlite_write_queue::{SqliteWriteQueue, WritePriority};

/// How a failed statement should be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The connection is broken (server restarted, session terminated): retry at once on another
    /// connection.
    Stale,
    /// Lock contention inside the database (SQLite busy, InnoDB deadlock): retry after a short
    /// backoff.
    Busy,
    /// Surface to the caller.
    Fail {
        /// Whether the caller may retry.
        retryable: bool,
    },
    /// The server refused the credentials or a privilege the lock needs: surface to the
    /// caller as [`Error::AccessDenied`].
    Denied,
}

/// Attempts on broken connections before giving up (a restart leaves every idle pooled
/// connection broken; each one fails fast and is closed).
const MAX_STALE_ATTEMPTS: u32 = 12;

/// A connection that something else owns and lends for one statement at a time: PostgreSQL's
/// LISTEN connection (`crate::dialect::postgres::listen`), so that a client that waits needs no
/// second connection for its statements.
pub(crate) trait LentConnection<DB: Database>: Send {
    /// The connection.
    fn conn(&mut self) -> &mut DB::Connection;

    /// Gives it back; `usable` is false when the statement on it did not complete, so its owner
    /// must replace it.
    fn give_back(self: Box<Self>, usable: bool);
}

/// What [`Lender::lend`] returns.
pub(crate) type Lending<'a, DB> =
    Pin<Box<dyn Future<Output = Option<Box<dyn LentConnection<DB>>>> + Send + 'a>>;

/// What lends a [`LentConnection`].
pub(crate) trait Lender<DB: Database>: Send + Sync {
    /// Its connection for one statement, if it has one and no other statement has it.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call lends nothing.
    fn lend(&self) -> Lending<'_, DB>;
}

/// Where a statement's connection came from.
enum Held<DB: Database> {
    /// The pool, or the client's kept connections.
    Pooled(PoolConnection<DB>),
    /// A [`Lender`].
    Lent(Box<dyn LentConnection<DB>>),
}

/// A connection for one statement that is closed, not reused, unless the statement run on it
/// completed. A statement interrupted by a timeout or a dropped future leaves the protocol in an
/// unknown state (or the socket blackholed), so the connection must not be reused. One that
/// completed goes back to the client's [`ConnectionCache`] connections where there is room and
/// nothing is left to send on it, else to the pool; a lent one goes back to its lender.
pub(crate) struct StatementConn<DB: Database> {
    conn: Option<Held<DB>>,
    /// The statement's slot (see `ConnectionCache::slot`), given up after the connection (a field
    /// drops after `drop` has run).
    _slot: tokio::sync::OwnedSemaphorePermit,
    /// When the connection last came out of the pool.
    since: Instant,
    cache: Arc<ConnectionCache<DB>>,
    clean: bool,
}

impl<DB: Database> StatementConn<DB> {
    /// The connection to run one statement on.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        match self.conn.as_mut().expect("a connection until dropped") {
            Held::Pooled(conn) => conn,
            Held::Lent(lent) => lent.conn(),
        }
    }

    /// Whether the connection is lent (see [`LentConnection`]).
    fn is_lent(&self) -> bool {
        matches!(self.conn, Some(Held::Lent(_)))
    }

    /// Marks the statement run on it as completed: the connection may be used again.
    #[cfg(test)]
    pub(crate) fn completed(&mut self) {
        self.clean = true;
    }
}

impl<DB: Database> Drop for StatementConn<DB> {
    fn drop(&mut self) {
        match self.conn.take() {
            None => {}
            Some(Held::Lent(mut lent)) => {
                let usable = self.clean && !sqlx::Connection::should_flush(&*lent.conn());
                lent.give_back(usable);
            }
            Some(Held::Pooled(mut conn)) => {
                if !self.clean {
                    conn.close_on_drop();
                } else if !sqlx::Connection::should_flush(&*conn) {
                    // (A transaction dropped unfinished leaves its rollback to send: the pool's
                    // release sends it at once.)
                    self.cache.put(conn, self.since);
                }
            }
        }
    }
}

/// How long a client whose statements run on a lent connection keeps another one unused, for
/// statements that overlap.
const LENT_SPARE_IDLE: Duration = Duration::from_secs(1);

/// A pool plus the rules for running statements on it.
pub struct StatementRunner<DB: Database> {
    pub(crate) backend: &'static str,
    pub(crate) pool: Pool<DB>,
    /// Round-trip budget for one statement, from the `timeout` option.
    pub(crate) timeout: Duration,
    /// How the server's own errors are handled (the dialect's error classes).
    pub(crate) classify: fn(&dyn DatabaseError) -> Class,
    /// SQLite: the write turn of the database file, shared by every client of the file in this
    /// process and ordered between processes (see `crate::speedup::sqlite_write_queue`); `None`
    /// where the server queues writers.
    pub(crate) write_queue: Option<Arc<SqliteWriteQueue>>,
    /// Connections kept between statements (see [`ConnectionCache`]).
    pub(crate) cache: Arc<ConnectionCache<DB>>,
    /// A connection lent between its own uses (PostgreSQL's listener), taken before the kept
    /// ones and the pool's when it is free.
    pub(crate) lender: Option<Arc<dyn Lender<DB>>>,
}

// By hand: a derive would require `DB: Clone`, which the driver marker types are not.
impl<DB: Database> Clone for StatementRunner<DB> {
    fn clone(&self) -> Self {
        StatementRunner {
            pool: self.pool.clone(),
            write_queue: self.write_queue.clone(),
            cache: self.cache.clone(),
            lender: self.lender.clone(),
            ..*self
        }
    }
}

impl<DB: Database> StatementRunner<DB> {
    /// A connection for one statement, after its turn (`ConnectionCache::slot`): the lent one
    /// where it is free, else the kept one used last (see [`ConnectionCache`]), else one from
    /// the pool.
    pub(crate) async fn connection(&self) -> std::result::Result<StatementConn<DB>, sqlx::Error> {
        let slot = self.cache.slot().await;
        let lent = match &self.lender {
            Some(lender) => lender.lend().await,
            None => None,
        };
        let (conn, since) = match lent {
            Some(lent) => {
                self.close_idle(LENT_SPARE_IDLE);
                (Held::Lent(lent), Instant::now())
            }
            None => match self.cache.take() {
                Some((conn, since)) => (Held::Pooled(conn), since),
                None => (Held::Pooled(self.pool.acquire().await?), Instant::now()),
            },
        };
        Ok(StatementConn {
            conn: Some(conn),
            _slot: slot,
            since,
            cache: self.cache.clone(),
            clean: false,
        })
    }

    /// Closes the connections idle in the pool and those kept unused for `limit`: while a lent
    /// connection runs the statements, they are not needed (more open again when statements
    /// overlap).
    pub(crate) fn close_idle(&self, limit: Duration) {
        self.close_with_pool_idle(self.cache.take_unused(limit));
    }

    /// Closes every connection out of the pool or idle in it, those in use once their
    /// statements end: a lent connection runs the statements from now on.
    pub(crate) fn retire_connections(&self) {
        self.close_with_pool_idle(self.cache.retire());
    }

    /// Closes `kept` and the connections idle in the pool.
    fn close_with_pool_idle(&self, kept: Vec<PoolConnection<DB>>) {
        let idle = std::iter::from_fn(|| self.pool.try_acquire());
        for mut conn in kept.into_iter().chain(idle) {
            conn.close_on_drop();
        }
    }

    /// Runs `attempt` on a pooled connection, within the `timeout` budget for the whole call.
    /// Broken connections are replaced and busy errors retried with backoff, inside the budget;
    /// other errors are returned. `attempt` may run more than once, so it must be idempotent for
    /// the same inputs.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        operation: &'static str,
        name: Option<&LockName>,
        attempt: F,
    ) -> Result<T>
    where
        F: FnMut(StatementConn<DB>) -> Fut,
        Fut: Future<Output = (StatementConn<DB>, std::result::Result<T, sqlx::Error>)>,
    {
        self.run_as(Some(WritePriority::Normal), operation, name, attempt)
            .await
    }

    /// [`run`](Self::run), waiting for SQLite's write queue with `priority`; `None` for an
    /// `attempt` that only reads, which does not wait for it.
    pub(crate) async fn run_as<T, F, Fut>(
        &self,
        priority: Option<WritePriority>,
        operation: &'static str,
        name: Option<&LockName>,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(StatementConn<DB>) -> Fut,
        Fut: Future<Output = (StatementConn<DB>, std::result::Result<T, sqlx::Error>)>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
        let mut stale = 0;
        loop {
            let once = async {
                // Writers take turns here, in arrival order, rather than in SQLite's busy
                // handler, which sleeps 1, 2, 5, 10 ms and more between tries.
                let _turn = match (self.write_queue.as_ref(), priority) {
                    (Some(queue), Some(priority)) => Some(queue.take(priority).await),
                    _ => None,
                };
                let conn = self.connection().await?;
                let (mut conn, result) = if conn.is_lent() {
                    // A lent connection that went silent (a hung backend, a dropped link) must
                    // leave time to run the statement again on another.
                    let until = (Instant::now() + self.timeout / 2).min(deadline);
                    match tokio::time::timeout_at(until.into(), attempt(conn)).await {
                        Ok(done) => done,
                        // Given back unusable when the attempt was dropped; a retry takes another.
                        Err(_) => {
                            return Err(sqlx::Error::Io(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "the listener's connection did not answer",
                            )));
                        }
                    }
                } else {
                    attempt(conn).await
                };
                conn.clean = match &result {
                    Ok(_) => true,
                    // The server answered in protocol: the connection is fine unless the error
                    // says the session is gone.
                    Err(e @ sqlx::Error::Database(_)) => self.class(e) != Class::Stale,
                    Err(
                        sqlx::Error::RowNotFound
                        | sqlx::Error::ColumnNotFound(_)
                        | sqlx::Error::ColumnIndexOutOfBounds { .. }
                        | sqlx::Error::ColumnDecode { .. }
                        | sqlx::Error::Decode(_)
                        | sqlx::Error::TypeNotFound { .. },
                    ) => true,
                    Err(_) => false,
                };
                result
            };
            let error = match tokio::time::timeout_at(deadline.into(), once).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => e,
                Err(_) => return Err(self.timed_out(operation, name)),
            };
            let class = self.class(&error);
            let retry = match class {
                Class::Stale => {
                    stale += 1;
                    stale < MAX_STALE_ATTEMPTS
                }
                Class::Busy => true,
                Class::Fail { .. } | Class::Denied => false,
            };
            if retry && Instant::now() < deadline {
                tracing::debug!(backend = self.backend, operation, lock = ?name.map(LockName::as_str), error = %error, ?class, "retrying statement");
                if class == Class::Busy {
                    let pause = backoff.next_delay();
                    tokio::time::sleep_until((Instant::now() + pause).min(deadline).into()).await;
                }
                continue;
            }
            return Err(self.surface(operation, name, error));
        }
    }

    /// Opens one connection straight from `opts`, outside the pool, and closes it again, so that
    /// a client that cannot use the server says why at once (connection refused, a bad password,
    /// a TLS failure). Through the pool the same failure only shows after `timeout`, as "pool
    /// timed out while waiting for an open connection".
    pub(crate) async fn connect_once<O>(&self, opts: &O) -> Result<()>
    where
        O: sqlx::ConnectOptions<Connection = DB::Connection>,
    {
        use sqlx::Connection as _;
        match tokio::time::timeout(self.timeout, opts.connect()).await {
            Err(_) => Err(self.timed_out("connect", None)),
            Ok(Err(error)) => Err(self.surface("connect", None, error)),
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
        }
    }

    /// How `e` should be handled: the dialect's classes for the server's own errors, and for
    /// the rest those every driver shares.
    fn class(&self, e: &sqlx::Error) -> Class {
        match e {
            sqlx::Error::Database(db) => (self.classify)(&**db),
            sqlx::Error::Io(e) if is_tls_handshake(e) => Class::Fail { retryable: false },
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => Class::Stale,
            // TLS errors come from the handshake (an untrusted or mismatched certificate, a
            // server without TLS where the URL requires it): settings, which a retry does not
            // change.
            sqlx::Error::Tls(_) => Class::Fail { retryable: false },
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
                Class::Fail { retryable: true }
            }
            _ => Class::Fail { retryable: false },
        }
    }

    /// The error a statement that failed surfaces as.
    fn surface(&self, op: &'static str, name: Option<&LockName>, error: sqlx::Error) -> Error {
        let class = self.class(&error);
        if class == Class::Denied {
            let reason = match &error {
                sqlx::Error::Database(db) => db.message().to_owned(),
                other => other.to_string(),
            };
            return Error::access_denied(self.backend, op, reason);
        }
        let retryable = !matches!(class, Class::Fail { retryable: false });
        Error::backend(self.backend, op, name, retryable, error)
    }

    fn timed_out(&self, operation: &'static str, name: Option<&LockName>) -> Error {
        let why = format!(
            "no answer from the database within {:?} (the `timeout` option)",
            self.timeout
        );
        Error::backend(self.backend, operation, name, true, why)
    }
}

/// An I/O error that carries a TLS failure (the MySQL driver reports an untrusted certificate
/// this way).
fn is_tls_handshake(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

/// Runs `statement` (one that may grant a lock) to completion even if the caller's future is
/// dropped: it is polled in place, and only if it is dropped unfinished is the rest of it moved
/// to a task of its own (the undo of a [`CleanupGuard`] whose state is the statement in flight),
/// which then runs `undo` right after it completes if `needs_undo` says the outcome may have
/// granted the lock, or if it failed (the outcome is then unknown). Nothing polls `undo` unless
/// it is needed.
///
/// A cleanup started when the caller's future is dropped runs on another connection and can
/// reach the server before the interrupted statement does; the grant would then land after the
/// cleanup and hold the lock until its ttl. Undoing after completion closes that window. (The
/// caller's own armed cleanup still runs as well: for a drop after the result was handed over,
/// and as a harmless no-op otherwise.)
pub(crate) async fn detached<T: Send + 'static>(
    backend: &'static str,
    name: &LockName,
    statement: impl Future<Output = Result<T>> + Send + 'static,
    needs_undo: fn(&T) -> bool,
    undo: impl Future<Output = Result<bool>> + Send + 'static,
) -> Result<T> {
    let in_flight: InFlight<T> = (Box::pin(statement), needs_undo, Box::pin(undo));
    let mut guard = CleanupGuard::arm(backend, name, in_flight, finish::<T>);
    let outcome = std::future::poll_fn(|cx| guard.state_mut().0.as_mut().poll(cx)).await;
    let _done = guard.disarm();
    outcome
}

/// A boxed statement or undo in flight.
pub(crate) type Pending<T> = std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send>>;

/// A [`detached`] statement in flight, whether its outcome needs undoing, and what undoes the
/// outcome if its caller went away.
type InFlight<T> = (Pending<T>, fn(&T) -> bool, Pending<bool>);

/// The undo of [`detached`]'s guard: the rest of the statement, then its undo, as one counted
/// clean-up.
fn finish<T: Send + 'static>((statement, needs_undo, undo): InFlight<T>) -> Undo {
    Undo::Spawn(Box::pin(async move {
        // An error leaves the outcome unknown (a timeout may follow a grant): undo too.
        if statement.await.as_ref().map_or(true, needs_undo) {
            undo.await
        } else {
            Ok(false)
        }
    }))
}

/// A ttl in whole `unit`s (rounded up): microseconds for PostgreSQL and MySQL intervals,
/// milliseconds for SQLite.
pub(crate) fn whole(d: Duration, unit: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(unit.as_nanos())).unwrap_or(i64::MAX)
}

/// A database-computed remaining time in microseconds as a `Duration` (`None` if negative).
pub(crate) fn from_micros(us: Option<i64>) -> Option<Duration> {
    us.and_then(|u| u64::try_from(u).ok())
        .map(Duration::from_micros)
}

/// The fence column as a token.
pub(crate) fn token(fence: i64) -> lockcore::FencingToken {
    lockcore::FencingToken(u64::try_from(fence).unwrap_or(0))
}

/// The token minimum of `opts` as a bind for the acquiring statement's
/// `fence = GREATEST(fence + 1, min_token)`: 0 when none is set (fences start at 1). The fence
/// column is a signed 64-bit integer, so a minimum above `i64::MAX` is refused before any I/O.
pub(crate) fn min_token_of(backend: &'static str, opts: &lockcore::AcquireOptions) -> Result<i64> {
    let Some(min_token) = opts.min_token_value() else {
        return Ok(0);
    };
    i64::try_from(min_token.0).map_err(|_| {
        Error::invalid_argument(
            "min_token",
            format!(
                "{backend} keeps fences in a signed 64-bit column: a min_token of {min_token} does not fit"
            ),
        )
    })
}

/// The waiters table of lease table `table`: `<table>_waiters`, or, where that would pass the
/// 63-byte identifier limit (PostgreSQL truncates longer names), the first 46 characters of
/// `table`, an 8-hex-digit FNV-1a hash of the whole name, and `_waiters`.
pub(crate) fn queue_table(table: &str) -> String {
    aux_table(table, "_waiters")
}

/// FNV-1a, 32 bits: a short name that is the same in every process and version (table names,
/// routine names, doorbell addresses).
pub(crate) fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |h: u32, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The table `suffix` names next to lease table `table`: `<table><suffix>`, or, where that would
/// pass the 63-byte identifier limit, a prefix of `table`, `_`, an 8-hex-digit FNV-1a hash of
/// the whole table name, and `suffix` (63 bytes in all). The suffixes in use (`_waiters`,
/// `_semaphores`, `_permits`, `_permit_queue`, `_readers`) are none the end of another, so the
/// tables of two lease tables never share a name.
pub(crate) fn aux_table(table: &str, suffix: &str) -> String {
    const MAX: usize = 63;
    if table.len() + suffix.len() <= MAX {
        return format!("{table}{suffix}");
    }
    let hash = fnv1a(table);
    // Table names are validated ASCII identifiers, so byte slicing is on a char boundary.
    let keep = MAX - suffix.len() - 9;
    format!("{}_{hash:08x}{suffix}", &table[..keep])
}

/// The name of stored routine `base` of `table` (a PostgreSQL function, a MySQL procedure),
/// carrying a hash of its `text`: a client only calls the text it was built with, and two
/// versions sharing a database keep their own routines.
pub(crate) fn routine_name(table: &str, base: &str, text: &str) -> String {
    aux_table(table, &format!("_{base}_{:08x}", fnv1a(text)))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{aux_table, detached, queue_table};

    /// An undo that records in `log` that it ran.
    async fn undo(log: Arc<Mutex<Vec<&'static str>>>) -> lockcore::Result<bool> {
        log.lock().unwrap().push("undo");
        Ok(true)
    }

    /// A statement dropped unfinished still runs to its end, and only then is undone; one that
    /// completes is handed over and not undone.
    #[tokio::test]
    async fn dropped_statement_finishes_then_is_undone() {
        let name = lockcore::LockName::new("n").unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (go, gate) = tokio::sync::oneshot::channel::<()>();
        let statement = {
            let log = log.clone();
            async move {
                let _ = gate.await;
                log.lock().unwrap().push("statement");
                Ok(true)
            }
        };
        let pending = detached(
            "test",
            &name,
            statement,
            |granted| *granted,
            undo(log.clone()),
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(20), pending)
                .await
                .is_err(),
            "the statement waits for the gate"
        );
        assert!(log.lock().unwrap().is_empty());
        go.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(30), async {
            while log.lock().unwrap().len() < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the abandoned statement finishes and is undone");
        assert_eq!(*log.lock().unwrap(), ["statement", "undo"]);

        let log = Arc::new(Mutex::new(Vec::new()));
        let granted = detached("test", &name, async { Ok(true) }, |g| *g, undo(log.clone())).await;
        assert!(granted.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            log.lock().unwrap().is_empty(),
            "a handed-over grant is not undone"
        );
    }

    #[test]
    fn queue_table_names_fit_and_stay_distinct() {
        assert_eq!(queue_table("dlock_leases"), "dlock_leases_waiters");
        let a = format!("_{}", "a".repeat(62));
        let b = format!("_{}b", "a".repeat(61));
        let (qa, qb) = (queue_table(&a), queue_table(&b));
        assert_eq!(qa.len(), 63);
        assert_eq!(qb.len(), 63);
        assert_ne!(qa, qb);
        assert!(qa.ends_with("_waiters"));
        assert_eq!(queue_table(&"x".repeat(55)).len(), 63);
        // The semaphore tables of a long table name fit too, and stay apart.
        let long = "y".repeat(63);
        let names: Vec<_> = [
            "_semaphores",
            "_permits",
            "_permit_queue",
            "_waiters",
            "_readers",
        ]
        .iter()
        .map(|s| aux_table(&long, s))
        .collect();
        assert!(names.iter().all(|n| n.len() == 63), "{names:?}");
        for (i, a) in names.iter().enumerate() {
            assert!(names[i + 1..].iter().all(|b| a != b), "{names:?}");
        }
    }
}
