//! The lock queue: waiters' nodes deleted or given up, release marks, readers and writers.

use backend_zk::ZkLock;
use backend_zk::zookeeper_client as zk;
use conformance_tests::kit::ZooKeeper;
use lockcore::{Error, LockExt, LockGuard, LockName, Released, Wait};

use crate::common::{SEC, client, dyn_lock, nodes, plain, unique, within};
use crate::support::wait_for_nodes;

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

/// Four clients, each on a session of its own, under `chroot` on the shared server.
async fn four_clients(chroot: &str) -> (ZkLock, ZkLock, ZkLock, ZkLock) {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let url = format!("{}/{chroot}", zk.url());
    (
        client(&url).await,
        client(&url).await,
        client(&url).await,
        client(&url).await,
    )
}

async fn queue_of_three(chroot: &str, label: &str) -> QueueOfThree {
    let (a, b, c, observer) = four_clients(chroot).await;
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
    let (a, b, c, observer) = four_clients("faults-gives-up").await;
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

/// Readers share behind a reader and queue behind a writer; a reader's acquire dropped while
/// it waits behind the writer leaves no node, and `inspect` counts the holding readers apart
/// from the waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_queue_and_dropped_reader() {
    use lockcore::ReadWriteExt;
    let (a, b, c, observer) = four_clients("faults-rw").await;
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
