//! What every area's tests share: a fresh database per test of each dialect, clients, raw SQL
//! on the lease tables, and the `per_dialect!` macro that runs a property on all three.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use backend_sql::{Dialect, SqlConfig};
use conformance_tests::kit;
use conformance_tests::within;
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, Lease, LockName, OwnerId, Wait};
use sqlx::Row;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
    MariaDb,
}

/// The SQLite files' folder, under cargo's folder for test files: a static is never dropped, so
/// the folder outlives the run, and there it goes with `target/`, not into `/tmp`.
pub(crate) fn sqlite_dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir"))
}

pub(crate) fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A URL to a store no other test uses.
pub(crate) async fn fresh_url(kind: Kind) -> String {
    match kind {
        Kind::Sqlite => format!(
            "sqlite://{}/{}/locks.db",
            sqlite_dir().path().display(),
            unique("db")
        ),
        Kind::Postgres => kit::Postgres::shared()
            .await
            .expect("kit PostgreSQL")
            .fresh_database("sqltest")
            .await
            .expect("create database"),
        Kind::MariaDb => kit::MariaDb::shared()
            .await
            .expect("kit MariaDB")
            .fresh_database("sqltest")
            .await
            .expect("create database"),
    }
}

/// `url` with `query` appended.
pub(crate) fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

pub(crate) async fn client(url: &str) -> Arc<dyn DistributedLock> {
    backend_sql::connect(url).await.expect("connect")
}

pub(crate) fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
}

pub(crate) fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

pub(crate) async fn take(
    c: &Arc<dyn DistributedLock>,
    n: &LockName,
    ttl: Duration,
) -> Option<Lease> {
    c.try_acquire(n, &opts(ttl).with_defaults(&c.defaults()))
        .await
        .expect("try_acquire")
}

/// Runs `$body` with `$pool` bound to whichever pool `$raw` holds: a raw statement is written
/// once, and [`Raw::sql`] gives its text in the dialect's form.
macro_rules! on_pool {
    ($raw:expr, $pool:ident => $body:expr) => {
        match $raw {
            Raw::Pg($pool) => $body,
            Raw::My($pool) => $body,
            Raw::Lite($pool) => $body,
        }
    };
}

/// Direct SQL on the same store, bypassing the backend.
pub(crate) enum Raw {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl Raw {
    pub(crate) async fn connect(url: &str) -> Raw {
        let dialect = SqlConfig::parse(url).expect("url").dialect();
        match dialect {
            Dialect::Postgres => Raw::Pg(sqlx::PgPool::connect(url).await.expect("raw pg")),
            Dialect::MySql => Raw::My(sqlx::MySqlPool::connect(url).await.expect("raw mysql")),
            Dialect::Sqlite => Raw::Lite(sqlx::SqlitePool::connect(url).await.expect("raw sqlite")),
        }
    }

    /// `template` in this store's dialect: `{q}` is its identifier quote, and `$1`, `$2`, ...
    /// its placeholders (`?` on MySQL, so each in order and once; `?1`, `?2`, ... on SQLite).
    pub(crate) fn sql(&self, template: &str) -> sqlx::AssertSqlSafe<String> {
        let text = match self {
            Raw::Pg(_) => template.replace("{q}", "\""),
            Raw::My(_) => {
                let mut text = String::with_capacity(template.len());
                let quoted = template.replace("{q}", "`");
                let mut chars = quoted.chars().peekable();
                while let Some(c) = chars.next() {
                    if c == '$' {
                        text.push('?');
                        while chars.next_if(char::is_ascii_digit).is_some() {}
                    } else {
                        text.push(c);
                    }
                }
                text
            }
            Raw::Lite(_) => template.replace("{q}", "\"").replace('$', "?"),
        };
        sqlx::AssertSqlSafe(text)
    }

    /// One of three templates (see [`Raw::sql`]), where the dialects' functions differ.
    pub(crate) fn sql_of(&self, pg: &str, my: &str, lite: &str) -> sqlx::AssertSqlSafe<String> {
        self.sql(match self {
            Raw::Pg(_) => pg,
            Raw::My(_) => my,
            Raw::Lite(_) => lite,
        })
    }

    /// (owner, fence, seconds until expiry by the database's clock) of `name`'s row.
    pub(crate) async fn row(&self, table: &str, name: &str) -> Option<(Option<String>, i64, f64)> {
        let sql = self.sql_of(
            &format!(
                "SELECT owner, fence, extract(epoch FROM expires_at - clock_timestamp())::float8 \
                 FROM {{q}}{table}{{q}} WHERE name = $1"
            ),
            &format!(
                "SELECT owner, fence, \
                 CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) AS DOUBLE) / 1e6 \
                 FROM {{q}}{table}{{q}} WHERE name = $1"
            ),
            &format!(
                "SELECT owner, fence, (expires_at - unixepoch('subsec') * 1000) / 1000.0 \
                 FROM {{q}}{table}{{q}} WHERE name = $1"
            ),
        );
        on_pool!(self, pool => sqlx::query(sql)
            .bind(name)
            .fetch_optional(pool)
            .await
            .expect("raw row")
            .map(|r| (r.get(0), r.get(1), r.get(2))))
    }
}

/// The lease table every test here uses (the default).
pub(crate) const TABLE: &str = "dlock_leases";

impl Raw {
    /// Queues a waiter row by hand, as a waiter in another process would, live for `secs` more
    /// seconds by the database's clock (negative: already expired). Returns its waiter id.
    pub(crate) async fn insert_waiter(&self, name: &str, secs: f64) -> String {
        let waiter = OwnerId::random().to_string();
        let sql = self.sql_of(
            &format!(
                "INSERT INTO {{q}}{WAITERS}{{q}} (name, waiter, expires_at) \
                 VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond')"
            ),
            &format!(
                "INSERT INTO {{q}}{WAITERS}{{q}} (name, waiter, expires_at) \
                 VALUES ($1, $2, NOW(6) + INTERVAL $3 MICROSECOND)"
            ),
            &format!(
                "INSERT INTO {{q}}{WAITERS}{{q}} (name, waiter, expires_at) \
                 VALUES ($1, $2, CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) + $3 / 1000)"
            ),
        );
        let micros = (secs * 1e6) as i64;
        on_pool!(self, pool => sqlx::query(sql)
            .bind(name)
            .bind(&waiter)
            .bind(micros)
            .execute(pool)
            .await
            .map(|_| ()))
        .expect("raw waiter row");
        waiter
    }

    /// Waiter rows of `name`, live or expired.
    pub(crate) async fn waiter_rows(&self, name: &str) -> i64 {
        i64::try_from(self.tickets(name).await.len()).expect("a count")
    }

    /// The tickets of `name`'s waiter rows, live or not, in queue order.
    pub(crate) async fn tickets(&self, name: &str) -> Vec<i64> {
        let sql = self.sql(&format!(
            "SELECT ticket FROM {{q}}{WAITERS}{{q}} WHERE name = $1 ORDER BY ticket"
        ));
        on_pool!(self, pool => sqlx::query_scalar(sql).bind(name).fetch_all(pool).await)
            .expect("raw waiter tickets")
    }

    /// Deletes every row of `name` in `table`.
    pub(crate) async fn delete_rows(&self, table: &str, name: &str) {
        let sql = self.sql(&format!("DELETE FROM {{q}}{table}{{q}} WHERE name = $1"));
        on_pool!(self, pool => sqlx::query(sql).bind(name).execute(pool).await.map(|_| ()))
            .expect("raw delete");
    }

    /// Rows of `table` whose name is `name`, live or expired.
    pub(crate) async fn rows_of(&self, table: &str, name: &str) -> i64 {
        let sql = self.sql(&format!(
            "SELECT count(*) FROM {{q}}{table}{{q}} WHERE name = $1"
        ));
        on_pool!(self, pool => sqlx::query_scalar(sql).bind(name).fetch_one(pool).await)
            .expect("raw count")
    }

    /// Runs `sql` (no parameters, nothing handed back).
    pub(crate) async fn exec(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        on_pool!(self, pool => sqlx::raw_sql(sql).execute(pool).await.map(|_| ()))
            .expect("raw statement");
    }
}

/// Waits until `inspect` reports `n` live waiters on `name`.
pub(crate) async fn until_queued(c: &Arc<dyn DistributedLock>, n: &LockName, waiters: usize) {
    within(Duration::from_secs(30), "waiters queued", async {
        loop {
            let info = c.inspect(n).await.expect("inspect");
            if info.and_then(|i| i.waiters) == Some(waiters) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

pub(crate) fn waiting(limit: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(Duration::from_secs(30))
        .keep_alive(KeepAlive::Off)
        .wait(Wait::For(limit))
}

macro_rules! per_dialect {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$case(super::Kind::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$case(super::Kind::Postgres).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mariadb() {
                    super::$case(super::Kind::MariaDb).await
                }
            }
        )*
    };
}

/// A waiting acquire of `n` by `c` with `opts` (with `shared`, a read hold's), on a task of its
/// own, with 30 s to be granted.
pub(crate) fn spawn_wait(
    c: &Arc<dyn DistributedLock>,
    n: &LockName,
    opts: AcquireOptions,
    shared: bool,
) -> tokio::task::JoinHandle<lockcore::Result<Option<Lease>>> {
    let (c, n) = (c.clone(), n.clone());
    let deadline = Some(Instant::now() + Duration::from_secs(30));
    tokio::spawn(async move {
        let opts = opts.with_defaults(&c.defaults());
        match shared {
            true => c.acquire_shared_wait(&n, &opts, deadline).await,
            false => c.acquire_wait(&n, &opts, deadline).await,
        }
    })
}

/// The lease a [`spawn_wait`] task was granted.
pub(crate) async fn granted(
    what: &str,
    task: tokio::task::JoinHandle<lockcore::Result<Option<Lease>>>,
) -> Lease {
    within(Duration::from_secs(30), what, task)
        .await
        .expect("task")
        .expect("acquire")
        .expect("granted")
}

/// A lease granted from the queue: `a` holds `n` plainly while `b` queues for it, then lets
/// it go, and `b`'s grant (its own, from the queue) is returned.
pub(crate) async fn queued_lease(
    a: &Arc<dyn DistributedLock>,
    b: &Arc<dyn DistributedLock>,
    n: &LockName,
    ttl: Duration,
) -> Lease {
    let first = take(a, n, Duration::from_secs(30)).await.expect("free");
    let waiter = spawn_wait(b, n, waiting(Duration::from_secs(30)).ttl(ttl), false);
    until_queued(a, n, 1).await;
    a.release(&first).await.expect("release");
    let lease = granted("the queued grant", waiter).await;
    assert!(
        lease.handle().is_some_and(|h| h.starts_with("queued")),
        "granted from the queue: {:?}",
        lease.handle()
    );
    lease
}

/// Waits until `table` holds no row of `name` (clean-ups run in the background).
pub(crate) async fn until_no_rows(raw: &Raw, table: &str, n: &LockName, what: &str) {
    within(Duration::from_secs(30), what, async {
        while raw.rows_of(table, n.as_str()).await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The semaphore tables of the default lease table.
pub(crate) const SEMAPHORES: &str = "dlock_leases_semaphores";
pub(crate) const PERMITS: &str = "dlock_leases_permits";
pub(crate) const PERMIT_QUEUE: &str = "dlock_leases_permit_queue";

/// The readers table and the waiters table of the default lease table.
pub(crate) const READERS: &str = "dlock_leases_readers";
pub(crate) const WAITERS: &str = "dlock_leases_waiters";

/// One attempt at a permit of `name` (a semaphore of `permits`) through the trait.
pub(crate) async fn permit(
    c: &Arc<dyn DistributedLock>,
    n: &LockName,
    permits: u32,
    o: AcquireOptions,
) -> lockcore::Result<Option<Lease>> {
    c.try_acquire_permit(n, permits, &o.with_defaults(&c.defaults()))
        .await
}
