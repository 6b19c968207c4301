use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Pool, Sqlite};

use super::ConnectionCache;

/// Generous: only to fail instead of hanging.
const LIMIT: Duration = Duration::from_secs(10);

/// A pool of `size` connections to a database file of its own (gone with the directory).
fn pool(dir: &tempfile::TempDir, size: u32) -> Pool<Sqlite> {
    let opts = SqliteConnectOptions::new()
        .filename(dir.path().join("cache.db"))
        .create_if_missing(true);
    SqlitePoolOptions::new()
        .max_connections(size)
        .connect_lazy_with(opts)
}

/// Marks `conn` with a temporary table (one connection's own) named `mark`.
async fn mark(conn: &mut PoolConnection<Sqlite>, mark: &str) {
    let create = format!("CREATE TEMP TABLE {mark} (x)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(&mut **conn)
        .await
        .expect("create a temporary table");
}

/// Whether `conn` carries `mark`.
async fn marked(conn: &mut PoolConnection<Sqlite>, mark: &str) -> bool {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM sqlite_temp_master WHERE name = ?1")
        .bind(mark)
        .fetch_one(&mut **conn)
        .await
        .expect("read the temporary tables");
    n == 1
}

/// Waits until the pool holds `n` idle connections (a dropped connection goes back through a
/// task of its own).
async fn pool_idle(pool: &Pool<Sqlite>, n: usize) {
    tokio::time::timeout(LIMIT, async {
        while pool.num_idle() != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the pool has {} idle, not {n}", pool.num_idle()));
}

/// The next statement gets the connection used last, not one from the pool; two are kept,
/// and the third goes back to the pool.
#[tokio::test]
async fn the_last_connection_used_is_taken_first_and_two_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, 8);
    let cache = ConnectionCache::new(8);
    let mut a = pool.acquire().await.unwrap();
    let mut b = pool.acquire().await.unwrap();
    let c = pool.acquire().await.unwrap();
    mark(&mut a, "a").await;
    mark(&mut b, "b").await;
    let now = Instant::now();
    cache.put(a, now);
    cache.put(b, now);
    cache.put(c, now);
    pool_idle(&pool, 1).await;

    let (mut first, _) = cache.take().expect("a cache connection");
    assert!(marked(&mut first, "b").await, "not the last one put back");
    let (mut second, _) = cache.take().expect("a second cache connection");
    assert!(marked(&mut second, "a").await, "not the first one put back");
    assert!(cache.take().is_none(), "a third was cache");
}

/// A pool of one connection (SQLite's `:memory:`) keeps none back: whatever takes a connection
/// from the pool directly, outside the statements' slots, always finds one there.
#[tokio::test]
async fn none_is_kept_from_a_pool_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, 1);
    let cache = ConnectionCache::new(1);
    cache.put(pool.acquire().await.unwrap(), Instant::now());
    assert!(cache.take().is_none());
    let again = tokio::time::timeout(LIMIT, pool.acquire()).await;
    assert!(
        matches!(again, Ok(Ok(_))),
        "the pool's one connection was cache"
    );
}

/// A connection left unused goes back to the pool on its own, and is not handed out again.
#[tokio::test]
async fn an_unused_connection_goes_back_to_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, 8);
    let cache = ConnectionCache::unused_for(8, Duration::from_millis(50));
    cache.put(pool.acquire().await.unwrap(), Instant::now());
    assert_eq!(pool.num_idle(), 0);
    pool_idle(&pool, 1).await;
    assert!(cache.take().is_none(), "handed out after it went back");
    // And a connection put back after that is given back too: the task starts again.
    cache.put(pool.acquire().await.unwrap(), Instant::now());
    assert_eq!(pool.num_idle(), 0);
    pool_idle(&pool, 1).await;
}

/// A connection that has gone from statement to statement for a minute goes back through the
/// pool, so that the pool's lifetime limit still reaches it.
#[tokio::test]
async fn a_connection_out_of_the_pool_for_a_minute_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, 8);
    let cache = ConnectionCache::new(8);
    let long_ago = Instant::now()
        .checked_sub(super::CACHED_FOR)
        .expect("a monotonic clock older than a minute");
    cache.put(pool.acquire().await.unwrap(), long_ago);
    assert!(cache.take().is_none(), "cache past its minute");
    pool_idle(&pool, 1).await;
    let since = Instant::now();
    cache.put(pool.acquire().await.unwrap(), since);
    let (_, kept_since) = cache.take().expect("a fresh one is cache");
    assert_eq!(
        kept_since, since,
        "its time out of the pool is cache with it"
    );
}

/// A statement that arrives while every connection is out waits for its turn, not in the pool:
/// the first connection to come back (here into the kept ones) is its, although the pool
/// itself gets nothing back while the other statement runs on.
#[tokio::test]
async fn a_statement_waiting_for_a_connection_gets_the_one_kept_next() {
    let dir = tempfile::tempdir().unwrap();
    let runner = crate::common::StatementRunner {
        backend: "test",
        pool: pool(&dir, 2),
        timeout: LIMIT,
        classify: |_| crate::common::Class::Fail { retryable: false },
        write_queue: None,
        cache: ConnectionCache::new(2),
        lender: None,
    };
    let running = runner.connection().await.expect("a first connection");
    let mut done = runner.connection().await.expect("a second connection");
    let waiting = {
        let runner = runner.clone();
        tokio::spawn(async move { runner.connection().await.map(drop) })
    };
    // Give it time to start waiting; it must not be granted before a connection comes back.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiting.is_finished(),
        "a third connection out of a pool of two"
    );
    done.completed();
    drop(done);
    let got = tokio::time::timeout(LIMIT, waiting).await;
    assert!(
        matches!(got, Ok(Ok(Ok(())))),
        "the waiting statement did not get the connection cache: {got:?}"
    );
    drop(running);
}

/// Dropped after its runtime has ended (a client dropped outside any runtime), the kept
/// connections are closed rather than handed to the pool, which would need a runtime to take
/// them back.
#[test]
fn kept_connections_dropped_outside_a_runtime_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (pool, cache) = runtime.block_on(async {
        let pool = pool(&dir, 8);
        let cache = ConnectionCache::new(8);
        cache.put(pool.acquire().await.unwrap(), Instant::now());
        (pool, cache)
    });
    drop(runtime);
    drop(cache);
    assert_eq!(
        pool.size(),
        0,
        "the cache connection is still counted by the pool"
    );
}

/// Once cleared (the client is closing), a connection that comes back goes to the pool, whose
/// close waits for every connection it handed out.
#[tokio::test]
async fn nothing_is_kept_once_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, 8);
    let cache = ConnectionCache::new(8);
    let (a, b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    cache.put(a, Instant::now());
    cache.clear();
    pool_idle(&pool, 1).await;
    cache.put(b, Instant::now());
    assert!(cache.take().is_none(), "cache after the clear");
    pool_idle(&pool, 2).await;
    tokio::time::timeout(LIMIT, pool.close())
        .await
        .expect("the pool closes: no connection is held back");
}

/// After `retire`, the kept connections are handed out to be closed, one out of the pool since
/// before is closed when put back, and one taken after is kept as before.
#[tokio::test]
async fn retired_connections_are_closed_and_later_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, 8);
    let cache = ConnectionCache::new(8);
    let kept = pool.acquire().await.unwrap();
    let in_use = pool.acquire().await.unwrap();
    let before = Instant::now();
    cache.put(kept, before);

    let retired = cache.retire();
    assert_eq!(retired.len(), 1, "the kept connection is handed out");
    assert!(cache.take().is_none(), "nothing kept after retire");
    for mut conn in retired {
        conn.close_on_drop();
    }
    cache.put(in_use, before);
    assert!(
        cache.take().is_none(),
        "a connection from before retire was kept"
    );
    tokio::time::timeout(LIMIT, async {
        while pool.size() != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} connections of before retire are still open",
            pool.size()
        )
    });

    let later = pool.acquire().await.unwrap();
    cache.put(later, Instant::now());
    assert!(
        cache.take().is_some(),
        "a connection taken after retire is kept"
    );
}
