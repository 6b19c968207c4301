//! Sessions and links: a holder silent past the session timeout, a lost `create` reply, a
//! session closed behind the holder's back.

use std::time::Instant;

use backend_zk::zookeeper_client as zk;
use conformance_tests::kit::{Fault, Proxy, ZooKeeper};
use conformance_tests::{FencedResource, History, Hold};
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LostReason, Released, Wait};

use crate::common::{SEC, client, dyn_lock, ms, nodes, plain, unique, within};
use crate::support::{node_stat, wait_for_nodes};

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
    let stat = node_stat(&observer, &name, &children[0]).await;
    assert_eq!(guard.fencing_token().0, stat.czxid as u64);
    assert_eq!(guard.release().await.expect("release"), Released::Released);
    wait_for_nodes(&observer, &name, 0, "no node left after release").await;
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
