//! What Redlock's test binaries share: the kit's masters as a URL, a client, and reading and
//! writing a lock's keys on one node behind dlock's back.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::kit::{Redis, RedisReply, RedisSet};
use lockcore::{
    AcquireOptions, DistributedLock, KeepAlive, LockExt, LockGuard, LockInfo, LockName, Wait,
};

pub const SEC: Duration = Duration::from_secs(1);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub use conformance_tests::within;

pub fn once(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
}

/// The Redlock URL of the kit's masters (or proxies in front of them) at `addrs`, with the
/// password every kit server of this process shares.
pub fn url_of(addrs: &[String], query: &str) -> String {
    format!(
        "redlock://:{}@{}?{query}",
        conformance_tests::kit::password(),
        addrs.join(",")
    )
}

pub fn addrs(set: &RedisSet) -> Vec<String> {
    set.nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect()
}

pub async fn connect(url: &str) -> Arc<dyn DistributedLock> {
    backend_redlock::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// `client`'s view of `name`, which must be known to the nodes.
pub async fn inspect(client: &dyn DistributedLock, name: &str) -> LockInfo {
    let name = LockName::new(name).expect("name");
    client
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("known")
}

/// The holder key of `name` on a node (default prefix).
pub fn lock_key(name: &str) -> String {
    format!(
        "{{dlock:{}}}:lock",
        LockName::new(name).expect("name").escaped()
    )
}

pub async fn get(node: &Redis, key: &str) -> Option<String> {
    match node.command(&["GET", key]).await.expect("GET") {
        RedisReply::Bulk(None) => None,
        other => other.as_text(),
    }
}

pub async fn exists(node: &Redis, key: &str) -> bool {
    node.command(&["EXISTS", key]).await.expect("EXISTS") == RedisReply::Integer(1)
}

/// Another owner's holder key on `node`, outside dlock.
pub async fn occupy(node: &Redis, name: &str) {
    let reply = node
        .command(&["SET", &lock_key(name), "blocker", "PX", "60000"])
        .await
        .expect("SET");
    assert_eq!(reply, RedisReply::Status("OK".into()));
}

pub async fn vacate(node: &Redis, name: &str) {
    node.command(&["DEL", &lock_key(name)]).await.expect("DEL");
}

/// Waits until no node has a holder key or a queue for `name` other than `blocker`'s.
pub async fn nothing_left(set: &RedisSet, name: &str) {
    let key = lock_key(name);
    let queue = key.replace(":lock", ":queue");
    within(
        10 * SEC,
        "no key or queue of the name left on any node",
        async {
            loop {
                let mut clean = true;
                for node in set.nodes() {
                    let holder = get(node, &key).await;
                    clean &= holder.is_none() || holder.as_deref() == Some("blocker");
                    clean &= !exists(node, &queue).await;
                }
                if clean {
                    break;
                }
                tokio::time::sleep(ms(20)).await;
            }
        },
    )
    .await;
}

/// Takes and releases `name` `times` times through `client`.
pub async fn bump(client: &Arc<dyn DistributedLock>, name: &str, times: usize) -> u64 {
    let mut last = 0;
    for _ in 0..times {
        let g = client
            .try_lock(name, &once(10 * SEC))
            .await
            .expect("acquire")
            .expect("free");
        assert!(g.fencing_token().0 > last, "tokens increase");
        last = g.fencing_token().0;
        g.release().await.expect("release");
    }
    last
}

/// `name`'s queue on `node`: each entry with its arrival ticket.
pub async fn queue_entries(node: &Redis, name: &str) -> Vec<(String, String)> {
    let queue = lock_key(name).replace(":lock", ":queue");
    let reply = node
        .command(&["ZRANGE", &queue, "0", "-1", "WITHSCORES"])
        .await
        .expect("ZRANGE");
    let RedisReply::Array(Some(items)) = reply else {
        panic!("ZRANGE replied {reply:?}");
    };
    let words: Vec<String> = items
        .iter()
        .map(|i| i.as_text().expect("a bulk string"))
        .collect();
    words
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect()
}

pub async fn fence_of(node: &Redis, name: &str) -> u64 {
    let key = lock_key(name).replace(":lock", ":fence");
    get(node, &key)
        .await
        .map_or(0, |v| v.parse().expect("a counter"))
}

/// `name` taken by `client` with `opts` and held on every node of `set`, not only on a majority.
///
/// `connect` returns once a majority of nodes has answered, and a vote stops listening shortly
/// after a majority granted: a request to a node that is still connecting is dropped unsent, so
/// a lock taken right after connect can sit on a bare majority (as Redlock allows). A test that
/// then breaks one holder and expects the others to carry the lease must start from a lock on
/// every node: this releases and takes the lock again until it is (five tries at most, each
/// watching the nodes for up to a second; a late grant lands within milliseconds).
pub async fn lock_on_every_node(
    client: &Arc<dyn DistributedLock>,
    set: &RedisSet,
    name: &str,
    opts: &AcquireOptions,
) -> LockGuard {
    let key = lock_key(name);
    for _ in 0..5 {
        let guard = client
            .try_lock(name, opts)
            .await
            .expect("acquire")
            .expect("free");
        let everywhere = tokio::time::timeout(SEC, async {
            loop {
                let mut held = 0;
                for node in set.nodes() {
                    held += usize::from(exists(node, &key).await);
                }
                if held == set.nodes().len() {
                    return;
                }
                tokio::time::sleep(ms(10)).await;
            }
        })
        .await;
        if everywhere.is_ok() {
            return guard;
        }
        guard.release().await.expect("release");
    }
    panic!(
        "`{name}` never came to be held on all {} nodes",
        set.nodes().len()
    );
}
