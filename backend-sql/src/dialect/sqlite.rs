//! SQLite, the embedded default: one database file in WAL mode shared by every process on the
//! host, `INSERT .. SELECT .. ON CONFLICT DO UPDATE .. WHERE expired RETURNING fence`, a FIFO
//! queue of waiter rows (see [`crate::queue`]), polling waiters.
//! "database is locked" is retried inside, within the `timeout` budget. Writers take turns on
//! the file before they reach SQLite, in this process and between processes ([`write_queue`]).
//! A waiter's grant leaves the queue in the same statement (two triggers on the lease table).

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::wait::Backoff;
use lockcore::{Error, Result};
use sqlx::Connection;
use sqlx::error::DatabaseError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePoolOptions};

use super::{SqlDialect, Statements, create_tables, head_of};
use crate::common::{Class, StatementRunner};
use crate::config::{Speedup, SqlConfig, SqlitePath, Target};
use crate::speedup::connection_cache::ConnectionCache;
use crate::speedup::sqlite_write_queue::write_queue;
use crate::statement::{Sql, Stmt, Style};

const BACKEND: &str = "sqlite";

/// Pooled connections for a database file (SQLite serialises writers anyway).
const POOL_SIZE: u32 = 4;

/// The database's clock in milliseconds since the Unix epoch (SQLite ≥ 3.42).
const NOW_MS: &str = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)";

/// SQLite's state besides the pool.
pub struct Sqlite {
    /// `sqlite::memory:`: private to this client.
    memory: bool,
    /// For `sqlite::memory:`: a connection that is never used, so the shared in-memory database
    /// lives as long as the client even when pooled connections are closed.
    _anchor: Mutex<Option<SqliteConnection>>,
}

/// The take-over of an existing row with the new fence `fence`: `fence + 1`, or
/// `MAX(fence + 1, $min_token)` with the token minimum (0 = none). Unqualified columns in DO UPDATE
/// are the existing row's.
fn upsert(fence: &str) -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE \
         SET owner = excluded.owner, fence = {fence}, expires_at = excluded.expires_at \
         WHERE owner IS NULL OR expires_at <= {NOW_MS} OR owner = excluded.owner \
         RETURNING fence"
    )
}

/// An acquire that inserts the row or takes it over, never while a live waiter (`ahead`: one
/// queued before us) is queued for the name. The fence becomes MAX(fence + 1, min_token);
/// `returning` adds columns after it.
fn gated(s: &Sql, ahead: &str, returning: &str) -> Stmt {
    s.row(&format!(
        "INSERT INTO {} (name, owner, fence, expires_at) \
         SELECT $name, $owner, MAX(1, $min_token), {NOW_MS} + $ttl \
         WHERE NOT EXISTS (SELECT 1 FROM {} AS w \
         WHERE w.name = $name{ahead} AND w.expires_at > {NOW_MS}) {}{returning}",
        s.leases,
        s.waiters,
        upsert("MAX(fence + 1, $min_token)")
    ))
}

/// SQLITE_BUSY, SQLITE_LOCKED: "database is locked".
fn busy(db: &dyn DatabaseError) -> bool {
    let primary = db.code().and_then(|c| c.parse::<i32>().ok());
    matches!(primary.map(|c| c & 0xff), Some(5 | 6)) || db.message().contains("database is locked")
}

/// Whether `e` is [`busy`].
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(busy)
}

/// Switches a file database to WAL on `conn`, retrying SQLITE_BUSY until `deadline`. Done before
/// the pool exists: switching to WAL takes an exclusive lock that the busy handler does not wait
/// for.
async fn switch_to_wal(conn: &mut SqliteConnection, deadline: Instant) -> Result<()> {
    let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
    loop {
        match sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut *conn)
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => {
                let retryable = is_busy(&e);
                return Err(Error::backend(BACKEND, "switch to WAL", None, retryable, e));
            }
        }
    }
}

impl SqlDialect for Sqlite {
    type Db = sqlx::Sqlite;
    const BACKEND: &'static str = BACKEND;
    const CLIENT: &'static str = "SqliteLock";
    const STYLE: Style = Style {
        numbered: Some('?'),
        quote: '"',
        binary_names: false,
        returning: true,
        ttl_unit: Duration::from_millis(1),
    };
    const NOW: &'static str = NOW_MS;
    const LOCAL_READS: bool = true;
    /// The triggers dequeue a granted waiter, whether its own statement or a release handing
    /// it the row set the owner.
    const GRANT_DEQUEUES: bool = true;
    /// See `GRANT_DEQUEUES`.
    const HAND_DEQUEUES: bool = true;

    fn micros_between(now: &str, at: &str) -> String {
        format!("({at} - {now}) * 1000")
    }

    fn classify(db: &dyn DatabaseError) -> Class {
        if busy(db) {
            Class::Busy
        } else {
            Class::Fail { retryable: false }
        }
    }

    // What it does besides creating the tables: see `SqlLock::connect`.
    async fn connect(
        config: &SqlConfig,
        sql: &mut Statements,
    ) -> Result<(StatementRunner<Self::Db>, Self)> {
        let Target::Sqlite { path, synchronous } = &config.target else {
            return Err(Error::invalid_config(BACKEND, "not a sqlite:// URL"));
        };
        let timeout = config.defaults.timeout;
        let deadline = Instant::now() + timeout;
        let memory = matches!(path, SqlitePath::Memory);
        let opts = match path {
            SqlitePath::Memory => SqliteConnectOptions::from_str("sqlite::memory:")
                .map_err(|e| Error::backend(BACKEND, "open", None, false, e))?,
            SqlitePath::File(file) => {
                if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        let why = format!("{}: {e}", dir.display());
                        Error::backend(BACKEND, "create the database directory", None, false, why)
                    })?;
                }
                SqliteConnectOptions::new()
                    .filename(file)
                    .create_if_missing(true)
                    .synchronous(*synchronous)
            }
        };
        let opts = opts.busy_timeout(timeout.min(Duration::from_secs(1)));

        // One connection sets the file up before any pooled connection exists.
        let opened =
            tokio::time::timeout_at(deadline.into(), SqliteConnection::connect_with(&opts));
        let mut setup = opened
            .await
            .map_err(|_| {
                let why = format!("the database did not open within {timeout:?}");
                Error::backend(BACKEND, "open", None, true, why)
            })?
            .map_err(|e| Error::backend(BACKEND, "open", None, is_busy(&e), e))?;
        let anchor = if memory {
            Some(setup)
        } else {
            switch_to_wal(&mut setup, deadline).await?;
            let _ = setup.close().await;
            None
        };
        // WAL is a property of the file: pooled connections need not (and, racing each other,
        // should not) switch to it again.
        let pool_size = if memory { 1 } else { POOL_SIZE };
        let pool = SqlitePoolOptions::new()
            .max_connections(pool_size)
            .min_connections(0)
            .acquire_timeout(timeout)
            .idle_timeout((!memory).then_some(Duration::from_secs(60)))
            .max_lifetime((!memory).then_some(Duration::from_secs(30 * 60)))
            .test_before_acquire(false)
            .connect_lazy_with(opts);
        // Without the write queue, writers meet in SQLite's busy handler (and no sidecar file
        // is made).
        let write_queue = match path {
            _ if !config.speedups.contains(Speedup::SqliteWriteQueue) => None,
            SqlitePath::Memory => Some(Arc::default()),
            SqlitePath::File(file) => Some(write_queue(file)),
        };
        let runner = StatementRunner {
            backend: BACKEND,
            pool,
            timeout,
            classify: Self::classify,
            write_queue,
            cache: ConnectionCache::for_speedups(pool_size, config.speedups),
            lender: None,
        };
        create_tables::<Self>(&runner, sql).await?;
        let _anchor = Mutex::new(anchor);
        Ok((runner, Sqlite { memory, _anchor }))
    }

    const CREATE: &[&str] = &[
        // TEXT with SQLite's default BINARY collation: names compare byte for byte.
        "CREATE TABLE IF NOT EXISTS {t} (name TEXT NOT NULL PRIMARY KEY, owner TEXT NULL, \
         fence INTEGER NOT NULL, expires_at INTEGER NOT NULL)",
        // Waiters: one row per queued acquire; `ticket` (the rowid: always above every existing
        // row's) orders them, `expires_at` is the waiter's liveness (refreshed while it waits).
        "CREATE TABLE IF NOT EXISTS {w} (ticket INTEGER PRIMARY KEY, name TEXT NOT NULL, \
         waiter TEXT NOT NULL, expires_at INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS \"{q}_by_name\" ON {w} (name, ticket)",
        // A grant (an insert of the row, or a take-over that sets its owner) dequeues its
        // owner in the same statement, and drops the name's expired waiters on the way: the
        // waiter's grant and its leaving the queue are one write (one commit), not two.
        "CREATE TRIGGER IF NOT EXISTS \"{q}_dequeue_on_insert\" AFTER INSERT ON {t} \
         WHEN NEW.owner IS NOT NULL BEGIN DELETE FROM {w} WHERE name = NEW.name \
         AND (waiter = NEW.owner OR expires_at <= CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)); END",
        "CREATE TRIGGER IF NOT EXISTS \"{q}_dequeue_on_grant\" AFTER UPDATE OF owner ON {t} \
         WHEN NEW.owner IS NOT NULL BEGIN DELETE FROM {w} WHERE name = NEW.name \
         AND (waiter = NEW.owner OR expires_at <= CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)); END",
        // Semaphores: the fence of each (never reset by release or expiry), and the row whose
        // write serialises the semaphore's grants and joins (SQLite's one writer at a time).
        "CREATE TABLE IF NOT EXISTS {s} (name TEXT NOT NULL PRIMARY KEY, fence INTEGER NOT NULL)",
        // Permit holders: one row per permit held, with the count it was granted under.
        "CREATE TABLE IF NOT EXISTS {p} (name TEXT NOT NULL, owner TEXT NOT NULL, \
         fence INTEGER NOT NULL, permits INTEGER NOT NULL, expires_at INTEGER NOT NULL, \
         PRIMARY KEY (name, owner))",
        // Permit waiters: as the lock's waiters, apart from them, with the count.
        "CREATE TABLE IF NOT EXISTS {v} (ticket INTEGER PRIMARY KEY, name TEXT NOT NULL, \
         waiter TEXT NOT NULL, permits INTEGER NOT NULL, expires_at INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS \"{vq}_by_name\" ON {v} (name, ticket)",
        // Readers: one row per read hold (fence set) or per queued reader's mark (fence NULL).
        "CREATE TABLE IF NOT EXISTS {r} (name TEXT NOT NULL, owner TEXT NOT NULL, \
         fence INTEGER NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (name, owner))",
    ];

    fn semaphore_lock(s: &Sql, bump: bool) -> Stmt {
        // Unqualified columns in DO UPDATE are the existing row's.
        let sem = &s.semaphores;
        if bump {
            s.row(&format!(
                "INSERT INTO {sem} (name, fence) VALUES ($name, MAX(1, $min_token)) \
                 ON CONFLICT (name) DO UPDATE SET fence = MAX(fence + 1, $min_token) RETURNING fence"
            ))
        } else {
            s.done(&format!(
                "INSERT INTO {sem} (name, fence) VALUES ($name, 0) \
                 ON CONFLICT (name) DO UPDATE SET fence = fence"
            ))
        }
    }

    fn lease_bump(s: &Sql) -> Stmt {
        // Unqualified columns in DO UPDATE are the existing row's.
        s.row(&format!(
            "INSERT INTO {} (name, owner, fence, expires_at) \
             VALUES ($name, NULL, MAX(1, $min_token), {NOW_MS}) \
             ON CONFLICT (name) DO UPDATE SET fence = MAX(fence + 1, $min_token) RETURNING fence",
            s.leases
        ))
    }

    fn acquire(s: &Sql) -> Stmt {
        gated(s, "", "")
    }

    fn wait_acquire(s: &Sql) -> Stmt {
        // A queued waiter's attempt: only when no live waiter with a smaller ticket is queued.
        // A grant also names the waiter then at the head (the triggers above have dequeued
        // this one, which the subquery leaves out either way).
        let head = format!(", NULL, ({})", head_of::<Self>(&s.waiters));
        gated(s, " AND w.ticket < $ticket AND w.waiter <> $owner", &head)
    }

    fn shared_across_processes(&self) -> bool {
        !self.memory
    }
}
