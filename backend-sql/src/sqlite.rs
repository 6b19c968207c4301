//! SQLite, the embedded default: one database file in WAL mode shared by every process on the
//! host, `INSERT .. SELECT .. ON CONFLICT DO UPDATE .. WHERE expired RETURNING fence`, a FIFO
//! queue of waiter rows (see [`crate::queue`]), polling waiters.
//! "database is locked" is retried inside, within the `timeout` budget.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::wait::Backoff;
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, Lease, LockInfo, LockName, OwnerId, RawFloor, Released, Result, WaitMechanism,
    async_trait,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePoolOptions};
use sqlx::{Connection, SqlStr, Sqlite};

use crate::common::{
    CancelCleanup, Class, Core, checked_batch, classify_transport, detached, finish_batch,
    floor_of, from_micros, millis, spawn_cleanup, sql, token,
};
use crate::config::{SqlConfig, SqlitePath, Target};
use crate::queue::{Attempt, LIVENESS, Queue, Wake};

const BACKEND: &str = "sqlite";

/// Pooled connections for a database file (SQLite serialises writers anyway).
const POOL_SIZE: u32 = 4;

/// The database's clock in milliseconds since the Unix epoch (SQLite ≥ 3.42).
const NOW_MS: &str = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)";

/// The statements of one client, built once with the validated table name.
struct Statements {
    create: SqlStr,
    create_queue: SqlStr,
    create_queue_index: SqlStr,
    gc_queue: SqlStr,
    acquire: SqlStr,
    floor_acquire: SqlStr,
    wait_acquire: SqlStr,
    probe: SqlStr,
    enqueue: SqlStr,
    refresh: SqlStr,
    dequeue: SqlStr,
    release: SqlStr,
    release_owner: SqlStr,
    extend: SqlStr,
    inspect: SqlStr,
    forget: SqlStr,
    forget_queue: SqlStr,
}

impl Statements {
    fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        let queue = crate::common::queue_table(table);
        let w = format!("\"{queue}\"");
        let wi = format!("\"{queue}_by_name\"");
        // `fence` is the new fence of a take-over: `fence + 1`, or `MAX(fence + 1, ?n)` with the
        // token floor bound at ?n (0 = none).
        let upsert = |fence: &str| {
            format!(
                "ON CONFLICT (name) DO UPDATE \
                 SET owner = excluded.owner, fence = {fence}, expires_at = excluded.expires_at \
                 WHERE owner IS NULL OR expires_at <= {NOW_MS} OR owner = excluded.owner \
                 RETURNING fence"
            )
        };
        Statements {
            // TEXT with SQLite's default BINARY collation: names compare byte for byte.
            create: sql(format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 name TEXT NOT NULL PRIMARY KEY, \
                 owner TEXT NULL, \
                 fence INTEGER NOT NULL, \
                 expires_at INTEGER NOT NULL)"
            )),
            // Waiters: one row per queued acquire; `ticket` (the rowid: always above every
            // existing row's) orders them, `expires_at` is the waiter's liveness (refreshed
            // while it waits).
            create_queue: sql(format!(
                "CREATE TABLE IF NOT EXISTS {w} (\
                 ticket INTEGER PRIMARY KEY, \
                 name TEXT NOT NULL, \
                 waiter TEXT NOT NULL, \
                 expires_at INTEGER NOT NULL)"
            )),
            create_queue_index: sql(format!(
                "CREATE INDEX IF NOT EXISTS {wi} ON {w} (name, ticket)"
            )),
            gc_queue: sql(format!("DELETE FROM {w} WHERE expires_at <= {NOW_MS}")),
            // ?1 name, ?2 owner, ?3 ttl ms, ?4 token floor (0 = none). Unqualified columns in
            // DO UPDATE are the existing row's. Never while a live waiter is queued for the
            // name (no jumping the queue). The fence becomes MAX(fence + 1, floor).
            acquire: sql(format!(
                "INSERT INTO {t} (name, owner, fence, expires_at) \
                 SELECT ?1, ?2, MAX(1, ?4), {NOW_MS} + ?3 \
                 WHERE NOT EXISTS (SELECT 1 FROM {w} AS w \
                 WHERE w.name = ?1 AND w.expires_at > {NOW_MS}) {}",
                upsert("MAX(fence + 1, ?4)")
            )),
            // The raw floor: the plain acquire, without the queue check (and without a token
            // floor).
            floor_acquire: sql(format!(
                "INSERT INTO {t} (name, owner, fence, expires_at) \
                 VALUES (?1, ?2, 1, {NOW_MS} + ?3) {}",
                upsert("fence + 1")
            )),
            // ?1 name, ?2 owner, ?3 ttl ms, ?4 ticket, ?5 token floor (0 = none). A queued
            // waiter's attempt: only when no live waiter with a smaller ticket is queued.
            wait_acquire: sql(format!(
                "INSERT INTO {t} (name, owner, fence, expires_at) \
                 SELECT ?1, ?2, MAX(1, ?5), {NOW_MS} + ?3 \
                 WHERE NOT EXISTS (SELECT 1 FROM {w} AS w \
                 WHERE w.name = ?1 AND w.ticket < ?4 AND w.waiter <> ?2 \
                 AND w.expires_at > {NOW_MS}) {}",
                upsert("MAX(fence + 1, ?5)")
            )),
            // ?1 name, ?2 waiter, ?3 ticket. Read-only look before a waiter writes (a reader
            // never waits for SQLite's write lock): live waiters ahead of it, and the holder's
            // time left in µs.
            probe: sql(format!(
                "SELECT (SELECT count(*) FROM {w} AS w \
                 WHERE w.name = ?1 AND w.ticket < ?3 AND w.waiter <> ?2 \
                 AND w.expires_at > {NOW_MS}), \
                 (SELECT (l.expires_at - {NOW_MS}) * 1000 FROM {t} AS l \
                 WHERE l.name = ?1 AND l.owner IS NOT NULL AND l.owner <> ?2 \
                 AND l.expires_at > {NOW_MS})"
            )),
            // ?1 name, ?2 waiter, ?3 liveness ms.
            enqueue: sql(format!(
                "INSERT INTO {w} (name, waiter, expires_at) VALUES (?1, ?2, {NOW_MS} + ?3) \
                 RETURNING ticket"
            )),
            // ?1 name, ?2 waiter, ?3 liveness ms. Never revives an expired waiter.
            refresh: sql(format!(
                "UPDATE {w} SET expires_at = {NOW_MS} + ?3 \
                 WHERE name = ?1 AND waiter = ?2 AND expires_at > {NOW_MS}"
            )),
            // ?1 name, ?2 waiter. Leaves the queue, dropping expired waiters of the name.
            dequeue: sql(format!(
                "DELETE FROM {w} WHERE name = ?1 AND (waiter = ?2 OR expires_at <= {NOW_MS})"
            )),
            // ?1 name, ?2 owner, ?3 fence. The row stays (the fence must never reset).
            release: sql(format!(
                "UPDATE {t} SET owner = NULL \
                 WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND expires_at > {NOW_MS}"
            )),
            // ?1 name, ?2 owner.
            release_owner: sql(format!(
                "UPDATE {t} SET owner = NULL WHERE name = ?1 AND owner = ?2"
            )),
            // ?1 name, ?2 owner, ?3 fence, ?4 ttl ms. Never resurrects an expired row.
            extend: sql(format!(
                "UPDATE {t} SET expires_at = {NOW_MS} + ?4 \
                 WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND expires_at > {NOW_MS}"
            )),
            // ?1 name. Remaining time in µs by the database's clock; live waiters.
            // Binds: name. Deletes the row of a name nobody holds or waits for (its fence too:
            // `forget` is only for names that are never used again).
            forget: sql(format!(
                "DELETE FROM {t} WHERE name = ?1 AND (owner IS NULL OR expires_at <= {NOW_MS}) \
                 AND NOT EXISTS (SELECT 1 FROM {w} AS w WHERE w.name = {t}.name \
                 AND w.expires_at > {NOW_MS})"
            )),
            // Binds: name. The name's waiter rows whose liveness ran out.
            forget_queue: sql(format!(
                "DELETE FROM {w} WHERE name = ?1 AND expires_at <= {NOW_MS}"
            )),
            inspect: sql(format!(
                "SELECT l.owner, l.fence, \
                 CASE WHEN l.owner IS NOT NULL AND l.expires_at > c.now \
                 THEN (l.expires_at - c.now) * 1000 END, \
                 (SELECT count(*) FROM {w} AS w WHERE w.name = l.name AND w.expires_at > c.now) \
                 FROM {t} AS l, (SELECT {NOW_MS} AS now) AS c WHERE l.name = ?1"
            )),
        }
    }
}

fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            let primary = db
                .code()
                .and_then(|c| c.parse::<i32>().ok())
                .map(|c| c & 0xff);
            // SQLITE_BUSY, SQLITE_LOCKED
            matches!(primary, Some(5 | 6)) || db.message().contains("database is locked")
        }
        _ => false,
    }
}

fn classify(e: &sqlx::Error) -> Class {
    if is_busy(e) {
        return Class::Busy;
    }
    if let Some(class) = classify_transport(e) {
        return class;
    }
    Class::Fail { retryable: false }
}

struct Inner {
    core: Core<Sqlite>,
    sql: Statements,
    table: String,
    redacted: String,
    defaults: ClientDefaults,
    memory: bool,
    /// For `sqlite::memory:`: a connection that is never used, so the shared in-memory database
    /// lives as long as the client even when pooled connections are closed.
    _anchor: Mutex<Option<SqliteConnection>>,
}

impl Inner {
    /// The acquire statement (see [`detached`]): the fence if granted, and how many tries it
    /// took (a retry may have followed a lost reply to a grant).
    async fn acquire_statement(
        self: Arc<Self>,
        name: LockName,
        owner: String,
        ttl_ms: i64,
        floor: i64,
    ) -> Result<(Option<i64>, u32)> {
        let mut tries = 0;
        let fence = self
            .core
            .run("acquire", Some(&name), |mut c| {
                tries += 1;
                let q = sqlx::query_scalar(self.sql.acquire.clone())
                    .bind(name.as_str())
                    .bind(owner.as_str())
                    .bind(ttl_ms)
                    .bind(floor);
                async move {
                    let r = q.fetch_optional(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok((fence, tries))
    }

    /// A waiter's acquire statement (see [`detached`]): the fence if granted.
    async fn wait_statement(
        self: Arc<Self>,
        name: LockName,
        waiter: String,
        ttl_ms: i64,
        ticket: i64,
        floor: i64,
    ) -> Result<Option<i64>> {
        self.core
            .run("acquire", Some(&name), |mut c| {
                let q = sqlx::query_scalar(self.sql.wait_acquire.clone())
                    .bind(name.as_str())
                    .bind(waiter.as_str())
                    .bind(ttl_ms)
                    .bind(ticket)
                    .bind(floor);
                async move {
                    let r = q.fetch_optional(c.conn()).await;
                    (c, r)
                }
            })
            .await
    }

    async fn release_owner(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let owner = owner.to_string();
        let done = self
            .core
            .run("release", Some(name), |mut c| {
                let q = sqlx::query(self.sql.release_owner.clone())
                    .bind(name.as_str())
                    .bind(owner.as_str());
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

/// A SQLite lock client. Several clients and processes may share one database file; writers are
/// serialised by SQLite and "database is locked" is retried within the `timeout` option.
///
/// `Debug` shows the URL.
#[derive(Clone)]
pub struct SqliteLock {
    inner: Arc<Inner>,
}

impl fmt::Debug for SqliteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLock")
            .field("url", &self.inner.redacted)
            .field("table", &self.inner.table)
            .finish()
    }
}

/// Runs `statement` on a single connection, retrying SQLITE_BUSY until `deadline`. Used before
/// the pool exists: switching to WAL takes an exclusive lock that the busy handler does not
/// wait for.
async fn setup_statement(
    conn: &mut SqliteConnection,
    statement: SqlStr,
    deadline: Instant,
    what: &'static str,
) -> Result<()> {
    let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
    loop {
        match sqlx::query(statement.clone()).execute(&mut *conn).await {
            Ok(_) => return Ok(()),
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => {
                let retryable = is_busy(&e);
                return Err(Error::backend(BACKEND, what, None, retryable, e));
            }
        }
    }
}

impl SqliteLock {
    /// Opens (creating it and its parent directory if needed) the database, switches a file
    /// database to WAL, and creates the lease table if it does not exist.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `config` is not a SQLite URL; [`Error::Backend`] if the file
    /// cannot be created or opened, or the database stays locked for the whole `timeout`.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened.
    pub async fn connect(config: &SqlConfig) -> Result<Self> {
        let Target::Sqlite { path, synchronous } = &config.target else {
            return Err(Error::invalid_config(BACKEND, "not a sqlite:// URL"));
        };
        let timeout = crate::config::timeout_of(config);
        let deadline = Instant::now() + timeout;
        let sql = Statements::new(&config.table);
        let config_err = |e: sqlx::Error| Error::backend(BACKEND, "open", None, false, e);
        let (opts, memory) = match path {
            SqlitePath::Memory => (
                SqliteConnectOptions::from_str("sqlite::memory:").map_err(config_err)?,
                true,
            ),
            SqlitePath::File(file) => {
                if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        Error::backend(
                            BACKEND,
                            "create the database directory",
                            None,
                            false,
                            format!("{}: {e}", dir.display()),
                        )
                    })?;
                }
                (
                    SqliteConnectOptions::new()
                        .filename(file)
                        .create_if_missing(true)
                        .synchronous(*synchronous),
                    false,
                )
            }
        };
        let opts = opts.busy_timeout(timeout.min(Duration::from_secs(1)));

        // One connection sets the file up before any pooled connection exists.
        let mut setup =
            tokio::time::timeout_at(deadline.into(), SqliteConnection::connect_with(&opts))
                .await
                .map_err(|_| {
                    Error::backend(
                        BACKEND,
                        "open",
                        None,
                        true,
                        format!("the database did not open within {timeout:?}"),
                    )
                })?
                .map_err(|e| Error::backend(BACKEND, "open", None, is_busy(&e), e))?;
        if !memory {
            setup_statement(
                &mut setup,
                SqlStr::from_static("PRAGMA journal_mode = WAL"),
                deadline,
                "switch to WAL",
            )
            .await?;
        }
        for statement in [&sql.create, &sql.create_queue, &sql.create_queue_index] {
            setup_statement(&mut setup, statement.clone(), deadline, "create table").await?;
        }
        // Expired waiter rows left by crashed processes (best effort).
        if let Err(e) = setup_statement(
            &mut setup,
            sql.gc_queue.clone(),
            deadline,
            "drop expired waiters",
        )
        .await
        {
            tracing::debug!(backend = BACKEND, error = %e, "dropping expired waiter rows failed");
        }
        let anchor = if memory {
            Some(setup)
        } else {
            let _ = setup.close().await;
            None
        };
        // WAL is a property of the file: pooled connections need not (and, racing each other,
        // should not) switch to it again.
        let pool_opts = opts;
        let pool = SqlitePoolOptions::new()
            .max_connections(if memory { 1 } else { POOL_SIZE })
            .min_connections(0)
            .acquire_timeout(timeout)
            .idle_timeout(if memory {
                None
            } else {
                Some(Duration::from_secs(60))
            })
            .max_lifetime(if memory {
                None
            } else {
                Some(Duration::from_secs(30 * 60))
            })
            .test_before_acquire(false)
            .connect_lazy_with(pool_opts);
        Ok(SqliteLock {
            inner: Arc::new(Inner {
                core: Core {
                    backend: BACKEND,
                    pool,
                    timeout,
                    classify,
                },
                sql,
                table: config.table.clone(),
                redacted: config.redacted.clone(),
                defaults: config.defaults.clone(),
                memory,
                _anchor: Mutex::new(anchor),
            }),
        })
    }

    /// Closes the pool gracefully. Dropping every clone does the same without waiting.
    ///
    /// # Errors
    /// None: closing is best-effort and cannot fail.
    ///
    /// # Cancel safety
    /// Safe to drop; connections then close in the background.
    pub async fn close(&self) {
        self.inner.core.pool.close().await;
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }
}

#[async_trait]
impl DistributedLock for SqliteLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            Fencing::Strict,
            Expiry::Ttl,
            Fairness::Fifo,
            WaitMechanism::Poll,
        )
        .shared_across_processes(!self.inner.memory)
        // The acquiring statement sets the fence to MAX(fence + 1, floor).
        .token_floor(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        let started = Instant::now();
        let floor = floor_of(BACKEND, opts)?;
        let owner = opts.owner_or_random();
        let owner_text = owner.to_string();
        let ttl = opts.ttl_value();
        let inner = &self.inner;
        let mut cleanup = {
            let inner = inner.clone();
            let name = name.clone();
            CancelCleanup::arm(move || {
                let task_name = name.clone();
                spawn_cleanup(BACKEND, &name, async move {
                    inner.release_owner(&task_name, owner).await
                });
            })
        };
        let (fence, tries) = detached(
            BACKEND,
            name,
            inner
                .clone()
                .acquire_statement(name.clone(), owner_text, millis(ttl), floor),
            |(fence, tries)| fence.is_some() || *tries > 1,
            {
                let (inner, name) = (inner.clone(), name.clone());
                move || async move { inner.release_owner(&name, owner).await }
            },
        )
        .await?;
        // A retry after a "database is locked" cannot have run the first try, but a retry
        // after a broken connection might: then a grant is given back, here and now, since a
        // waiting acquire goes on with the same owner id when the caller chose it.
        if fence.is_none() && tries > 1 {
            inner.release_owner(name, owner).await?;
        }
        cleanup.disarm();
        Ok(fence.map(|f| {
            Lease::new(
                name.clone(),
                owner,
                token(f),
                started,
                ttl,
                opts.drift_value(),
            )
        }))
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        crate::queue::acquire(self, name, opts, deadline).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let inner = &self.inner;
        let owner = lease.owner().to_string();
        let fence = i64::try_from(lease.token().0).unwrap_or(i64::MAX);
        let done = inner
            .core
            .run("release", Some(lease.name()), |mut c| {
                let q = sqlx::query(inner.sql.release.clone())
                    .bind(lease.name().as_str())
                    .bind(owner.as_str())
                    .bind(fence);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(if done.rows_affected() > 0 {
            Released::Released
        } else {
            Released::NotHeld
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::check_ttl(ttl)?;
        let started = Instant::now();
        let inner = &self.inner;
        let owner = lease.owner().to_string();
        let fence = i64::try_from(lease.token().0).unwrap_or(i64::MAX);
        let done = inner
            .core
            .run("extend", Some(lease.name()), |mut c| {
                let q = sqlx::query(inner.sql.extend.clone())
                    .bind(lease.name().as_str())
                    .bind(owner.as_str())
                    .bind(fence)
                    .bind(millis(ttl));
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        if done.rows_affected() == 1 {
            Ok(lease.renewed(started, ttl))
        } else {
            Err(Error::lock_lost(BACKEND, lease.name(), "extend"))
        }
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        // One transaction on one connection: one commit (one log flush) for the whole batch.
        let (results, todo) = checked_batch(leases);
        if !todo.is_empty() {
            let inner = &self.inner;
            let started = Instant::now();
            let owners: Vec<String> = todo
                .iter()
                .map(|&i| leases[i].0.owner().to_string())
                .collect();
            let done: Result<Vec<u64>> = inner
                .core
                .run("extend", None, |mut c| {
                    let queries: Vec<_> = todo
                        .iter()
                        .zip(&owners)
                        .map(|(&i, owner)| {
                            let (lease, ttl) = &leases[i];
                            sqlx::query(inner.sql.extend.clone())
                                .bind(lease.name().as_str())
                                .bind(owner.as_str())
                                .bind(i64::try_from(lease.token().0).unwrap_or(i64::MAX))
                                .bind(millis(*ttl))
                        })
                        .collect();
                    async move {
                        let r = async {
                            let mut tx = sqlx::Connection::begin(c.conn()).await?;
                            let mut out = Vec::with_capacity(queries.len());
                            for q in queries {
                                out.push(q.execute(&mut *tx).await?.rows_affected());
                            }
                            tx.commit().await?;
                            Ok(out)
                        }
                        .await;
                        (c, r)
                    }
                })
                .await;
            return finish_batch(BACKEND, leases, results, &todo, started, done);
        }
        finish_batch(
            BACKEND,
            leases,
            results,
            &todo,
            Instant::now(),
            Ok(Vec::new()),
        )
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let inner = &self.inner;
        let row: Option<(Option<String>, i64, Option<i64>, i64)> = inner
            .core
            .run("inspect", Some(name), |mut c| {
                let q = sqlx::query_as(inner.sql.inspect.clone()).bind(name.as_str());
                async move {
                    let r = q.fetch_optional(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(row.map(|(owner, fence, remaining, waiters)| {
            let remaining = from_micros(remaining);
            LockInfo::new(
                name,
                owner.filter(|_| remaining.is_some()),
                Some(token(fence)),
                remaining,
                Some(usize::try_from(waiters).unwrap_or(0)),
            )
        }))
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        let sql = &self.inner.sql;
        self.inner
            .core
            .execute_each(
                "forget",
                name,
                &[&sql.forget_queue, &sql.forget],
                name.as_str().to_owned(),
            )
            .await?;
        Ok(self.inspect(name).await?.is_none())
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(SqliteFloor {
            inner: self.inner.clone(),
        }))
    }
}

impl Inner {
    async fn dequeue(&self, name: &LockName, waiter: &str) -> Result<()> {
        self.core
            .run("leave queue", Some(name), |mut c| {
                let q = sqlx::query(self.sql.dequeue.clone())
                    .bind(name.as_str())
                    .bind(waiter);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(())
    }
}

impl Queue for SqliteLock {
    const BACKEND: &'static str = BACKEND;

    fn wake(&self, _name: &LockName, _waiter: OwnerId) -> Wake {
        Wake::poll()
    }

    async fn enqueue(&self, name: &LockName, waiter: &str) -> Result<i64> {
        let inner = &self.inner;
        inner
            .core
            .run("enqueue", Some(name), |mut c| {
                let q = sqlx::query_scalar(inner.sql.enqueue.clone())
                    .bind(name.as_str())
                    .bind(waiter)
                    .bind(millis(LIVENESS));
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await
    }

    async fn refresh(&self, name: &LockName, waiter: &str) -> Result<bool> {
        let inner = &self.inner;
        let done = inner
            .core
            .run("refresh waiter", Some(name), |mut c| {
                let q = sqlx::query(inner.sql.refresh.clone())
                    .bind(name.as_str())
                    .bind(waiter)
                    .bind(millis(LIVENESS));
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn attempt(
        &self,
        name: &LockName,
        waiter: OwnerId,
        ticket: i64,
        ttl: Duration,
        floor: i64,
    ) -> Result<Attempt> {
        let inner = &self.inner;
        let waiter_text = waiter.to_string();
        // Look first (read-only): only the head of the queue, with the row free, takes the
        // database's write lock.
        let (ahead, left): (i64, Option<i64>) = inner
            .core
            .run("acquire", Some(name), |mut c| {
                let q = sqlx::query_as(inner.sql.probe.clone())
                    .bind(name.as_str())
                    .bind(waiter_text.as_str())
                    .bind(ticket);
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        let ahead = u64::try_from(ahead).unwrap_or(0);
        let holder_left = from_micros(left);
        if ahead > 0 || holder_left.is_some() {
            return Ok(Attempt::Blocked {
                ahead: Some(ahead),
                holder_left,
            });
        }
        let fence = detached(
            BACKEND,
            name,
            inner
                .clone()
                .wait_statement(name.clone(), waiter_text, millis(ttl), ticket, floor),
            Option::is_some,
            {
                let (lock, name) = (self.clone(), name.clone());
                move || async move { lock.cancel(&name, waiter).await }
            },
        )
        .await?;
        Ok(match fence {
            Some(fence) => Attempt::Granted(fence),
            None => Attempt::Blocked {
                ahead: Some(0),
                holder_left: None,
            },
        })
    }

    async fn dequeue(&self, name: &LockName, waiter: &str) -> Result<()> {
        self.inner.dequeue(name, waiter).await
    }

    async fn cancel(&self, name: &LockName, waiter: OwnerId) -> Result<bool> {
        self.inner.dequeue(name, &waiter.to_string()).await?;
        self.inner.release_owner(name, waiter).await
    }
}

/// The plain acquire (no waiter-queue check) and the release statement straight on the pool.
struct SqliteFloor {
    inner: Arc<Inner>,
}

#[async_trait]
impl RawFloor for SqliteFloor {
    fn description(&self) -> String {
        "INSERT .. ON CONFLICT DO UPDATE .. RETURNING fence (without the queue check), then \
         UPDATE .. SET owner = NULL, on the same sqlx pool"
            .into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let pool = &self.inner.core.pool;
        let owner = OwnerId::random().to_string();
        let err = |e| Error::backend(BACKEND, "raw floor", Some(name), true, e);
        let fence: Option<i64> = sqlx::query_scalar(self.inner.sql.floor_acquire.clone())
            .bind(name.as_str())
            .bind(owner.as_str())
            .bind(millis(Duration::from_secs(10)))
            .fetch_optional(pool)
            .await
            .map_err(err)?;
        if let Some(fence) = fence {
            sqlx::query(self.inner.sql.release.clone())
                .bind(name.as_str())
                .bind(owner.as_str())
                .bind(fence)
                .execute(pool)
                .await
                .map_err(err)?;
        }
        Ok(())
    }
}
