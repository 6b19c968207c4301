//! The bench floors of a Redlock URL: the minimal lock fanned out to every node, in Redlock's
//! two rounds.

use backend_redis::node::Node;
use futures_util::future::join_all;
use lockcore::{LockName, RawFloor, Result, async_trait};

/// The parallel fan-out floors, in Redlock's two rounds: on every node at once the plain
/// (`SET NX PX`) or the minimal fenced acquire (one script: `SET NX PX` + `INCR` of a fence
/// counter), all answers awaited, then on every node at once the compare-and-delete. Each node
/// is reached over its own connection, as Redlock's are.
pub(crate) struct FanOutFloor {
    pub(crate) nodes: Vec<Node>,
    pub(crate) fenced: bool,
}

#[async_trait]
impl RawFloor for FanOutFloor {
    fn description(&self) -> String {
        let acquire = if self.fenced {
            "one script SET NX PX + INCR fence"
        } else {
            "SET NX PX"
        };
        format!(
            "on all {} nodes in parallel: {acquire}; once all answered, EVALSHA compare-and-delete on all",
            self.nodes.len()
        )
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let taken = join_all(
            self.nodes
                .iter()
                .map(|n| n.floor_acquire(name, self.fenced)),
        )
        .await;
        let taken = taken.into_iter().collect::<Result<Vec<_>>>()?;
        let deleted = join_all(
            self.nodes
                .iter()
                .zip(&taken)
                .map(|(n, hold)| n.floor_delete(name, hold)),
        )
        .await;
        deleted.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}
