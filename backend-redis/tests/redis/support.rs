//! What the Redis tests share: a kit server per binary, options, the keys of a name, and
//! waiting for a condition.

use std::sync::Arc;
use std::time::Duration;

use backend_redis::RedisConfig;
use conformance_tests::kit::{Redis, RedisReply};
use conformance_tests::within;
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LockName, Released, Wait};

pub(crate) const SEC: Duration = Duration::from_secs(1);

pub(crate) const PASSWORD: &str = "s3cr3t-Pa55";

pub(crate) fn unique(label: &str) -> String {
    format!("redis-tests/{label}/{:08x}", rand::random::<u32>())
}

pub(crate) fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::For(30 * SEC))
}

pub(crate) async fn shared() -> &'static Redis {
    Redis::shared().await.expect("kit redis")
}

pub(crate) async fn ok(redis: &Redis, args: &[&str]) {
    if let RedisReply::Error(e) = redis.command(args).await.expect("redis command") {
        panic!("{args:?}: {e}");
    }
}

pub(crate) async fn basic_round(c: &Arc<dyn DistributedLock>, label: &str) {
    let name = unique(label);
    let g = c.lock(&name, &opts(10 * SEC)).await.expect("acquire");
    assert!(
        c.try_lock(&name, &opts(10 * SEC))
            .await
            .expect("try")
            .is_none()
    );
    assert_eq!(g.release().await.expect("release"), Released::Released);
}

pub(crate) fn assert_no_secret(text: &str) {
    assert!(!text.contains(PASSWORD), "the password leaked: {text}");
}

/// Options for a permit: no keep-alive, the given ttl, waiting up to 30 s.
pub(crate) fn permit_opts(ttl: Duration) -> AcquireOptions {
    opts(ttl)
}

/// The keys of the semaphore `name` under prefix `dlock`: holders, queue, alive, fence, count.
pub(crate) fn sem_keys(name: &str) -> [String; 5] {
    let esc = LockName::new(name).unwrap().escaped();
    ["holders", "queue", "alive", "fence", "permits"].map(|k| format!("{{dlock:{esc}}}:sem:{k}"))
}

/// The members of a ZSET (or nothing when it does not exist).
pub(crate) async fn members(redis: &Redis, key: &str) -> Vec<String> {
    match redis.command(&["ZRANGE", key, "0", "-1"]).await.unwrap() {
        RedisReply::Array(Some(items)) => items.iter().filter_map(|i| i.as_text()).collect(),
        other => panic!("ZRANGE {key}: {other:?}"),
    }
}

/// Polls `check` until it holds (the waits here end on events, never on a timed assertion;
/// the limit only turns a hang into a failure).
pub(crate) async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(30 * SEC, what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// One node of this crate on the kit's `redis`, for the tests that call its primitives.
pub(crate) fn node_of(redis: &Redis) -> backend_redis::node::Node {
    let config = RedisConfig::parse(&redis.url()).unwrap();
    backend_redis::node::Node::open(&config, "127.0.0.1", redis.port(), false, "test").unwrap()
}

/// The server's clock in milliseconds (`TIME`), as the scripts read it.
pub(crate) async fn server_ms(redis: &Redis) -> u64 {
    match redis.command(&["TIME"]).await.unwrap() {
        RedisReply::Array(Some(items)) => {
            let s: u64 = items[0].as_text().unwrap().parse().unwrap();
            let us: u64 = items[1].as_text().unwrap().parse().unwrap();
            s * 1000 + us / 1000
        }
        other => panic!("TIME: {other:?}"),
    }
}

/// The keys of the lock `name` under prefix `dlock`: lock, fence, queue, shared (the readers).
pub(crate) fn rw_keys(name: &str) -> [String; 4] {
    let esc = LockName::new(name).unwrap().escaped();
    ["lock", "fence", "queue", "shared"].map(|k| format!("{{dlock:{esc}}}:{k}"))
}

/// Polls `inspect` until `n` live waiters are queued for `name`.
pub(crate) async fn queued(c: &Arc<dyn DistributedLock>, name: &str, n: usize) {
    let lock_name = LockName::new(name).unwrap();
    until("waiters queued", || async {
        c.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters) == Some(n)
    })
    .await
}
