//! What the fault tests of several areas share: waiting for a lock's node count.

use backend_zk::ZkLock;

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
