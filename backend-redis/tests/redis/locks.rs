//! Locks on one Redis and on a Cluster: keys, names, token minimums, the queue, scripts,
//! wake-ups, pipelined renewals, inspect.

use std::sync::Arc;
use std::time::Duration;

use backend_redis::{RedisConfig, RedisLock};
use conformance_tests::kit::{Redis, RedisCluster, RedisReply};
use conformance_tests::within;
use lockcore::{
    AcquireOptions, DistributedLock, Error, Fencing, FencingToken, KeepAlive, LockExt, LockName,
    Released, Wait,
};

use crate::support::*;

/// The keys of one lock share a hash tag and the fence counter survives release and expiry;
/// the holder value is the lease's owner id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_layout_and_fence_key() {
    let redis = shared().await;
    let c = backend_redis::connect(&format!("{}?prefix=layout", redis.url()))
        .await
        .expect("client");
    let name = unique("layout");
    let esc = LockName::new(&name).unwrap().escaped();
    let g = c.lock(&name, &opts(10 * SEC)).await.expect("acquire");
    let lock_key = format!("{{layout:{esc}}}:lock");
    let fence_key = format!("{{layout:{esc}}}:fence");
    let value = redis.command(&["GET", &lock_key]).await.unwrap().as_text();
    assert_eq!(value, Some(g.lease().owner().to_string()));
    assert_eq!(
        redis.command(&["GET", &fence_key]).await.unwrap().as_text(),
        Some(g.fencing_token().to_string()),
        "while held, the fence counter is the holder's token"
    );
    g.release().await.expect("release");
    assert_eq!(
        redis.command(&["GET", &fence_key]).await.unwrap().as_text(),
        Some("1".to_owned()),
        "the fence counter stays after release"
    );
    assert_eq!(
        redis.command(&["EXISTS", &lock_key]).await.unwrap(),
        RedisReply::Integer(0)
    );
}

/// `names()` as sorted strings.
async fn sorted_names(client: &Arc<dyn DistributedLock>) -> Vec<String> {
    let mut names: Vec<String> = client
        .names()
        .await
        .expect("names")
        .iter()
        .map(|n| n.as_str().to_owned())
        .collect();
    names.sort();
    names
}

/// `names()` lists every name with a fence counter under the client's own prefix (decoded,
/// whatever characters the name has), held or not, and none of another prefix's; a forgotten
/// name is gone from the list. On a Cluster, the names on every master are found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_lists_this_prefixs_names() {
    let redis = shared().await;
    let prefix = format!("names{:08x}", rand::random::<u32>());
    let c = backend_redis::connect(&format!("{}?prefix={prefix}", redis.url()))
        .await
        .expect("client");
    let other = backend_redis::connect(&format!("{}?prefix={prefix}x", redis.url()))
        .await
        .expect("client of another prefix");
    let (free, held, odd) = ("orders/eu", "ledger", "a b:c{d}*?%");
    c.lock(free, &opts(10 * SEC))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let g = c.lock(held, &opts(10 * SEC)).await.expect("acquire");
    c.lock(odd, &opts(10 * SEC))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    other
        .lock("elsewhere", &opts(10 * SEC))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let names = sorted_names(&c).await;
    let mut expected = vec![free.to_owned(), held.to_owned(), odd.to_owned()];
    expected.sort();
    assert_eq!(names, expected);
    g.release().await.expect("release");
    assert!(
        c.forget(&LockName::new(free).unwrap())
            .await
            .expect("forget")
    );
    let names = c.names().await.expect("names");
    assert!(
        !names.iter().any(|n| n.as_str() == free),
        "a forgotten name is not listed: {names:?}"
    );
    assert_eq!(names.len(), 2);

    // A Cluster: every master is scanned (enough names that they land on all three).
    let cluster = backend_redis::connect(&format!(
        "{}?prefix={prefix}",
        RedisCluster::shared().await.unwrap().url()
    ))
    .await
    .expect("cluster client");
    let mut expected: Vec<String> = (0..24).map(|i| format!("spread/{i}")).collect();
    for name in &expected {
        cluster
            .lock(name, &opts(10 * SEC))
            .await
            .expect("acquire")
            .release()
            .await
            .expect("release");
    }
    let names = sorted_names(&cluster).await;
    expected.sort();
    assert_eq!(names, expected);
}

/// A token minimum is honoured on every path that grants (the `try` fast path, an uncontended
/// waiting acquire, a queued waiter handed the lock by a release, a reader): the token is the
/// minimum and the fence counter holds it, so the next plain grant is one above. A minimum Lua
/// numbers cannot carry exactly is refused before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_token_on_every_granting_path() {
    let redis = shared().await;
    let (a, b) = (
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
    );
    let name = unique("min_token-paths");
    let lock_name = LockName::new(&name).unwrap();
    let fence_key = format!("{{dlock:{}}}:fence", lock_name.escaped());
    let fence = || async { redis.command(&["GET", &fence_key]).await.unwrap().as_text() };
    let raised = |f: u64| opts(30 * SEC).min_token(FencingToken(f));

    // An uncontended waiting acquire: the acquire script's first branch.
    let g = a.lock(&name, &raised(500)).await.expect("acquire");
    assert_eq!(g.fencing_token(), FencingToken(500));
    assert_eq!(fence().await, Some("500".to_owned()));
    g.release().await.expect("release");

    // A `try`: the fast script.
    let g = a
        .try_lock(&name, &raised(1000))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(g.fencing_token(), FencingToken(1000));
    assert_eq!(fence().await, Some("1000".to_owned()));

    // A queued waiter, granted by the full script once the holder releases.
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.lock(&name, &raised(5000)).await })
    };
    within(30 * SEC, "the waiter queued", async {
        while a.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters) != Some(1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    g.release().await.expect("release");
    let gw = within(30 * SEC, "the waiter gets the lock", waiter)
        .await
        .expect("task")
        .expect("acquire");
    assert_eq!(gw.fencing_token(), FencingToken(5000));
    assert_eq!(fence().await, Some("5000".to_owned()));
    assert_eq!(gw.release().await.expect("release"), Released::Released);

    // A minimum below the counter changes nothing; a plain grant continues from the minimum.
    let g = a.lock(&name, &raised(3)).await.expect("acquire");
    assert_eq!(g.fencing_token(), FencingToken(5001));
    g.release().await.expect("release");

    let err = a
        .try_lock(&name, &raised((1 << 53) + 1))
        .await
        .expect_err("a min_token above 2^53");
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                argument: "min_token",
                ..
            }
        ),
        "got {err}"
    );
    assert_eq!(
        fence().await,
        Some("5001".to_owned()),
        "the refused min_token wrote"
    );
    assert_eq!(
        a.inspect(&lock_name).await.unwrap().and_then(|i| i.holder),
        None,
        "the refused min_token took the lock"
    );

    // Readers draw from the same counter, and their grants (a `try`, a wait) raise it too.
    use lockcore::ReadWriteExt;
    let r1 = a
        .try_read_lock(&name, &raised(7000))
        .await
        .expect("try read")
        .expect("free");
    assert_eq!(r1.fencing_token(), FencingToken(7000));
    let r2 = b.read_lock(&name, &raised(8000)).await.expect("read");
    assert_eq!(r2.fencing_token(), FencingToken(8000));
    assert_eq!(fence().await, Some("8000".to_owned()));
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let g = a.lock(&name, &opts(30 * SEC)).await.expect("acquire");
    assert_eq!(g.fencing_token(), FencingToken(8001));
    g.release().await.expect("release");
}

/// A waiter that stops re-checking (a crashed client) is dropped from the queue once its
/// liveness runs out, so the live waiter behind it gets the lock; `try_lock` does not jump a
/// queue with a live waiter; `inspect` counts live waiters only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiter_does_not_block_the_queue() {
    let redis = shared().await;
    let (a, b, c) = (
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
    );
    let name = unique("dead-waiter");
    let esc = LockName::new(&name).unwrap().escaped();
    let ga = a.lock(&name, &opts(30 * SEC)).await.expect("a holds");
    // A crashed waiter: queued first, alive for one more second, never re-checks.
    let (queue, alive) = (
        format!("{{dlock:{esc}}}:queue"),
        format!("{{dlock:{esc}}}:alive"),
    );
    let time = redis.command(&["TIME"]).await.unwrap();
    let now_ms = match time {
        RedisReply::Array(Some(items)) => {
            let s: u64 = items[0].as_text().unwrap().parse().unwrap();
            let us: u64 = items[1].as_text().unwrap().parse().unwrap();
            s * 1000 + us / 1000
        }
        other => panic!("TIME: {other:?}"),
    };
    // A queue entry is the owner id followed by the client id.
    let ghost = "0".repeat(48);
    ok(redis, &["ZADD", &queue, "0", &ghost]).await;
    ok(
        redis,
        &["ZADD", &alive, &(now_ms + 1000).to_string(), &ghost],
    )
    .await;

    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    let lock_name = LockName::new(&name).unwrap();
    within(30 * SEC, "b queued", async {
        while c.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters) != Some(2) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    ga.release().await.expect("release");
    assert!(
        c.try_lock(&name, &opts(10 * SEC)).await.unwrap().is_none(),
        "try_lock jumped a queue with live waiters"
    );
    let gb = within(60 * SEC, "b gets the lock past the dead waiter", waiter)
        .await
        .expect("task")
        .expect("b acquires");
    let info = c.inspect(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.waiters, Some(0));
    assert_eq!(info.holder, Some(gb.lease().owner().to_string()));
    assert_eq!(
        redis.command(&["ZSCORE", &queue, &ghost]).await.unwrap(),
        RedisReply::Bulk(None),
        "the dead waiter was pruned"
    );
    gb.release().await.expect("release");
}

/// After `SCRIPT FLUSH` (as after a restart) every operation reloads its script and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_flush() {
    let redis = Redis::start().await.expect("kit redis");
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    basic_round(&c, "before-flush").await;
    let name = unique("flush");
    let g = c
        .lock(&name, &opts(2 * SEC).keep_alive(KeepAlive::renew()))
        .await
        .unwrap();
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    // Keep-alive (a pipeline of EVALSHAs) must survive NOSCRIPT too.
    tokio::time::sleep(2 * SEC).await;
    assert!(g.is_held(), "keep-alive failed after SCRIPT FLUSH");
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(g.release().await.unwrap(), Released::Released);
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    basic_round(&c, "after-flush").await;
    let info = c.inspect(&LockName::new(&name).unwrap()).await.unwrap();
    assert!(info.is_some_and(|i| !i.is_held()));
}

/// The connect-time probe reads the four persistence settings (one pipeline on a single
/// server) and judges them: no persistence (the kit's server) is conditional on persistence; a
/// user whose ACL refuses `CONFIG` still locks, conditional on what could not be checked; a
/// server that fsyncs every write and evicts nothing is strict, each setting asked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_judges_persistence() {
    let redis = Redis::start().await.expect("kit redis");
    let plain = backend_redis::connect(&redis.url()).await.unwrap();
    assert_eq!(
        plain.capabilities().fencing,
        Fencing::Conditional {
            assumption: backend_redis::ASSUMPTION_NO_PERSISTENCE
        }
    );

    let password = format!(">{PASSWORD}");
    let user = ["ACL", "SETUSER", "noconfig", "on", &password, "~*", "&*"];
    ok(&redis, &[&user[..], &["+@all", "-config"]].concat()).await;
    let port = redis.port();
    let url = format!("redis://noconfig:{PASSWORD}@127.0.0.1:{port}");
    let blind = backend_redis::connect(&url)
        .await
        .expect("connects without CONFIG");
    assert_eq!(
        blind.capabilities().fencing,
        Fencing::Conditional {
            assumption: backend_redis::ASSUMPTION_UNKNOWN
        }
    );
    basic_round(&blind, "noconfig").await;

    ok(&redis, &["CONFIG", "SET", "appendonly", "yes"]).await;
    ok(&redis, &["CONFIG", "SET", "appendfsync", "always"]).await;
    ok(&redis, &["CONFIG", "RESETSTAT"]).await;
    let durable = backend_redis::connect(&redis.url()).await.unwrap();
    assert_eq!(durable.capabilities().fencing, Fencing::Strict);
    assert_eq!(redis.calls("config|get").await.unwrap(), 4);
}

/// A script the server does not know (after a restart or `SCRIPT FLUSH`) is loaded with
/// `SCRIPT LOAD` (never `EVAL`, whose cached scripts Redis 8 evicts) once, however many calls
/// of it met `NOSCRIPT`: a pipeline of 20 renewals that all met it loads the script once and
/// sends the 20 again behind the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_loads_each_script_once() {
    let redis = Redis::start().await.expect("kit redis");
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    ok(&redis, &["CONFIG", "RESETSTAT"]).await;
    basic_round(&c, "first-load").await;
    let loads = redis.calls("script|load").await.unwrap();
    // The round runs a lock, a refused try and a release: two or three scripts.
    assert!(
        (2..=3).contains(&loads),
        "{loads} SCRIPT LOADs for one round"
    );
    assert_eq!(redis.calls("eval").await.unwrap(), 0);

    let keep = AcquireOptions::new()
        .ttl(3 * SEC)
        .keep_alive(KeepAlive::renew());
    let mut guards = Vec::new();
    for i in 0..20 {
        let name = unique(&format!("batch-{i}"));
        guards.push(c.lock(&name, &keep).await.expect("acquire"));
    }
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    ok(&redis, &["CONFIG", "RESETSTAT"]).await;
    // Renewals are due a third of the ttl after each grant; after 2.5 s every lease has been
    // renewed at least once, through the flushed cache.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        guards.iter().all(|g| g.is_held()),
        "a renewal failed after SCRIPT FLUSH"
    );
    assert!(redis.calls("evalsha").await.unwrap() >= 40);
    assert_eq!(
        redis.calls("script|load").await.unwrap(),
        1,
        "one script, loaded once"
    );
    assert_eq!(redis.calls("eval").await.unwrap(), 0);
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Released);
    }
}

/// A release wakes the head waiter's client only: with B and C queued behind A, A's release
/// sends one message, to B; C hears nothing until B releases and C is the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_head_waiters_client() {
    let redis = shared().await;
    wakes_only_the_head(&redis.url(), &[redis], None).await;
}

/// In a Redis 7 Cluster the same, on shard channels: each waiter's client subscribes a channel
/// in the lock's own slot on the node serving it (`SSUBSCRIBE`), and no node holds a plain
/// wake-up subscription, so a release's message never crosses the cluster bus (whose
/// outgoing links Redis 7.0 opens without `TCP_NODELAY`, delaying messages up to 40 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wakes_the_head_on_a_shard_channel_of_the_locks_node() {
    let cluster = RedisCluster::shared().await.expect("kit cluster");
    let nodes: Vec<&Redis> = cluster.nodes().iter().collect();
    wakes_only_the_head(&cluster.url(), &nodes, Some(cluster)).await;
}

/// How many channels `PUBSUB <what> <pattern>` lists on `node`.
async fn pubsub_count(node: &Redis, what: &str, pattern: &str) -> usize {
    match node.command(&["PUBSUB", what, pattern]).await {
        Ok(RedisReply::Array(Some(items))) => items.len(),
        other => panic!("PUBSUB {what}: {other:?}"),
    }
}

/// The wake-head case on `url` (served by `nodes`; `cluster` when it is one).
async fn wakes_only_the_head(url: &str, nodes: &[&Redis], cluster: Option<&RedisCluster>) {
    let prefix = format!("wake{:08x}", rand::random::<u32>());
    let url = format!("{url}?prefix={prefix}");
    let config = RedisConfig::parse(&url).unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Arc::new(RedisLock::connect(&config).await.expect("client")));
    }
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    let dyn_of = |l: &Arc<RedisLock>| -> Arc<dyn DistributedLock> { l.clone() };
    let name = unique("wake-head");
    let lock_name = LockName::new(&name).unwrap();
    // Where the waiters' channels must be: the plain `<prefix>:wake:<client>` on a single
    // server; in a Cluster the shard channels `{<prefix>:<name>}:wake:<client>` on the node
    // serving the lock's slot.
    let tag = format!("{{{prefix}:{}}}", lock_name.escaped());
    let (owner, plain_pattern, shard_pattern) = match cluster {
        None => (nodes[0], format!("{prefix}:wake:*"), None),
        Some(cluster) => {
            let slot = match nodes[0]
                .command(&["CLUSTER", "KEYSLOT", &format!("{tag}:lock")])
                .await
                .expect("keyslot")
            {
                RedisReply::Integer(s) => u16::try_from(s).expect("slot"),
                other => panic!("CLUSTER KEYSLOT: {other:?}"),
            };
            let owner = nodes[cluster.node_for_slot(slot)];
            (
                owner,
                format!("{prefix}:wake:*"),
                Some(format!("{tag}:wake:*")),
            )
        }
    };
    let ga = dyn_of(a)
        .lock(&name, &opts(30 * SEC))
        .await
        .expect("a holds");
    let wait = |who: &Arc<RedisLock>| {
        let (who, name) = (dyn_of(who), name.clone());
        tokio::spawn(async move {
            who.lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    // Queued and subscribed, in this order, before anything is released.
    let queued = |n: usize, channels: usize| {
        let (a, lock_name) = (a.clone(), lock_name.clone());
        let (plain, shard) = (plain_pattern.clone(), shard_pattern.clone());
        async move {
            within(30 * SEC, "waiters queued and subscribed", async {
                loop {
                    let waiters = a.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters);
                    let subscribed = match &shard {
                        None => pubsub_count(owner, "CHANNELS", &plain).await,
                        Some(shard) => pubsub_count(owner, "SHARDCHANNELS", shard).await,
                    };
                    if waiters == Some(n) && subscribed == channels {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
        }
    };
    let b_task = wait(b);
    queued(1, 1).await;
    let c_task = wait(c);
    queued(2, 2).await;
    if cluster.is_some() {
        for node in nodes {
            assert_eq!(
                pubsub_count(node, "CHANNELS", &plain_pattern).await,
                0,
                "a plain wake-up channel is subscribed on {}",
                node.port()
            );
        }
    }

    ga.release().await.expect("a releases");
    let gb = within(30 * SEC, "b takes over", b_task)
        .await
        .expect("task")
        .expect("b acquires");
    assert_eq!(b.stats().wakeups, 1, "the head's client is told once");
    assert_eq!(c.stats().wakeups, 0, "a waiter behind the head is not told");
    assert!(!c_task.is_finished());

    gb.release().await.expect("b releases");
    let gc = within(30 * SEC, "c takes over", c_task)
        .await
        .expect("task")
        .expect("c acquires");
    assert_eq!(c.stats().wakeups, 1);
    assert_eq!(b.stats().wakeups, 1, "b no longer waits");
    assert_eq!(a.stats().wakeups, 0, "a never waited");
    gc.release().await.expect("c releases");
}

/// Many leases with keep-alive on one client are renewed in pipelines, not one round trip per
/// lease: the client's counters show far fewer pipelines than renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_pipelined() {
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let config = RedisConfig::parse(&url).unwrap();
        let lock = Arc::new(RedisLock::connect(&config).await.expect("client"));
        let c: Arc<dyn DistributedLock> = lock.clone();
        let opts = AcquireOptions::new()
            .ttl(3 * SEC)
            .keep_alive(KeepAlive::renew())
            .wait(Wait::No);
        let base = unique("pipelined");
        let mut guards = Vec::new();
        for i in 0..200 {
            guards.push(
                c.lock(&format!("{base}/{i}"), &opts)
                    .await
                    .expect("acquire"),
            );
        }
        tokio::time::sleep(4 * SEC).await;
        for g in &guards {
            assert!(g.is_held(), "{url}: keep-alive let a lease go");
        }
        let stats = lock.stats();
        eprintln!("{url}: {stats:?}");
        assert!(stats.renewals >= 600, "{url}: {stats:?}");
        assert_eq!(stats.renewals_lost, 0, "{url}: {stats:?}");
        assert!(
            stats.renewal_batches * 50 <= stats.renewals,
            "{url}: renewals were not batched: {stats:?}"
        );
        if !url.starts_with("redis+cluster") {
            assert!(
                stats.renewal_pipelines * 20 <= stats.renewals,
                "{url}: {stats:?}"
            );
        }
        for g in guards {
            g.release().await.expect("release");
        }
    }
}

/// `inspect` reports holder, token, remaining time and live waiters; capabilities are as
/// documented for a server without persistence and for a Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_capabilities() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let caps = c.capabilities();
    assert_eq!(caps.backend, "redis");
    assert!(matches!(caps.fencing, Fencing::Conditional { .. }));
    assert_eq!(caps.fairness, lockcore::Fairness::Fifo);
    assert_eq!(caps.waiting, lockcore::WaitMechanism::PubSub);
    assert_eq!(caps.expiry, lockcore::Expiry::Ttl);
    let cluster = backend_redis::connect(&RedisCluster::shared().await.unwrap().url())
        .await
        .unwrap();
    assert!(matches!(
        cluster.capabilities().fencing,
        Fencing::Conditional { assumption } if assumption.contains("failover")
    ));

    let name = unique("inspect");
    let lock_name = LockName::new(&name).unwrap();
    assert_eq!(c.inspect(&lock_name).await.unwrap(), None, "never seen");
    let g = c.lock(&name, &opts(20 * SEC)).await.unwrap();
    let info = c.inspect(&lock_name).await.unwrap().expect("seen");
    assert_eq!(info.holder, Some(g.lease().owner().to_string()));
    assert_eq!(info.token, Some(g.fencing_token()));
    let left = info.remaining.expect("remaining");
    assert!(left > 10 * SEC && left <= 20 * SEC, "{left:?}");
    assert_eq!(info.waiters, Some(0));
    let token = g.fencing_token();
    g.release().await.unwrap();
    let info = c.inspect(&lock_name).await.unwrap().expect("seen");
    assert!(!info.is_held());
    assert_eq!(info.remaining, None);
    assert_eq!(
        info.token,
        Some(token),
        "a free lock reports its last token"
    );
}
