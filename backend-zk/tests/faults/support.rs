//! What the fault tests of several areas share: waiting for a lock's node count, reading a node.

use backend_zk::ZkLock;
use backend_zk::zookeeper_client as zk;
use lockcore::LockName;

use crate::common::{SEC, ms, nodes, within};

/// Polls until `name` has exactly `n` nodes (the generous limit only stops a hang).
pub(crate) async fn wait_for_nodes(observer: &ZkLock, name: &str, n: usize, what: &str) {
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

/// The `Stat` of `child`, one of `name`'s nodes, as the `observer` session reads it.
pub(crate) async fn node_stat(observer: &ZkLock, name: &str, child: &str) -> zk::Stat {
    let parent = observer.parent_path(&LockName::new(name).expect("valid name"));
    observer
        .zk_client()
        .check_stat(&format!("{parent}/{child}"))
        .await
        .expect("exists")
        .expect("the node exists")
}
