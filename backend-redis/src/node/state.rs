//! What a node reports and clears outside any lease: the lock's state ([`Node::inspect`]),
//! the names it knows ([`Node::names`]), [`Node::forget`], and Redlock's fence write-back
//! ([`Node::fence_max`]).

use lockcore::{LockName, Result};
use redis::Value;

use super::replies;
use super::scripts::{self, Key};
use super::store::Store;
use super::{InspectReply, Node, backend_error, protocol_error};

impl Node {
    /// Raises the fence counter of `name` to `token` unless it is already there or beyond (a
    /// max-only write: a late or repeated one never lowers a counter); returns the counter
    /// afterwards.
    ///
    /// # Cancel safety
    /// The write either happened on the server or not; either is safe.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that is not an
    /// integer.
    pub async fn fence_max(&self, name: &LockName, token: u64) -> Result<u64> {
        let call = self
            .keys(name)
            .call(&scripts::FENCE_MAX, &[Key::Fence])
            .arg(token);
        match self.shared.store.eval(&call).await {
            Ok(Value::Int(v)) => u64::try_from(v).map_err(|_| {
                protocol_error("fence write-back", Some(name), format!("counter {v}"))
            }),
            Ok(other) => Err(protocol_error(
                "fence write-back",
                Some(name),
                format!("unexpected reply {other:?}"),
            )),
            Err(e) => Err(backend_error("fence write-back", Some(name), e)),
        }
    }

    /// What this node holds for `name`: holder, its remaining time, the fence counter, live
    /// waiters and queued entries, live readers and the oldest of them.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub async fn inspect(&self, name: &LockName) -> Result<InspectReply> {
        let call = self.keys(name).call(
            &scripts::INSPECT,
            &[Key::Lock, Key::Fence, Key::Queue, Key::Alive, Key::Readers],
        );
        let value = self.run("inspect", name, &call).await?;
        replies::parse_inspect(&value).map_err(|e| protocol_error("inspect", Some(name), e))
    }

    /// Deletes what is left of the lock `name` (fence counter, queue, ticket counter, expired
    /// readers) unless it is held (by a writer or a live reader) or waited for, and of the
    /// semaphore `name` (its fence counter, recorded count, queue and ticket counter) unless a
    /// permit is live or a waiter is, each on its own (as lockcore's memory backend does); `true`
    /// when nothing of either is left.
    ///
    /// # Cancel safety
    /// The deletion either happened on the server or not.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub async fn forget(&self, name: &LockName) -> Result<bool> {
        let call = self.keys(name).call(
            &scripts::FORGET,
            &[
                Key::Lock,
                Key::Fence,
                Key::Queue,
                Key::Alive,
                Key::Seq,
                Key::SemHolders,
                Key::SemFence,
                Key::SemQueue,
                Key::SemAlive,
                Key::SemSeq,
                Key::SemCount,
                Key::SemTerms,
                Key::Readers,
            ],
        );
        let value = self.run("forget", name, &call).await?;
        match value {
            Value::Int(n) => Ok(n == 1),
            other => Err(protocol_error(
                "forget",
                Some(name),
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// Every name with a fence counter under this node's prefix (a name gets one with its
    /// first grant and keeps it until `forget`), found with `SCAN`, which does not block the
    /// server; in a Cluster, on every master of the slot map.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub async fn names(&self) -> Result<Vec<LockName>> {
        let s = &self.shared;
        let pattern = scripts::fence_pattern(&s.prefix);
        let mut names = std::collections::BTreeSet::new();
        let masters = match &s.store {
            Store::Single(_) => vec![None],
            Store::Cluster(c) => c
                .masters()
                .await
                .map_err(|e| backend_error("list names", None, e))?
                .into_iter()
                .map(Some)
                .collect(),
        };
        for master in &masters {
            let mut cursor = 0_u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply = match (&s.store, master) {
                    (Store::Cluster(c), Some(node)) => c.query_node(node, scan).await,
                    _ => s.store.query(&scan).await,
                }
                .map_err(|e| backend_error("list names", None, e))?;
                let (next, keys) = replies::parse_scan(&reply)
                    .map_err(|e| protocol_error("list names", None, e))?;
                names.extend(
                    keys.iter()
                        .filter_map(|k| scripts::name_of_fence_key(&s.prefix, k)),
                );
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(names.into_iter().collect())
    }
}
