//! Redlock's own tests, on the kit's masters: the quorum matrix, node faults (a minority killed
//! or blackholed, a majority down, replies slower than the lease), fencing across node restarts,
//! the documented-unsafe schedule (a node restarted without persistence) next to the same
//! schedule made safe by keeping the node out for the ttl, and wake-ups from any node.
//!
//! The shared suite and the shared fault scenarios (every node broken at once) run on Redlock
//! in `tests/conformance.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_redis::RedlockLock;
use backend_redis::config::RedisConfig;
use conformance_tests::kit::{Fault, Proxy, Redis, RedisReply, RedisSet, redis_command};
use conformance_tests::{FencedResource, History, Hold};
use lockcore::{
    AcquireOptions, DistributedLock, Error, Fencing, FencingToken, KeepAlive, LockExt, LockGuard,
    LockName, Released, Wait,
};

const SEC: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Fails instead of hanging.
async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

fn once(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
}

fn url_of(addrs: &[String], query: &str) -> String {
    format!("redlock://{}?{query}", addrs.join(","))
}

fn addrs(set: &RedisSet) -> Vec<String> {
    set.nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect()
}

async fn connect(url: &str) -> Arc<dyn DistributedLock> {
    backend_redis::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// The holder key of `name` on a node (default prefix).
fn lock_key(name: &str) -> String {
    format!(
        "{{dlock:{}}}:lock",
        LockName::new(name).expect("name").escaped()
    )
}

async fn get(node: &Redis, key: &str) -> Option<String> {
    match redis_command(node.addr(), &["GET", key])
        .await
        .expect("GET")
    {
        RedisReply::Bulk(None) => None,
        other => other.as_text(),
    }
}

async fn exists(node: &Redis, key: &str) -> bool {
    redis_command(node.addr(), &["EXISTS", key])
        .await
        .expect("EXISTS")
        == RedisReply::Integer(1)
}

/// Another owner's holder key on `node`, outside dlock.
async fn occupy(node: &Redis, name: &str) {
    let reply = redis_command(
        node.addr(),
        &["SET", &lock_key(name), "blocker", "PX", "60000"],
    )
    .await
    .expect("SET");
    assert_eq!(reply, RedisReply::Status("OK".into()));
}

async fn vacate(node: &Redis, name: &str) {
    redis_command(node.addr(), &["DEL", &lock_key(name)])
        .await
        .expect("DEL");
}

/// Waits until no node has a holder key or a queue for `name` other than `blocker`'s.
async fn nothing_left(set: &RedisSet, name: &str) {
    let key = lock_key(name);
    let queue = key.replace(":lock", ":queue");
    within(10 * SEC, "the failed acquire's clean-up", async {
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
    })
    .await;
}

/// `names()` is the union of the nodes' names: a node that is down when listing does not hide
/// the others' names, and a name only one node knows is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_the_union_of_the_nodes() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let client = connect(&url_of(&addrs(&set), "node_timeout=200ms&timeout=1s")).await;
    client
        .try_lock("everywhere", &once(30 * SEC))
        .await
        .expect("acquire")
        .expect("free")
        .release()
        .await
        .expect("release");
    set.nodes()[0].pause();
    client
        .try_lock("without-node-0", &once(30 * SEC))
        .await
        .expect("a majority grants")
        .expect("free")
        .release()
        .await
        .expect("release");
    let mut names: Vec<String> = client
        .names()
        .await
        .expect("names with a node down")
        .iter()
        .map(|n| n.as_str().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["everywhere", "without-node-0"]);
    set.nodes()[0].resume();
    // A name whose counter only node 0 still has is listed too.
    let fence = lock_key("only-node-0").replace("}:lock", "}:fence");
    redis_command(set.nodes()[0].addr(), &["SET", &fence, "7"])
        .await
        .expect("SET");
    let names = client.names().await.expect("names");
    assert!(
        names.iter().any(|n| n.as_str() == "only-node-0"),
        "{names:?}"
    );
    assert_eq!(names.len(), 3, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_matrix_acquire_succeeds_exactly_when_a_majority_is_free() {
    for n in [3usize, 5] {
        let set = RedisSet::start(n, &[]).await.expect("kit masters");
        let client = connect(&url_of(&addrs(&set), "node_timeout=1s")).await;
        let quorum = n / 2 + 1;
        for mask in 0u32..(1 << n) {
            let name = format!("matrix/{n}/{mask:05b}");
            let occupied: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            for &i in &occupied {
                occupy(&set.nodes()[i], &name).await;
            }
            let free = n - occupied.len();
            let got = client
                .try_lock(&name, &once(30 * SEC))
                .await
                .unwrap_or_else(|e| panic!("N={n} occupied {occupied:?}: {e}"));
            match got {
                Some(guard) => {
                    assert!(
                        free >= quorum,
                        "N={n}: granted with only {free} free nodes (occupied {occupied:?})"
                    );
                    // Occupied nodes keep the other owner; at least a majority holds ours (a
                    // free node slower than the vote's grace may have been left out and undone).
                    let owner = guard.lease().owner().to_string();
                    let mut ours = 0;
                    for (i, node) in set.nodes().iter().enumerate() {
                        let holder = get(node, &lock_key(&name)).await;
                        if occupied.contains(&i) {
                            assert_eq!(holder.as_deref(), Some("blocker"), "N={n} node {i}");
                        } else {
                            ours += usize::from(holder.as_deref() == Some(owner.as_str()));
                        }
                    }
                    assert!(ours >= quorum, "N={n}: only {ours} nodes hold the grant");
                    guard.release().await.expect("release");
                    for &i in &occupied {
                        vacate(&set.nodes()[i], &name).await;
                    }
                    nothing_left(&set, &name).await;
                }
                None => {
                    assert!(
                        free < quorum,
                        "N={n}: refused with {free} free nodes (occupied {occupied:?})"
                    );
                    nothing_left(&set, &name).await;
                    for &i in &occupied {
                        assert_eq!(
                            get(&set.nodes()[i], &lock_key(&name)).await.as_deref(),
                            Some("blocker"),
                            "N={n}: a failed acquire touched another owner's key on node {i}"
                        );
                    }
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_still_acquires_and_a_majority_down_is_a_quorum_error() {
    for n in [3usize, 5] {
        let set = RedisSet::start(n, &[]).await.expect("kit masters");
        let client = connect(&url_of(&addrs(&set), "node_timeout=500ms")).await;
        let quorum = n / 2 + 1;
        let name = format!("down/{n}");
        for node in &set.nodes()[quorum..] {
            node.kill9();
        }
        let guard = client
            .try_lock(&name, &once(30 * SEC))
            .await
            .expect("a minority down")
            .expect("granted by the live majority");
        guard.release().await.expect("release");
        set.nodes()[quorum - 1].kill9();
        match client.try_lock(&name, &once(30 * SEC)).await {
            Err(Error::QuorumNotReached { got, needed, .. }) => {
                assert_eq!(needed, quorum);
                assert!(got < quorum, "{got} of {needed}");
            }
            Err(e) => panic!("N={n}: a majority down gave {e}, not a quorum error"),
            Ok(g) => panic!(
                "N={n}: a majority down gave {:?}, not a quorum error",
                g.map(|g| g.fencing_token())
            ),
        }
        let waited = client
            .lock(&name, &once(30 * SEC).wait(Wait::For(2 * SEC)))
            .await;
        assert!(
            matches!(waited, Err(Error::QuorumNotReached { .. })),
            "N={n}: a waiting acquire with a majority down: {:?}",
            waited.map(|g| g.fencing_token())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_minority_does_not_stop_acquire_or_release() {
    let set = RedisSet::start(5, &[]).await.expect("kit masters");
    let mut proxies = Vec::new();
    for node in &set.nodes()[3..] {
        proxies.push(Proxy::start(node.addr()).await.expect("proxy"));
    }
    let mut hosts = addrs(&set)[..3].to_vec();
    hosts.extend(proxies.iter().map(|p| p.addr().to_string()));
    let client = connect(&url_of(&hosts, "node_timeout=100ms")).await;
    tokio::task::block_in_place(|| {
        for p in &proxies {
            p.set(Fault::BlackholeReplies);
        }
    });
    let mut last = 0;
    for round in 0..5 {
        let guard = within(
            10 * SEC,
            "acquire",
            client.try_lock("blackholed", &once(30 * SEC)),
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: {e}"))
        .unwrap_or_else(|| panic!("round {round}: refused with three nodes free"));
        assert!(guard.fencing_token().0 > last, "tokens increase");
        last = guard.fencing_token().0;
        guard
            .extend(30 * SEC)
            .await
            .expect("extend by the majority");
        guard.release().await.expect("release");
    }
    tokio::task::block_in_place(|| {
        for p in &proxies {
            p.set(Fault::PassThrough);
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_slower_than_the_lease_fail_the_acquire_and_leave_nothing() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let mut proxies = Vec::new();
    for node in set.nodes() {
        proxies.push(Proxy::start(node.addr()).await.expect("proxy"));
    }
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let client = connect(&url_of(&hosts, "node_timeout=5s")).await;
    tokio::task::block_in_place(|| {
        for p in &proxies {
            p.set(Fault::Latency(ms(400)));
        }
    });
    // A 20 s key but 500 ms of validity: the grants arrive after ~800 ms, when the lease would
    // already be over; the keys must then be deleted by the clean-up, not by their ttl.
    let opts = once(20 * SEC).drift(ms(19_500));
    let name = "slow-replies";
    let failed = within(30 * SEC, "the slow acquire", client.try_lock(name, &opts)).await;
    match failed {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(g) => panic!(
            "an acquire slower than its lease returned {:?}",
            g.map(|g| g.fencing_token())
        ),
    }
    // Within nothing_left's 10 s guard, well before the keys' 20 s ttl: the clean-up removed them.
    nothing_left(&set, name).await;
    tokio::task::block_in_place(|| {
        for p in &proxies {
            p.set(Fault::PassThrough);
        }
    });
    let g = client
        .try_lock(name, &once(5 * SEC))
        .await
        .expect("acquire after the latency")
        .expect("free");
    g.release().await.expect("release");
}

/// Takes and releases `name` `times` times through `client`.
async fn bump(client: &Arc<dyn DistributedLock>, name: &str, times: usize) -> u64 {
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

fn hold(client: usize, guard: &LockGuard, acquired: Instant) -> Hold {
    let lease = guard.lease();
    Hold {
        client,
        name: lease.name().as_str().to_owned(),
        token: lease.token().0,
        acquired,
        valid_until: lease.valid_until(),
        ended: None,
    }
}

/// The schedule of the Redlock debate: the holder has A, B, C (D and E are taken by someone
/// else); C crashes and restarts; a second client then gets C, D, E. With C back at once and
/// empty (no persistence), both clients hold the lock at the same time: that is the documented
/// unsafety. Fencing still protects the resource: the second client's token is above every
/// counter it heard (A and B refused it with theirs), so the first client's late write is
/// refused. With C kept out for the ttl, the first lease is over before the second begins.
async fn restart_schedule(keep_out: bool) -> (History, FencedResource, u64, u64) {
    let set = RedisSet::start(5, &[]).await.expect("kit masters");
    let nodes = set.nodes();
    let url = url_of(&addrs(&set), "node_timeout=1s");
    let first = connect(&url).await;
    let name = if keep_out { "kept-out" } else { "restarted" };
    for e in &nodes[3..] {
        occupy(e, name).await;
    }
    let earlier = bump(&first, name, 3).await;
    let ttl = if keep_out { 2 * SEC } else { 30 * SEC };
    let g1 = first
        .try_lock(name, &once(ttl))
        .await
        .expect("first acquires")
        .expect("A, B, C are free");
    let t1 = g1.fencing_token().0;
    assert!(t1 > earlier);
    let history = History::new();
    history.push(hold(1, &g1, Instant::now()));
    let fenced = FencedResource::new();
    fenced
        .write(g1.fencing_token(), 1)
        .expect("the first holder writes");

    nodes[2].kill9();
    if keep_out {
        // Kept out until the first lease is over everywhere (its keys on A and B expire).
        let over = g1.lease().valid_until() + g1.lease().drift() + ms(50);
        tokio::time::sleep_until(over.into()).await;
    }
    nodes[2].restart().await.expect("C restarts, empty");
    for e in &nodes[3..] {
        vacate(e, name).await;
    }
    // A client that starts now (an older one's first request to C would meet the connection
    // the crash broke, and lose that node's vote). It reaches C, D and E through 30 ms of
    // latency, so that A's and B's answers (with their counters) arrive before its majority
    // does, however the machine schedules.
    let mut slow = Vec::new();
    for node in &nodes[2..] {
        let proxy = Proxy::start(node.addr()).await.expect("proxy");
        tokio::task::block_in_place(|| proxy.set(Fault::Latency(ms(30))));
        slow.push(proxy);
    }
    let mut hosts = addrs(&set)[..2].to_vec();
    hosts.extend(slow.iter().map(|p| p.addr().to_string()));
    let second = connect(&url_of(&hosts, "node_timeout=2s")).await;
    let g2 = second
        .try_lock(name, &once(30 * SEC))
        .await
        .expect("second acquires")
        .expect("C, D, E grant");
    let t2 = g2.fencing_token().0;
    history.push(hold(2, &g2, Instant::now()));
    fenced
        .write(g2.fencing_token(), 2)
        .expect("the second holder's write is accepted");
    let late = fenced.write(g1.fencing_token(), 3);
    assert!(
        late.is_err(),
        "the first holder's late write (token {t1}) was accepted after token {t2}"
    );
    g2.release().await.expect("release");
    drop(g1);
    (history, fenced, t1, t2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_unsafe_a_node_restarted_without_persistence_lets_two_hold_but_fencing_refuses_the_stale_write()
 {
    let (history, fenced, t1, t2) = restart_schedule(false).await;
    let violations = history.violations();
    assert!(
        !violations.is_empty(),
        "the schedule should show two holders at once (the documented unsafety)"
    );
    assert!(
        t2 > t1,
        "the second token {t2} is above the first {t1}: A and B refused with their counters"
    );
    assert_eq!(fenced.accepted().len(), 2, "one write per holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_schedule_with_the_node_kept_out_for_the_ttl_is_safe() {
    let (history, _fenced, t1, t2) = restart_schedule(true).await;
    assert_eq!(history.violations(), vec![], "no two holders at once");
    assert!(t2 > t1, "tokens increase: {t1} then {t2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_minority_restarts_with_persistence() {
    let set = RedisSet::start(3, &["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .expect("kit masters with AOF");
    let url = url_of(&addrs(&set), "node_timeout=1s");
    let client = connect(&url).await;
    assert_eq!(
        client.capabilities().fencing,
        Fencing::Strict,
        "every node fsyncs every write"
    );
    let name = "persisted";
    let mut last = bump(&client, name, 3).await;
    for i in 0..3 {
        set.nodes()[i].kill9();
        let during = bump(&client, name, 2).await;
        assert!(during > last, "node {i} down: {during} after {last}");
        set.nodes()[i]
            .restart()
            .await
            .expect("restart with its AOF");
        let after = bump(&client, name, 2).await;
        assert!(after > during, "node {i} back: {after} after {during}");
        last = after;
    }
}

/// A floored grant's token is the floor although every granting node's INCR gave a lower
/// number: the write-back raises those nodes' counters to the floor before the lease is
/// returned, so a plain acquire afterwards gets a higher token, even with a node that refused
/// the floored grant (and kept its low counter) voting in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floored_grant_writes_the_floor_back_so_later_tokens_are_higher() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let client = connect(&url_of(&addrs(&set), "node_timeout=1s")).await;
    let name = "floored";
    let fence_key = lock_key(name).replace(":lock", ":fence");
    assert_eq!(
        bump(&client, name, 2).await,
        2,
        "every node's counter is at 2"
    );

    // Node 2 is taken by someone else: nodes 0 and 1 grant (their INCRs give 3), node 2 refuses.
    occupy(&set.nodes()[2], name).await;
    let floor = 1000u64;
    let g = client
        .try_lock(name, &once(10 * SEC).token_floor(FencingToken(floor)))
        .await
        .expect("acquire")
        .expect("a majority is free");
    assert_eq!(g.fencing_token(), FencingToken(floor));
    for node in &set.nodes()[..2] {
        assert_eq!(
            get(node, &fence_key).await,
            Some(floor.to_string()),
            "a granting node's counter was not raised to the floor"
        );
    }
    assert_eq!(
        get(&set.nodes()[2], &fence_key).await,
        Some("2".to_owned()),
        "the refusing node's counter changed"
    );
    assert_eq!(g.release().await.expect("release"), Released::Released);

    vacate(&set.nodes()[2], name).await;
    let after = client
        .try_lock(name, &once(10 * SEC))
        .await
        .expect("acquire")
        .expect("free");
    assert_eq!(
        after.fencing_token(),
        FencingToken(floor + 1),
        "the plain grant after the floored one did not continue from the floor"
    );
    after.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_the_nodes_wakes_the_waiter_and_inspect_shows_every_node() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let url = url_of(&addrs(&set), "node_timeout=1s");
    let config = RedisConfig::parse(&url).expect("url");
    let waiter = Arc::new(RedlockLock::connect(&config).await.expect("connect"));
    let holder: Arc<dyn DistributedLock> =
        Arc::new(RedlockLock::connect(&config).await.expect("connect"));
    let waiter_client: Arc<dyn DistributedLock> = waiter.clone();
    let name = "wake";
    let g = holder
        .try_lock(name, &once(30 * SEC))
        .await
        .expect("acquire")
        .expect("free");
    let info = holder
        .inspect(&LockName::new(name).unwrap())
        .await
        .expect("inspect")
        .expect("known");
    assert_eq!(info.holder, Some(g.lease().owner().to_string()));
    assert_eq!(info.details.len(), 3, "{:?}", info.details);
    // A majority at least (a node slower than the vote's grace is left out and undone).
    let holding = info
        .details
        .iter()
        .filter(|d| d.contains("held by"))
        .count();
    assert!(holding >= 2, "{:?}", info.details);
    let waiting = tokio::spawn(async move {
        waiter_client
            .lock(name, &once(30 * SEC).wait(Wait::For(30 * SEC)))
            .await
    });
    // Long enough for the waiter to queue and subscribe on every node.
    tokio::time::sleep(ms(700)).await;
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    let before = waiter.wakeups();
    g.release().await.expect("release");
    let got = within(30 * SEC, "the waiter", waiting)
        .await
        .expect("task")
        .expect("the waiter acquires");
    assert!(
        waiter.wakeups() > before,
        "the release reached the waiter as a wake-up message"
    );
    got.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_needs_a_majority_and_says_which_nodes_failed() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let hosts = addrs(&set);
    set.nodes()[2].kill9();
    let client = connect(&url_of(&hosts, "node_timeout=200ms")).await;
    assert!(
        matches!(client.capabilities().fencing, Fencing::Conditional { .. }),
        "an unreachable node's persistence is unknown"
    );
    set.nodes()[1].kill9();
    let err = backend_redis::connect(&url_of(&hosts, "timeout=1s"))
        .await
        .expect_err("one node of three");
    let text = err.to_string();
    assert!(text.contains("only 1 of 3 nodes"), "{text}");
    assert!(
        text.contains(&hosts[1]) && text.contains(&hosts[2]),
        "{text}"
    );
    assert!(err.is_retryable(), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_says_quorum_lost_when_renewals_stop_reaching_a_majority() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let client = connect(&url_of(&addrs(&set), "node_timeout=200ms")).await;
    let opts = AcquireOptions::new()
        .ttl(SEC)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let guard = client
        .try_lock("renewed", &opts)
        .await
        .expect("acquire")
        .expect("free");
    // Renewals keep it past its ttl while a majority answers, even with one node gone.
    set.nodes()[2].kill9();
    tokio::time::sleep(2 * SEC).await;
    assert!(
        guard.is_held() && guard.lost_reason().is_none(),
        "one node of three down: {:?}",
        guard.lost_reason()
    );
    set.nodes()[1].kill9();
    let reason = within(10 * SEC, "lost()", guard.lost()).await;
    assert_eq!(reason, lockcore::LostReason::QuorumLost);
    assert!(!guard.is_held());
}

/// `name`'s queue on `node`: each entry with its arrival ticket.
async fn queue_entries(node: &Redis, name: &str) -> Vec<(String, String)> {
    let queue = lock_key(name).replace(":lock", ":queue");
    let reply = redis_command(node.addr(), &["ZRANGE", &queue, "0", "-1", "WITHSCORES"])
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

async fn fence_of(node: &Redis, name: &str) -> u64 {
    let key = lock_key(name).replace(":lock", ":fence");
    get(node, &key)
        .await
        .map_or(0, |v| v.parse().expect("a counter"))
}

/// A waiter that loses a split vote gives the lock back but keeps its place: with the holder
/// gone from one node only, every re-check wins that node and loses the others (a split), and
/// the waiters' entries there keep their arrival tickets throughout. Before, each split sent
/// the loser to the back of that node's queue (a new ticket), so the nodes' queues drifted
/// apart and votes split more. Once the holder releases, both waiters get the lock and their
/// releases leave no queue entry behind on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_keeps_the_waiters_places_and_releases_leave_no_entries() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let url = url_of(&addrs(&set), "node_timeout=1s");
    let holder = connect(&url).await;
    let name = "keeps-place";
    let held = holder
        .try_lock(name, &once(30 * SEC))
        .await
        .expect("acquire")
        .expect("free");
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let client = connect(&url).await;
        waiters.push(tokio::spawn(async move {
            let opts = once(30 * SEC).wait(Wait::For(30 * SEC));
            let guard = client.lock(name, &opts).await?;
            guard.release().await.map(|_| ())
        }));
        // Queued in this order on every node.
        tokio::time::sleep(ms(300)).await;
    }
    let node = &set.nodes()[0];
    let before = queue_entries(node, name).await;
    assert_eq!(before.len(), 2, "both waiters queued: {before:?}");
    let fence = fence_of(node, name).await;
    // The holder's key goes from node 0 only: each waiter's re-check (every 0.5 s or so) wins
    // node 0 and loses the two others.
    vacate(node, name).await;
    within(20 * SEC, "a split vote on node 0", async {
        while fence_of(node, name).await < fence + 2 {
            tokio::time::sleep(ms(50)).await;
        }
    })
    .await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter got the lock while a majority was held"
    );
    assert_eq!(
        queue_entries(node, name).await,
        before,
        "a split vote moved a waiter in node 0's queue"
    );
    held.release().await.expect("release");
    for waiter in waiters {
        within(30 * SEC, "a waiter", waiter)
            .await
            .expect("task")
            .expect("the waiter acquires and releases");
    }
    for node in set.nodes() {
        assert_eq!(
            queue_entries(node, name).await,
            Vec::<(String, String)>::new(),
            "a queue entry outlived its waiter's release on {}",
            node.addr()
        );
    }
}

/// A release is decided by a majority: with one node paused it returns `Released`, and the
/// paused node's delete, already on its connection, lands once the node resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_returns_at_a_majority_and_the_slow_node_still_gets_its_delete() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let client = connect(&url_of(&addrs(&set), "node_timeout=1s&timeout=30s")).await;
    let name = "slow-release";
    let guard = client
        .try_lock(name, &once(60 * SEC))
        .await
        .expect("acquire")
        .expect("free");
    let slow = &set.nodes()[2];
    assert!(exists(slow, &lock_key(name)).await, "held on every node");
    slow.pause();
    let released = within(20 * SEC, "release", guard.release()).await;
    slow.resume();
    assert_eq!(released.expect("release"), Released::Released);
    within(20 * SEC, "the slow node's delete", async {
        while exists(slow, &lock_key(name)).await {
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
}

/// A waiter that wins keeps its queue entries until it releases (see the test above); `inspect`
/// does not count the holder among the waiters meanwhile, and the release takes the entries out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_waited_is_not_counted_as_a_waiter() {
    let set = RedisSet::start(3, &[]).await.expect("kit masters");
    let url = url_of(&addrs(&set), "node_timeout=1s");
    let (holder, waiter) = (connect(&url).await, connect(&url).await);
    let name = "waited";
    let first = holder
        .try_lock(name, &once(30 * SEC))
        .await
        .expect("acquire")
        .expect("free");
    let waiting = tokio::spawn(async move {
        waiter
            .lock(name, &once(30 * SEC).wait(Wait::For(30 * SEC)))
            .await
    });
    within(10 * SEC, "the waiter queues everywhere", async {
        while futures_util::future::join_all(set.nodes().iter().map(|n| queue_entries(n, name)))
            .await
            .iter()
            .any(Vec::is_empty)
        {
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
    first.release().await.expect("release");
    let second = within(30 * SEC, "the waiter", waiting)
        .await
        .expect("task")
        .expect("the waiter acquires");
    let lock = LockName::new(name).expect("name");
    let info = holder
        .inspect(&lock)
        .await
        .expect("inspect")
        .expect("known");
    assert_eq!(info.holder, Some(second.lease().owner().to_string()));
    assert!(
        !queue_entries(&set.nodes()[0], name).await.is_empty()
            || !queue_entries(&set.nodes()[1], name).await.is_empty(),
        "the winner's entries stay until its release"
    );
    assert_eq!(info.waiters, Some(0), "{:?}", info.details);
    second.release().await.expect("release");
    for node in set.nodes() {
        assert!(queue_entries(node, name).await.is_empty());
    }
}
