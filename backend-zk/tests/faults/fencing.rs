//! The fencing token: the lock node's czxid, and safe through an ensemble leader's kill.

use std::sync::Arc;

use conformance_tests::kit::{ZkEnsemble, ZooKeeper};
use conformance_tests::{FencedResource, History};
use lockcore::{LockExt, Wait};

use crate::common::{SEC, client, contend, dyn_lock, ms, nodes, plain, unique, within};
use crate::support::node_stat;

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
        let stat = node_stat(&observer, &name, &children[0]).await;
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
