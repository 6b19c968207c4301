//! SQL-specific tests on real databases: SQLite files, and the kit's PostgreSQL and MariaDB
//! servers (a fresh database per test). Each property runs on all three dialects.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use backend_sql::{Dialect, SqlConfig};
use conformance_tests::kit;
use lockcore::{
    AcquireOptions, DistributedLock, Error, FencingToken, KeepAlive, Lease, LockExt, LockName,
    OwnerId, Released, Wait, WaitMechanism,
};
use sqlx::Row;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
    MariaDb,
}

fn sqlite_dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
}

fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A URL to a store no other test uses.
async fn fresh_url(kind: Kind) -> String {
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
fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

async fn client(url: &str) -> Arc<dyn DistributedLock> {
    backend_sql::connect(url).await.expect("connect")
}

fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn take(c: &Arc<dyn DistributedLock>, n: &LockName, ttl: Duration) -> Option<Lease> {
    c.try_acquire(n, &opts(ttl).with_defaults(&c.defaults()))
        .await
        .expect("try_acquire")
}

/// Direct SQL on the same store, bypassing the backend.
enum Raw {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl Raw {
    async fn connect(url: &str) -> Raw {
        let dialect = SqlConfig::parse(url).expect("url").dialect();
        match dialect {
            Dialect::Postgres => Raw::Pg(sqlx::PgPool::connect(url).await.expect("raw pg")),
            Dialect::MySql => Raw::My(sqlx::MySqlPool::connect(url).await.expect("raw mysql")),
            Dialect::Sqlite => Raw::Lite(sqlx::SqlitePool::connect(url).await.expect("raw sqlite")),
        }
    }

    /// (owner, fence, seconds until expiry by the database's clock) of `name`'s row.
    async fn row(&self, table: &str, name: &str) -> Option<(Option<String>, i64, f64)> {
        match self {
            Raw::Pg(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT owner, fence, extract(epoch FROM expires_at - clock_timestamp())::float8 \
                 FROM \"{table}\" WHERE name = $1"
            )))
            .bind(name)
            .fetch_optional(p)
            .await
            .expect("raw row")
            .map(|r| (r.get(0), r.get(1), r.get(2))),
            Raw::My(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT owner, fence, \
                 CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) AS DOUBLE) / 1e6 \
                 FROM `{table}` WHERE name = ?"
            )))
            .bind(name.as_bytes())
            .fetch_optional(p)
            .await
            .expect("raw row")
            .map(|r| (r.get(0), r.get(1), r.get(2))),
            Raw::Lite(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT owner, fence, \
                 (expires_at - unixepoch('subsec') * 1000) / 1000.0 \
                 FROM \"{table}\" WHERE name = ?1"
            )))
            .bind(name)
            .fetch_optional(p)
            .await
            .expect("raw row")
            .map(|r| (r.get(0), r.get(1), r.get(2))),
        }
    }
}

/// The lease table every test here uses (the default).
const TABLE: &str = "dlock_leases";

impl Raw {
    /// Queues a waiter row by hand, as a waiter in another process would, live for `secs` more
    /// seconds by the database's clock (negative: already expired). Returns its waiter id.
    async fn insert_waiter(&self, name: &str, secs: f64) -> String {
        let waiter = OwnerId::random().to_string();
        let w = format!("{TABLE}_waiters");
        let micros = (secs * 1e6) as i64;
        match self {
            Raw::Pg(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO \"{w}\" (name, waiter, expires_at) \
                 VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond')"
            )))
            .bind(name)
            .bind(&waiter)
            .bind(micros)
            .execute(p)
            .await
            .map(|_| ()),
            Raw::My(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO `{w}` (name, waiter, expires_at) \
                 VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND)"
            )))
            .bind(name.as_bytes())
            .bind(&waiter)
            .bind(micros)
            .execute(p)
            .await
            .map(|_| ()),
            Raw::Lite(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO \"{w}\" (name, waiter, expires_at) \
                 VALUES (?1, ?2, CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) + ?3)"
            )))
            .bind(name)
            .bind(&waiter)
            .bind(micros / 1000)
            .execute(p)
            .await
            .map(|_| ()),
        }
        .expect("raw waiter row");
        waiter
    }

    /// Waiter rows of `name`, live or expired.
    async fn waiter_rows(&self, name: &str) -> i64 {
        i64::try_from(self.tickets(name).await.len()).expect("a count")
    }

    /// The tickets of `name`'s waiter rows, live or not, in queue order.
    async fn tickets(&self, name: &str) -> Vec<i64> {
        let w = format!("{TABLE}_waiters");
        match self {
            Raw::Pg(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT ticket FROM \"{w}\" WHERE name = $1 ORDER BY ticket"
                )))
                .bind(name)
                .fetch_all(p)
                .await
            }
            Raw::My(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT ticket FROM `{w}` WHERE name = ? ORDER BY ticket"
                )))
                .bind(name.as_bytes())
                .fetch_all(p)
                .await
            }
            Raw::Lite(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT ticket FROM \"{w}\" WHERE name = ?1 ORDER BY ticket"
                )))
                .bind(name)
                .fetch_all(p)
                .await
            }
        }
        .expect("raw waiter tickets")
    }

    /// Deletes every waiter row of `name`.
    async fn delete_waiters(&self, name: &str) {
        let w = format!("{TABLE}_waiters");
        match self {
            Raw::Pg(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM \"{w}\" WHERE name = $1"
            )))
            .bind(name)
            .execute(p)
            .await
            .map(|_| ()),
            Raw::My(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM `{w}` WHERE name = ?"
            )))
            .bind(name.as_bytes())
            .execute(p)
            .await
            .map(|_| ()),
            Raw::Lite(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM \"{w}\" WHERE name = ?1"
            )))
            .bind(name)
            .execute(p)
            .await
            .map(|_| ()),
        }
        .expect("raw waiter delete");
    }
}

/// Fails instead of hanging.
async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
}

/// Waits until `inspect` reports `n` live waiters on `name`.
async fn until_queued(c: &Arc<dyn DistributedLock>, n: &LockName, waiters: usize) {
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

fn waiting(limit: Duration) -> AcquireOptions {
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

per_dialect!(
    schema_creation_is_idempotent_under_concurrent_connects,
    release_and_extend_are_owner_checked,
    fence_survives_release_and_expiry,
    long_and_case_differing_names_stay_distinct,
    expiry_is_database_time,
    inspect_reports_holder_token_and_remaining,
    raw_floor_runs_the_same_statements,
    concurrent_clients_never_see_busy_errors,
    extend_many_reports_each_lease,
    try_lock_does_not_jump_a_live_queue,
    cancelled_waiters_leave_no_row,
    dead_waiter_blocks_only_until_its_liveness,
    token_floor_and_chosen_owner_on_every_granting_statement,
    a_grant_from_the_queue_names_the_next_head,
    a_release_hands_the_lock_to_the_next_writer,
    a_hand_over_passes_over_readers_and_stale_waiters,
    a_dead_waiter_handed_the_lock_holds_it_for_the_lease,
);

/// A waiting acquire of `n` by `c` with `opts` (with `shared`, a read hold's), on a task of its
/// own, with 30 s to be granted.
fn spawn_wait(
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
async fn granted(
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
async fn queued_lease(
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

/// The release of a lease granted from the queue hands the row to the next waiter in the
/// same statement: when `release` returns, the row is already the waiter's with the next
/// fence, before the waiter has looked (and on SQLite and PostgreSQL its waiter row is gone).
/// The waiter then returns that grant without writing it again (on PostgreSQL, from the
/// release's notification, or from its own attempt should that run first), with its own ttl
/// where it asked for another, and its waiter row goes.
async fn a_release_hands_the_lock_to_the_next_writer(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("hand-over");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let next = OwnerId::random();
    // Another ttl than the releaser's: the handed row is extended to this one.
    let opts = waiting(Duration::from_secs(30))
        .ttl(Duration::from_secs(10))
        .owner(next);
    let waiter = spawn_wait(&c, &n, opts, false);
    until_queued(&a, &n, 1).await;
    let fence = i64::try_from(held.token().0).expect("fence");
    assert_eq!(b.release(&held).await.expect("release"), Released::Released);
    let (owner, row_fence, _) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(owner, Some(next.to_string()), "handed over by the release");
    assert_eq!(row_fence, fence + 1);
    if kind != Kind::MariaDb {
        // SQLite's triggers and PostgreSQL's statement dequeue the new owner with the
        // hand-over; MySQL's new owner does so in the background.
        assert_eq!(
            raw.waiter_rows(n.as_str()).await,
            0,
            "the waiter row stayed"
        );
    }
    let got = granted("the next waiter's grant", waiter).await;
    assert_eq!(got.owner(), next);
    assert_eq!(got.token().0, u64::try_from(fence + 1).expect("fence"));
    assert_eq!(got.ttl(), Duration::from_secs(10));
    let (owner, row_fence, left) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!((owner, row_fence), (Some(next.to_string()), fence + 1));
    assert!(
        left > 8.0 && left <= 10.5,
        "the row runs for the new holder's ttl, not the releaser's: {left} s left"
    );
    within(Duration::from_secs(30), "the waiter row to go", async {
        while raw.waiter_rows(n.as_str()).await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(c.release(&got).await.expect("release"), Released::Released);
}

/// A hand-over goes only to a writer at the head that refreshed its liveness lately: with a
/// reader first in line, or a waiter whose row has less than 1.5 s left (one that stopped
/// refreshing), the release frees the row as a plain one does.
async fn a_hand_over_passes_over_readers_and_stale_waiters(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b, r) = (client(&url).await, client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("hand-over-skips");

    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let fence = i64::try_from(held.token().0).expect("fence");
    raw.insert_waiter(n.as_str(), 1.0).await;
    b.release(&held).await.expect("release");
    let row = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(
        (row.0, row.1),
        (None, fence),
        "a stale waiter is not handed the lock"
    );
    raw.delete_waiters(n.as_str()).await;

    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let fence = i64::try_from(held.token().0).expect("fence");
    let reader = spawn_wait(&r, &n, waiting(Duration::from_secs(30)), true);
    until_queued(&a, &n, 1).await;
    b.release(&held).await.expect("release");
    let read = granted("the reader's grant", reader).await;
    let row = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_ne!(row.0, None, "the readers hold the row");
    assert!(row.1 > fence, "the reader's own grant bumped the fence");
    assert_ne!(row.0, Some(held.owner().to_string()));
    assert_eq!(r.release(&read).await.expect("release"), Released::Released);
}

/// The price of a hand-over, pinned down: a waiter that died in the 1.5 s after its last
/// refresh (here a row queued by hand with 2.5 s of liveness, which nobody refreshes) can be
/// handed the lock, which then stays taken until the handed lease (the releaser's ttl) runs
/// out, as when a holder dies; then anyone may take it.
async fn a_dead_waiter_handed_the_lock_holds_it_for_the_lease(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("hand-over-dead");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(2)).await;
    let dead = raw.insert_waiter(n.as_str(), 2.5).await;
    let released = Instant::now();
    b.release(&held).await.expect("release");
    let owner = raw.row(TABLE, n.as_str()).await.expect("row").0;
    assert_eq!(owner, Some(dead), "handed to the dead waiter");
    assert!(take(&a, &n, Duration::from_secs(30)).await.is_none());
    let lease = within(
        Duration::from_secs(30),
        "the handed lease to run out",
        async {
            loop {
                if let Some(lease) = take(&a, &n, Duration::from_secs(30)).await {
                    return lease;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    let waited = released.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "taken {waited:?} after a 2 s lease was handed over"
    );
    assert_eq!(
        a.release(&lease).await.expect("release"),
        Released::Released
    );
}

/// A waiter granted from the queue gets a lease marked as such, and where the dialect rings
/// doorbells (MySQL's grant procedure, SQLite's grant), the mark names the live waiter left at
/// the head, so that the release rings it without looking it up (see the crate's `bell`
/// module). PostgreSQL notifies instead and names none.
async fn a_grant_from_the_queue_names_the_next_head(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("named-head");
    let holder = a
        .try_lock(n.as_str(), &opts(Duration::from_secs(30)))
        .await
        .expect("try")
        .expect("free");
    let waiter = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move { b.lock(n.as_str(), &waiting(Duration::from_secs(30))).await })
    };
    until_queued(&a, &n, 1).await;
    // Behind it, a waiter in another process (never granted here: it only waits).
    raw.insert_waiter(n.as_str(), 60.0).await;
    let behind = *raw.tickets(n.as_str()).await.last().expect("a ticket");
    holder.release().await.expect("release");
    let got = within(Duration::from_secs(30), "the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("acquire");
    let expected = match kind {
        Kind::Postgres => "queued".to_owned(),
        Kind::Sqlite | Kind::MariaDb => format!("queued {behind}"),
    };
    assert_eq!(got.lease().handle(), Some(expected.as_str()));
    assert_eq!(raw.tickets(n.as_str()).await, [behind]);
    assert_eq!(got.release().await.expect("release"), Released::Released);
    raw.delete_waiters(n.as_str()).await;
}

/// A token floor and a chosen owner reach every statement that grants: the insert of a new row
/// and the take-over of the plain acquire, and a queued waiter's attempt. The fence column
/// holds the floor afterwards, so plain grants continue above it; a floor below the fence
/// changes nothing, and one that does not fit the column is refused before any I/O.
async fn token_floor_and_chosen_owner_on_every_granting_statement(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("floored");
    let fence = || async { raw.row(TABLE, n.as_str()).await.map(|r| r.1) };
    let floored = |o: AcquireOptions, f: u64| o.token_floor(FencingToken(f));

    // A name never used: the insert.
    let owner = OwnerId::random();
    let g = a
        .try_lock(
            n.as_str(),
            &floored(opts(Duration::from_secs(30)), 100).owner(owner),
        )
        .await
        .expect("try")
        .expect("free");
    assert_eq!(g.fencing_token(), FencingToken(100));
    assert_eq!(g.lease().owner(), owner);
    assert_eq!(fence().await, Some(100));
    g.release().await.expect("release");

    // The take-over of a free row, then a queued waiter granted when the holder releases.
    let holder = a
        .try_lock(n.as_str(), &floored(opts(Duration::from_secs(30)), 200))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(holder.fencing_token(), FencingToken(200));
    let waiter_owner = OwnerId::random();
    let waiter = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move {
            b.lock(
                n.as_str(),
                &floored(waiting(Duration::from_secs(30)), 500).owner(waiter_owner),
            )
            .await
        })
    };
    until_queued(&a, &n, 1).await;
    holder.release().await.expect("release");
    let got = within(Duration::from_secs(30), "the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("acquire");
    assert_eq!(got.fencing_token(), FencingToken(500));
    assert_eq!(got.lease().owner(), waiter_owner);
    let row = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(
        (row.0, row.1),
        (Some(waiter_owner.to_string()), 500),
        "the row records the waiter's owner and the floor"
    );
    assert_eq!(
        raw.waiter_rows(n.as_str()).await,
        0,
        "the granted waiter left the queue before its acquire returned"
    );
    got.release().await.expect("release");

    // A low floor changes nothing; plain grants continue above the floor.
    let low = a
        .try_lock(n.as_str(), &floored(opts(Duration::from_secs(30)), 1))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(low.fencing_token(), FencingToken(501));
    low.release().await.expect("release");

    let err = a
        .try_lock(
            n.as_str(),
            &floored(opts(Duration::from_secs(30)), i64::MAX as u64 + 1),
        )
        .await
        .expect_err("a floor beyond the fence column");
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                argument: "token_floor",
                ..
            }
        ),
        "got {err}"
    );
    assert_eq!(
        raw.row(TABLE, n.as_str()).await.map(|r| (r.0, r.1)),
        Some((None, 501)),
        "the refused floor touched the row"
    );
}

/// `try_acquire` never jumps a live queue: a live waiter row (as a waiter in another process
/// leaves) keeps even a free or never-used lock from being taken, an expired one does not; and
/// after a release, a `try_lock` gets nothing while the queued waiter has not had its turn.
async fn try_lock_does_not_jump_a_live_queue(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("queued");
    let ttl = Duration::from_secs(10);
    // PostgreSQL and SQLite gate even the insert of a new row; MySQL gates only the take-over
    // of an existing one (a real waiter only queues after finding the row held).
    if kind != Kind::MariaDb {
        raw.insert_waiter(n.as_str(), 60.0).await;
        assert!(
            take(&c, &n, ttl).await.is_none(),
            "a never-used lock was taken past a live waiter"
        );
        raw.delete_waiters(n.as_str()).await;
    }
    let lease = take(&c, &n, ttl).await.expect("free, nobody queued");
    c.release(&lease).await.unwrap();

    raw.insert_waiter(n.as_str(), -1.0).await;
    let lease = take(&c, &n, ttl)
        .await
        .expect("an expired waiter row does not hold up the lock");
    c.release(&lease).await.unwrap();
    raw.insert_waiter(n.as_str(), 60.0).await;
    assert!(
        take(&c, &n, ttl).await.is_none(),
        "a free lock was taken past a live waiter"
    );
    let info = c.inspect(&n).await.unwrap().expect("row");
    assert_eq!(info.waiters, Some(1), "live waiters only: {info:?}");
    raw.delete_waiters(n.as_str()).await;

    // A real queue: the holder releases; until the waiter has had its turn, try_lock gets nothing.
    let (holder, w, intruder) = (client(&url).await, client(&url).await, client(&url).await);
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    let (got_tx, mut got_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let waiter = {
        let n = n.clone();
        tokio::spawn(async move {
            let g = w
                .lock(n.as_str(), &waiting(Duration::from_secs(60)))
                .await
                .expect("queued waiter acquires");
            let _ = got_tx.send(());
            let _ = go_rx.await;
            g.release().await.expect("release");
        })
    };
    until_queued(&holder, &n, 1).await;
    holder.release(&lease).await.unwrap();
    within(Duration::from_secs(60), "the waiter's turn", async {
        loop {
            let got = got_rx.try_recv().is_ok();
            assert!(
                take(&intruder, &n, ttl).await.is_none(),
                "try_lock jumped the queue"
            );
            if got {
                break;
            }
        }
    })
    .await;
    let _ = go_tx.send(());
    within(Duration::from_secs(30), "waiter", waiter)
        .await
        .expect("waiter task");
    let lease = take(&intruder, &n, ttl)
        .await
        .expect("free once the queue is empty");
    intruder.release(&lease).await.unwrap();
}

/// Waiters that are dropped, or whose wait times out, leave no waiter row behind: a dropped
/// one's row goes with the cleanup spawned at once, a timed-out one's before the timeout is
/// returned. Then the lock is free for anyone as soon as the holder releases.
async fn cancelled_waiters_leave_no_row(kind: Kind) {
    let url = fresh_url(kind).await;
    let (holder, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("cancelled");
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (c, n) = (client(&url).await, n.clone());
        tasks.push(tokio::spawn(async move {
            c.lock(n.as_str(), &waiting(Duration::from_secs(600))).await
        }));
    }
    until_queued(&holder, &n, 3).await;
    assert_eq!(raw.waiter_rows(n.as_str()).await, 3);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.is_err_and(|e| e.is_cancelled()), "not cancelled");
    }
    within(
        Duration::from_secs(30),
        "dropped waiters' rows deleted",
        async {
            while raw.waiter_rows(n.as_str()).await > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;

    let c = client(&url).await;
    match c
        .lock(n.as_str(), &waiting(Duration::from_millis(300)))
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(
        raw.waiter_rows(n.as_str()).await,
        0,
        "a timed-out waiter left its row"
    );
    holder.release(&lease).await.unwrap();
    let lease = take(&c, &n, Duration::from_secs(10))
        .await
        .expect("free, nobody queued");
    c.release(&lease).await.unwrap();
}

/// A waiter that crashed (its row left behind, as by a kill -9 right after a refresh) holds up
/// the queue until its liveness runs out by the database's clock, and no longer: the next
/// waiter gets the lock, and the dead row is deleted on the way.
async fn dead_waiter_blocks_only_until_its_liveness(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("dead-waiter");
    let lease = take(&c, &n, Duration::from_secs(10)).await.expect("free");
    c.release(&lease).await.unwrap();
    let queued = Instant::now();
    raw.insert_waiter(n.as_str(), 2.0).await;
    assert!(
        take(&c, &n, Duration::from_secs(10)).await.is_none(),
        "the dead waiter's row is still live"
    );
    let g = within(
        Duration::from_secs(60),
        "acquire behind a dead waiter",
        c.lock(n.as_str(), &waiting(Duration::from_secs(60))),
    )
    .await
    .expect("the queue moves on once the dead waiter's liveness has run out");
    let waited = queued.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "granted {waited:?} after a waiter row live for 2 s was queued"
    );
    assert_eq!(
        raw.waiter_rows(n.as_str()).await,
        0,
        "the dead row and the granted waiter's row are gone"
    );
    g.release().await.unwrap();
}

/// Keep-alive's batch: every lease gets its own outcome, in order, with the same owner checks
/// as `extend`.
async fn extend_many_reports_each_lease(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let live = take(&c, &name("live"), Duration::from_secs(30))
        .await
        .unwrap();
    let released = take(&c, &name("released"), Duration::from_secs(30))
        .await
        .unwrap();
    c.release(&released).await.unwrap();
    let expired = take(&c, &name("expired"), Duration::from_millis(100))
        .await
        .unwrap();
    let forged = Lease::new(
        name("live"),
        OwnerId::random(),
        live.token(),
        Instant::now(),
        Duration::from_secs(30),
        Duration::ZERO,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let minute = Duration::from_secs(60);
    let out = c
        .extend_many(&[
            (live.clone(), minute),
            (released.clone(), minute),
            (expired.clone(), minute),
            (live.clone(), Duration::from_millis(1)),
            (forged, minute),
        ])
        .await;
    assert_eq!(out.len(), 5);
    let renewed = out[0].as_ref().expect("the live lease is extended");
    assert_eq!(renewed.token(), live.token());
    assert!(renewed.valid_until() > live.valid_until());
    for (i, what) in [(1, "released"), (2, "expired"), (4, "forged")] {
        assert!(
            matches!(out[i], Err(Error::LockLost { .. })),
            "{what}: {:?}",
            out[i]
        );
    }
    assert!(
        matches!(out[3], Err(Error::InvalidArgument { .. })),
        "{:?}",
        out[3]
    );
    let left = c
        .inspect(&name("live"))
        .await
        .unwrap()
        .unwrap()
        .remaining
        .unwrap();
    assert!(
        left > Duration::from_secs(45),
        "extended to a minute: {left:?}"
    );
    assert!(
        take(&c, &name("expired"), Duration::from_secs(5))
            .await
            .is_some()
    );
    assert_eq!(c.extend_many(&[]).await.len(), 0);
}

/// Eight clients connecting at once to a database without the table all succeed, and they then
/// share one table (one holds, the others see it held).
async fn schema_creation_is_idempotent_under_concurrent_connects(kind: Kind) {
    let url = with_query(&fresh_url(kind).await, "table=fresh_table");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let url = url.clone();
        tasks.spawn(async move { backend_sql::connect(&url).await });
    }
    let mut clients = Vec::new();
    while let Some(r) = tasks.join_next().await {
        clients.push(r.expect("task").expect("concurrent first connect"));
    }
    let n = name("shared");
    let lease = take(&clients[0], &n, Duration::from_secs(30))
        .await
        .expect("first client acquires");
    for c in &clients[1..] {
        assert!(
            take(c, &n, Duration::from_secs(30)).await.is_none(),
            "a client created concurrently uses another table"
        );
    }
    // Connecting again to the existing table is fine too.
    let again = client(&url).await;
    assert!(take(&again, &n, Duration::from_secs(30)).await.is_none());
    assert_eq!(
        clients[0].release(&lease).await.unwrap(),
        Released::Released
    );
}

/// Release and extend need the holder's owner id *and* token, and a live row.
async fn release_and_extend_are_owner_checked(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let n = name("owned");
    let ttl = Duration::from_secs(30);
    let lease = take(&a, &n, ttl).await.expect("acquire");
    let opts_ttl = Duration::from_secs(30);
    let forged_owner = Lease::new(
        n.clone(),
        OwnerId::random(),
        lease.token(),
        Instant::now(),
        ttl,
        Duration::ZERO,
    );
    let forged_token = Lease::new(
        n.clone(),
        lease.owner(),
        lockcore::FencingToken(lease.token().0 + 1),
        Instant::now(),
        ttl,
        Duration::ZERO,
    );
    for forged in [&forged_owner, &forged_token] {
        assert_eq!(b.release(forged).await.unwrap(), Released::NotHeld);
        match b.extend(forged, opts_ttl).await {
            Err(Error::LockLost { .. }) => {}
            other => panic!("extend with a forged lease: {other:?}"),
        }
    }
    assert!(
        take(&b, &n, ttl).await.is_none(),
        "forged release freed the lock"
    );
    // The real lease works from any client of the store.
    let extended = b.extend(&lease, ttl).await.expect("extend by the owner");
    assert_eq!(extended.token(), lease.token(), "extend keeps the token");
    assert_eq!(b.release(&lease).await.unwrap(), Released::Released);
    assert_eq!(a.release(&lease).await.unwrap(), Released::NotHeld);
    match a.extend(&lease, ttl).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend after release: {other:?}"),
    }
}

/// The row outlives release and expiry, and each acquisition's token beats every earlier one.
async fn fence_survives_release_and_expiry(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("fence");
    let l1 = take(&a, &n, Duration::from_secs(30)).await.expect("first");
    a.release(&l1).await.unwrap();
    let row = raw.row("dlock_leases", n.as_str()).await;
    assert!(
        matches!(row, Some((None, f, _)) if f == l1.token().0 as i64),
        "release must keep the row with its fence and clear the owner: {row:?}"
    );
    let l2 = take(&b, &n, Duration::from_millis(200))
        .await
        .expect("second");
    assert!(
        l2.token() > l1.token(),
        "{:?} !> {:?}",
        l2.token(),
        l1.token()
    );
    // Let it expire without release; the next holder takes the row over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    match b.extend(&l2, Duration::from_secs(30)).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend of an expired lease resurrected it: {other:?}"),
    }
    let l3 = take(&a, &n, Duration::from_secs(30)).await.expect("third");
    assert!(
        l3.token() > l2.token(),
        "{:?} !> {:?}",
        l3.token(),
        l2.token()
    );
    assert_eq!(
        b.release(&l2).await.unwrap(),
        Released::NotHeld,
        "the expired holder cannot free the new holder's lock"
    );
    // New clients (new pools) continue from the stored fence.
    let c = client(&url).await;
    a.release(&l3).await.unwrap();
    let l4 = take(&c, &n, Duration::from_secs(30)).await.expect("fourth");
    assert!(l4.token() > l3.token());
    c.release(&l4).await.unwrap();
}

/// 1024-byte names, names differing only in case or in their last byte, and multi-byte names are
/// distinct locks (MariaDB's default collation is case-insensitive; the name column must not be).
async fn long_and_case_differing_names_stay_distinct(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let names = [
        "a".repeat(1024),
        format!("{}b", "a".repeat(1023)),
        format!("{}A", "a".repeat(1023)),
        "Lock".to_owned(),
        "lock".to_owned(),
        "LOCK".to_owned(),
        "lock ".to_owned(),
        "ä".repeat(512),
        "a".repeat(1023),
        "ǅ/\u{1F512}/'; DROP TABLE dlock_leases; --".to_owned(),
    ];
    let mut leases = Vec::new();
    for n in &names {
        let lease = take(&c, &name(n), Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{:?}.. collides with another name", &n[..n.len().min(12)]));
        leases.push(lease);
    }
    for lease in &leases {
        let info = c.inspect(lease.name()).await.unwrap().expect("row exists");
        assert_eq!(info.name, lease.name().as_str());
        assert_eq!(info.holder, Some(lease.owner().to_string()));
        assert_eq!(info.token, Some(lease.token()));
    }
    for lease in &leases {
        assert_eq!(c.release(lease).await.unwrap(), Released::Released);
    }
}

/// `expires_at` is written by the database's clock: the row ends ttl after the database's
/// `now`, and the remaining time the backend reports is computed by the database.
async fn expiry_is_database_time(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let raw = Raw::connect(&url).await;
    let n = name("clock");
    let ttl = Duration::from_secs(3600);
    let lease = take(&c, &n, ttl).await.expect("acquire");
    let (owner, _, secs_left) = raw.row("dlock_leases", n.as_str()).await.expect("row");
    assert_eq!(owner, Some(lease.owner().to_string()));
    assert!(
        (3590.0..=3600.001).contains(&secs_left),
        "row expires {secs_left} s after the database's now, expected about 3600"
    );
    // Extend rewrites it from the database's now, to the new ttl.
    c.extend(&lease, Duration::from_secs(60)).await.unwrap();
    let (_, _, secs_left) = raw.row("dlock_leases", n.as_str()).await.expect("row");
    assert!(
        (50.0..=60.001).contains(&secs_left),
        "after extend(60s) the row expires in {secs_left} s"
    );
    c.release(&lease).await.unwrap();
}

async fn inspect_reports_holder_token_and_remaining(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let n = name("inspected");
    assert!(c.inspect(&n).await.unwrap().is_none(), "never used: no row");
    let lease = take(&c, &n, Duration::from_secs(20))
        .await
        .expect("acquire");
    let info = c.inspect(&n).await.unwrap().expect("row");
    assert!(info.is_held());
    assert_eq!(info.holder, Some(lease.owner().to_string()));
    assert_eq!(info.token, Some(lease.token()));
    let left = info.remaining.expect("remaining");
    assert!(
        left > Duration::from_secs(10) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    c.release(&lease).await.unwrap();
    let info = c.inspect(&n).await.unwrap().expect("row kept");
    assert!(!info.is_held());
    assert_eq!(info.holder, None);
    assert_eq!(info.remaining, None);
    assert_eq!(
        info.token,
        Some(lease.token()),
        "the last token stays visible"
    );
}

async fn raw_floor_runs_the_same_statements(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let floor = c.raw_floor().expect("SQL backends have a raw floor");
    assert!(!floor.description().is_empty());
    let n = name("floor");
    for _ in 0..3 {
        floor.pair(&n).await.expect("raw pair");
    }
    // The floor works on the real table and leaves the lock free, with its fence advanced.
    let lease = take(&c, &n, Duration::from_secs(10)).await.expect("free");
    assert_eq!(lease.token().0, 4, "three raw pairs, then this acquisition");
    c.release(&lease).await.unwrap();
}

/// Four clients (four pools) hammer one name: no error ever reaches the caller (SQLite's
/// "database is locked" and InnoDB deadlocks are retried inside), and no two hold at once.
async fn concurrent_clients_never_see_busy_errors(kind: Kind) {
    let url = fresh_url(kind).await;
    let holders = Arc::new(AtomicU64::new(0));
    let acquired = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..4 {
        let c = client(&url).await;
        let holders = holders.clone();
        let acquired = acquired.clone();
        tasks.spawn(async move {
            let n = name("hammered");
            let other = name(&format!("private-{i}"));
            for round in 0..60 {
                let lease = c
                    .try_acquire(&n, &opts(Duration::from_secs(10)))
                    .await
                    .unwrap_or_else(|e| panic!("client {i} round {round}: {e}"));
                if let Some(lease) = lease {
                    assert_eq!(
                        holders.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    acquired.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    let r = c.release(&lease).await;
                    assert_eq!(
                        r.unwrap_or_else(|e| panic!("client {i} release: {e}")),
                        Released::Released
                    );
                }
                // Writes to other rows compete for the same database lock.
                let own = c
                    .try_acquire(&other, &opts(Duration::from_secs(10)))
                    .await
                    .unwrap_or_else(|e| panic!("client {i} own lock: {e}"))
                    .expect("nobody else uses this name");
                c.release(&own)
                    .await
                    .unwrap_or_else(|e| panic!("client {i} own release: {e}"));
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("client task");
    }
    assert!(acquired.load(Ordering::SeqCst) > 0);
}

// ---- tests that are not per dialect ----

/// Bad URLs, options and table names fail as `InvalidConfig` (before any I/O: the hosts do not
/// exist) and never show the password.
#[tokio::test]
async fn bad_input_fails_before_io_without_the_password() {
    let secret = "Sup3rS3cret";
    let cases = [
        format!("postgres://u:{secret}@db.invalid:5432/x?colour=blue"),
        format!("postgres://u:{secret}@db.invalid:5432/x?table=1bad"),
        format!("postgres://u:{secret}@db.invalid:5432/x?table=a%22b"),
        format!("postgres://u:{secret}@db.invalid:5432/x?ttl=forever"),
        format!("postgres://u:{secret}@db.invalid:5432/x?ttl=1ms"),
        format!("postgres://u:{secret}@db.invalid:5432/x?timeout=0s"),
        format!("postgres://u:{secret}@db.invalid:5432/x?sslmode=verify-fully"),
        format!("postgres://u:{secret}@db.invalid:5432/x?sslmode=require&ca=/etc/ca.pem"),
        format!("postgres://u:{secret}@db.invalid:5432/x?ca=/nonexistent/ca.pem"),
        format!("mysql://u:{secret}@db.invalid:3306/x?ssl-mode=REQUIRED&ssl-ca=/etc/ca.pem"),
        format!("postgres://u:{secret}@db.invalid:notaport/x"),
        format!("postgresql://u:{secret}@/x"),
        format!("mysql://u:{secret}@db.invalid:3306"),
        format!("mariadb://u:{secret}@db.invalid:3306/x?table="),
        format!("mysql://u:{secret}@db.invalid:3306/x?prefix=a"),
        format!("mysql://u:{secret}@db.invalid/x/y"),
        "sqlite://".to_owned(),
        "sqlite:///tmp/?ttl=1s".to_owned(),
        "sqlite::memory:?table=drop%20table".to_owned(),
        "sqlite::memory:?ttl=10s&drift=20s".to_owned(),
    ];
    for url in &cases {
        // Bad input is rejected before any I/O; the timeout only turns a hang into a failure.
        let err = tokio::time::timeout(Duration::from_secs(30), backend_sql::connect(url))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} hung instead of being rejected",
                    backend_sql::redact_url(url)
                )
            })
            .expect_err(&format!(
                "{} should be rejected",
                backend_sql::redact_url(url)
            ));
        assert!(
            matches!(err, Error::InvalidConfig { .. }),
            "{}: expected InvalidConfig, got {err:?}",
            backend_sql::redact_url(url)
        );
        let text = format!("{err} / {err:?}");
        assert!(!text.contains(secret), "password leaked: {text}");
    }
    let err = backend_sql::connect("oracle://u:pw@h/x").await.unwrap_err();
    match err {
        Error::UnsupportedScheme { available, .. } => {
            assert_eq!(available, backend_sql::SCHEMES)
        }
        other => panic!("{other:?}"),
    }
}

/// Debug of clients and errors from a real server never show the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_stay_out_of_debug_and_server_errors() {
    let secret = "Sup3rS3cret";
    // The kit's URL carries its password: a live client to Debug.
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let url = pg.url();
    let c = client(&url).await;
    let debug = format!("{c:?}");
    assert!(!debug.contains(pg.password()), "{debug}");
    assert!(debug.contains("***"), "{debug}");
    let config = SqlConfig::parse(&url).unwrap();
    assert!(!format!("{config:?}").contains(pg.password()));

    // MariaDB checks passwords: a wrong one fails, without echoing it.
    let db = kit::MariaDb::shared().await.expect("kit MariaDB");
    let url = format!(
        "mysql://root:{secret}@127.0.0.1:{}/test?timeout=5s",
        db.port()
    );
    let err = backend_sql::connect(&url).await.unwrap_err();
    let text = format!("{err} / {err:?}");
    assert!(matches!(err, Error::AccessDenied { .. }), "{text}");
    assert!(text.contains("mysql"), "names the backend: {text}");
    assert!(!text.contains(secret), "{text}");

    // Nothing listening: a connection error, no password.
    let port = kit::free_port();
    let url = format!("postgres://postgres:{secret}@127.0.0.1:{port}/postgres?timeout=1s");
    let err = backend_sql::connect(&url).await.unwrap_err();
    let text = format!("{err} / {err:?}");
    assert!(err.is_retryable(), "{text}");
    assert!(!text.contains(secret), "{text}");
}

/// Count the server sessions of our clients before, during and after use: every connection,
/// the PostgreSQL listener included, is closed once the clients are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_leak_postgres() {
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let url = with_query(
        &pg.fresh_database("leak").await.unwrap(),
        "application_name=dlock_leak_test",
    );
    let count = || async {
        pg.query(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dlock_leak_test'",
        )
        .await
        .expect("psql")
        .trim()
        .parse::<u32>()
        .expect("count")
    };
    leak_check(&url, count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_leak_mariadb() {
    let db = kit::MariaDb::shared().await.expect("kit MariaDB");
    let url = db.fresh_database("leak").await.unwrap();
    let database = url.rsplit('/').next().unwrap().to_owned();
    let count = || {
        let database = database.clone();
        async move {
            db.query(
                "mysql",
                &format!(
                    "SELECT count(*) FROM information_schema.PROCESSLIST WHERE db = '{database}'"
                ),
            )
            .await
            .expect("mariadb client")
            .trim()
            .parse::<u32>()
            .expect("count")
        }
    };
    leak_check(&url, count).await;
}

async fn leak_check<F, Fut>(url: &str, count: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u32>,
{
    assert_eq!(count().await, 0, "sessions before any client");
    for _round in 0..2 {
        let clients = [client(url).await, client(url).await, client(url).await];
        let n = name("leak");
        let lease = take(&clients[0], &n, Duration::from_secs(30))
            .await
            .expect("acquire");
        // Waiters (on PostgreSQL this opens each client's listener) and contention.
        let waiters: Vec<_> = clients[1..]
            .iter()
            .map(|c| {
                let c = c.clone();
                tokio::spawn(async move {
                    c.lock(
                        "leak",
                        &AcquireOptions::new()
                            .ttl(Duration::from_secs(30))
                            .keep_alive(KeepAlive::Off)
                            .wait(Wait::For(Duration::from_secs(30))),
                    )
                    .await
                    .expect("waiter acquires")
                    .release()
                    .await
                    .expect("release")
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(count().await > 0, "the clients are connected");
        clients[0].release(&lease).await.unwrap();
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(60), w)
                .await
                .expect("waiter hangs")
                .expect("waiter task");
        }
        drop(clients);
    }
    // Connections close in the background once the pools are gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = count().await;
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} sessions still open 30 s after the clients were dropped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A waiter on PostgreSQL is woken by the release's NOTIFY, long before its own deadline and the
/// holder's expiry (both a minute away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiter_woken_by_notify() {
    let url = fresh_url(Kind::Postgres).await;
    let (holder, waiter) = (client(&url).await, client(&url).await);
    let n = name("notified");
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    // The first wait starts the listener and returns once it listens.
    let warm = name("warm-up");
    tokio::time::timeout(
        Duration::from_secs(20),
        waiter.wait_for_release(&warm, Instant::now() + Duration::from_secs(10)),
    )
    .await
    .expect("listener start hangs")
    .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let wait = {
        let waiter = waiter.clone();
        let n = n.clone();
        tokio::spawn(async move { waiter.wait_for_release(&n, until).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !wait.is_finished(),
        "the waiter returned while the lock was held"
    );
    holder.release(&lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("the release did not wake the waiter")
        .expect("task")
        .expect("wait_for_release");
    assert!(take(&waiter, &n, Duration::from_secs(5)).await.is_some());
}

/// A role that may connect and nothing else (no right on dlock's tables) LISTENs on the table's
/// channel and NOTIFYs forged hand-overs while a holder holds and three waiters queue (each in a
/// client of its own, as processes are): for every waiter, every ticket the queue could have
/// given out, the waiters' ttl, in the form a hand-over had before it was tagged and with tags
/// of its own. No waiter takes one for a grant: after the holder's release the lock goes to the
/// waiters in queue order with increasing tokens. The hand-overs the store itself sends carry
/// the tag of the secret each waiter stored in its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_forged_hand_over_notifications_grant_nothing() {
    use sha2::{Digest, Sha256};

    let url = fresh_url(Kind::Postgres).await;
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let mut attacker_url = url::Url::parse(&url).expect("url");
    let database = attacker_url.path().trim_start_matches('/').to_owned();
    let (role, password) = (
        unique("mallory"),
        format!("{:032x}", rand::random::<u128>()),
    );
    pg.query(
        &database,
        &format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"),
    )
    .await
    .expect("create the role");
    attacker_url.set_username(&role).expect("user");
    attacker_url
        .set_password(Some(&password))
        .expect("password");
    let attacker_url = attacker_url.to_string();

    let (holder, raw) = (client(&url).await, Raw::connect(&url).await);
    let Raw::Pg(admin) = &raw else {
        unreachable!("a postgres URL")
    };
    let n = name("forged-hand-overs");
    let held = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("free");
    let ttl = Duration::from_secs(60);
    let owners = [OwnerId::random(), OwnerId::random(), OwnerId::random()];
    let mut tasks = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let c = client(&url).await;
        let opts = waiting(Duration::from_secs(60)).ttl(ttl).owner(*owner);
        tasks.push(spawn_wait(&c, &n, opts, false));
        until_queued(&holder, &n, i + 1).await;
    }

    let attacker = sqlx::PgPool::connect(&attacker_url)
        .await
        .expect("the role connects");
    let denied = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT waiter FROM \"{WAITERS}\""
    )))
    .fetch_all(&attacker)
    .await;
    assert!(
        denied.is_err_and(|e| e.to_string().contains("permission denied")),
        "the role can read the waiters"
    );
    let mut listener = sqlx::postgres::PgListener::connect(&attacker_url)
        .await
        .expect("the role listens");
    listener.listen(TABLE).await.expect("LISTEN");
    let ttl_us = ttl.as_micros();
    let mut forged = Vec::new();
    for owner in owners {
        for ticket in 1..=100 {
            forged.push(format!("H{owner}7,{ttl_us},{ticket},{n}"));
            forged.push(format!(
                "H{owner}7,{ttl_us},{ticket},{},{n}",
                "0".repeat(64)
            ));
            let tag = format!("{:064x}", rand::random::<u128>());
            forged.push(format!("H{owner}7,{ttl_us},{ticket},{tag},{n}"));
        }
    }
    sqlx::query("SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p")
        .bind(TABLE)
        .bind(&forged)
        .fetch_one(&attacker)
        .await
        .expect("the role notifies");
    // The waiters have had their forged grants when the last one reaches the role's own
    // listener: every listener gets a transaction's notifications together.
    within(Duration::from_secs(30), "the forged notifications", async {
        let mut seen = 0;
        while seen < forged.len() {
            listener.recv().await.expect("recv");
            seen += 1;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (owner, task) in owners.iter().zip(&tasks) {
        assert!(!task.is_finished(), "waiter {owner} took a forged grant");
    }
    let (row_owner, _, _) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(row_owner, Some(held.owner().to_string()));

    // What each waiter stored, to check the store's own hand-overs by.
    let secrets: Vec<(String, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT waiter, ticket, secret FROM \"{WAITERS}\" WHERE name = $1"
    )))
    .bind(n.as_str())
    .fetch_all(admin)
    .await
    .expect("the waiters' secrets");
    assert_eq!(secrets.len(), 3, "{secrets:?}");

    holder.release(&held).await.expect("release");
    let mut last = held.token();
    for (owner, task) in owners.iter().zip(tasks) {
        let lease = granted("a waiter's grant, in queue order", task).await;
        assert_eq!(lease.owner(), *owner, "granted out of queue order");
        assert!(
            lease.token() > last,
            "tokens went {last} then {}",
            lease.token()
        );
        last = lease.token();
        holder.release(&lease).await.expect("release");
    }
    // The second and third grants were hand-overs: the store's notification carries the tag
    // of the secret in the waiter's row.
    let mut genuine = 0;
    while let Ok(Ok(note)) = tokio::time::timeout(Duration::from_secs(2), listener.recv()).await {
        let Some(rest) = note.payload().strip_prefix('H') else {
            continue;
        };
        let (waiter, rest) = rest.split_at(32);
        let fields: Vec<&str> = rest.splitn(5, ',').collect();
        let (_, ticket, secret) = secrets
            .iter()
            .find(|(w, _, _)| w == waiter)
            .expect("a hand-over to a waiter");
        assert_eq!(fields[2], ticket.to_string(), "{}", note.payload());
        let signed = format!(
            "{secret},{},{},{},{waiter},{secret}",
            fields[0], fields[1], fields[2]
        );
        let tag: String = Sha256::digest(signed.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(fields[3], tag, "the store's tag of {}", note.payload());
        genuine += 1;
    }
    assert_eq!(genuine, 2, "hand-overs notified");
}

/// A waiters table made before waiters stored a secret gains the column when a client
/// connects, and only then: a table that has it is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiters_table_without_the_secret_gains_it() {
    let url = fresh_url(Kind::Postgres).await;
    let _first = client(&url).await;
    let Raw::Pg(pool) = Raw::connect(&url).await else {
        unreachable!("a postgres URL")
    };
    let columns = || async {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT attname::text FROM pg_attribute \
             WHERE attrelid = to_regclass('dlock_leases_waiters') AND attnum > 0 \
             AND NOT attisdropped ORDER BY attnum",
        )
        .fetch_all(&pool)
        .await
        .expect("columns");
        names
    };
    assert!(columns().await.contains(&"secret".to_owned()));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE \"{WAITERS}\" DROP COLUMN secret"
    )))
    .execute(&pool)
    .await
    .expect("an older table");
    assert!(!columns().await.contains(&"secret".to_owned()));
    let (a, b) = (client(&url).await, client(&url).await);
    assert_eq!(
        columns().await,
        ["ticket", "name", "waiter", "expires_at", "secret"]
    );
    // And the queue works on it: a hand-over from a queued lease to the next waiter.
    let n = name("gained-secret");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let waiter = spawn_wait(&a, &n, waiting(Duration::from_secs(30)), false);
    until_queued(&a, &n, 1).await;
    b.release(&held).await.expect("release");
    let next = granted("the next waiter", waiter).await;
    assert!(next.token() > held.token());
    a.release(&next).await.expect("release");
}

/// PostgreSQL's two queue tables (the lock's waiters and the permit waiters) are UNLOGGED, and
/// only they: holders, fences and read holds stay in logged tables. A crash empties an unlogged
/// table, which is here done by hand (`TRUNCATE`, as crash recovery does) while two waiters
/// queue behind a holder: each finds its row gone at its next refresh and joins again at the
/// tail, so the queue forms again (a `try_lock` is refused again, as a live queue requires), and
/// the holder's release hands the lock to the waiters in the order of their new rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_tables_are_unlogged_and_waiters_join_again_when_emptied() {
    let url = fresh_url(Kind::Postgres).await;
    let (holder, intruder, raw) = (
        client(&url).await,
        client(&url).await,
        Raw::connect(&url).await,
    );
    let Raw::Pg(pool) = &raw else {
        unreachable!("a postgres URL")
    };
    let kinds: Vec<(String, String)> = sqlx::query_as(
        "SELECT relname::text, relpersistence::text FROM pg_class \
         WHERE relkind = 'r' AND relname LIKE 'dlock_leases%' ORDER BY relname",
    )
    .fetch_all(pool)
    .await
    .expect("table kinds");
    let unlogged: Vec<&str> = kinds
        .iter()
        .filter(|(_, p)| p == "u")
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(
        unlogged,
        ["dlock_leases_permit_queue", "dlock_leases_waiters"],
        "{kinds:?}"
    );
    assert_eq!(kinds.len(), 6, "{kinds:?}");

    let n = name("emptied-queue");
    let ttl = Duration::from_secs(10);
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    let ids = [OwnerId::random(), OwnerId::random()];
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let c = client(&url).await;
        let opts = waiting(Duration::from_secs(30)).owner(*id);
        tasks.push(spawn_wait(&c, &n, opts, false));
        until_queued(&holder, &n, i + 1).await;
    }
    let waiters = format!("\"{TABLE}_waiters\"");
    let before = raw.tickets(n.as_str()).await;
    assert_eq!(before.len(), 2, "{before:?}");
    sqlx::query(sqlx::AssertSqlSafe(format!("TRUNCATE {waiters}")))
        .execute(pool)
        .await
        .expect("truncate the waiters");
    assert!(
        take(&intruder, &n, ttl).await.is_none(),
        "the lock is still held"
    );
    // Both waiters join again within a refresh (1 s) or so.
    let queue: Vec<(i64, String)> =
        within(Duration::from_secs(20), "the waiters join again", async {
            loop {
                let rows: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT ticket, waiter FROM {waiters} WHERE name = $1 ORDER BY ticket"
                )))
                .bind(n.as_str())
                .fetch_all(pool)
                .await
                .expect("waiter rows");
                if rows.len() == 2 {
                    break rows;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    assert!(
        queue.iter().all(|(t, _)| before.iter().all(|b| t > b)),
        "new rows at the tail: {before:?} then {queue:?}"
    );
    holder.release(&lease).await.expect("release");
    assert!(
        take(&intruder, &n, ttl).await.is_none(),
        "a try_lock jumped the queue that formed again"
    );
    // The lease goes to the waiter whose new row is first, then to the other.
    let first = usize::from(queue[0].1 != ids[0].to_string());
    assert_eq!(queue[1 - first].1, ids[1 - first].to_string(), "{queue:?}");
    let mut tasks = tasks.into_iter();
    let (t0, t1) = (tasks.next().expect("task"), tasks.next().expect("task"));
    let (head, second) = if first == 0 { (t0, t1) } else { (t1, t0) };
    let head = granted("the head's grant", head).await;
    assert_eq!(head.owner(), ids[first]);
    assert!(
        !second.is_finished(),
        "the second waiter got in beside the head"
    );
    holder.release(&head).await.expect("release the head");
    let next = granted("the second grant", second).await;
    assert_eq!(next.owner(), ids[1 - first]);
    assert!(next.token() > head.token() && head.token() > lease.token());
    holder.release(&next).await.expect("release the second");
}

/// `sqlite::memory:` clients are independent stores; file URLs create missing parent dirs. A
/// file's waiters in other processes of a Linux host are rung by doorbells, which the
/// capabilities say; a private store has nobody to ring.
#[tokio::test]
async fn sqlite_memory_is_private_and_files_get_parent_dirs() {
    let (a, b) = (
        client("sqlite::memory:").await,
        client("sqlite::memory:").await,
    );
    assert!(!a.capabilities().shared_across_processes);
    assert_eq!(a.capabilities().waiting, WaitMechanism::Poll);
    let n = name("m");
    let la = take(&a, &n, Duration::from_secs(10)).await.expect("a");
    assert!(take(&b, &n, Duration::from_secs(10)).await.is_some());
    assert!(take(&a, &n, Duration::from_secs(10)).await.is_none());
    a.release(&la).await.unwrap();

    let path = sqlite_dir().path().join("deep/er/dir/locks.db");
    let c = client(&format!("sqlite://{}", path.display())).await;
    assert!(c.capabilities().shared_across_processes);
    let rung = match cfg!(target_os = "linux") {
        true => WaitMechanism::Doorbell,
        false => WaitMechanism::Poll,
    };
    assert_eq!(c.capabilities().waiting, rung);
    assert!(path.exists());
}

// ---- SQLite across processes ----

const HAMMER_URL: &str = "DLOCK_SQL_HAMMER_URL";
const HAMMER_OUT: &str = "DLOCK_SQL_HAMMER_OUT";
const HAMMER_NAME: &str = "hammered-by-four-processes";
const HAMMER_FOR: Duration = Duration::from_secs(3);
const HAMMER_PROCESSES: usize = 4;

/// CLOCK_MONOTONIC in nanoseconds: the clock `Instant` reads on Linux, shared by every process
/// on the host, so holds recorded by different processes can be compared.
#[allow(unsafe_code)]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid, exclusive pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    u64::try_from(ts.tv_sec).expect("time") * 1_000_000_000
        + u64::try_from(ts.tv_nsec).expect("time")
}

/// One child process: hammers [`HAMMER_NAME`] with waiting and single-attempt acquires for
/// [`HAMMER_FOR`], writing one line per hold (`token acquired_ns valid_until_ns ended_ns`).
/// Any error panics, which fails the child and so the parent.
async fn hammer_child(url: &str, out: &str) {
    use std::io::Write;
    let c = client(url).await;
    let mut lines = String::new();
    let stop_at = Instant::now() + HAMMER_FOR;
    let mut round = 0u64;
    while Instant::now() < stop_at {
        round += 1;
        let opts = AcquireOptions::new()
            .ttl(Duration::from_secs(10))
            .keep_alive(KeepAlive::Off);
        let guard = if round.is_multiple_of(4) {
            c.try_lock(HAMMER_NAME, &opts)
                .await
                .unwrap_or_else(|e| panic!("try_lock, round {round}: {e}"))
        } else {
            Some(
                c.lock(HAMMER_NAME, &opts.wait(Wait::For(Duration::from_secs(60))))
                    .await
                    .unwrap_or_else(|e| panic!("lock, round {round}: {e}")),
            )
        };
        let Some(guard) = guard else {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let (acquired_at, acquired_ns) = (Instant::now(), monotonic_ns());
        tokio::time::sleep(Duration::from_millis(1)).await;
        let ended_ns = monotonic_ns();
        let lease = guard.lease();
        let valid_until_ns = acquired_ns
            + u64::try_from(
                lease
                    .valid_until()
                    .saturating_duration_since(acquired_at)
                    .as_nanos(),
            )
            .expect("ns");
        lines.push_str(&format!(
            "{} {acquired_ns} {valid_until_ns} {ended_ns}\n",
            lease.token().0
        ));
        match guard.release().await {
            Ok(Released::Released) => {}
            other => panic!("release, round {round}: {other:?}"),
        }
    }
    let mut f = std::fs::File::create(out).expect("output file");
    f.write_all(lines.as_bytes()).expect("write holds");
}

/// SQLite is the embedded default shared by every process on the host: four OS processes
/// hammer one name on one database file for a few seconds, with waiting and single-attempt
/// acquires. No error of any kind (in particular no "database is locked") reaches any of them,
/// every process gets the lock, and the merged history has no overlapping holds and tokens that
/// grow with acquisition order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_four_processes_hammer_one_name() {
    if let (Ok(url), Ok(out)) = (std::env::var(HAMMER_URL), std::env::var(HAMMER_OUT)) {
        return hammer_child(&url, &out).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    // The file and its tables exist before the children race to open it.
    drop(client(&url).await);
    let mut children = Vec::new();
    for i in 0..HAMMER_PROCESSES {
        let out = dir.path().join(format!("holds-{i}.txt"));
        let child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "sqlite_four_processes_hammer_one_name",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HAMMER_URL, &url)
            .env(HAMMER_OUT, &out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a hammering process");
        children.push((out, child));
    }
    let (base_at, base_ns) = (Instant::now(), monotonic_ns());
    let at = |ns: u64| {
        if ns >= base_ns {
            base_at + Duration::from_nanos(ns - base_ns)
        } else {
            base_at - Duration::from_nanos(base_ns - ns)
        }
    };
    let mut holds = Vec::new();
    for (i, (out, child)) in children.into_iter().enumerate() {
        let output = within(
            Duration::from_secs(120),
            "hammering process",
            child.wait_with_output(),
        )
        .await
        .expect("wait for the child");
        assert!(
            output.status.success(),
            "process {i} failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let text = std::fs::read_to_string(&out).expect("holds file");
        let before = holds.len();
        for line in text.lines() {
            let v: Vec<u64> = line
                .split_whitespace()
                .map(|x| x.parse().expect("number"))
                .collect();
            holds.push(conformance_tests::Hold {
                client: i,
                name: HAMMER_NAME.to_owned(),
                token: v[0],
                acquired: at(v[1]),
                valid_until: at(v[2]),
                ended: Some(at(v[3])),
            });
        }
        assert!(holds.len() > before, "process {i} never got the lock");
    }
    eprintln!("hammer: {} holds", holds.len());
    let violations = conformance_tests::check(&holds);
    assert!(
        violations.is_empty(),
        "{} violations in {} holds, first: {}",
        violations.len(),
        holds.len(),
        violations[0]
    );
}

/// `take` then `release` on a fresh name: the client works end to end.
async fn round_trip(c: &Arc<dyn DistributedLock>) {
    let n = name(&unique("tls"));
    let lease = take(c, &n, Duration::from_secs(30))
        .await
        .expect("a fresh name is free");
    assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
}

/// The text of a failed connect, checked to be a non-retryable backend error.
async fn refused(url: &str) -> String {
    let err = backend_sql::connect(url).await.unwrap_err();
    let text = format!("{err} / {err:?}");
    // A server that refuses the client (no client certificate, a user that must use TLS) says
    // so as access denied; a failed handshake is a store error.
    assert!(
        matches!(err, Error::Backend { .. } | Error::AccessDenied { .. }),
        "{text}"
    );
    assert!(
        !err.is_retryable(),
        "a TLS setting does not change on retry: {text}"
    );
    text
}

/// PostgreSQL over TLS against the kit's own CA: verified connections work and are encrypted
/// (every session of the client, the LISTEN connection included); without the CA, full
/// verification refuses the server; a CA file that is missing or not PEM is a config error
/// raised before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_is_verified_and_used() {
    let pg = kit::Postgres::start_tls()
        .await
        .expect("kit PostgreSQL with TLS");
    let ca = pg.ca_cert().expect("a TLS server has a CA");
    // One `ssl|listens` line per session of the client named `app`.
    let ssl_of = |app: &'static str| {
        let pg = &pg;
        async move {
            let sql = format!(
                "SELECT s.ssl, a.query LIKE 'LISTEN%' FROM pg_stat_ssl s \
                 JOIN pg_stat_activity a USING (pid) WHERE a.application_name = '{app}'"
            );
            let out = pg.query("postgres", &sql).await.expect("psql");
            out.lines().map(str::to_owned).collect::<Vec<_>>()
        }
    };

    let verified = format!(
        "{}?sslmode=verify-full&ca={}&application_name=dlock_tls",
        pg.url(),
        ca.display()
    );
    let c = client(&verified).await;
    round_trip(&c).await;
    // A waiter makes the client open its LISTEN connection too.
    let n = name(&unique("tls-wait"));
    let held = take(&c, &n, Duration::from_secs(30)).await.unwrap();
    let waiter = {
        let c = c.clone();
        let n = n.clone();
        tokio::spawn(async move {
            let guard = c
                .lock(n.as_str(), &waiting(Duration::from_secs(30)))
                .await?;
            let lease = guard.lease();
            guard.release().await?;
            Ok::<_, Error>(lease)
        })
    };
    until_queued(&c, &n, 1).await;
    let sessions = within(Duration::from_secs(30), "the LISTEN session", async {
        loop {
            let sessions = ssl_of("dlock_tls").await;
            if sessions.iter().any(|s| s.ends_with("|t")) {
                break sessions;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(sessions.len() >= 2, "pool and listener: {sessions:?}");
    assert!(
        sessions.iter().all(|s| s.starts_with("t|")),
        "all encrypted: {sessions:?}"
    );
    c.release(&held).await.unwrap();
    let next = within(Duration::from_secs(30), "the TLS waiter", waiter)
        .await
        .unwrap()
        .expect("granted after the release");
    assert!(next.token() > held.token());

    // The same query tells a plain session apart, so the check above can fail.
    let plain = client(&format!(
        "{}?sslmode=disable&application_name=dlock_plain",
        pg.url()
    ))
    .await;
    round_trip(&plain).await;
    let sessions = ssl_of("dlock_plain").await;
    assert!(
        !sessions.is_empty() && sessions.iter().all(|s| s.starts_with("f|")),
        "{sessions:?}"
    );

    // `require` encrypts without checking the certificate.
    round_trip(&client(&format!("{}?sslmode=require", pg.url())).await).await;
    // Full verification against the system's roots: the kit's CA is not among them.
    let text = refused(&format!("{}?sslmode=verify-full&timeout=5s", pg.url())).await;
    assert!(text.to_lowercase().contains("certificate"), "{text}");

    for (file, expected) in [
        (pg.dir().join("no-such-ca.pem"), "cannot be read"),
        (pg.dir().join("postgres.log"), "holds no PEM block"),
    ] {
        let err = backend_sql::connect(&format!("{}?ca={}", pg.url(), file.display()))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains(expected), "{err}");
    }
}

/// MySQL hands the lock over in the release, and the new holder deletes its waiter row in the
/// background. Here another session holds the waiters table with `LOCK TABLES .. READ`, so that
/// delete waits (reads, and so the hand-overs, go on) while the new holder releases: the release
/// waits for it. Had it not, the second waiter would be handed the lock at once, and the first
/// holder's row, still live, would head the queue: the second holder's release would hand the
/// lock to it, an owner id nobody waits as, and the lock would stay taken until that lease ran
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_handed_holder_leaves_the_queue_before_it_releases() {
    let url = fresh_url(Kind::MariaDb).await;
    let (a, b, c, d) = (
        client(&url).await,
        client(&url).await,
        client(&url).await,
        client(&url).await,
    );
    let raw = Raw::connect(&url).await;
    let Raw::My(pool) = &raw else {
        unreachable!("a MariaDB URL")
    };
    let n = name("handed-again");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let (w, x) = (OwnerId::random(), OwnerId::random());
    let first = spawn_wait(&c, &n, waiting(Duration::from_secs(30)).owner(w), false);
    until_queued(&a, &n, 1).await;
    let mut second = spawn_wait(&d, &n, waiting(Duration::from_secs(30)).owner(x), false);
    until_queued(&a, &n, 2).await;

    let mut blocker = pool.acquire().await.expect("a connection");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLES `{TABLE}_waiters` READ"
    )))
    .execute(&mut *blocker)
    .await
    .expect("lock the waiters table for reading");
    assert_eq!(b.release(&held).await.expect("release"), Released::Released);
    let got = granted("the first waiter's grant", first).await;
    assert_eq!(got.owner(), w);
    let release = {
        let c = c.clone();
        tokio::spawn(async move { c.release(&got).await })
    };
    let early = tokio::time::timeout(Duration::from_millis(500), &mut second).await;
    assert!(
        early.is_err(),
        "the first holder released while its waiter row was still queued"
    );
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut *blocker)
        .await
        .expect("unlock");
    let released = within(Duration::from_secs(30), "the first release", release).await;
    assert_eq!(
        released.expect("task").expect("release"),
        Released::Released
    );
    let got = granted("the second waiter's grant", second).await;
    assert_eq!(got.owner(), x);
    assert_eq!(d.release(&got).await.expect("release"), Released::Released);
    let (owner, _, _) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(
        owner, None,
        "the lock went to the queue row of a holder that had left"
    );
}

/// MariaDB over TLS against the kit's own CA, with an account that the server admits only over
/// TLS (`REQUIRE SSL`): verified and `required` connections work, a plain one is refused by the
/// server (so the working ones really are encrypted), and an unknown CA is refused by us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tls_is_verified_and_used() {
    let secret = "Tl5-S3cret";
    let db = kit::MariaDb::start_tls()
        .await
        .expect("kit MariaDB with TLS");
    let ca = db.ca_cert().expect("a TLS server has a CA");
    db.query(
        "mysql",
        &format!(
            "CREATE USER 'tlsonly'@'127.0.0.1' IDENTIFIED BY '{secret}' REQUIRE SSL; \
             GRANT ALL ON test.* TO 'tlsonly'@'127.0.0.1'"
        ),
    )
    .await
    .expect("create the TLS-only account");
    let base = format!("mysql://tlsonly:{secret}@127.0.0.1:{}/test", db.port());

    round_trip(&client(&format!("{base}?ca={}", ca.display())).await).await;
    round_trip(
        &client(&format!(
            "{base}?ssl-mode=VERIFY_CA&ssl-ca={}",
            ca.display()
        ))
        .await,
    )
    .await;
    round_trip(&client(&format!("{base}?ssl-mode=REQUIRED")).await).await;

    let text = refused(&format!("{base}?ssl-mode=DISABLED&timeout=5s")).await;
    assert!(!text.contains(secret), "{text}");
    let text = refused(&format!("{base}?ssl-mode=VERIFY_IDENTITY&timeout=5s")).await;
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    assert!(!text.contains(secret), "{text}");
}

/// Client certificates: a PostgreSQL account admitted only by `cert` authentication (the
/// certificate's CN names the account) and a MariaDB account created `REQUIRE X509` work with
/// `cert` + `key` and are refused without them, or with a certificate issued to someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_authenticate() {
    let pg = kit::Postgres::start_tls()
        .await
        .expect("kit PostgreSQL with TLS");
    let files = pg.tls().expect("a TLS server has its files");
    pg.query("postgres", "CREATE ROLE certonly LOGIN SUPERUSER")
        .await
        .expect("create the role");
    pg.prepend_hba("hostssl all certonly 127.0.0.1/32 cert\nhost all certonly 127.0.0.1/32 reject")
        .await
        .expect("cert-only rule");
    let mine = files.issue_client("certonly").await.expect("client cert");
    let theirs = files
        .issue_client("someone-else")
        .await
        .expect("client cert");
    let base = format!(
        "postgres://certonly@127.0.0.1:{}/postgres?ca={}&timeout=5s",
        pg.port(),
        files.ca_cert().display()
    );
    let with =
        |c: &kit::CertAndKey| format!("{base}&cert={}&key={}", c.cert.display(), c.key.display());
    round_trip(&client(&with(&mine)).await).await;
    let text = refused(&base).await;
    assert!(text.contains("valid client certificate"), "{text}");
    let text = refused(&with(&theirs)).await;
    assert!(text.contains("certonly"), "names the account: {text}");
    // A key file that holds no key is caught before connecting.
    let err = backend_sql::connect(&format!(
        "{base}&cert={}&key={}",
        mine.cert.display(),
        mine.cert.display()
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(err.to_string().contains("client key"), "{err}");

    let db = kit::MariaDb::start_tls()
        .await
        .expect("kit MariaDB with TLS");
    let files = db.tls().expect("a TLS server has its files");
    db.query(
        "mysql",
        "CREATE USER 'x509only'@'127.0.0.1' REQUIRE X509; \
         GRANT ALL ON test.* TO 'x509only'@'127.0.0.1'",
    )
    .await
    .expect("create the X509 account");
    let mine = files.issue_client("x509only").await.expect("client cert");
    let base = format!(
        "mysql://x509only@127.0.0.1:{}/test?ssl-ca={}&timeout=5s",
        db.port(),
        files.ca_cert().display()
    );
    round_trip(
        &client(&format!(
            "{base}&ssl-cert={}&ssl-key={}",
            mine.cert.display(),
            mine.key.display()
        ))
        .await,
    )
    .await;
    refused(&base).await;
}

// ---- counting semaphores ----

/// The semaphore tables of the default lease table.
const SEMAPHORES: &str = "dlock_leases_semaphores";
const PERMITS: &str = "dlock_leases_permits";
const PERMIT_QUEUE: &str = "dlock_leases_permit_queue";

impl Raw {
    /// Rows of `table` whose name is `name`, live or expired.
    async fn rows_of(&self, table: &str, name: &str) -> i64 {
        match self {
            Raw::Pg(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT count(*) FROM \"{table}\" WHERE name = $1"
                )))
                .bind(name)
                .fetch_one(p)
                .await
            }
            Raw::My(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT COUNT(*) FROM `{table}` WHERE name = ?"
                )))
                .bind(name.as_bytes())
                .fetch_one(p)
                .await
            }
            Raw::Lite(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT count(*) FROM \"{table}\" WHERE name = ?1"
                )))
                .bind(name)
                .fetch_one(p)
                .await
            }
        }
        .expect("raw count")
    }

    /// The semaphore `name`'s fence, if it has a row.
    async fn semaphore_fence(&self, name: &str) -> Option<i64> {
        match self {
            Raw::Pg(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT fence FROM \"{SEMAPHORES}\" WHERE name = $1"
                )))
                .bind(name)
                .fetch_optional(p)
                .await
            }
            Raw::My(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT fence FROM `{SEMAPHORES}` WHERE name = ?"
                )))
                .bind(name.as_bytes())
                .fetch_optional(p)
                .await
            }
            Raw::Lite(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT fence FROM \"{SEMAPHORES}\" WHERE name = ?1"
                )))
                .bind(name)
                .fetch_optional(p)
                .await
            }
        }
        .expect("raw semaphore row")
    }

    /// Queues a permit waiter row by hand for a semaphore of `permits`, as a waiter in another
    /// process would, live for `secs` more seconds by the database's clock.
    async fn insert_permit_waiter(&self, name: &str, permits: i64, secs: f64) {
        let waiter = OwnerId::random().to_string();
        let micros = (secs * 1e6) as i64;
        match self {
            Raw::Pg(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO \"{PERMIT_QUEUE}\" (name, waiter, permits, expires_at) \
                 VALUES ($1, $2, $3, clock_timestamp() + $4::bigint * interval '1 microsecond')"
            )))
            .bind(name)
            .bind(&waiter)
            .bind(permits)
            .bind(micros)
            .execute(p)
            .await
            .map(|_| ()),
            Raw::My(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO `{PERMIT_QUEUE}` (name, waiter, permits, expires_at) \
                 VALUES (?, ?, ?, NOW(6) + INTERVAL ? MICROSECOND)"
            )))
            .bind(name.as_bytes())
            .bind(&waiter)
            .bind(permits)
            .bind(micros)
            .execute(p)
            .await
            .map(|_| ()),
            Raw::Lite(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO \"{PERMIT_QUEUE}\" (name, waiter, permits, expires_at) \
                 VALUES (?1, ?2, ?3, CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) + ?4)"
            )))
            .bind(name)
            .bind(&waiter)
            .bind(permits)
            .bind(micros / 1000)
            .execute(p)
            .await
            .map(|_| ()),
        }
        .expect("raw permit waiter row");
    }

    /// Deletes every permit waiter row of `name`.
    async fn delete_permit_waiters(&self, name: &str) {
        match self {
            Raw::Pg(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM \"{PERMIT_QUEUE}\" WHERE name = $1"
            )))
            .bind(name)
            .execute(p)
            .await
            .map(|_| ()),
            Raw::My(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM `{PERMIT_QUEUE}` WHERE name = ?"
            )))
            .bind(name.as_bytes())
            .execute(p)
            .await
            .map(|_| ()),
            Raw::Lite(p) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM \"{PERMIT_QUEUE}\" WHERE name = ?1"
            )))
            .bind(name)
            .execute(p)
            .await
            .map(|_| ()),
        }
        .expect("raw permit waiter delete");
    }
}

/// One attempt at a permit of `name` (a semaphore of `permits`) through the trait.
async fn permit(
    c: &Arc<dyn DistributedLock>,
    n: &LockName,
    permits: u32,
    o: AcquireOptions,
) -> lockcore::Result<Option<Lease>> {
    c.try_acquire_permit(n, permits, &o.with_defaults(&c.defaults()))
        .await
}

/// A waiting permit acquire through lockcore (the way applications call it).
async fn wait_permit(
    c: &Arc<dyn DistributedLock>,
    n: &LockName,
    permits: u32,
    limit: Duration,
) -> lockcore::Result<lockcore::PermitGuard> {
    use lockcore::SemaphoreExt;
    c.semaphore(n.as_str(), permits)?
        .acquire(&waiting(limit))
        .await
}

/// Waits until `inspect_semaphore` reports `waiters` live permit waiters on `name`.
async fn until_permit_waiters(c: &Arc<dyn DistributedLock>, n: &LockName, waiters: usize) {
    within(Duration::from_secs(30), "permit waiters queued", async {
        loop {
            let info = c.inspect_semaphore(n).await.expect("inspect_semaphore");
            if info.and_then(|i| i.waiters) == Some(waiters) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Waits until `table` holds no row of `name` (clean-ups run in the background).
async fn until_no_rows(raw: &Raw, table: &str, n: &LockName, what: &str) {
    within(Duration::from_secs(30), what, async {
        while raw.rows_of(table, n.as_str()).await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

per_dialect!(
    semaphore_and_lock_of_a_name_are_apart,
    permit_count_checked_while_in_use_only,
    permit_tokens_increase_across_release_and_expiry,
    dropped_permit_waits_leave_no_rows,
    permit_leases_extend_and_release_owner_checked,
    idle_semaphore_is_forgotten,
    concurrent_tries_never_exceed_the_count,
    a_release_hands_its_permit_over_only_in_queue_order,
);

/// The same store as `url`, named another way, so that a client of it has its own wake-up and
/// hand-over registry, as a client in another process has.
fn as_another_process(url: &str) -> String {
    match url.strip_prefix("sqlite://") {
        Some(path) => {
            let (dir, file) = path.rsplit_once('/').expect("a file path");
            format!("sqlite://{dir}/./{file}")
        }
        None => url.replacen("127.0.0.1", "localhost", 1),
    }
}

/// A permit's release hands the freed permit to a waiter of its own process only when the
/// store's queue says it is next: a waiter of another process that queued first gets the
/// permit first, and the local waiter gets it when that one releases.
async fn a_release_hands_its_permit_over_only_in_queue_order(kind: Kind) {
    let url = fresh_url(kind).await;
    let n = name("hand-over-order");
    let holder = client(&url).await;
    let held = permit(&holder, &n, 1, opts(Duration::from_secs(30)))
        .await
        .expect("try a permit")
        .expect("a free permit");
    let remote = client(&as_another_process(&url)).await;
    let limit = Duration::from_secs(60);
    let first = {
        let (remote, n) = (remote.clone(), n.clone());
        tokio::spawn(async move { wait_permit(&remote, &n, 1, limit).await })
    };
    until_permit_waiters(&holder, &n, 1).await;
    let local = client(&url).await;
    let second = {
        let (local, n) = (local.clone(), n.clone());
        tokio::spawn(async move { wait_permit(&local, &n, 1, limit).await })
    };
    until_permit_waiters(&holder, &n, 2).await;
    assert_eq!(holder.release(&held).await.unwrap(), Released::Released);
    let first = within(Duration::from_secs(30), "the first waiter's permit", first)
        .await
        .expect("the first waiter's task")
        .expect("the first waiter's permit");
    // The store's only holder is the first waiter; the local one still waits in the queue.
    let info = holder
        .inspect_semaphore(&n)
        .await
        .expect("inspect_semaphore")
        .expect("the semaphore's row");
    let owners: Vec<&str> = info.holders.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(owners, [first.lease().owner().to_string().as_str()]);
    assert_eq!(info.waiters, Some(1));
    assert!(!second.is_finished(), "the local waiter returned early");
    let first_token = first.lease().token();
    assert!(first_token > held.token());
    first.release().await.expect("release the first permit");
    let second = within(
        Duration::from_secs(30),
        "the second waiter's permit",
        second,
    )
    .await
    .expect("the second waiter's task")
    .expect("the second waiter's permit");
    assert!(second.lease().token() > first_token);
    second.release().await.expect("release the second permit");
}

/// Twelve clients (twelve pools) try for a permit of three at the same moment, for several
/// rounds: never more than three grants at once, and each grant's token is unique (the grant
/// transaction serialises on the semaphore row).
async fn concurrent_tries_never_exceed_the_count(kind: Kind) {
    crowd_a_semaphore(&fresh_url(kind).await).await;
}

/// On a PostgreSQL database whose sessions default to REPEATABLE READ, a grant that meets
/// another committed after its snapshot fails with a serialization error, which is retried:
/// still never more than three grants at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_semaphore_under_a_repeatable_read_default() {
    let url = fresh_url(Kind::Postgres).await;
    let Raw::Pg(pool) = Raw::connect(&url).await else {
        unreachable!("a PostgreSQL URL")
    };
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{db}\" SET default_transaction_isolation TO 'repeatable read'"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let Raw::Pg(fresh) = Raw::connect(&url).await else {
        unreachable!()
    };
    let level: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&fresh)
        .await
        .unwrap();
    assert_eq!(level, "repeatable read", "new sessions' default");
    crowd_a_semaphore(&url).await;
}

/// Twelve clients try for a permit of three at once, five rounds (see
/// `concurrent_tries_never_exceed_the_count`).
async fn crowd_a_semaphore(url: &str) {
    let url = url.to_owned();
    let n = name("crowded");
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(client(&url).await);
    }
    let mut tokens = std::collections::BTreeSet::new();
    for round in 0..5 {
        let start = Arc::new(tokio::sync::Barrier::new(clients.len()));
        let tries: Vec<_> = clients
            .iter()
            .map(|c| {
                let (c, n, start) = (c.clone(), n.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    let got = permit(&c, &n, 3, opts(Duration::from_secs(60))).await;
                    (c, got.expect("try_acquire_permit"))
                })
            })
            .collect();
        let mut granted = Vec::new();
        for t in tries {
            let (c, got) = within(Duration::from_secs(60), "a try", t).await.unwrap();
            if let Some(lease) = got {
                assert!(
                    tokens.insert(lease.token()),
                    "token {:?} twice",
                    lease.token()
                );
                granted.push((c, lease));
            }
        }
        assert!(
            (1..=3).contains(&granted.len()),
            "round {round}: {} grants of a semaphore of three",
            granted.len()
        );
        for (c, lease) in granted {
            assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
        }
    }
}

/// A semaphore and the lock of the same name do not exclude each other, and neither's queue
/// holds up the other: a queued lock waiter does not stop a permit's single attempt, and a
/// queued permit waiter does not stop the lock's.
async fn semaphore_and_lock_of_a_name_are_apart(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let n = name("both");
    let ttl = Duration::from_secs(60);
    let lock = take(&a, &n, ttl).await.expect("the lock");
    let p1 = permit(&b, &n, 2, opts(ttl))
        .await
        .expect("permit")
        .expect("a permit while the lock of the name is held");
    // A lock waiter queues; the semaphore does not see it.
    let lock_waiter = {
        let (c, n) = (client(&url).await, n.clone());
        tokio::spawn(async move { c.lock(n.as_str(), &waiting(Duration::from_secs(60))).await })
    };
    until_queued(&a, &n, 1).await;
    let p2 = permit(&b, &n, 2, opts(ttl))
        .await
        .expect("permit")
        .expect("a permit while a lock waiter is queued");
    let info = b.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.waiters, Some(0), "{info:?}");
    assert_eq!(info.holders.len(), 2, "{info:?}");
    // A permit waiter queues; the lock does not see it.
    let permit_waiter = {
        let (c, n) = (client(&url).await, n.clone());
        tokio::spawn(async move { wait_permit(&c, &n, 2, Duration::from_secs(60)).await })
    };
    until_permit_waiters(&a, &n, 1).await;
    let info = a.inspect(&n).await.unwrap().expect("lock row");
    assert_eq!(info.waiters, Some(1), "the lock's queue: {info:?}");
    a.release(&lock).await.unwrap();
    let g = within(Duration::from_secs(30), "the lock waiter", lock_waiter)
        .await
        .expect("task")
        .expect("the lock waiter gets the lock");
    g.release().await.unwrap();
    // Free and nobody queued for the lock: a try gets it past the permit waiter.
    let lock = take(&a, &n, ttl)
        .await
        .expect("the lock is not held up by a permit waiter");
    assert_eq!(b.release(&p1).await.unwrap(), Released::Released);
    let g = within(Duration::from_secs(30), "the permit waiter", permit_waiter)
        .await
        .expect("task")
        .expect("the permit waiter gets the released permit");
    assert!(g.fencing_token() > p2.token(), "the semaphore's own tokens");
    g.release().await.unwrap();
    assert_eq!(b.release(&p2).await.unwrap(), Released::Released);
    a.release(&lock).await.unwrap();
}

/// The count is recorded while the semaphore is in use (a live holder or a live waiter), and
/// another count is refused then, by a single attempt and by a waiting acquire alike; once
/// nobody holds or waits, the next caller's count is the semaphore's.
async fn permit_count_checked_while_in_use_only(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("counted");
    let ttl = Duration::from_secs(60);
    fn is_mismatch<T>(r: &lockcore::Result<T>) -> bool {
        matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "permits",
                ..
            })
        )
    }
    let p = permit(&c, &n, 2, opts(ttl)).await.unwrap().expect("permit");
    let info = c.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.permits, Some(2));
    let other = permit(&c, &n, 3, opts(ttl)).await;
    assert!(is_mismatch(&other), "a try with another count: {other:?}");
    let other = wait_permit(&c, &n, 3, Duration::from_secs(5)).await;
    assert!(is_mismatch(&other), "a waiting acquire with another count");
    assert_eq!(raw.rows_of(PERMIT_QUEUE, n.as_str()).await, 0);
    assert_eq!(c.release(&p).await.unwrap(), Released::Released);
    let info = c.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.permits, None, "idle: no count recorded: {info:?}");

    // Idle: the next caller's count is the semaphore's.
    let p = permit(&c, &n, 3, opts(ttl))
        .await
        .unwrap()
        .expect("a permit of the new count once idle");
    assert!(is_mismatch(&permit(&c, &n, 2, opts(ttl)).await));
    c.release(&p).await.unwrap();

    // In use by a live waiter alone (as one in another process leaves): refused too, and a
    // try of the same count does not jump it; an expired waiter is no use.
    raw.insert_permit_waiter(n.as_str(), 4, 60.0).await;
    assert!(is_mismatch(&permit(&c, &n, 3, opts(ttl)).await));
    assert!(
        permit(&c, &n, 4, opts(ttl)).await.unwrap().is_none(),
        "a try jumped a live permit waiter"
    );
    raw.delete_permit_waiters(n.as_str()).await;
    raw.insert_permit_waiter(n.as_str(), 4, -1.0).await;
    let p = permit(&c, &n, 5, opts(ttl))
        .await
        .unwrap()
        .expect("an expired waiter neither records a count nor holds anyone up");
    c.release(&p).await.unwrap();
}

/// A semaphore's fence is never reset: tokens keep increasing across release and expiry (and
/// new clients), a token floor lifts them, and a refused attempt leaves the fence as it was.
async fn permit_tokens_increase_across_release_and_expiry(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b, raw) = (
        client(&url).await,
        client(&url).await,
        Raw::connect(&url).await,
    );
    let n = name("tokens");
    let p1 = permit(&a, &n, 1, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("first");
    assert_eq!(a.release(&p1).await.unwrap(), Released::Released);
    // A 1 s ttl, not less: the refusal below needs p2 still held (a stalled test process once
    // outlasted a 200 ms one).
    let p2 = permit(&b, &n, 1, opts(Duration::from_secs(1)))
        .await
        .unwrap()
        .expect("second");
    // The store counted p2's ttl from a moment before this one.
    let p2_ends_by = Instant::now() + Duration::from_secs(1);
    assert!(p2.token() > p1.token());
    // Full: refused, and the refused attempt's bump is rolled back.
    assert!(
        permit(&a, &n, 1, opts(Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        raw.semaphore_fence(n.as_str()).await,
        Some(p2.token().0 as i64)
    );
    // Expired without release: the next grant gets a higher token; the old lease is dead.
    tokio::time::sleep_until((p2_ends_by + Duration::from_millis(100)).into()).await;
    match b.extend(&p2, Duration::from_secs(30)).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend of an expired permit resurrected it: {other:?}"),
    }
    let p3 = permit(&a, &n, 1, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("third, after the expiry");
    assert!(p3.token() > p2.token());
    assert_eq!(b.release(&p2).await.unwrap(), Released::NotHeld);
    assert_eq!(a.release(&p3).await.unwrap(), Released::Released);
    // A token floor lifts the fence; later grants continue above it.
    let floored = opts(Duration::from_secs(30)).token_floor(FencingToken(1000));
    let p4 = permit(&a, &n, 1, floored).await.unwrap().expect("floored");
    assert_eq!(p4.token(), FencingToken(1000));
    a.release(&p4).await.unwrap();
    let c = client(&url).await;
    let p5 = permit(&c, &n, 1, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("a new client");
    assert_eq!(p5.token(), FencingToken(1001));
    assert_eq!(raw.semaphore_fence(n.as_str()).await, Some(1001));
    c.release(&p5).await.unwrap();
    assert_eq!(
        raw.rows_of(PERMITS, n.as_str()).await,
        0,
        "released permits keep no row (expired ones go with the next grant)"
    );
}

/// Permit acquires dropped while they wait, or around the moment a permit frees, leave no waiter
/// row and no permit row behind (the clean-ups spawned at once delete them); a wait that times
/// out leaves its row before it returns.
async fn dropped_permit_waits_leave_no_rows(kind: Kind) {
    let url = fresh_url(kind).await;
    let (holder, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("dropped");
    let long = opts(Duration::from_secs(60));
    let held = permit(&holder, &n, 1, long.clone())
        .await
        .unwrap()
        .expect("the only permit");
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (c, n) = (client(&url).await, n.clone());
        tasks.push(tokio::spawn(async move {
            wait_permit(&c, &n, 1, Duration::from_secs(600)).await
        }));
    }
    until_permit_waiters(&holder, &n, 3).await;
    assert_eq!(raw.rows_of(PERMIT_QUEUE, n.as_str()).await, 3);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.is_err_and(|e| e.is_cancelled()), "not cancelled");
    }
    until_no_rows(
        &raw,
        PERMIT_QUEUE,
        &n,
        "dropped permit waiters' rows deleted",
    )
    .await;
    assert_eq!(raw.rows_of(PERMITS, n.as_str()).await, 1, "the holder's");

    let c = client(&url).await;
    match wait_permit(&c, &n, 1, Duration::from_millis(300)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        raw.rows_of(PERMIT_QUEUE, n.as_str()).await,
        0,
        "a timed-out permit waiter left its row"
    );
    holder.release(&held).await.unwrap();

    // Dropped at varying points around a release: some drops land after the grant, whose
    // permit the clean-up then frees. Once this process's clean-ups (the interrupted
    // statement finished in the background, then undone) have ended, nothing is left.
    let w = client(&url).await;
    for round in 0..12u64 {
        let held = permit(&holder, &n, 1, long.clone())
            .await
            .unwrap()
            .expect("free again");
        let pending = {
            let (w, n) = (w.clone(), n.clone());
            tokio::spawn(async move { wait_permit(&w, &n, 1, Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        holder.release(&held).await.unwrap();
        tokio::time::sleep(Duration::from_micros(round * 400)).await;
        pending.abort();
        if let Ok(Ok(g)) = pending.await {
            g.release().await.unwrap();
        }
        assert!(
            lockcore::cleanup::settle(Duration::from_secs(30)).await,
            "clean-ups still running after 30 s"
        );
        for table in [PERMIT_QUEUE, PERMITS] {
            let left = raw.rows_of(table, n.as_str()).await;
            assert_eq!(
                left, 0,
                "round {round}: {table} rows left by a dropped acquire"
            );
        }
    }
}

/// A permit's lease extends and releases like a lock's, owner- and token-checked: another
/// owner's lease, a stale token, or the lock's lease of the same name and owner cannot release
/// or extend it; keep-alive's batch extends permits and locks together.
async fn permit_leases_extend_and_release_owner_checked(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let n = name("permit-owned");
    let ttl = Duration::from_secs(30);
    let p = permit(&a, &n, 2, opts(ttl)).await.unwrap().expect("permit");
    assert_eq!(p.handle(), Some("permit"));
    let forged = |owner: OwnerId, token: u64| {
        Lease::new(
            n.clone(),
            owner,
            FencingToken(token),
            Instant::now(),
            ttl,
            Duration::ZERO,
        )
    };
    let other_owner = forged(OwnerId::random(), p.token().0).with_handle("permit");
    let stale_token = forged(p.owner(), p.token().0 - 1).with_handle("permit");
    let as_lock = forged(p.owner(), p.token().0);
    for lease in [&other_owner, &stale_token, &as_lock] {
        assert_eq!(b.release(lease).await.unwrap(), Released::NotHeld);
        match b.extend(lease, ttl).await {
            Err(Error::LockLost { .. }) => {}
            other => panic!("extend with a forged lease: {other:?}"),
        }
    }
    let info = a.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.holders.len(), 1, "a forged release freed it: {info:?}");
    // A chosen owner id acquiring again takes its own permit over with a newer token (as a
    // lock's acquire does): one place, and the older lease of it is stale.
    let chosen = OwnerId::random();
    let first = permit(&b, &n, 2, opts(ttl).owner(chosen))
        .await
        .unwrap()
        .expect("permit");
    let again = permit(&b, &n, 2, opts(ttl).owner(chosen))
        .await
        .unwrap()
        .expect("the chosen owner's own permit");
    assert!(again.token() > first.token());
    let info = a.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.holders.len(), 2, "one place per owner: {info:?}");
    assert_eq!(b.release(&first).await.unwrap(), Released::NotHeld);
    assert_eq!(b.release(&again).await.unwrap(), Released::Released);
    // Extended from any client: the lease keeps its token and handle, the row its new expiry.
    let longer = b
        .extend(&p, Duration::from_secs(300))
        .await
        .expect("extend by the owner");
    assert_eq!(longer.token(), p.token());
    assert_eq!(longer.handle(), Some("permit"));
    let left = a
        .inspect_semaphore(&n)
        .await
        .unwrap()
        .expect("semaphore")
        .holders[0]
        .remaining;
    assert!(
        left.is_some_and(|l| l > Duration::from_secs(60)),
        "the row's expiry: {left:?}"
    );
    // Keep-alive's batch: a permit and a lock of the same name, each extended in its table.
    let lock = take(&a, &n, ttl).await.expect("the lock of the same name");
    let done = b
        .extend_many(&[
            (lock.clone(), ttl),
            (p.clone(), ttl),
            (other_owner.clone(), ttl),
        ])
        .await;
    assert!(done[0].is_ok(), "{:?}", done[0]);
    assert_eq!(
        done[1].as_ref().map(Lease::handle).ok(),
        Some(Some("permit"))
    );
    assert!(
        matches!(done[2], Err(Error::LockLost { .. })),
        "{:?}",
        done[2]
    );
    assert_eq!(b.release(&p).await.unwrap(), Released::Released);
    assert_eq!(a.release(&p).await.unwrap(), Released::NotHeld);
    match a.extend(&p, ttl).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend after release: {other:?}"),
    }
    assert!(
        a.inspect(&n).await.unwrap().unwrap().holder.is_some(),
        "the permit's release freed the lock"
    );
    a.release(&lock).await.unwrap();
}

/// `forget` leaves nothing of a semaphore nobody holds or waits for (its fence included), and
/// keeps one in use; `inspect_semaphore` then reports it unknown.
async fn idle_semaphore_is_forgotten(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("forgotten");
    assert!(c.inspect_semaphore(&n).await.unwrap().is_none());
    let p = permit(&c, &n, 2, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("permit");
    let q = permit(&c, &n, 2, opts(Duration::from_millis(50)))
        .await
        .unwrap()
        .expect("permit");
    let info = c.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.permits, Some(2));
    assert_eq!(info.holders.len(), 2);
    assert_eq!(info.holders[0].owner, p.owner().to_string(), "oldest first");
    assert_eq!(info.holders[0].token, p.token());
    assert!(!c.forget(&n).await.unwrap(), "forgot a semaphore in use");
    assert!(raw.semaphore_fence(n.as_str()).await.is_some());
    c.release(&p).await.unwrap();
    // `q`'s ttl runs out: expired permits do not keep a semaphore in use.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(q.token().0, p.token().0 + 1);
    assert!(
        c.forget(&n).await.unwrap(),
        "an idle semaphore is forgotten"
    );
    assert!(c.inspect_semaphore(&n).await.unwrap().is_none());
    for table in [SEMAPHORES, PERMITS, PERMIT_QUEUE] {
        assert_eq!(raw.rows_of(table, n.as_str()).await, 0, "{table}");
    }
}

// ---- read-write locks ----

/// The readers table and the waiters table of the default lease table.
const READERS: &str = "dlock_leases_readers";
const WAITERS: &str = "dlock_leases_waiters";

async fn try_read(c: &Arc<dyn DistributedLock>, n: &LockName, ttl: Duration) -> Option<Lease> {
    c.try_acquire_shared(n, &opts(ttl).with_defaults(&c.defaults()))
        .await
        .expect("try_acquire_shared")
}

/// Waits until a writer's `try` on `n` succeeds (the readers' row came free), and returns
/// that lease.
async fn until_writer_gets_in(c: &Arc<dyn DistributedLock>, n: &LockName) -> Lease {
    within(Duration::from_secs(30), "the writer to get in", async {
        loop {
            if let Some(w) = take(c, n, Duration::from_secs(30)).await {
                return w;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

per_dialect!(
    readers_hold_the_row_until_the_last_goes,
    dropped_read_waits_leave_no_rows,
    no_reader_outlives_the_readers_lease_row,
);

impl Raw {
    /// Live read holds of `name` that expire after the lease row does, by the database's
    /// stored times (one query, so both are read at once).
    async fn holds_past_the_row(&self, name: &str) -> i64 {
        let query = |q: char, p: &str| {
            sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {q}{READERS}{q} AS r JOIN {q}{TABLE}{q} AS l \
                 ON l.name = r.name WHERE r.name = {p} AND r.fence IS NOT NULL \
                 AND r.expires_at > l.expires_at"
            ))
        };
        match self {
            Raw::Pg(p) => {
                sqlx::query_scalar(query('"', "$1"))
                    .bind(name)
                    .fetch_one(p)
                    .await
            }
            Raw::My(p) => {
                sqlx::query_scalar(query('`', "?"))
                    .bind(name.as_bytes())
                    .fetch_one(p)
                    .await
            }
            Raw::Lite(p) => {
                sqlx::query_scalar(query('"', "?1"))
                    .bind(name)
                    .fetch_one(p)
                    .await
            }
        }
        .expect("raw comparison")
    }
}

/// A reader's hold never runs out after the lease row that keeps writers out. A writer takes
/// the row as soon as it expires; a hold that outlived it, even by the time between two
/// statements of one transaction, could still be released (`Released`, where the holder had
/// lost it) or, worse, extended while the writer held. CI once saw the release: the fault case
/// `rw_reader_paused_past_ttl` on PostgreSQL, whose writer gets in 1 ms after the row expires.
/// Checked after a grant, after an extension, and after a second reader joins and extends.
async fn no_reader_outlives_the_readers_lease_row(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("catalog");
    let ttl = Duration::from_secs(30);
    let a = try_read(&c, &n, ttl).await.expect("a reader");
    assert_eq!(raw.holds_past_the_row(n.as_str()).await, 0, "after a grant");
    let a = c.extend(&a, ttl).await.expect("extend");
    assert_eq!(
        raw.holds_past_the_row(n.as_str()).await,
        0,
        "after an extension"
    );
    let b = try_read(&c, &n, ttl).await.expect("a second reader");
    let _b = c.extend(&b, ttl).await.expect("extend");
    assert_eq!(
        raw.holds_past_the_row(n.as_str()).await,
        0,
        "with two readers"
    );
    assert_eq!(c.release(&a).await.unwrap(), Released::Released);
}

/// Readers share the name and keep a writer out until the last of them goes: a release that
/// leaves another reader keeps the writer out, a reader's extension keeps it out past the
/// reader's first ttl, and a reader that is never released (a crashed process) holds it out
/// only until its lease runs out; then its release and extension find nothing, and the
/// writer's token is above every reader's. While the writer holds, readers are refused; once
/// it has gone, the last reader's release frees the name at once, and nothing is left in the
/// readers table.
async fn readers_hold_the_row_until_the_last_goes(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("catalog");
    let long = Duration::from_secs(30);
    let a = try_read(&c, &n, long).await.expect("the first reader");
    let b = try_read(&c, &n, Duration::from_secs(2))
        .await
        .expect("a second reader shares");
    assert!(b.token() > a.token(), "reader tokens increase");
    let info = c.inspect(&n).await.unwrap().expect("the row");
    assert_eq!(info.holder.as_deref(), Some("readers"));
    assert_eq!(info.details, ["2 reader(s) holding"]);
    assert!(
        take(&c, &n, long).await.is_none(),
        "a writer beside readers"
    );
    assert_eq!(c.release(&a).await.unwrap(), Released::Released);
    assert!(
        take(&c, &n, long).await.is_none(),
        "a writer got in while a reader still held"
    );
    let b = c
        .extend(&b, Duration::from_secs(6))
        .await
        .expect("a live reader extends");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        take(&c, &n, long).await.is_none(),
        "a writer got in past the reader's first ttl although it had extended"
    );
    // `b` is never released: its lease runs out.
    let w = until_writer_gets_in(&c, &n).await;
    assert!(
        w.token() > b.token(),
        "the writer's token is above the readers'"
    );
    assert_eq!(c.release(&b).await.unwrap(), Released::NotHeld);
    assert!(matches!(
        c.extend(&b, long).await,
        Err(Error::LockLost { .. })
    ));
    assert!(
        try_read(&c, &n, long).await.is_none(),
        "a reader beside the writer"
    );
    assert_eq!(c.release(&w).await.unwrap(), Released::Released);
    let r = try_read(&c, &n, long)
        .await
        .expect("a reader after the writer");
    assert!(r.token() > w.token());
    assert_eq!(c.release(&r).await.unwrap(), Released::Released);
    let w2 = take(&c, &n, long)
        .await
        .expect("the last reader's release frees the name at once");
    c.release(&w2).await.unwrap();
    assert_eq!(
        raw.rows_of(READERS, n.as_str()).await,
        0,
        "reader rows left"
    );
}

/// A reader queued behind a writer leaves its mark in the readers table and a row in the
/// waiters table; a reader whose wait is dropped (its task aborted) leaves neither behind, and
/// the writer's release then finds nobody waiting.
async fn dropped_read_waits_leave_no_rows(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("catalog");
    let w = take(&c, &n, Duration::from_secs(30)).await.expect("writer");
    let reader = {
        let (c, n) = (c.clone(), n.clone());
        tokio::spawn(async move {
            let opts = opts(Duration::from_secs(30)).with_defaults(&c.defaults());
            let until = Instant::now() + Duration::from_secs(60);
            c.acquire_shared_wait(&n, &opts, Some(until)).await
        })
    };
    until_queued(&c, &n, 1).await;
    assert_eq!(
        raw.rows_of(READERS, n.as_str()).await,
        1,
        "the queued reader's mark"
    );
    let info = c.inspect(&n).await.unwrap().expect("the row");
    assert_eq!(info.details, ["1 of the 1 waiting are readers"]);
    reader.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    until_no_rows(&raw, READERS, &n, "the dropped reader's mark").await;
    until_no_rows(&raw, WAITERS, &n, "the dropped reader's waiter row").await;
    assert_eq!(c.release(&w).await.unwrap(), Released::Released);
    let info = c.inspect(&n).await.unwrap().expect("the row");
    assert_eq!((info.holder, info.waiters), (None, Some(0)));
}

// ---- accounts that may not create tables ----

impl Raw {
    /// Runs `sql` (no parameters, nothing handed back).
    async fn exec(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Raw::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(|_| ()),
            Raw::My(p) => sqlx::raw_sql(sql).execute(p).await.map(|_| ()),
            Raw::Lite(p) => sqlx::raw_sql(sql).execute(p).await.map(|_| ()),
        }
        .expect("raw statement");
    }
}

/// An account allowed to read and write the tables but not to create any (PostgreSQL:
/// `CREATE TABLE IF NOT EXISTS` is refused without the schema's `CREATE`, even when the table
/// is there; MySQL likewise without the `CREATE` privilege) uses the tables a first run with
/// more rights made: locks and permits work. On a database without the tables it gets the
/// refusal, as access denied, at connect.
async fn a_dml_only_account_uses_existing_tables(kind: Kind) {
    let url = fresh_url(kind).await;
    drop(client(&url).await);
    let account = unique("dml");
    let (db, port) = {
        let rest = url.rsplit_once('@').expect("user@host").1;
        let (host, db) = rest.split_once('/').expect("host/db");
        (
            db.to_owned(),
            host.rsplit_once(':').expect("port").1.to_owned(),
        )
    };
    // A second database, where nobody made the tables.
    let bare = fresh_url(kind).await;
    let bare_db = bare.rsplit_once('/').expect("db").1.to_owned();
    let admin = Raw::connect(&url).await;
    let grants: Vec<String> = match kind {
        Kind::Postgres => vec![
            format!(
                "CREATE ROLE \"{account}\" LOGIN PASSWORD '{}'",
                kit::password()
            ),
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC".to_owned(),
            format!("GRANT USAGE ON SCHEMA public TO \"{account}\""),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public \
                 TO \"{account}\""
            ),
            format!("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO \"{account}\""),
        ],
        Kind::MariaDb => ["%", "localhost", "127.0.0.1"]
            .iter()
            .flat_map(|host| {
                [
                    format!(
                        "CREATE USER '{account}'@'{host}' IDENTIFIED BY '{}'",
                        kit::password()
                    ),
                    format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.* TO '{account}'@'{host}'"
                    ),
                    format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON `{bare_db}`.* \
                         TO '{account}'@'{host}'"
                    ),
                ]
            })
            .collect(),
        Kind::Sqlite => unreachable!("SQLite has no accounts"),
    };
    for grant in grants {
        admin.exec(&grant).await;
    }
    if kind == Kind::Postgres {
        // Schemas are per database: the bare one's too.
        let bare_admin = Raw::connect(&bare).await;
        bare_admin
            .exec("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            .await;
    }
    let scheme = if kind == Kind::Postgres {
        "postgres"
    } else {
        "mysql"
    };
    let as_account = |db: &str| {
        let password = kit::password();
        format!("{scheme}://{account}:{password}@127.0.0.1:{port}/{db}")
    };
    let c = client(&as_account(&db)).await;
    let n = name("least-privilege");
    let lock = take(&c, &n, Duration::from_secs(30))
        .await
        .expect("the lock");
    // A queued waiter's grant (on MySQL a stored procedure, where the account may call one).
    let waiter = {
        let (c, n) = (client(&as_account(&db)).await, n.clone());
        tokio::spawn(async move { c.lock(n.as_str(), &waiting(Duration::from_secs(30))).await })
    };
    until_queued(&c, &n, 1).await;
    assert_eq!(c.release(&lock).await.unwrap(), Released::Released);
    let granted = within(Duration::from_secs(30), "the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("the waiter's lock");
    granted.release().await.expect("release");
    let p = permit(&c, &n, 2, opts(Duration::from_secs(30)))
        .await
        .expect("try a permit")
        .expect("a permit");
    assert_eq!(c.release(&p).await.unwrap(), Released::Released);
    match backend_sql::connect(&as_account(&bare_db)).await {
        Err(Error::AccessDenied { .. }) => {}
        Err(other) => panic!("a database without the tables: {other}"),
        Ok(_) => panic!("connected to a database without the tables it may not create"),
    }
}

mod a_dml_only_account_uses_existing_tables {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::a_dml_only_account_uses_existing_tables(super::Kind::Postgres).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb() {
        super::a_dml_only_account_uses_existing_tables(super::Kind::MariaDb).await
    }
}
