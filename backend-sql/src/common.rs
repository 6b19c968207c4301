//! Machinery the three dialects share: running one statement with a time limit and internal
//! retries, closing connections whose statement was interrupted, the cancel-cleanup guard, and
//! unit conversions.

use std::future::Future;
use std::time::{Duration, Instant};

use lockcore::wait::Backoff;
use lockcore::{Error, LockName, Result};
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// How a failed statement should be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
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
}

/// Attempts on broken connections before giving up (a restart leaves every idle pooled
/// connection broken; each one fails fast and is closed).
const MAX_STALE_ATTEMPTS: u32 = 12;

/// A pooled connection that is closed, not returned to the pool, unless the statement run on it
/// completed. A statement interrupted by a timeout or a dropped future leaves the protocol in an
/// unknown state (or the socket blackholed), so the connection must not be reused.
pub(crate) struct Checked<DB: Database> {
    conn: PoolConnection<DB>,
    clean: bool,
}

impl<DB: Database> Checked<DB> {
    fn new(conn: PoolConnection<DB>) -> Self {
        Checked { conn, clean: false }
    }

    /// The connection to run one statement on.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }
}

impl<DB: Database> Drop for Checked<DB> {
    fn drop(&mut self) {
        if !self.clean {
            self.conn.close_on_drop();
        }
    }
}

/// A pool plus the rules for running statements on it.
pub(crate) struct Core<DB: Database> {
    pub(crate) backend: &'static str,
    pub(crate) pool: Pool<DB>,
    pub(crate) timeout: Duration,
    pub(crate) classify: fn(&sqlx::Error) -> Class,
}

// By hand: a derive would require `DB: Clone`, which the driver marker types are not.
impl<DB: Database> Clone for Core<DB> {
    fn clone(&self) -> Self {
        Core {
            backend: self.backend,
            pool: self.pool.clone(),
            timeout: self.timeout,
            classify: self.classify,
        }
    }
}

impl<DB: Database> Core<DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments: sqlx::IntoArguments<DB>,
{
    /// Runs each of `statements` in turn with `key` as its one parameter (`forget` clears a
    /// name's queue, then its row).
    pub(crate) async fn execute_each<K>(
        &self,
        operation: &'static str,
        name: &LockName,
        statements: &[&sqlx::SqlStr],
        key: K,
    ) -> Result<()>
    where
        K: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + Clone + Send + 'static,
    {
        for statement in statements {
            self.run(operation, Some(name), |mut c| {
                let q = sqlx::query::<DB>((*statement).clone()).bind(key.clone());
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        }
        Ok(())
    }
}

impl<DB: Database> Core<DB> {
    /// Runs `attempt` on a pooled connection, within the `timeout` budget for the whole call.
    /// Broken connections are replaced and busy errors retried with backoff, inside the budget;
    /// other errors are returned. `attempt` may run more than once, so it must be idempotent for
    /// the same inputs.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        operation: &'static str,
        name: Option<&LockName>,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Checked<DB>) -> Fut,
        Fut: Future<Output = (Checked<DB>, std::result::Result<T, sqlx::Error>)>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
        let mut stale = 0;
        loop {
            let once = async {
                let conn = self.pool.acquire().await?;
                let (mut checked, result) = attempt(Checked::new(conn)).await;
                checked.clean = match &result {
                    Ok(_) => true,
                    // The server answered in protocol: the connection is fine unless the error
                    // says the session is gone.
                    Err(e @ sqlx::Error::Database(_)) => (self.classify)(e) != Class::Stale,
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
            let class = (self.classify)(&error);
            let retry = match class {
                Class::Stale => {
                    stale += 1;
                    stale < MAX_STALE_ATTEMPTS
                }
                Class::Busy => true,
                Class::Fail { .. } => false,
            };
            if retry && Instant::now() < deadline {
                tracing::debug!(backend = self.backend, operation, lock = ?name.map(LockName::as_str), error = %error, ?class, "retrying statement");
                if class == Class::Busy {
                    let pause = backoff.next_delay();
                    tokio::time::sleep_until((Instant::now() + pause).min(deadline).into()).await;
                }
                continue;
            }
            let retryable = !matches!(class, Class::Fail { retryable: false });
            return Err(Error::backend(
                self.backend,
                operation,
                name,
                retryable,
                error,
            ));
        }
    }

    /// Opens one connection straight from `opts`, outside the pool, and closes it again, so that
    /// a client that cannot use the server says why at once (connection refused, a bad password,
    /// a TLS failure). Through the pool the same failure only shows after `timeout`, as "pool
    /// timed out while waiting for an open connection".
    pub(crate) async fn probe<O>(&self, opts: &O) -> Result<()>
    where
        O: sqlx::ConnectOptions<Connection = DB::Connection>,
    {
        use sqlx::Connection as _;
        match tokio::time::timeout(self.timeout, opts.connect()).await {
            Err(_) => Err(self.timed_out("connect", None)),
            Ok(Err(error)) => {
                let retryable =
                    !matches!((self.classify)(&error), Class::Fail { retryable: false });
                Err(Error::backend(
                    self.backend,
                    "connect",
                    None,
                    retryable,
                    error,
                ))
            }
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
        }
    }

    fn timed_out(&self, operation: &'static str, name: Option<&LockName>) -> Error {
        Error::backend(
            self.backend,
            operation,
            name,
            true,
            format!(
                "no answer from the database within {:?} (the `timeout` option)",
                self.timeout
            ),
        )
    }
}

/// Classification of errors every driver shares (not server error codes).
pub(crate) fn classify_transport(e: &sqlx::Error) -> Option<Class> {
    Some(match e {
        sqlx::Error::Io(e) if is_tls_handshake(e) => Class::Fail { retryable: false },
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => Class::Stale,
        // TLS errors come from the handshake (an untrusted or mismatched certificate, a server
        // without TLS where the URL requires it): settings, which a retry does not change.
        sqlx::Error::Tls(_) => Class::Fail { retryable: false },
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            Class::Fail { retryable: true }
        }
        sqlx::Error::Database(_) => return None,
        _ => Class::Fail { retryable: false },
    })
}

/// An I/O error that carries a TLS failure (the MySQL driver reports an untrusted certificate
/// this way).
fn is_tls_handshake(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

/// A cleanup armed while an acquire may have written a row for an owner the caller never
/// hears about. Dropping it armed runs the cleanup (which spawns a task) right away.
pub(crate) struct CancelCleanup {
    action: Option<Box<dyn FnOnce() + Send>>,
}

impl CancelCleanup {
    pub(crate) fn arm(action: impl FnOnce() + Send + 'static) -> Self {
        CancelCleanup {
            action: Some(Box::new(action)),
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.action = None;
    }
}

impl Drop for CancelCleanup {
    fn drop(&mut self) {
        if let Some(action) = self.action.take() {
            action();
        }
    }
}

/// Runs `statement` (one that may grant a lock) to completion even if the caller's future is
/// dropped: it is polled in place, and only if it is dropped unfinished is the rest of it moved
/// to a task of its own, which then runs `undo` right after it completes if `needs_undo` says the
/// outcome may have granted the lock, or if it failed (the outcome is then unknown).
///
/// A cleanup started when the caller's future is dropped runs on another connection and can
/// reach the server before the interrupted statement does; the grant would then land after the
/// cleanup and hold the lock until its ttl. Undoing after completion closes that window. (The
/// caller's own armed cleanup still runs as well: for a drop after the result was handed over,
/// and as a harmless no-op otherwise.)
pub(crate) async fn detached<T, S, U, UF>(
    backend: &'static str,
    name: &LockName,
    statement: S,
    needs_undo: fn(&T) -> bool,
    undo: U,
) -> Result<T>
where
    T: Send + 'static,
    S: Future<Output = Result<T>> + Send + 'static,
    U: FnOnce() -> UF + Send + 'static,
    UF: Future<Output = Result<bool>> + Send + 'static,
{
    let name = name.clone();
    FinishOnDrop {
        statement: Some(Box::pin(statement)),
        on_abandon: Some(Box::new(move |outcome: Result<T>| {
            // An error leaves the outcome unknown (a timeout may follow a grant): undo too.
            if outcome.as_ref().map_or(true, needs_undo) {
                spawn_cleanup(backend, &name, undo());
            }
        })),
    }
    .await
}

/// The future behind [`detached`].
struct FinishOnDrop<T: Send + 'static> {
    statement: Option<std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send>>>,
    /// Called with the outcome of a statement whose caller went away.
    on_abandon: Option<Box<dyn FnOnce(Result<T>) + Send>>,
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = Result<T>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<T>> {
        let Some(statement) = self.statement.as_mut() else {
            return std::task::Poll::Pending;
        };
        let outcome = std::task::ready!(statement.as_mut().poll(cx));
        self.statement = None;
        std::task::Poll::Ready(outcome)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let (Some(statement), Some(on_abandon)) = (self.statement.take(), self.on_abandon.take())
        else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            // The spawned future is 'static and Send: the statement and the undo own all they use.
            let finish: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> =
                Box::pin(async move { on_abandon(statement.await) });
            rt.spawn(finish);
        }
    }
}

pub(crate) use lockcore::spawn_cleanup;

/// A ttl in whole microseconds (rounded up), for PostgreSQL and MySQL intervals.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
}

/// A ttl in whole milliseconds (rounded up), for SQLite.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
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

/// The token floor of `opts` as a bind for the acquiring statement's
/// `fence = GREATEST(fence + 1, floor)`: 0 when none is set (fences start at 1). The fence column
/// is a signed 64-bit integer, so a floor above `i64::MAX` is refused before any I/O.
pub(crate) fn floor_of(backend: &'static str, opts: &lockcore::AcquireOptions) -> Result<i64> {
    let Some(floor) = opts.token_floor_value() else {
        return Ok(0);
    };
    i64::try_from(floor.0).map_err(|_| {
        Error::invalid_argument(
            "token_floor",
            format!(
                "{backend} keeps fences in a signed 64-bit column: a floor of {floor} does not fit"
            ),
        )
    })
}

/// Wraps SQL built once per client (with a validated table name) so every call clones an `Arc`.
pub(crate) fn sql(text: String) -> sqlx::SqlStr {
    use sqlx::SqlSafeStr;
    sqlx::AssertSqlSafe(std::sync::Arc::<str>::from(text)).into_sql_str()
}

/// Splits an `extend_many` batch: leases whose ttl is out of range get their error now, the rest
/// are returned (with their index) to be extended in one go.
pub(crate) fn checked_batch(
    leases: &[(lockcore::Lease, Duration)],
) -> (Vec<Option<Result<lockcore::Lease>>>, Vec<usize>) {
    let mut results = Vec::with_capacity(leases.len());
    let mut todo = Vec::new();
    for (i, (_, ttl)) in leases.iter().enumerate() {
        match lockcore::check_ttl(*ttl) {
            Ok(()) => {
                results.push(None);
                todo.push(i);
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    (results, todo)
}

/// Turns a batch of owner-checked `UPDATE`s (rows affected per lease in `todo`, or one error for
/// the whole batch) into each lease's outcome, and returns every lease's result in order.
pub(crate) fn finish_batch(
    backend: &'static str,
    leases: &[(lockcore::Lease, Duration)],
    mut results: Vec<Option<Result<lockcore::Lease>>>,
    todo: &[usize],
    started: Instant,
    done: Result<Vec<u64>>,
) -> Vec<Result<lockcore::Lease>> {
    match done {
        Ok(done) => {
            for (&i, n) in todo.iter().zip(done) {
                let (lease, ttl) = &leases[i];
                results[i] = Some(if n == 1 {
                    Ok(lease.renewed(started, *ttl))
                } else {
                    Err(Error::lock_lost(backend, lease.name(), "extend"))
                });
            }
        }
        Err(e) => {
            for &i in todo {
                results[i] = Some(Err(batch_error(&e, leases[i].0.name())));
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every lease has a result"))
        .collect()
}

/// Copies a batch-wide failure to every lease it concerned.
pub(crate) fn batch_error(e: &Error, name: &LockName) -> Error {
    match e {
        Error::Backend {
            backend,
            operation,
            retryable,
            source,
            ..
        } => Error::backend(
            backend,
            operation,
            Some(name),
            *retryable,
            source.to_string(),
        ),
        other => Error::backend(
            "sql",
            "extend",
            Some(name),
            other.is_retryable(),
            other.to_string(),
        ),
    }
}

/// The waiters table of lease table `table`: `<table>_waiters`, or, where that would pass the
/// 63-byte identifier limit (PostgreSQL truncates longer names), the first 46 characters of
/// `table`, an 8-hex-digit FNV-1a hash of the whole name, and `_waiters`.
pub(crate) fn queue_table(table: &str) -> String {
    const SUFFIX: &str = "_waiters";
    const MAX: usize = 63;
    if table.len() + SUFFIX.len() <= MAX {
        return format!("{table}{SUFFIX}");
    }
    let mut hash: u32 = 0x811c_9dc5;
    for b in table.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    // Table names are validated ASCII identifiers, so byte slicing is on a char boundary.
    let keep = MAX - SUFFIX.len() - 9;
    format!("{}_{hash:08x}{SUFFIX}", &table[..keep])
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{detached, queue_table};

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
        let undo = {
            let log = log.clone();
            move || async move {
                log.lock().unwrap().push("undo");
                Ok(true)
            }
        };
        let pending = detached("test", &name, statement, |granted| *granted, undo);
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
        let undo = {
            let log = log.clone();
            move || async move {
                log.lock().unwrap().push("undo");
                Ok(true)
            }
        };
        let granted = detached("test", &name, async { Ok(true) }, |g| *g, undo).await;
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
    }
}
