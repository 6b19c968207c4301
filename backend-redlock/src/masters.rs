//! The N masters and the quorum: each master's [`Node`] and what its probe found, the majority
//! every decision needs, the per-node request limit, and [`gather`], which drives one round of
//! requests to every node under one deadline.

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use backend_redis::node::Node;
use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use lockcore::cleanup::Undo;
use lockcore::{ClientDefaults, Error, Fencing, LockName, OwnerId, Result};

use crate::BACKEND;
use crate::config;

/// Fencing assumption of Redlock when not every node persists every write.
pub const ASSUMPTION_REDLOCK: &str = "no node loses its fence counters: every node runs with appendonly yes + appendfsync always and never evicts keys (a node restarted empty can let a later majority start below an earlier token; keeping it out for the maximum ttl protects mutual exclusion, not the counters)";

/// Once a majority has answered, how long the others are still waited for: as long again as
/// the majority took, but at least this. Healthy nodes answer together, so their answers (and
/// fence counters) are heard; a silent node costs this, not the node timeout.
pub const MIN_GRACE: Duration = Duration::from_millis(2);

/// One master: its node primitives, its address for messages, and the fencing its persistence
/// settings give, once it has answered a probe.
pub(crate) struct Master {
    pub(crate) node: Node,
    pub(crate) addr: String,
    /// `None` while the node has not answered a probe: connect goes on at a majority and
    /// probes the rest in the background.
    probed: Mutex<Option<Fencing>>,
}

impl Master {
    pub(crate) fn new(node: Node, addr: String) -> Self {
        Master {
            node,
            addr,
            probed: Mutex::new(None),
        }
    }

    fn probed(&self) -> Option<Fencing> {
        *self.probed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connects, checks the credentials with a `PING` and reads the persistence settings.
    pub(crate) async fn probe(&self) -> Result<Fencing> {
        let fencing = self.node.probe().await?;
        *self.probed.lock().unwrap_or_else(PoisonError::into_inner) = Some(fencing);
        Ok(fencing)
    }
}

/// What every Redlock operation works on.
pub(crate) struct Masters {
    pub(crate) nodes: Vec<Master>,
    pub(crate) quorum: usize,
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) defaults: ClientDefaults,
    pub(crate) redacted: String,
}

impl Masters {
    /// Strict while every node that has answered a probe keeps its counters (a node that has
    /// not answered yet is judged when it does); conditional as soon as one does not.
    pub(crate) fn fencing(&self) -> Fencing {
        let all_strict = self
            .nodes
            .iter()
            .filter_map(Master::probed)
            .all(|f| f == Fencing::Strict);
        if all_strict {
            Fencing::Strict
        } else {
            Fencing::Conditional {
                assumption: ASSUMPTION_REDLOCK,
            }
        }
    }

    /// How long one node may take to answer one request for a lease of `ttl`.
    pub(crate) fn node_limit(&self, ttl: Duration) -> Duration {
        config::node_limit(self.node_timeout, ttl)
    }

    pub(crate) fn quorum_error(&self, operation: &'static str, got: usize) -> Error {
        Error::QuorumNotReached {
            backend: BACKEND,
            operation,
            got,
            needed: self.quorum,
        }
    }

    /// Leaves every node's queue and deletes any lock granted to `owner` there.
    pub(crate) async fn cancel_everywhere(&self, name: &LockName, owner: OwnerId) {
        join_all(
            self.nodes
                .iter()
                .map(|n| async move { n.node.cancel(name, owner).await }),
        )
        .await;
    }
}

/// What an acquire of `owner` may have left on any node (the state of its clean-up guard).
pub(crate) type Attempted = (std::sync::Arc<Masters>, LockName, OwnerId);

/// The undo of an acquire that did not return its lease: leaves every queue and deletes any
/// lock granted meanwhile, on every node at once.
pub(crate) fn leave_everywhere((masters, name, owner): Attempted) -> Undo {
    Undo::Spawn(Box::pin(async move {
        masters.cancel_everywhere(&name, owner).await;
        Ok(true)
    }))
}

/// What [`gather`] does after an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Wait for the next answer.
    More,
    /// Stop: the round is decided.
    Stop,
    /// The round is won; listen to the others only for as long again as the round took so far
    /// (at least [`MIN_GRACE`]).
    Grace,
}

/// Drives one round of node requests, all started together, under a single deadline (`limit`
/// from now) for all of them: one timer per round, not one per node (on a multi-threaded
/// runtime a timer can cost more than a request's own bookkeeping). `step` sees each answer as
/// it comes. Requests still pending at the end stay in `pending`.
pub(crate) async fn gather<F: Future>(
    pending: &mut FuturesUnordered<F>,
    limit: Duration,
    mut step: impl FnMut(F::Output) -> Flow,
) {
    let started = Instant::now();
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    let mut graced = false;
    loop {
        let answer = tokio::select! {
            biased;
            answer = pending.next() => answer,
            () = &mut deadline => return,
        };
        let Some(answer) = answer else {
            return;
        };
        match step(answer) {
            Flow::More => {}
            Flow::Stop => return,
            Flow::Grace if graced => {}
            Flow::Grace => {
                graced = true;
                let until = tokio::time::Instant::now() + started.elapsed().max(MIN_GRACE);
                if until < deadline.deadline() {
                    deadline.as_mut().reset(until);
                }
            }
        }
    }
}
