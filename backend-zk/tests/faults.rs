//! Scenarios only ZooKeeper has: sessions that expire behind a silent link, a lost reply to
//! `create`, a leader killed in an ensemble, queue nodes deleted or abandoned, the czxid fencing
//! token, and a silent semaphore holder whose permit comes back with its
//! session. Each uses a kit server of its own (or its own chroot on the shared
//! one), and checks safety on recorded histories and a fenced resource.

mod common;

use common::{SEC, client, contend, dyn_lock, ms, nodes, plain, unique, within};

use std::sync::{Arc, Mutex};
use std::time::Instant;

use backend_zk::ZkLock;
use backend_zk::zookeeper_client as zk;
use conformance_tests::kit::{Fault, Proxy, ZkEnsemble, ZooKeeper};
use conformance_tests::{FencedResource, History, Hold};
use lockcore::{
    AcquireOptions, DistributedLock, Error, KeepAlive, LockExt, LockGuard, LockName, LostReason,
    Released, SemaphoreExt, Wait,
};

/// Polls until `name` has exactly `n` nodes (the generous limit only stops a hang).
async fn wait_for_nodes(observer: &ZkLock, name: &str, n: usize, what: &str) {
    within(30 * SEC, what, async {
        loop {
            if nodes(observer, name).await.len() == n {
                break;
            }
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
}

/// The token is the lock node's creation zxid, as an independent session reads it with
/// `exists`, and it is above the czxid of every earlier holder's node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_token_is_the_lock_nodes_czxid() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let url = format!("{}/faults-czxid", zk.url());
    let (a, observer) = (client(&url).await, client(&url).await);
    let name = unique("czxid");
    let locks = dyn_lock(&a);
    let mut last = 0;
    for _ in 0..3 {
        let g = locks
            .lock(&name, &plain(10 * SEC, Wait::No))
            .await
            .expect("acquire");
        let children = nodes(&observer, &name).await;
        assert_eq!(children.len(), 1, "one node per acquisition: {children:?}");
        let parent = observer.parent_path(&LockName::new(&name).unwrap());
        let stat = observer
            .zk_client()
            .check_stat(&format!("{parent}/{}", children[0]))
            .await
            .expect("exists")
            .expect("the holder's node exists");
        assert_eq!(
            g.fencing_token().0,
            stat.czxid as u64,
            "token is not the czxid"
        );
        assert_eq!(
            stat.ephemeral_owner,
            a.session_id(),
            "the node belongs to the holder's session"
        );
        assert!(g.fencing_token().0 > last, "tokens must increase");
        last = g.fencing_token().0;
        g.release().await.expect("release");
    }
}

/// The holder's link goes silent (its requests and pings blackholed, so the server hears
/// nothing) for longer than the session timeout.
/// Its `lost()` fires `ConnectionLost` by its lease's end; another client gets the lock only
/// once the server has expired the holder's session, with a higher token; the holder's late
/// write is refused and, once the link is back, its release frees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_blackholed_past_session_timeout() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let query = "session_timeout=2s&timeout=1s";
    let holder = client(&format!("zk://{}/faults?{query}", proxy.addr())).await;
    let other = client(&format!("{}/faults?{query}", zk.url())).await;
    assert_eq!(holder.session_timeout(), 2 * SEC, "negotiated timeout");
    let name = unique("blackholed");
    let history = History::new();
    let fenced = FencedResource::new();

    let held = AcquireOptions::new()
        .ttl(30 * SEC)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let guard = dyn_lock(&holder)
        .lock(&name, &held)
        .await
        .expect("holder acquires");
    let held_at = Instant::now();
    assert!(
        guard.lease().ttl() <= 2 * SEC,
        "a lease must not outlive the session timeout: {:?}",
        guard.lease().ttl()
    );
    let old = guard.fencing_token();
    fenced.write(old, 0).expect("the holder writes");

    proxy.set(Fault::BlackholeRequests);
    let reason = within(30 * SEC, "the holder's lost()", guard.lost()).await;
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(!guard.is_held());
    history.push(Hold {
        client: 0,
        name: name.clone(),
        token: old.0,
        acquired: held_at,
        valid_until: guard.lease().valid_until(),
        ended: None,
    });

    let next = within(
        60 * SEC,
        "the other client's takeover",
        dyn_lock(&other).lock(&name, &plain(30 * SEC, Wait::For(45 * SEC))),
    )
    .await
    .expect("the other client gets the lock after the session expired");
    let id = history.acquired(1, &next.lease());
    assert!(
        next.fencing_token() > old,
        "takeover token not above the old one"
    );
    fenced
        .write(next.fencing_token(), 1)
        .expect("the new holder writes");
    assert!(
        fenced.write(old, 2).is_err(),
        "the old holder's late write was accepted"
    );

    proxy.set(Fault::PassThrough);
    let released = within(30 * SEC, "the old holder's release", async {
        loop {
            match holder.release(&guard.lease()).await {
                Ok(r) => break r,
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(100)).await,
                Err(e) => panic!("the old holder's release: {e}"),
            }
        }
    })
    .await;
    assert_eq!(released, Released::NotHeld);
    history.ended(id);
    next.release().await.expect("release");
    drop(guard);
    history.assert_safe();
    fenced.assert_never_accepted_stale();
}

/// A permit's holder goes silent (its link drops every request, as if its process had died:
/// not even its client's own clean-up reaches the server). In each layout the semaphore stays
/// full until the server ends the holder's session and with it the ephemeral permit node;
/// then a waiter gets the permit, with a token above the silent holder's, whose late write to
/// its slot is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_permit_holder_returns_its_permit_with_its_session() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    for layout in ["dlock", "curator", "kazoo"] {
        let proxy = Proxy::start(zk.addr()).await.expect("proxy");
        let query = format!("session_timeout=2s&timeout=1s&layout={layout}");
        let holder = client(&format!("zk://{}/sem-{layout}?{query}", proxy.addr())).await;
        let other = dyn_lock(&client(&format!("{}/sem-{layout}?{query}", zk.url())).await);
        let name = unique("silent");
        let slot = FencedResource::new();
        let held = dyn_lock(&holder)
            .semaphore(&name, 1)
            .expect("semaphore")
            .acquire(&plain(30 * SEC, Wait::No))
            .await
            .expect("the holder takes the permit");
        let old = held.fencing_token();
        slot.write(old, 0).expect("the holder writes");
        let sem = other.semaphore(&name, 1).expect("semaphore");
        assert!(
            sem.try_acquire(&plain(30 * SEC, Wait::No))
                .await
                .expect("try_acquire")
                .is_none(),
            "{layout}: a second permit of one"
        );

        proxy.set(Fault::BlackholeRequests);
        let next = within(
            60 * SEC,
            "the permit after the session's end",
            sem.acquire(&plain(30 * SEC, Wait::For(45 * SEC))),
        )
        .await
        .unwrap_or_else(|e| panic!("{layout}: the permit did not come back: {e}"));
        assert!(
            next.fencing_token() > old,
            "{layout}: the new holder's token is not above the silent one's"
        );
        slot.write(next.fencing_token(), 1)
            .expect("the new holder writes");
        assert!(
            slot.write(old, 2).is_err(),
            "{layout}: the silent holder's late write was accepted"
        );
        slot.assert_never_accepted_stale();
        next.release().await.expect("release");
        std::mem::forget(held);
    }
}

/// The reply to `create` is lost and the connection dies under it. The client reconnects,
/// finds its own node by its owner id instead of creating a second one, and gets the lock
/// with exactly one node; after release no node is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_reply_lost_leaves_one_node() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let holder = client(&format!(
        "zk://{}/faults?session_timeout=6s&timeout=20s",
        proxy.addr()
    ))
    .await;
    let observer = client(&format!("{}/faults", zk.url())).await;
    let name = unique("lost-reply");
    // Make the parent exist, so the create is the one request that goes unanswered.
    let g = dyn_lock(&holder)
        .lock(&name, &plain(30 * SEC, Wait::No))
        .await
        .expect("warm-up acquire");
    g.release().await.expect("release");

    proxy.set(Fault::BlackholeReplies);
    let attempt = {
        let locks = dyn_lock(&holder);
        let name = name.clone();
        tokio::spawn(async move { locks.try_lock(&name, &plain(30 * SEC, Wait::No)).await })
    };
    // The create reaches the server; its reply is dropped.
    wait_for_nodes(&observer, &name, 1, "the create reaches the server").await;
    // Let the client notice the dead connection, then let it reconnect.
    tokio::time::sleep(3 * SEC).await;
    proxy.set(Fault::PassThrough);
    let guard = within(60 * SEC, "the attempt", attempt)
        .await
        .expect("task")
        .expect("the attempt succeeds once the link is back")
        .expect("the lock was free");
    let children = nodes(&observer, &name).await;
    assert_eq!(children.len(), 1, "one attempt left {children:?}");
    // The node found again (no create reply to read a stat from) still gives the czxid.
    let parent = observer.parent_path(&LockName::new(&name).unwrap());
    let stat = observer
        .zk_client()
        .check_stat(&format!("{parent}/{}", children[0]))
        .await
        .expect("exists")
        .expect("the node exists");
    assert_eq!(guard.fencing_token().0, stat.czxid as u64);
    assert_eq!(guard.release().await.expect("release"), Released::Released);
    wait_for_nodes(&observer, &name, 0, "no node left after release").await;
}

/// The leader of a 3-node ensemble is killed -9 while four clients (spread over the nodes)
/// contend: no two holders overlap, tokens grow, the fenced resource refuses nothing current
/// and accepts nothing stale, and everyone keeps getting the lock after the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_leader_killed_no_two_holders() {
    let ensemble = ZkEnsemble::start(3).await.expect("kit ensemble");
    let url = format!("{}/faults?session_timeout=6s&timeout=2s", ensemble.url());
    let name = unique("leader-kill");
    let history = Arc::new(History::new());
    let fenced = Arc::new(FencedResource::new());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for id in 0..4 {
        let locks = dyn_lock(&client(&url).await);
        tasks.push(contend(locks, &name, id, &history, &fenced, &stop));
    }
    tokio::time::sleep(2 * SEC).await;
    let leader = ensemble.leader().await.expect("a leader");
    let before = history.holds().len();
    ensemble.node(leader).kill9();
    within(60 * SEC, "a new quorum", ensemble.wait_for_quorum())
        .await
        .expect("quorum");
    within(60 * SEC, "acquisitions after the election", async {
        while history.holds().len() < before + 8 {
            tokio::time::sleep(ms(100)).await;
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        within(60 * SEC, "contending client", t)
            .await
            .expect("task panicked");
    }
    history.assert_safe();
    fenced.assert_never_accepted_stale();
    assert_eq!(fenced.rejected(), 0);
}

/// A lock held by `a` with `b`, then `c`, waiting for it, each on a session of its own.
struct QueueOfThree {
    observer: ZkLock,
    name: String,
    ga: LockGuard,
    wb: tokio::task::JoinHandle<lockcore::Result<LockGuard>>,
    wc: tokio::task::JoinHandle<lockcore::Result<LockGuard>>,
    /// The three nodes' paths, in queue order (a's, b's, c's).
    paths: Vec<String>,
}

async fn queue_of_three(chroot: &str, label: &str) -> QueueOfThree {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let url = format!("{}/{chroot}", zk.url());
    let (a, b, c, observer) = (
        client(&url).await,
        client(&url).await,
        client(&url).await,
        client(&url).await,
    );
    let name = unique(label);
    let ga = dyn_lock(&a)
        .lock(&name, &plain(60 * SEC, Wait::No))
        .await
        .expect("a acquires");
    let wait = plain(60 * SEC, Wait::For(60 * SEC));
    let queue_up = |who: ZkLock| {
        let (who, name, wait) = (dyn_lock(&who), name.clone(), wait.clone());
        tokio::spawn(async move { who.lock(&name, &wait).await })
    };
    let wb = queue_up(b);
    wait_for_nodes(&observer, &name, 2, "b queued").await;
    let wc = queue_up(c);
    wait_for_nodes(&observer, &name, 3, "c queued").await;
    let parent = observer.parent_path(&LockName::new(&name).unwrap());
    let mut queue = nodes(&observer, &name).await;
    queue.sort_by_key(|n| n.rsplit('-').next().unwrap_or_default().to_owned());
    let paths = queue.iter().map(|n| format!("{parent}/{n}")).collect();
    QueueOfThree {
        observer,
        name,
        ga,
        wb,
        wc,
        paths,
    }
}

/// An operator deletes a waiter's queue node: that waiter's acquire fails with a
/// non-retryable error, and the waiter behind it still gets the lock when the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_waiter_node_fails_only_that_waiter() {
    let QueueOfThree {
        observer,
        ga,
        wb,
        wc,
        paths,
        ..
    } = queue_of_three("faults-deleted", "deleted-waiter").await;
    observer
        .zk_client()
        .delete(&paths[1], None)
        .await
        .expect("the operator deletes b's node");
    match within(30 * SEC, "b's acquire", wb).await.expect("task") {
        Err(e @ Error::Backend { .. }) => assert!(!e.is_retryable(), "{e}"),
        other => panic!("b should fail once its node is deleted, got {other:?}"),
    }
    assert!(!wc.is_finished(), "c got the lock while a held it");
    assert_eq!(ga.release().await.expect("release"), Released::Released);
    let gc = within(30 * SEC, "c's acquire", wc)
        .await
        .expect("task")
        .expect("c gets the lock");
    gc.release().await.expect("release");
}

/// The waiter right behind the holder is woken by the holder's node going and then holds
/// without reading the queue again (nothing can be created below the head). That shortcut must
/// not hide its own node's deletion: here one operator transaction deletes the waiter's node
/// and then the holder's, so both events arrive together, own first; the waiter must fail, and
/// the waiter behind it must get the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_node_deleted_with_the_head_is_not_a_grant() {
    let QueueOfThree {
        observer,
        name,
        ga,
        wb,
        wc,
        paths,
    } = queue_of_three("faults-head-and-own", "head-and-own").await;
    let operator = observer.zk_client();
    let mut multi = operator.new_multi_writer();
    multi.add_delete(&paths[1], None).expect("b's node");
    multi.add_delete(&paths[0], None).expect("a's node");
    multi
        .commit()
        .await
        .expect("the operator deletes b's node, then a's, in one transaction");
    match within(30 * SEC, "b's acquire", wb).await.expect("task") {
        Err(e @ Error::Backend { .. }) => assert!(!e.is_retryable(), "{e}"),
        Ok(g) => panic!(
            "b got the lock (token {}) although its node was deleted first",
            g.fencing_token().0
        ),
        Err(e) => panic!("b should fail with its node deleted, got {e:?}"),
    }
    let gc = within(30 * SEC, "c's acquire", wc)
        .await
        .expect("task")
        .expect("c gets the lock once a's and b's nodes are gone");
    assert!(
        gc.fencing_token() > ga.fencing_token(),
        "c's token is above a's"
    );
    assert_eq!(
        nodes(&observer, &name).await.len(),
        1,
        "only c's node is left"
    );
    // a's node went behind its back: its release finds nothing to release.
    assert_eq!(ga.release().await.expect("release"), Released::NotHeld);
    gc.release().await.expect("release");
}

/// What a waiter's watch sees when the node it waits for goes: an exclusive holder that waited
/// writes the release mark and deletes in one transaction (a data change: the waiter behind
/// may hold without reading the queue again); one that held at once, a reader's release, and a
/// waiter giving up are plain deletes (behind a node that was the head when it was created,
/// every waiter saw it as the head and holds on the deletion; otherwise the waiter reads the
/// queue). A three-deep queue then hands over without reading: the waiter two places back
/// holds once the one ahead of it, which waited, releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_marks_exclusive_nodes_only() {
    use lockcore::ReadWriteExt;
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let url = format!("{}/faults-mark", zk.url());
    let (a, b, observer) = (client(&url).await, client(&url).await, client(&url).await);
    let operator = observer.zk_client();
    let parent_of = |name: &str| observer.parent_path(&LockName::new(name).unwrap());
    let watch_only_node = |name: String| {
        let (observer, operator) = (observer.clone(), operator.clone());
        async move {
            let children = nodes(&observer, &name).await;
            assert_eq!(children.len(), 1, "one node: {children:?}");
            let path = format!(
                "{}/{}",
                observer.parent_path(&LockName::new(&name).unwrap()),
                children[0]
            );
            let (stat, watcher) = operator.check_and_watch_stat(&path).await.expect("watch");
            assert!(stat.is_some(), "the node exists");
            watcher
        }
    };

    // An exclusive release of a node that held at once: a plain delete.
    let name = unique("mark-write-at-once");
    let g = dyn_lock(&a)
        .lock(&name, &plain(60 * SEC, Wait::No))
        .await
        .expect("a acquires");
    let watcher = watch_only_node(name.clone()).await;
    assert_eq!(g.release().await.expect("release"), Released::Released);
    let event = within(30 * SEC, "the write node's event", watcher.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeDeleted);
    assert!(
        nodes(&observer, &name).await.is_empty(),
        "and the node is gone"
    );

    // A shared release: a plain delete.
    let name = unique("mark-read");
    let r = dyn_lock(&a)
        .read_lock(&name, &plain(60 * SEC, Wait::No))
        .await
        .expect("a reads");
    let watcher = watch_only_node(name.clone()).await;
    assert_eq!(r.release().await.expect("release"), Released::Released);
    let event = within(30 * SEC, "the read node's event", watcher.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeDeleted);

    // A waiter giving up: a plain delete.
    let name = unique("mark-give-up");
    let g = dyn_lock(&a)
        .lock(&name, &plain(60 * SEC, Wait::No))
        .await
        .expect("a acquires");
    let waiter = {
        let (b, name) = (dyn_lock(&b), name.clone());
        tokio::spawn(async move { b.lock(&name, &plain(60 * SEC, Wait::For(60 * SEC))).await })
    };
    wait_for_nodes(&observer, &name, 2, "b queued").await;
    let mut queue = nodes(&observer, &name).await;
    queue.sort_by_key(|n| n.rsplit('-').next().unwrap_or_default().to_owned());
    let b_node = format!("{}/{}", parent_of(&name), queue[1]);
    let (_, watcher) = operator
        .check_and_watch_stat(&b_node)
        .await
        .expect("watch b's node");
    waiter.abort();
    let event = within(30 * SEC, "the given-up node's event", watcher.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeDeleted);
    assert!(waiter.await.unwrap_err().is_cancelled());

    assert_eq!(g.release().await.expect("release"), Released::Released);

    // A chain: c waits behind b, which waits behind the holder a.
    let QueueOfThree {
        observer,
        name,
        ga,
        wb,
        wc,
        paths,
        ..
    } = queue_of_three("faults-mark", "mark-chain").await;
    let a_token = ga.fencing_token();
    assert_eq!(ga.release().await.expect("release"), Released::Released);
    let gb = within(30 * SEC, "b's acquire", wb)
        .await
        .expect("task")
        .expect("b holds");
    assert!(!wc.is_finished(), "c holds while b does");
    let b_token = gb.fencing_token();
    assert!(b_token > a_token);
    // b waited behind a: its release writes the mark, which c, two places back when it
    // listed, holds on without reading the queue again.
    let (_, watcher) = observer
        .zk_client()
        .check_and_watch_stat(&paths[1])
        .await
        .expect("watch b's node");
    assert_eq!(gb.release().await.expect("release"), Released::Released);
    let event = within(30 * SEC, "b's node's event", watcher.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeDataChanged);
    let gc = within(30 * SEC, "c's acquire", wc)
        .await
        .expect("task")
        .expect("c holds");
    assert!(gc.fencing_token() > b_token);
    assert_eq!(
        nodes(&observer, &name).await.len(),
        1,
        "only c's node is left"
    );
    gc.release().await.expect("release");
}

/// A waiter ahead in the queue gives up (its wait times out): its node goes, the holder keeps
/// the lock, and the waiter behind it gets the lock only when the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_ahead_gives_up_holder_not_displaced() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let url = format!("{}/faults-gives-up", zk.url());
    let (a, b, c, observer) = (
        client(&url).await,
        client(&url).await,
        client(&url).await,
        client(&url).await,
    );
    let name = unique("gives-up");
    let ga = dyn_lock(&a)
        .lock(&name, &plain(60 * SEC, Wait::No))
        .await
        .expect("a acquires");
    let wb = {
        let (b, name) = (dyn_lock(&b), name.clone());
        tokio::spawn(async move { b.lock(&name, &plain(60 * SEC, Wait::For(SEC))).await })
    };
    wait_for_nodes(&observer, &name, 2, "b queued").await;
    let wc = {
        let (c, name) = (dyn_lock(&c), name.clone());
        tokio::spawn(async move { c.lock(&name, &plain(60 * SEC, Wait::For(60 * SEC))).await })
    };
    wait_for_nodes(&observer, &name, 3, "c queued").await;
    match within(30 * SEC, "b's acquire", wb).await.expect("task") {
        Err(Error::Timeout { .. }) => {}
        other => panic!("b should time out, got {other:?}"),
    }
    wait_for_nodes(&observer, &name, 2, "b's node removed").await;
    let info = dyn_lock(&observer)
        .inspect(&LockName::new(&name).unwrap())
        .await
        .expect("inspect")
        .expect("known");
    assert_eq!(
        info.holder,
        Some(ga.lease().owner().to_string()),
        "holder displaced"
    );
    assert_eq!(info.waiters, Some(1));
    assert!(!wc.is_finished(), "c got the lock while a held it");
    assert!(ga.is_held());
    let token = ga.fencing_token();
    assert_eq!(ga.release().await.expect("release"), Released::Released);
    let gc = within(30 * SEC, "c's acquire", wc)
        .await
        .expect("task")
        .expect("c gets the lock");
    assert!(gc.fencing_token() > token);
    gc.release().await.expect("release");
}

/// The holder's session is closed behind its back while its link is down (another connection
/// resumes the session and closes it, as an operator tool would): the server deletes the node,
/// and once the link is back the guard's next renewal finds the session gone, so `lost()` says
/// `SessionExpired`; the next holder's token is higher and the old holder's late write is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_session_fires_session_expired() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    // A long session and lease, so the link is back well before the lease could run out.
    let holder = client(&format!(
        "zk://{}/faults-session?session_timeout=40s&ttl=40s",
        proxy.addr()
    ))
    .await;
    let other = client(&format!("{}/faults-session", zk.url())).await;
    let name = unique("closed-session");
    let fenced = FencedResource::new();
    let opts = AcquireOptions::new()
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let guard = dyn_lock(&holder)
        .lock(&name, &opts)
        .await
        .expect("holder acquires");
    let old = guard.fencing_token();
    fenced.write(old, 0).expect("holder writes");
    proxy.set(Fault::Down);
    let session = holder.zk_client().session().clone();
    let intruder = zk::Client::connector()
        .with_session(session)
        .connect(&zk.connect_string())
        .await
        .expect("resume the holder's session");
    drop(intruder); // closes the session: its ephemeral nodes go
    let next = within(
        30 * SEC,
        "the other client's acquire",
        dyn_lock(&other).lock(&name, &plain(30 * SEC, Wait::For(20 * SEC))),
    )
    .await
    .expect("the other client acquires once the session is closed");
    assert!(next.fencing_token() > old);
    fenced
        .write(next.fencing_token(), 1)
        .expect("new holder writes");
    proxy.set(Fault::PassThrough);
    let reason = within(60 * SEC, "the holder's lost()", guard.lost()).await;
    assert_eq!(reason, LostReason::SessionExpired);
    assert!(fenced.write(old, 2).is_err(), "stale write accepted");
    next.release().await.expect("release");
    assert_eq!(
        holder.release(&guard.lease()).await.expect("release"),
        Released::NotHeld
    );
    drop(guard);
}

/// Readers share behind a reader and queue behind a writer; a reader's acquire dropped while
/// it waits behind the writer leaves no node, and `inspect` counts the holding readers apart
/// from the waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_queue_and_dropped_reader() {
    use lockcore::ReadWriteExt;
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let url = format!("{}/faults-rw", zk.url());
    let (a, b, c, observer) = (
        client(&url).await,
        client(&url).await,
        client(&url).await,
        client(&url).await,
    );
    let name = unique("rw");
    let opts = plain(30 * SEC, Wait::No);
    let r1 = dyn_lock(&a).read_lock(&name, &opts).await.expect("r1");
    let r2 = dyn_lock(&b)
        .read_lock(&name, &opts)
        .await
        .expect("r2 shares");
    let writer = {
        let (c, name) = (dyn_lock(&c), name.clone());
        tokio::spawn(async move {
            c.write_lock(&name, &plain(30 * SEC, Wait::For(60 * SEC)))
                .await
        })
    };
    wait_for_nodes(&observer, &name, 3, "the writer queued").await;
    let late_reader = {
        let (a, name) = (dyn_lock(&a), name.clone());
        tokio::spawn(async move {
            a.read_lock(&name, &plain(30 * SEC, Wait::For(60 * SEC)))
                .await
        })
    };
    wait_for_nodes(&observer, &name, 4, "the late reader queued").await;
    let info = dyn_lock(&observer)
        .inspect(&LockName::new(&name).unwrap())
        .await
        .expect("inspect")
        .expect("known");
    assert_eq!(
        info.waiters,
        Some(2),
        "two readers hold, a writer and a reader wait"
    );
    late_reader.abort();
    assert!(late_reader.await.is_err_and(|e| e.is_cancelled()));
    wait_for_nodes(&observer, &name, 3, "the dropped reader's node removed").await;
    assert!(
        !writer.is_finished(),
        "the writer got in while readers held"
    );
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let w = within(30 * SEC, "the writer", writer)
        .await
        .expect("task")
        .expect("the writer gets the lock");
    w.release().await.expect("release");
    wait_for_nodes(&observer, &name, 0, "nothing left").await;
}

/// In dlock's layout a permit waiter watches only the `permits` nodes right ahead of its own.
/// With two permits held by A then B and waiters C then D: B leaving first (not the oldest
/// holder) must admit C, whose watched pair is {A, B}; D, watching {B, C}, wakes too but must
/// stay queued (A and C hold), and A leaving must then admit it. A waiter that watched only the
/// node `permits` places ahead (A, for C) would never learn of B's release, and the guard below
/// would fail the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_is_admitted_whichever_holder_ahead_leaves() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let locks = dyn_lock(&client(&format!("{}/ahead", zk.url())).await);
    let name = unique("ahead");
    let sem = locks.semaphore(&name, 2).expect("semaphore");
    let hold = || plain(30 * SEC, Wait::No);
    let a = sem.acquire(&hold()).await.expect("A holds");
    let b = sem.acquire(&hold()).await.expect("B holds");
    let waiter = |expect: &'static str| {
        let sem = sem.clone();
        tokio::spawn(async move {
            sem.acquire(&plain(30 * SEC, Wait::For(60 * SEC)))
                .await
                .expect(expect)
        })
    };
    let key = LockName::new(&name).unwrap();
    let queued = |n: usize, what: &'static str| {
        let (locks, key) = (locks.clone(), key.clone());
        within(30 * SEC, what, async move {
            loop {
                let info = locks.inspect_semaphore(&key).await.expect("inspect");
                if info.and_then(|i| i.waiters) == Some(n) {
                    break;
                }
                tokio::time::sleep(ms(20)).await;
            }
        })
    };
    let c = waiter("C is admitted");
    queued(1, "C queued").await;
    let d = waiter("D is admitted");
    queued(2, "D queued").await;

    assert_eq!(b.release().await.expect("B releases"), Released::Released);
    let c = within(45 * SEC, "C admitted after B left", c)
        .await
        .expect("C's task");
    let info = locks
        .inspect_semaphore(&key)
        .await
        .expect("inspect")
        .expect("in use");
    assert_eq!(info.holders.len(), 2, "A and C hold, D waits: {info:?}");
    assert!(!d.is_finished(), "D was admitted with A and C holding");

    assert_eq!(a.release().await.expect("A releases"), Released::Released);
    let d = within(45 * SEC, "D admitted after A left", d)
        .await
        .expect("D's task");
    assert!(d.fencing_token() > c.fencing_token());
    drop((c, d));
}

/// The total of watches the server at `addr` holds, from `wchs`.
async fn watches(addr: std::net::SocketAddr) -> usize {
    let text = conformance_tests::kit::zk_four_letter(addr, "wchs", 5 * SEC)
        .await
        .expect("wchs");
    text.split("Total watches:")
        .nth(1)
        .and_then(|t| t.trim().parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no watch total in {text:?}"))
}

/// In dlock's layout the first waiter of a semaphore watches exactly the nodes ahead of it, so
/// when one of them goes it holds on that event alone, without reading the children again: here
/// the waiter's link drops every request from the moment its watches are set, and it still
/// gets the permit when the holder releases (the event comes from the server). Its token is
/// above the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_permit_waiter_holds_on_the_event_alone() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let url = |addr: String| format!("zk://{addr}/sem-event?timeout=20s");
    let holder = dyn_lock(&client(&url(zk.addr().to_string())).await);
    let waiter = dyn_lock(&client(&url(proxy.addr().to_string())).await);
    let name = unique("first-waiter");
    let held = holder
        .semaphore(&name, 1)
        .expect("semaphore")
        .acquire(&plain(60 * SEC, Wait::No))
        .await
        .expect("the holder takes the permit");
    let before = watches(zk.addr()).await;
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            waiter
                .semaphore(&name, 1)
                .expect("semaphore")
                .acquire(&plain(60 * SEC, Wait::For(60 * SEC)))
                .await
        })
    };
    // Its watch on the holder's node and on its own.
    await_watches(zk.addr(), before + 2, "the waiter").await;
    proxy.set(Fault::BlackholeRequests);
    let old = held.fencing_token();
    assert_eq!(held.release().await.expect("release"), Released::Released);
    let got = within(30 * SEC, "the waiter's permit", waiting)
        .await
        .expect("task")
        .expect("the waiter holds on the deletion event, with no request answered");
    assert!(got.fencing_token() > old, "its token is above the holder's");
    proxy.set(Fault::PassThrough);
    assert_eq!(got.release().await.expect("release"), Released::Released);
}

/// A pass-through link to `upstream` that records the opcode of every request its one client
/// sends (ZooKeeper frames: a 4-byte length, then, after the connect request, the xid and the
/// opcode). Returns the address to connect to and the recorded opcodes.
async fn opcode_recorder(upstream: std::net::SocketAddr) -> (String, Arc<Mutex<Vec<i32>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let ops = Arc::new(Mutex::new(Vec::new()));
    let recorded = ops.clone();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.expect("accept");
        let server = tokio::net::TcpStream::connect(upstream)
            .await
            .expect("upstream");
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        });
        let mut connected = false;
        loop {
            let mut len = [0u8; 4];
            if from_client.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
            if from_client.read_exact(&mut frame).await.is_err() {
                return;
            }
            if connected && frame.len() >= 8 {
                let op = i32::from_be_bytes(frame[4..8].try_into().expect("4 bytes"));
                ops.lock().unwrap().push(op);
            }
            connected = true;
            if to_server.write_all(&len).await.is_err()
                || to_server.write_all(&frame).await.is_err()
            {
                return;
            }
        }
    });
    (addr, recorded)
}

/// ZooKeeper's opcodes for `getChildren` and `getChildren2`.
const GET_CHILDREN: [i32; 2] = [8, 12];

/// Waits until the server at `addr` holds exactly `n` watches.
async fn await_watches(addr: std::net::SocketAddr, n: usize, what: &str) {
    let deadline = Instant::now() + 30 * SEC;
    loop {
        let now = watches(addr).await;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never set its watches: {now}, not {n}"
        );
        tokio::time::sleep(ms(20)).await;
    }
}

/// In dlock's layout a permit waiter keeps its watches while it waits: after a release that
/// moves it up without letting it hold, it reads the children once and sends one `exists`, for
/// the node that moved into its window of `permits` nodes ahead, not one for each of them and
/// its own. Here, on two permits, H2's release lets W1 hold and moves W2 up (H1 and W1 are then
/// its window, and W1 was watched already); H1's release then lets W2 hold on the event alone,
/// with no request at all. The tokens increase along the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_waiters_keep_their_watches_as_they_move_up() {
    /// ZooKeeper's opcodes for `exists`, `ping` and `removeWatches` (the client sends the last
    /// when the watchers of a path are dropped, as a waiter's are once it holds).
    const EXISTS: i32 = 3;
    const PING: i32 = 11;
    const REMOVE_WATCHES: i32 = 18;
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let url = |addr: String| format!("zk://{addr}/sem-move-up?timeout=20s");
    let direct = || url(zk.addr().to_string());
    let (recorder, ops) = opcode_recorder(zk.addr()).await;
    let (h1, h2, w1, w2, w3) = (
        dyn_lock(&client(&direct()).await),
        dyn_lock(&client(&direct()).await),
        dyn_lock(&client(&direct()).await),
        dyn_lock(&client(&url(recorder)).await),
        dyn_lock(&client(&direct()).await),
    );
    let name = unique("move-up");
    let take = |lock: &Arc<dyn DistributedLock>| {
        let (lock, name) = (lock.clone(), name.clone());
        async move {
            lock.semaphore(&name, 2)
                .expect("semaphore")
                .acquire(&plain(60 * SEC, Wait::No))
                .await
                .expect("a free permit")
        }
    };
    let g1 = take(&h1).await;
    let g2 = take(&h2).await;
    let waiter = |lock: Arc<dyn DistributedLock>| {
        let name = name.clone();
        tokio::spawn(async move {
            lock.semaphore(&name, 2)
                .expect("semaphore")
                .acquire(&plain(60 * SEC, Wait::For(60 * SEC)))
                .await
        })
    };
    // Each waiter watches the two nodes ahead of it and its own.
    let base = watches(zk.addr()).await;
    let first = waiter(w1);
    await_watches(zk.addr(), base + 3, "W1").await;
    let second = waiter(w2);
    await_watches(zk.addr(), base + 6, "W2").await;
    let third = waiter(w3);
    await_watches(zk.addr(), base + 9, "W3").await;
    let mark = ops.lock().unwrap().len();

    let tokens = [g1.fencing_token(), g2.fencing_token()];
    assert_eq!(g2.release().await.expect("release"), Released::Released);
    let got1 = within(30 * SEC, "W1's permit", first)
        .await
        .expect("task")
        .expect("W1 holds");
    // W2 moves up: it reads the children and watches H1, which moved into its window (W1 it
    // watches already); H1 is held until W2's requests are in.
    let sent = |from: usize| -> Vec<i32> {
        ops.lock().unwrap()[from..]
            .iter()
            .copied()
            .filter(|op| ![PING, REMOVE_WATCHES].contains(op))
            .collect()
    };
    let deadline = Instant::now() + 30 * SEC;
    while sent(mark).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "W2 never moved up: {:?}",
            sent(mark)
        );
        tokio::time::sleep(ms(20)).await;
    }
    let moved = sent(mark);
    assert_eq!(
        moved.len(),
        2,
        "W2 sent one listing and one exists: {moved:?}"
    );
    assert!(GET_CHILDREN.contains(&moved[0]), "{moved:?}");
    assert_eq!(moved[1], EXISTS, "{moved:?}");
    assert!(!second.is_finished() && !third.is_finished(), "two permits");
    let moved_at = mark;
    let mark = ops.lock().unwrap().len();
    assert_eq!(g1.release().await.expect("release"), Released::Released);
    let got2 = within(30 * SEC, "W2's permit", second)
        .await
        .expect("task")
        .expect("W2 holds");
    assert_eq!(sent(mark), Vec::<i32>::new(), "W2 held on H1's event alone");
    assert_eq!(
        sent(moved_at),
        moved,
        "and sent nothing else after the release that moved it up"
    );
    assert!(
        tokens.iter().all(|t| *t < got1.fencing_token())
            && got1.fencing_token() < got2.fencing_token(),
        "tokens increase"
    );
    got1.release().await.expect("release");
    let got3 = within(30 * SEC, "W3's permit", third)
        .await
        .expect("task")
        .expect("W3 holds");
    got2.release().await.expect("release");
    got3.release().await.expect("release");
}
