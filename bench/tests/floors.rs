//! Each store's floors against real servers started by the test kit: a pair works on keys,
//! nodes or rows of its own and leaves nothing held.

use std::time::Duration;

use conformance_tests::kit;
use dlock_bench::floor::{self, Floors};
use lockcore::{AcquireOptions, Error, KeepAlive, LockName, Wait};

fn name(what: &str) -> LockName {
    LockName::new(format!("bench-floor/{what}/{:08x}", rand_u32())).expect("a valid name")
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.subsec_nanos() ^ std::process::id()
}

fn kinds(f: &Floors) -> [bool; 3] {
    [f.raw.is_some(), f.fenced.is_some(), f.recipe.is_some()]
}

/// Three floor pairs on `name`, then a lock acquisition of the same name: a SQL floor runs on
/// the lease table's rows, so the lock is free and its token follows the floor's three fences.
async fn sql_floor_leaves_the_row_free_with_its_fence_advanced(url: &str) {
    let floors = floor::connect(url).await.expect("floors");
    assert_eq!(
        kinds(&floors),
        [true, false, false],
        "{url}: a raw floor only"
    );
    let raw = floors.raw.expect("raw floor");
    let n = name("sql");
    for _ in 0..3 {
        raw.pair(&n).await.expect("floor pair");
    }
    let lock = dlock::connect(url).await.expect("lock client");
    let opts = AcquireOptions::new()
        .wait(Wait::No)
        .keep_alive(KeepAlive::Off)
        .ttl(Duration::from_secs(10))
        .with_defaults(&lock.defaults());
    let lease = lock
        .try_acquire(&n, &opts)
        .await
        .expect("acquire")
        .expect("the floor left the row free");
    assert_eq!(
        lease.token().0,
        4,
        "three floor pairs, then this acquisition"
    );
    lock.release(&lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_floor_runs_on_the_lease_table() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    sql_floor_leaves_the_row_free_with_its_fence_advanced(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_floor_runs_on_the_lease_table() {
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let url = pg.fresh_database("benchfloor").await.expect("database");
    sql_floor_leaves_the_row_free_with_its_fence_advanced(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_floor_runs_on_the_lease_table() {
    let db = kit::MariaDb::shared().await.expect("kit MariaDB");
    let url = db.fresh_database("benchfloor").await.expect("database");
    sql_floor_leaves_the_row_free_with_its_fence_advanced(&url).await;
}

#[tokio::test]
async fn an_in_memory_sqlite_database_has_no_floor() {
    let floors = floor::connect("sqlite::memory:").await.expect("floors");
    assert_eq!(kinds(&floors), [false, false, false]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_floors_take_and_delete_a_key_of_their_own() {
    let redis = kit::Redis::shared().await.expect("kit Redis");
    let floors = floor::connect(&redis.url()).await.expect("floors");
    assert_eq!(kinds(&floors), [true, true, false]);
    let n = name("redis");
    let (raw, fenced) = (floors.raw.unwrap(), floors.fenced.unwrap());
    for _ in 0..2 {
        raw.pair(&n).await.expect("raw pair");
        fenced.pair(&n).await.expect("fenced pair");
    }
    let base = format!(
        "{{{}:floor:{}}}",
        backend_redis::DEFAULT_PREFIX,
        n.escaped()
    );
    let fence = redis
        .command(&["GET", &format!("{base}:fence")])
        .await
        .unwrap();
    assert_eq!(
        fence.as_text().as_deref(),
        Some("2"),
        "one token per fenced pair"
    );
    let key = redis
        .command(&["EXISTS", &format!("{base}:lock")])
        .await
        .unwrap();
    assert_eq!(
        key,
        kit::RedisReply::Integer(0),
        "every pair deleted its key"
    );
    // A script the server lost is sent again whole.
    redis.command(&["SCRIPT", "FLUSH"]).await.unwrap();
    fenced
        .pair(&n)
        .await
        .expect("fenced pair after SCRIPT FLUSH");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_floors_fan_out_to_every_node() {
    let set = kit::RedisSet::shared(3).await.expect("kit Redis set");
    let floors = floor::connect(&set.redlock_url()).await.expect("floors");
    let fenced = floors.fenced.expect("fenced floor");
    assert!(
        fenced.description().contains("all 3 nodes"),
        "{}",
        fenced.description()
    );
    let n = name("redlock");
    fenced.pair(&n).await.expect("fenced pair");
    let base = format!(
        "{{{}:floor:{}}}",
        backend_redis::DEFAULT_PREFIX,
        n.escaped()
    );
    for node in set.nodes() {
        let fence = node
            .command(&["GET", &format!("{base}:fence")])
            .await
            .unwrap();
        assert_eq!(
            fence.as_text().as_deref(),
            Some("1"),
            "each node drew one token"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_floors_leave_no_node_behind() {
    let zk = kit::ZooKeeper::shared().await.expect("kit ZooKeeper");
    let url = format!("{}/benchfloor{:08x}", zk.url(), rand_u32());
    let floors = floor::connect(&url).await.expect("floors");
    assert_eq!(kinds(&floors), [true, false, true]);
    let n = name("zk");
    for _ in 0..3 {
        floors
            .raw
            .as_ref()
            .unwrap()
            .pair(&n)
            .await
            .expect("raw pair");
        floors
            .recipe
            .as_ref()
            .unwrap()
            .pair(&n)
            .await
            .expect("recipe pair");
    }
    let config = backend_zk::ZkConfig::parse(&url).unwrap();
    let lock = backend_zk::ZkLock::connect(&config).await.expect("client");
    let client = lock.zk_client();
    let parent = format!("{}/recipe-floor-{}", config.base_path(), n.escaped());
    let left = client
        .list_children(&parent)
        .await
        .expect("the recipe floor's parent");
    assert!(left.is_empty(), "recipe floor nodes left: {left:?}");
    let plain = format!("{}/floor-{}", config.base_path(), n.escaped());
    assert!(
        client.check_stat(&plain).await.expect("stat").is_none(),
        "{plain} left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_floor_runs_both_stores_floors() {
    let redis = kit::Redis::shared().await.expect("kit Redis");
    let enc = |u: &str| url::form_urlencoded::byte_serialize(u.as_bytes()).collect::<String>();
    let url = format!("dual://?first={}&second=memory://", enc(&redis.url()));
    let floors = floor::connect(&url).await.expect("floors");
    assert_eq!(kinds(&floors), [true, true, true]);
    let fenced = floors.fenced.unwrap();
    let described = fenced.description();
    assert!(
        described.starts_with("first store: one script SET NX PX + INCR"),
        "{described}"
    );
    assert!(
        described.contains("then second store: HashMap"),
        "{described}"
    );
    fenced.pair(&name("dual")).await.expect("dual pair");
}

#[tokio::test]
async fn an_unknown_scheme_is_refused_before_any_io() {
    match floor::connect("nosuch://host").await {
        Err(Error::UnsupportedScheme { scheme, available }) => {
            assert_eq!(scheme, "nosuch");
            assert!(
                available.contains(&"redis") && available.contains(&"zk"),
                "{available:?}"
            );
        }
        other => panic!(
            "expected UnsupportedScheme, got {:?}",
            other.map(|f| kinds(&f))
        ),
    }
}
