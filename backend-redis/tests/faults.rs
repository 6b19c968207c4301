//! Fault scenarios only Redis has, against private kit servers: a reply lost during an acquire
//! (what the armed cleanup does), a subscriber connection that goes silent, a Cluster master
//! killed without persistence or failed over to its replica, and a server killed while every
//! permit of a semaphore is held, with and without persistence. Each test's doc comment declares
//! it **safe** or **documented unsafe**. The scenarios every backend shares (kill -9 with and
//! without AOF, SIGSTOP past the ttl, blackholed holder, connections killed, holder process
//! killed, client paused) run from `conformance_tests::faults` through `tests/conformance.rs`;
//! their declarations are in `conformance_tests::catalog`.

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::kit::{Fault, Proxy, Redis, RedisCluster, RedisReply};
use conformance_tests::{FencedResource, History, Violation, within};
use lockcore::{
    AcquireOptions, DistributedLock, Fencing, FencingToken, KeepAlive, LockExt, LockGuard,
    LockName, LostReason, Released, Wait,
};

const SEC: Duration = Duration::from_secs(1);

async fn client(url: &str) -> Arc<dyn DistributedLock> {
    backend_redis::connect(url).await.expect("redis client")
}

fn unique(label: &str) -> String {
    format!("faults/{label}/{:08x}", rand::random::<u32>())
}

fn held_opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No)
}

fn plain_opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::For(30 * SEC))
}

/// Takes and releases `name` until the fence counter reaches at least `n`; returns a guard for
/// the next acquisition (token > n) with keep-alive.
async fn hold_after_bumps(c: &Arc<dyn DistributedLock>, name: &str, n: usize) -> LockGuard {
    hold_after_bumps_ttl(c, name, n, 2 * SEC).await
}

/// As [`hold_after_bumps`], the held lease with `ttl`.
async fn hold_after_bumps_ttl(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    n: usize,
    ttl: Duration,
) -> LockGuard {
    for _ in 0..n {
        let g = c.lock(name, &plain_opts(10 * SEC)).await.expect("acquire");
        g.release().await.expect("release");
    }
    c.lock(name, &held_opts(ttl)).await.expect("acquire")
}

/// **Safe.** Replies blackholed during an acquire (`Fault::BlackholeReplies` on a proxy
/// between client A and the server): the request reaches the server but A never hears back,
/// so A's acquire fails with a retryable error and nobody believes it holds the lock. What
/// the server granted is either deleted at once by A's armed cleanup (its request also
/// reaches the server) or left to its ttl: an invisible lock never has more than its ttl
/// left, and B gets the lock afterwards with a higher token. A's client recovers once the
/// link is healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_blackholed_during_acquire() {
    let redis = Redis::start().await.expect("kit redis");
    let proxy = Proxy::start(redis.addr()).await.expect("proxy");
    let a = client(&format!("{}?timeout=1s", redis.url_via(proxy.addr()))).await;
    let b = client(&redis.url()).await;
    let name = unique("blackhole");
    let lock_name = LockName::new(&name).unwrap();
    let ttl = 3 * SEC;
    let opts = AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No);

    proxy.set(Fault::BlackholeReplies);
    let outcome = within(30 * SEC, "A's blackholed acquire", a.lock(&name, &opts)).await;
    let err = match outcome {
        Ok(g) => panic!("an acquire whose reply was lost returned a guard: {g:?}"),
        Err(e) => e,
    };
    assert!(
        err.is_retryable(),
        "a lost reply is a retryable error: {err}"
    );

    let info = b.inspect(&lock_name).await.expect("inspect");
    if let Some(info) = info.filter(|i| i.is_held()) {
        let left = info.remaining.expect("a held lock has a ttl");
        assert!(
            left <= ttl,
            "an invisible lock has {left:?} left, more than its ttl"
        );
    }
    let gb = within(60 * SEC, "B acquires", b.lock(&name, &plain_opts(10 * SEC)))
        .await
        .expect("B acquires once the invisible lock is gone");
    if let Some(info) = b.inspect(&lock_name).await.expect("inspect") {
        assert_eq!(info.holder, Some(gb.lease().owner().to_string()));
    }

    proxy.set(Fault::PassThrough);
    let token_b = gb.fencing_token();
    gb.release().await.expect("release");
    let g = within(30 * SEC, "A after the blackhole", async {
        loop {
            match a.lock(&name, &plain_opts(5 * SEC)).await {
                Ok(g) => break g,
                Err(e) => {
                    assert!(
                        e.is_retryable(),
                        "unexpected error after the blackhole: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
    .await;
    assert!(g.fencing_token() > token_b);
    assert_eq!(g.release().await.expect("release"), Released::Released);
}

/// The ids of the server's pub/sub clients (`CLIENT LIST TYPE pubsub`).
async fn subscriber_ids(redis: &Redis) -> Vec<String> {
    match redis
        .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .await
        .expect("CLIENT LIST")
    {
        RedisReply::Bulk(Some(text)) => String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|l| l.split_whitespace().next()?.strip_prefix("id="))
            .map(str::to_owned)
            .collect(),
        other => panic!("unexpected CLIENT LIST reply {other:?}"),
    }
}

/// **Safe.** The waiter's subscriber connection dies silently (every connection open at that
/// moment loses its replies for good, as when a firewall drops idle connections; new ones
/// work). Nothing fails on the subscriber, so only its pings can tell: the client subscribes on
/// a new connection, and the wait ends with the holder's release, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_subscriber_is_replaced() {
    let redis = Redis::start().await.expect("kit redis");
    let proxy = Proxy::start(redis.addr()).await.expect("proxy");
    let holder = client(&redis.url()).await;
    let waiter_client = client(&format!("{}?timeout=1s", redis.url_via(proxy.addr()))).await;
    let name = unique("silent-subscriber");
    let guard = holder
        .lock(&name, &held_opts(10 * SEC))
        .await
        .expect("holder acquires");
    let token = guard.fencing_token();
    let waited = name.clone();
    let waiting = tokio::spawn(async move {
        let opts = AcquireOptions::new()
            .ttl(10 * SEC)
            .keep_alive(KeepAlive::Off)
            .wait(Wait::For(120 * SEC));
        let g = waiter_client
            .lock(&waited, &opts)
            .await
            .expect("the waiter acquires after the release");
        let token = g.fencing_token();
        g.release().await.expect("release");
        token
    });
    let first = within(30 * SEC, "the waiter's subscriber", async {
        loop {
            if let [id] = subscriber_ids(&redis).await.as_slice() {
                return id.clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // A healthy subscriber answers its pings and stays: two rounds of them (one every 5 s).
    tokio::time::sleep(12 * SEC).await;
    assert_eq!(
        subscriber_ids(&redis).await,
        std::slice::from_ref(&first),
        "a subscriber that answered its pings was replaced"
    );
    proxy.blackhole_existing_replies();
    let replacement = within(60 * SEC, "a new subscriber", async {
        loop {
            if let Some(id) = subscriber_ids(&redis)
                .await
                .into_iter()
                .find(|id| *id != first)
            {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert_ne!(replacement, first);
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    guard.release().await.expect("release");
    let next = within(60 * SEC, "the waiter", waiting)
        .await
        .expect("waiter task");
    assert!(next > token);
}

/// **Documented unsafe.** kill -9 of the Cluster master that owns a lock's slot, restarted
/// without persistence (no replicas): while it is down the cluster reports `CLUSTERDOWN`, the
/// holder's renewals fail and `lost()` fires `ConnectionLost`; once the node is back (same id
/// and slots from its `nodes.conf`, no keys) the lock is free and its fence counter restarted at
/// 1, below the token the old holder had. The same unsafety as a single server without
/// persistence (plus, with replicas, asynchronous replication on failover), which is why a
/// Cluster declares `Fencing::Conditional`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_kill9_resets_the_fence() {
    let cluster = RedisCluster::start(3).await.expect("kit cluster");
    let url = format!("{}?timeout=2s", cluster.url());
    let a = client(&url).await;
    assert!(matches!(
        a.capabilities().fencing,
        Fencing::Conditional { .. }
    ));
    let name = unique("cluster-kill9");
    let esc = LockName::new(&name).unwrap().escaped();
    let slot = match cluster
        .node(0)
        .command(&["CLUSTER", "KEYSLOT", &format!("{{dlock:{esc}}}:lock")])
        .await
        .expect("keyslot")
    {
        RedisReply::Integer(s) => u16::try_from(s).expect("slot"),
        other => panic!("CLUSTER KEYSLOT: {other:?}"),
    };
    let owner = cluster.node_for_slot(slot);
    let ga = hold_after_bumps(&a, &name, 2).await;
    assert_eq!(ga.fencing_token(), FencingToken(3));

    cluster.node(owner).kill9();
    let reason = within(60 * SEC, "A's lost()", ga.lost()).await;
    assert_eq!(reason, LostReason::ConnectionLost);
    cluster.restart_node(owner).await.expect("node restart");

    let b = client(&url).await;
    let gb = within(60 * SEC, "B acquires", async {
        loop {
            match b.lock(&name, &plain_opts(10 * SEC)).await {
                Ok(g) => break g,
                Err(e) => {
                    assert!(e.is_retryable(), "unexpected error after the restart: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    })
    .await;
    assert_eq!(
        gb.fencing_token(),
        FencingToken(1),
        "documented unsafe: the restarted master lost the fence counter"
    );
    gb.release().await.expect("release");
    drop(ga);
}

/// The index of the master that serves lock `name`'s keys, and the keys' hash-tagged base.
async fn cluster_owner(cluster: &RedisCluster, name: &str) -> (usize, String) {
    let esc = LockName::new(name).unwrap().escaped();
    let base = format!("{{dlock:{esc}}}");
    let slot = match cluster
        .node(0)
        .command(&["CLUSTER", "KEYSLOT", &format!("{base}:lock")])
        .await
        .expect("keyslot")
    {
        RedisReply::Integer(s) => u16::try_from(s).expect("slot"),
        other => panic!("CLUSTER KEYSLOT: {other:?}"),
    };
    (cluster.node_for_slot(slot), base)
}

/// Waits until master `i`'s writes so far reached its replica (`WAIT 1`).
async fn wait_replicated(cluster: &RedisCluster, i: usize) {
    let acked = cluster
        .node(i)
        .command(&["WAIT", "1", "10000"])
        .await
        .expect("WAIT");
    assert_eq!(acked, RedisReply::Integer(1), "the replica did not ack");
}

/// Takes `name` with `c` as soon as the cluster serves it again (retryable errors retried).
async fn lock_when_served(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    opts: &AcquireOptions,
) -> LockGuard {
    within(60 * SEC, "acquire after the failover", async {
        loop {
            match c.lock(name, opts).await {
                Ok(g) => break g,
                Err(e) => {
                    assert!(e.is_retryable(), "unexpected error after the failover: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
    .await
}

/// **Safe.** A Cluster master failed over after its writes reached its replica: the holder's
/// lock and the fence counter are on the promoted replica. A holder with keep-alive takes a
/// lock, the master's writes are acknowledged by its replica (`WAIT 1`), the master is killed
/// -9 and its replica promoted (`CLUSTER FAILOVER TAKEOVER`). The holder never sees `lost()`,
/// its renewals reach the new master, a contender cannot take the lock, and after the holder
/// releases the next holder's token is higher; the history is safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_after_replication_keeps_the_lock() {
    let cluster = RedisCluster::start_with_replicas(3, &[])
        .await
        .expect("kit cluster");
    let url = format!("{}?timeout=2s", cluster.url());
    let (a, b) = (client(&url).await, client(&url).await);
    let name = unique("cluster-failover-replicated");
    let (owner, base) = cluster_owner(&cluster, &name).await;
    let replica = cluster.replica(owner).expect("replica");
    let history = History::new();
    let resource = FencedResource::new();

    // The ttl outlasts the failover (kill, takeover, the client's new slot map) with room for
    // renewals that fail meanwhile.
    let ga = hold_after_bumps_ttl(&a, &name, 2, 10 * SEC).await;
    let a_hold = history.acquired(0, &ga.lease());
    resource.write(ga.fencing_token(), 1).expect("A writes");
    wait_replicated(&cluster, owner).await;

    cluster.node(owner).kill9();
    let before = ga.lease().valid_until();
    cluster.promote_replica(owner).await.expect("failover");
    let exists = replica
        .command(&["EXISTS", &format!("{base}:lock")])
        .await
        .expect("EXISTS");
    assert_eq!(
        exists,
        RedisReply::Integer(1),
        "the lock key is on the new master"
    );

    // A renewal after the kill can only have been answered by the promoted replica.
    within(30 * SEC, "a renewal on the new master", async {
        while ga.lease().valid_until() <= before {
            assert_eq!(ga.lost_reason(), None, "A lost the lock in the failover");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    history.extended(a_hold, &ga.lease());
    assert!(ga.is_held());
    assert_eq!(ga.lost_reason(), None);

    let contender = b
        .try_lock(&name, &plain_opts(10 * SEC))
        .await
        .expect("B's try_lock");
    assert!(contender.is_none(), "B took a lock A still holds");
    resource
        .write(ga.fencing_token(), 2)
        .expect("A writes again");

    let a_token = ga.fencing_token();
    history.ended(a_hold);
    assert_eq!(ga.release().await.expect("A releases"), Released::Released);
    let gb = lock_when_served(&b, &name, &plain_opts(10 * SEC)).await;
    let b_hold = history.acquired(1, &gb.lease());
    assert!(gb.fencing_token() > a_token, "B's token is not above A's");
    resource.write(gb.fencing_token(), 3).expect("B writes");
    history.ended(b_hold);
    gb.release().await.expect("B releases");

    history.assert_safe();
    resource.assert_never_accepted_stale();
    assert_eq!(resource.rejected(), 0);
}

/// **Documented unsafe.** A Cluster master failed over before its writes reached its replica:
/// the promoted replica has neither the lock nor the fence counter's last increment. The
/// replica is stopped (SIGSTOP) and its replication link cut, A takes the lock (token 3, the
/// counter at 2 replicated before), the master is killed -9 and the replica resumed and
/// promoted (`CLUSTER FAILOVER TAKEOVER`). B acquires at once, while A's lease still runs, and
/// gets token 3 again: the checker finds the overlap and the repeated token, and the fenced
/// resource accepts both holders' writes (it cannot tell them apart). This is why a Cluster
/// declares `Fencing::Conditional`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_before_replication_loses_the_lock_and_its_token() {
    let cluster = RedisCluster::start_with_replicas(3, &[])
        .await
        .expect("kit cluster");
    let url = format!("{}?timeout=2s", cluster.url());
    let (a, b) = (client(&url).await, client(&url).await);
    let name = unique("cluster-failover-unreplicated");
    let (owner, base) = cluster_owner(&cluster, &name).await;
    let replica = cluster.replica(owner).expect("replica");
    let history = History::new();
    let resource = FencedResource::new();

    for _ in 0..2 {
        let g = a.lock(&name, &plain_opts(10 * SEC)).await.expect("acquire");
        g.release().await.expect("release");
    }
    wait_replicated(&cluster, owner).await;
    replica.pause();
    // A stopped replica still has its socket: what the master sends lands in its receive
    // buffer and is read on SIGCONT. Closing the link from the master's side makes the write
    // below miss the replica for sure.
    let killed = cluster
        .node(owner)
        .command(&["CLIENT", "KILL", "TYPE", "replica"])
        .await
        .expect("CLIENT KILL");
    assert_eq!(
        killed,
        RedisReply::Integer(1),
        "the replica link was not cut"
    );

    // No keep-alive: A's lease runs its full ttl, with no renewal to tell A of the loss.
    let ga = a
        .lock(&name, &plain_opts(10 * SEC))
        .await
        .expect("A acquires");
    assert_eq!(ga.fencing_token(), FencingToken(3));
    let a_hold = history.acquired(0, &ga.lease());
    resource.write(ga.fencing_token(), 1).expect("A writes");

    cluster.node(owner).kill9();
    replica.resume();
    cluster.promote_replica(owner).await.expect("failover");
    let on_new_master = |key: &'static str| {
        let key = format!("{base}:{key}");
        async move { replica.command(&["GET", &key]).await.expect("GET") }
    };
    assert_eq!(
        on_new_master("lock").await,
        RedisReply::Bulk(None),
        "the lock key came over"
    );
    assert_eq!(
        on_new_master("fence").await,
        RedisReply::Bulk(Some(b"2".to_vec())),
        "the fence counter is not the replicated one"
    );

    let gb = lock_when_served(&b, &name, &plain_opts(10 * SEC)).await;
    let b_hold = history.acquired(1, &gb.lease());
    assert!(ga.is_held(), "A's lease ran out before B acquired");
    assert_eq!(
        gb.fencing_token(),
        ga.fencing_token(),
        "documented unsafe: the promoted replica hands A's token out again"
    );
    // The resource cannot tell the two holders apart: both write under token 3.
    resource.write(gb.fencing_token(), 2).expect("B writes");
    resource
        .write(ga.fencing_token(), 3)
        .expect("A, no longer the holder, writes");
    assert_eq!(resource.accepted(), vec![(3, 1), (3, 2), (3, 3)]);
    assert_eq!(resource.rejected(), 0);

    history.ended(b_hold);
    gb.release().await.expect("B releases");
    history.ended(a_hold);
    let kinds: Vec<&str> = history.violations().iter().map(Violation::kind).collect();
    assert_eq!(
        kinds,
        ["token-order", "overlap"],
        "{:?}",
        history.violations()
    );
    drop(ga);
}

/// **Liveness.** Every master of a Cluster killed -9 at once and restarted from its
/// `nodes.conf`, three times in a row, while clients hold and wait for locks and read locks:
/// after each restart every client takes a lock again. A client whose cluster connection was
/// left without any node connection while the whole cluster was down would fail every command
/// with `ClusterConnectionNotFound` for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_clients_recover_after_every_master_restarts() {
    use lockcore::ReadWriteExt;
    let cluster = RedisCluster::start_with(3, &["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .expect("kit cluster");
    let url = format!("{}?timeout=1s", cluster.url());
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url).await);
    }
    let name = unique("cluster-restart-all");
    for round in 1..=3 {
        // A reader holds; the other clients queue for the write lock behind it.
        let reader = clients[0]
            .read_lock(&name, &held_opts(2 * SEC))
            .await
            .expect("read lock");
        let mut waiting = tokio::task::JoinSet::new();
        for c in &clients[1..] {
            let (c, name) = (c.clone(), name.clone());
            waiting.spawn(async move {
                let opts = AcquireOptions::new()
                    .ttl(2 * SEC)
                    .keep_alive(KeepAlive::Off)
                    .wait(Wait::For(3 * SEC));
                let mut last = String::from("none");
                let taken = tokio::time::timeout(60 * SEC, async {
                    loop {
                        match c.lock(&name, &opts).await {
                            Ok(g) => break g,
                            Err(e) => {
                                assert!(
                                    e.is_retryable()
                                        || matches!(e, lockcore::Error::Timeout { .. }),
                                    "unexpected error: {e}"
                                );
                                last = e.to_string();
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                })
                .await;
                match taken {
                    Ok(g) => {
                        let _ = g.release().await;
                        Ok(())
                    }
                    Err(_) => Err(last),
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.nodes().iter().for_each(Redis::kill9);
        within(30 * SEC, "the reader's lost()", reader.lost()).await;
        cluster.restart_all().await.expect("restart every master");
        while let Some(r) = waiting.join_next().await {
            if let Err(last) = r.expect("waiter task") {
                panic!(
                    "round {round}: a client got no lock within 60 s after every master \
                     restarted; its last error: {last}"
                );
            }
        }
        drop(reader);
    }
}

/// Takes every permit of the semaphore `name` (`permits` of them, ttl 60 s, no keep-alive) on
/// `c`, after `bumps` grants and releases, retrying while a restarted server still loads.
async fn fill_semaphore(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    permits: u32,
    bumps: usize,
) -> Vec<lockcore::PermitGuard> {
    use lockcore::SemaphoreExt;
    let sem = c.semaphore(name, permits).expect("semaphore");
    let opts = plain_opts(60 * SEC);
    for _ in 0..bumps {
        let p = sem.acquire(&opts).await.expect("permit");
        p.release().await.expect("release");
    }
    let mut held = Vec::new();
    for _ in 0..permits {
        held.push(sem.acquire(&opts).await.expect("permit"));
    }
    held
}

/// One permit try on `c` once the restarted server answers (`None`: all taken).
async fn try_permit_after_restart(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    permits: u32,
) -> Option<lockcore::PermitGuard> {
    use lockcore::SemaphoreExt;
    let sem = c.semaphore(name, permits).expect("semaphore");
    within(60 * SEC, "a permit try after the restart", async {
        loop {
            match sem.try_acquire(&plain_opts(60 * SEC)).await {
                Ok(p) => break p,
                Err(e) => {
                    assert!(e.is_retryable(), "unexpected error after the restart: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
    .await
}

/// **Safe.** kill -9 of a server with `appendonly yes` + `appendfsync always` while every permit
/// of a semaphore is held, then a restart: the permits come back with their absolute expiry
/// (the AOF holds each grant's `ZADD`), so a newcomer is still refused; the holders' leases are
/// still theirs (an extend keeps the token); and the semaphore's counter came back, so the
/// next grant's token is above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_survives_kill9_with_persistence() {
    let redis = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .expect("kit redis");
    let a = client(&redis.url()).await;
    assert_eq!(a.capabilities().fencing, Fencing::Strict);
    let name = unique("sem-durable");
    let held = fill_semaphore(&a, &name, 2, 3).await;
    let top = held.iter().map(|p| p.fencing_token()).max().unwrap();
    assert_eq!(top, FencingToken(5));

    redis.kill9();
    redis.restart().await.expect("restart");
    let b = client(&redis.url()).await;
    assert!(
        try_permit_after_restart(&b, &name, 2).await.is_none(),
        "a permit was lost by the restart: the semaphore admitted a third holder"
    );
    for p in &held {
        let renewed = within(30 * SEC, "extend after the restart", async {
            loop {
                match a.extend(&p.lease(), 60 * SEC).await {
                    Ok(l) => break l,
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("extend after the restart: {e}"),
                }
            }
        })
        .await;
        assert_eq!(renewed.token(), p.fencing_token());
    }
    let mut held = held.into_iter();
    let first = held.next().unwrap();
    assert_eq!(first.release().await.expect("release"), Released::Released);
    let next = try_permit_after_restart(&b, &name, 2)
        .await
        .expect("the freed permit");
    assert!(
        next.fencing_token() > top,
        "{} <= {top}",
        next.fencing_token()
    );
    next.release().await.expect("release");
    for p in held {
        p.release().await.expect("release");
    }
}

/// **Documented unsafe.** The same kill -9 on a server without persistence: the restarted
/// server has no permits and no counter, so two newcomers get in beside the two old holders
/// (whose leases are still valid on their clocks), and the next token starts again at 1, below
/// the old holders' tokens. Why a server without `appendfsync always` declares
/// `Fencing::Conditional`, for permits as for locks; the old holders' extends say `LockLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_loses_its_permits_and_counter_without_persistence() {
    let redis = Redis::start().await.expect("kit redis");
    let a = client(&redis.url()).await;
    assert!(matches!(
        a.capabilities().fencing,
        Fencing::Conditional { .. }
    ));
    let name = unique("sem-volatile");
    let held = fill_semaphore(&a, &name, 2, 3).await;

    redis.kill9();
    redis.restart().await.expect("restart");
    let b = client(&redis.url()).await;
    let first = try_permit_after_restart(&b, &name, 2)
        .await
        .expect("documented unsafe: the restarted server admits a newcomer");
    let second = try_permit_after_restart(&b, &name, 2)
        .await
        .expect("documented unsafe: and a second one, beside the two old holders");
    assert_eq!(
        first.fencing_token(),
        FencingToken(1),
        "documented unsafe: the semaphore's counter starts again"
    );
    assert_eq!(second.fencing_token(), FencingToken(2));
    let old: Vec<FencingToken> = held.iter().map(|p| p.fencing_token()).collect();
    assert_eq!(old, [FencingToken(4), FencingToken(5)]);
    for p in &held {
        let answer = within(30 * SEC, "extend after the restart", async {
            loop {
                match a.extend(&p.lease(), 60 * SEC).await {
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    other => break other,
                }
            }
        })
        .await;
        assert!(
            matches!(answer, Err(lockcore::Error::LockLost { .. })),
            "an old permit was renewed on a server that lost it: {answer:?}"
        );
    }
    first.release().await.expect("release");
    second.release().await.expect("release");
    drop(held);
}

/// **Safe.** The server closes an idle client's connection (`CLIENT KILL`, a restarted proxy,
/// an idle timeout): the next extend, inspect and release go over a new connection instead of
/// failing with "broken pipe", so a holder whose connection died while it worked still frees
/// its lock at once, and the lock is free afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_an_idle_connection_was_killed_reconnect() {
    use conformance_tests::kit::ServerControl as _;
    let redis = Redis::start().await.expect("kit redis");
    let c = client(&redis.url()).await;
    let name = unique("idle-killed");
    let opts = AcquireOptions::new()
        .ttl(60 * SEC)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No);
    let guard = c.lock(&name, &opts).await.expect("acquire");
    let kill = || async {
        let killed = redis.kill_client_connections().await.expect("CLIENT KILL");
        assert!(killed >= 1, "the client's connection was not killed");
        // Long enough for the client's connection to see the close before it is used again.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    kill().await;
    guard.extend(60 * SEC).await.expect("extend after the kill");
    kill().await;
    let info = c
        .inspect(&LockName::new(&name).expect("name"))
        .await
        .expect("inspect after the kill")
        .expect("the lock is held");
    assert_eq!(info.token, Some(guard.fencing_token()));
    kill().await;
    let released = guard.release().await.expect("release after the kill");
    assert_eq!(released, Released::Released);
    let again = c.lock(&name, &opts).await.expect("the lock is free again");
    again.release().await.expect("release");
}
