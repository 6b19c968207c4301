//! What a granted lease does on its node: release and extend, one lease at a time or many in
//! one pipeline, for a lock, a reader or a permit alike (the lease's handle picks the script).

use std::future::Future;
use std::time::Duration;

use lockcore::{Lease, LockName, OwnerId, Result};
use redis::{RedisResult, Value};

use super::cluster::{NodeAddr, slot};
use super::replies;
use super::scripts::{self, Call, Key};
use super::store::Store;
use super::{Node, backend_error, is_permit, is_plain, is_reader, millis, protocol_error};

impl Node {
    /// The owner- and token-checked release of `lease`, which also takes the holder's own queue
    /// entry out and wakes the head waiter; resolves to `true` when this node deleted the lock,
    /// `false` when it was no longer `lease`'s. A permit's lease ([`PERMIT`](super::PERMIT)) frees
    /// its permit and hands the free permits to the head waiters in the same script, telling each
    /// its token (see `lua/sem_release.lua`); a reader's ([`READER`](super::READER)) frees its read
    /// hold, and the last reader's release wakes the head waiter. A lease the `try` fast path
    /// granted ([`PLAIN`](super::PLAIN)) is released by `lua/release_plain.lua` while its key is
    /// still plain, with two keys and two arguments, and by the full script (a second round
    /// trip) only when a waiter has marked the key since. The call is built now and the
    /// returned future owns all it needs, so it can finish in a task of its own.
    ///
    /// A release over a connection found closed is sent again over a new one; if the first
    /// try ran (its reply lost), the second finds the lock gone and resolves to `false`.
    ///
    /// # Cancel safety
    /// The release either ran on the server or not.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send + 'static {
        let (node, name) = (self.clone(), lease.name().clone());
        let (owner, token) = (lease.owner(), lease.token().0);
        // A lease the fast path granted tries the short script first (see `PLAIN`).
        let (plain, full) = if is_plain(lease) {
            let plain = self
                .keys(lease.name())
                .call(&scripts::RELEASE_PLAIN, &[Key::Lock, Key::Fence])
                .owner_arg(owner)
                .arg(token);
            (Some(plain), None)
        } else {
            (None, Some(self.release_call(lease)))
        };
        async move {
            if let Some(plain) = plain {
                let value = node.run("release", &name, &plain).await?;
                match replies::int(&value) {
                    Some(1) => return Ok(true),
                    Some(0) => return Ok(false),
                    // Marked since the grant: only the full release may undo that.
                    Some(-1) => {}
                    _ => {
                        let bad = format!("release: unexpected reply {value:?}");
                        return Err(protocol_error("release", Some(&name), bad));
                    }
                }
            }
            let call = full.unwrap_or_else(|| node.lock_release_call(&name, owner, token));
            let value = node.run("release", &name, &call).await?;
            replies::parse_flag(&value).map_err(|e| protocol_error("release", Some(&name), e))
        }
    }

    /// The full release call of `lease`, whatever it holds.
    fn release_call(&self, lease: &Lease) -> Call {
        let keys = self.keys(lease.name());
        if is_permit(lease) {
            keys.call(
                &scripts::SEM_RELEASE,
                &[
                    Key::SemHolders,
                    Key::SemQueue,
                    Key::SemAlive,
                    Key::SemCount,
                    Key::SemFence,
                    Key::SemTerms,
                ],
            )
            .arg(replies::permit_member(lease.owner(), lease.token().0))
            .arg(&*self.wakes_of(lease.name()))
            .arg(0)
        } else if is_reader(lease) {
            // The semaphore's release on the lock's readers: only the last reader's release
            // wakes the head (a writer, if anyone).
            keys.call(
                &scripts::SEM_RELEASE,
                &[Key::Readers, Key::Queue, Key::Alive, Key::Lock],
            )
            .arg(replies::permit_member(lease.owner(), lease.token().0))
            .arg(&*self.wakes_of(lease.name()))
            .arg(1)
        } else {
            self.lock_release_call(lease.name(), lease.owner(), lease.token().0)
        }
    }

    /// `lua/release.lua` for the lock `name` held by `owner` with `token`.
    fn lock_release_call(&self, name: &LockName, owner: OwnerId, token: u64) -> Call {
        self.keys(name)
            .call(
                &scripts::RELEASE,
                &[Key::Lock, Key::Fence, Key::Queue, Key::Alive],
            )
            .owner_arg(owner)
            .arg(token)
            .arg(&*self.wakes_of(name))
            .arg(self.shared.client.as_str())
    }

    /// The extend call of `lease`: a lock's, a permit's (see [`PERMIT`](super::PERMIT)) or a
    /// reader's (see [`READER`](super::READER)), so that one pipeline renews every kind.
    fn extend_call(&self, lease: &Lease, ttl: Duration) -> Call {
        let keys = self.keys(lease.name());
        if is_permit(lease) || is_reader(lease) {
            // A reader's hold is a member of the same shape as a permit's, on the lock's keys;
            // the lock key, RESERVED while a reader holds, is kept as long.
            let holders: &[Key] = if is_reader(lease) {
                &[Key::Readers, Key::Lock]
            } else {
                &[Key::SemHolders]
            };
            return keys
                .call(&scripts::SEM_EXTEND, holders)
                .arg(replies::permit_member(lease.owner(), lease.token().0))
                .arg(millis(ttl));
        }
        keys.call(&scripts::EXTEND, &[Key::Lock, Key::Fence])
            .owner_arg(lease.owner())
            .arg(lease.token().0)
            .arg(millis(ttl))
    }

    /// Sets a new ttl on `lease`'s lock if it is still this lease's (owner and token checked):
    /// `true` when extended, `false` when expired or taken. Never resurrects a lock.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lock.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool> {
        let reply = self.shared.store.eval(&self.extend_call(lease, ttl)).await;
        extend_answer(lease, reply)
    }

    /// [`extend`](Node::extend) for many leases with as few round trips as the deployment
    /// allows: one pipeline on a single server, one per master in a Cluster (sent at once).
    /// One answer per lease, in order.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended each lock.
    ///
    /// # Errors
    /// Each answer as [`extend`](Node::extend)'s.
    pub async fn extend_many(&self, leases: &[(&Lease, Duration)]) -> Vec<Result<bool>> {
        let calls: Vec<Call> = leases
            .iter()
            .map(|(lease, ttl)| self.extend_call(lease, *ttl))
            .collect();
        let replies = self.shared.store.eval_many(&calls).await;
        leases
            .iter()
            .zip(replies)
            .map(|((lease, _), reply)| extend_answer(lease, reply))
            .collect()
    }

    /// How many pipelines [`extend_many`](Node::extend_many) sends for `leases`: one on a single
    /// server, one per master of the slot map in a Cluster.
    pub(crate) fn pipelines(&self, leases: &[(&Lease, Duration)]) -> u64 {
        match &self.shared.store {
            Store::Single(_) => u64::from(!leases.is_empty()),
            Store::Cluster(c) => {
                let mut nodes: Vec<Option<NodeAddr>> = leases
                    .iter()
                    .map(|(lease, _)| c.node_of(slot(self.keys(lease.name()).tag().as_bytes())))
                    .collect();
                nodes.sort_unstable();
                nodes.dedup();
                nodes.len() as u64
            }
        }
    }
}

/// An extend script's reply as an answer for `lease`.
fn extend_answer(lease: &Lease, reply: RedisResult<Value>) -> Result<bool> {
    let value = reply.map_err(|e| backend_error("extend", Some(lease.name()), e))?;
    replies::parse_flag(&value).map_err(|e| protocol_error("extend", Some(lease.name()), e))
}
