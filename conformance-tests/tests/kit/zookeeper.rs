//! ZooKeeper: a standalone server's life, the shared server, an ensemble losing its leader.

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::kit::{ZkEnsemble, ZooKeeper, zk_four_letter};
use conformance_tests::within;

use crate::support::{kill9_and_restart, pause_then_resume, refuses};

async fn zk_imok(addr: SocketAddr, within: Duration) -> bool {
    matches!(zk_four_letter(addr, "ruok", within).await, Ok(a) if a == "imok")
}

#[tokio::test]
async fn zookeeper_standalone_starts_dies_restarts_pauses_and_resumes() {
    let zk = ZooKeeper::start().await.expect("zookeeper starts");
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{}", zk.port()));
    assert_eq!(zk.url(), format!("zk://127.0.0.1:{}", zk.port()));
    assert_ne!(zk.port(), 2181);
    assert!(zk_imok(zk.addr(), Duration::from_secs(10)).await);
    assert_eq!(zk.node().mode().await.as_deref(), Some("standalone"));
    let mntr = zk_four_letter(zk.addr(), "mntr", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(mntr.contains("zk_server_state\tstandalone"), "{mntr}");

    kill9_and_restart(&zk).await;
    assert_eq!(zk.node().mode().await.as_deref(), Some("standalone"));

    pause_then_resume(&zk, zk_imok).await;
}

#[tokio::test]
async fn zookeeper_shared_is_one_server() {
    let a = ZooKeeper::shared().await.expect("shared zookeeper");
    let b = ZooKeeper::shared().await.expect("shared zookeeper");
    assert!(std::ptr::eq(a, b));
    assert!(zk_imok(a.addr(), Duration::from_secs(10)).await);
}

#[tokio::test]
async fn zookeeper_ensemble_elects_a_leader_and_survives_losing_it() {
    let ensemble = ZkEnsemble::start(3).await.expect("3-node ensemble starts");
    assert_eq!(ensemble.len(), 3);
    let expected: Vec<String> = (0..3)
        .map(|i| format!("127.0.0.1:{}", ensemble.node(i).port()))
        .collect();
    assert_eq!(ensemble.connect_string(), expected.join(","));

    let mut modes = Vec::new();
    for node in ensemble.nodes() {
        modes.push(node.mode().await.expect("every node serves"));
    }
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );
    let leader = ensemble.leader().await.expect("a leader");

    ensemble.node(leader).kill9();
    assert!(refuses(ensemble.node(leader).addr()).await);
    // A follower that loses its leader drops its client connections while it re-elects, so
    // a single ruok may be cut off: poll.
    for (i, node) in ensemble.nodes().iter().enumerate() {
        if i != leader {
            let what = format!("node {i} answers ruok again");
            within(Duration::from_secs(30), &what, async {
                while !zk_imok(node.addr(), Duration::from_secs(2)).await {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
        }
    }
    let new_leader = ensemble
        .wait_for_quorum()
        .await
        .expect("the two survivors elect a leader");
    assert_ne!(new_leader, leader);

    ensemble
        .node(leader)
        .restart()
        .await
        .expect("the old leader restarts");
    let mode = ensemble.node(leader).mode().await;
    assert!(
        matches!(mode.as_deref(), Some("follower" | "leader")),
        "the restarted node rejoins: {mode:?}"
    );
    assert_eq!(ensemble.wait_for_quorum().await.unwrap(), new_leader);
}
