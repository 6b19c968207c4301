//! The counting-semaphore recipe, in each [`Layout`]. A permit is an ephemeral node (so a
//! crashed holder's permit comes back when its session ends); its fencing token is that node's
//! `czxid`, as for the lock, and grants are made in the order of those zxids, so tokens are
//! unique and increase with every grant of a semaphore. The lease is released and extended by
//! the lock's own code (its handle names the node).
//!
//! - **dlock's layout**: `{base}/s-{escaped name}` (a CONTAINER, apart from the lock's
//!   `n-{escaped name}`) holds one EPHEMERAL_SEQUENTIAL `permit-{owner}-{seq}` node per
//!   acquirer; the first `permits` of them in sequence order hold, and a waiter watches the
//!   children (any node ahead of it that goes moves it up, so no single node is the one to
//!   watch). The parent's data records the count: every request
//!   node is created in one transaction with a versioned write of the count, so two callers
//!   that read the semaphore idle cannot both set a count, and a caller that finds it in use
//!   with another count is refused.
//! - **Curator's** (`InterProcessSemaphoreV2`): an internal mutex at `{name}/locks` (Curator's
//!   `InterProcessMutex` nodes) serialises acquirers; its holder creates
//!   `{name}/leases/_c_{uuid}-lease-{seq}` and holds once the `leases` children number at most
//!   `permits`, else waits for them to change while keeping the internal mutex. Curator
//!   records no count; dlock writes its count to the `leases` node's data (Curator leaves it
//!   empty and never reads it), so dlock clients refuse each other's other counts.
//! - **kazoo's** (`Semaphore`): an internal kazoo `Lock` at `{name}-__lock__` serialises
//!   acquirers; its holder creates the EPHEMERAL node `{name}/{uuid hex}` once fewer than
//!   `permits` such nodes exist. `{name}`'s data records the count, as kazoo's
//!   `_ensure_path` does, and kazoo raises on another count.
//!
//! In the path layouts the internal mutex is acquired with the lock recipe and kept out of
//! the lease reaper (it is held only while this call runs, and deleted before it returns).
//!
//! This file holds what the layouts share (paths, permit nodes, the count, inspection); dlock's
//! own acquire is in `own`, Curator's and kazoo's in `library`.

use std::time::Instant;

use lockcore::{
    AcquireOptions, Error, FencingToken, Lease, LockName, OwnerId, PermitHolder, Result,
    SemaphoreInfo, backend_support::permits_mismatch,
};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::cleanup::{Nodes, delete_eventually, session_ended};
use crate::lock::{ZkLock, drift_for, effective_ttl, handle};
use crate::names::{self, Layout, Request};
use crate::recipe::own_node_gone;
use crate::session::{acls, no_answer, timed, until, zk_error};

mod library;
mod own;

/// dlock's permit node name, before the owner id and the sequence.
const DLOCK_PERMIT: &str = "permit-";
/// `InterProcessSemaphoreV2`'s children of the semaphore's path, and its lease node name.
const CURATOR_LOCKS: &str = "locks";
const CURATOR_LEASES: &str = "leases";
const CURATOR_LEASE: &str = "lease-";
/// What kazoo's `Semaphore` appends to its path for its internal lock.
const KAZOO_LOCK: &str = "-__lock__";

/// Where a semaphore's nodes live.
struct Paths {
    /// The parent of the permit (lease) nodes.
    leases: String,
    /// The node whose data records the count.
    count: String,
    /// The internal mutex (Curator's and kazoo's layouts).
    mutex: Option<LockName>,
}

/// A permit (lease) node among a semaphore's children.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PermitNode {
    node: String,
    owner: Option<OwnerId>,
    /// The server's sequence (none for kazoo's plain nodes).
    seq: Option<i64>,
}

/// Parses a child of the lease parent; `None` for anything else.
fn parse_permit(layout: Layout, node: &str) -> Option<PermitNode> {
    match layout {
        Layout::Dlock => {
            let (owner, seq) = node.strip_prefix(DLOCK_PERMIT)?.split_once('-')?;
            Some(PermitNode {
                node: node.to_owned(),
                owner: Some(OwnerId::parse(owner)?),
                seq: Some(seq.parse().ok().filter(|s: &i64| *s >= 0)?),
            })
        }
        Layout::Curator => {
            let split = node.len().checked_sub(10)?;
            let (stem, digits) = (node.get(..split)?, &node[split..]);
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let head = stem.strip_suffix(CURATOR_LEASE)?;
            Some(PermitNode {
                node: node.to_owned(),
                owner: names::curator_owner(head),
                seq: digits.parse().ok(),
            })
        }
        Layout::Kazoo => Some(PermitNode {
            node: node.to_owned(),
            owner: Some(OwnerId::parse(node)?),
            seq: None,
        }),
    }
}

/// The permit nodes among `children`, in sequence order where there is one.
fn permits_of(layout: Layout, children: &[String]) -> Vec<PermitNode> {
    let mut nodes: Vec<PermitNode> = children
        .iter()
        .filter_map(|c| parse_permit(layout, c))
        .collect();
    nodes.sort_by_key(|n| n.seq);
    nodes
}

/// The count a node's data records, if it is a number.
fn recorded(data: &[u8]) -> Option<u64> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

/// A semaphore's permit nodes, for the clean-up of an acquisition that ends without a permit.
const PERMIT_REQUESTS: Nodes = Nodes {
    node_of: permit_node_of,
    what: "abandoned permit request",
};

/// [`Nodes::node_of`] for a semaphore's permit nodes.
fn permit_node_of(layout: Layout, children: &[String], owner: OwnerId) -> Option<String> {
    permits_of(layout, children)
        .into_iter()
        .find(|c| c.owner == Some(owner))
        .map(|c| c.node)
}

/// The error for a request whose own node vanished: retryable when the session ended (the
/// server removed it), else what the lock says.
fn node_gone(client: &zk::Client, name: &LockName, when: &str) -> Error {
    if session_ended(client.state()) {
        Error::backend(
            BACKEND,
            "acquire a permit",
            Some(name),
            true,
            format!("the session ended {when}"),
        )
    } else {
        own_node_gone(name, when)
    }
}

/// The internal mutex of a semaphore in the path layouts, held for one acquisition: deleted
/// when the acquisition ends, by [`MutexHold::release`] or, if the future is dropped, by a
/// counted clean-up spawned at once.
struct MutexHold {
    client: zk::Client,
    path: Option<String>,
}

impl MutexHold {
    /// Deletes the node now; a failure leaves it to the clean-up of [`Drop`].
    async fn release(&mut self, lock: &ZkLock) {
        if let Some(path) = &self.path
            && let Ok(Ok(()) | Err(zk::Error::NoNode)) =
                timed(lock.limit(), self.client.delete(path, None)).await
        {
            self.path = None;
        }
    }
}

impl Drop for MutexHold {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let client = self.client.clone();
            lockcore::cleanup::spawn_counted(async move {
                delete_eventually(client, path, "semaphore's internal lock").await;
            });
        }
    }
}

/// Waits until the watched children change (or the session's state does), or `deadline`.
async fn wait_change(watcher: zk::OneshotWatcher, deadline: Option<Instant>) {
    until(deadline, watcher.changed()).await;
}

impl ZkLock {
    /// Where `name`'s semaphore lives in this client's layout.
    ///
    /// # Errors
    /// [`Error::InvalidName`] in the path layouts for a name that is no znode path.
    fn sem_paths(&self, name: &LockName) -> Result<Paths> {
        let base = &self.inner.base;
        let layout = self.layout();
        Ok(match layout {
            Layout::Dlock => {
                let node = names::node_name(name);
                let leases = format!("{base}/s-{}", &node[2..]);
                Paths {
                    count: leases.clone(),
                    leases,
                    mutex: None,
                }
            }
            Layout::Curator => {
                let root = names::lock_path(layout, base, name)?;
                let leases = format!("{root}/{CURATOR_LEASES}");
                Paths {
                    count: leases.clone(),
                    leases,
                    mutex: Some(LockName::new(format!("{}/{CURATOR_LOCKS}", name.as_str()))?),
                }
            }
            Layout::Kazoo => {
                let root = names::lock_path(layout, base, name)?;
                Paths {
                    count: root.clone(),
                    leases: root,
                    mutex: Some(LockName::new(format!("{}{KAZOO_LOCK}", name.as_str()))?),
                }
            }
        })
    }

    /// One permit acquisition: at once or not at all (`wait` false), or until `deadline`.
    pub(crate) async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Lease>> {
        let paths = self.sem_paths(name)?;
        let owner = opts.owner_or_random();
        let opts = opts.clone().owner(owner);
        match &paths.mutex {
            None => {
                self.dlock_permit(name, permits, &opts, &paths, deadline, wait)
                    .await
            }
            Some(mutex) => {
                let Some(internal) = self
                    .acquire(mutex, &opts, deadline, wait, Request::Mutex)
                    .await?
                else {
                    return Ok(None);
                };
                let client = self.inner.session.client().await?;
                let path = internal
                    .handle()
                    .and_then(|h| h.split_once(':'))
                    .map(|(_, p)| p.to_owned());
                // Held only while this call runs: out of the reaper's hands.
                if let Some(p) = &path {
                    self.held().remove(p);
                }
                let mut hold = MutexHold { client, path };
                let got = self
                    .library_permit(
                        name, permits, &opts, &paths, mutex, deadline, wait, &mut hold,
                    )
                    .await;
                hold.release(self).await;
                got
            }
        }
    }

    /// A granted permit's lease, registered with the reaper.
    fn permit_lease(
        &self,
        client: &zk::Client,
        name: &LockName,
        opts: &AcquireOptions,
        path: &str,
        stat: &zk::Stat,
        checked_at: Instant,
    ) -> Lease {
        let ttl = effective_ttl(opts.ttl_value(), client.session_timeout());
        self.register(path, checked_at + ttl, true);
        Lease::new(
            name.clone(),
            opts.owner_or_random(),
            FencingToken(stat.czxid as u64),
            checked_at,
            ttl,
            drift_for(opts, ttl),
        )
        .with_handle(handle(stat.ephemeral_owner, path))
    }

    /// Checks (and, while nobody else holds or waits, sets) the count recorded for a semaphore
    /// in the path layouts, with its internal mutex held: kazoo's `Semaphore` keeps it in its
    /// path's data, and dlock keeps it in Curator's `leases` node (which Curator ignores).
    async fn check_count(
        &self,
        client: &zk::Client,
        name: &LockName,
        permits: u32,
        paths: &Paths,
        mutex: &LockName,
    ) -> Result<()> {
        const OP: &str = "read the semaphore's count";
        let node = &paths.count;
        let data = match timed(self.limit(), client.get_data(node)).await {
            Ok(Ok((data, _))) => Some(data),
            Ok(Err(zk::Error::NoNode)) => None,
            Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
            Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
        };
        let count = permits.to_string();
        let Some(data) = data else {
            // Made as its library makes it (kazoo: PERSISTENT; Curator: CONTAINERs), then the
            // count written, as kazoo's `_ensure_path` does.
            match self.layout() {
                Layout::Curator => {
                    let containers = zk::CreateMode::Container.with_acls(acls(&self.inner.config));
                    match timed(self.limit(), client.mkdir(node, &containers)).await {
                        Ok(Ok(()) | Err(zk::Error::NodeExists)) => {}
                        Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                        Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                    }
                }
                _ => self.make_parent(client, node, name).await?,
            }
            return self.write_count(client, name, node, &count).await;
        };
        if recorded(&data) == Some(u64::from(permits)) {
            return Ok(());
        }
        let leases = self
            .children(client, &paths.leases, name, OP)
            .await?
            .unwrap_or_default();
        let mutex_parent = names::lock_path(self.layout(), &self.inner.base, mutex)?;
        let queued = self
            .children(client, &mutex_parent, name, OP)
            .await?
            .map_or(0, |c| names::queue(self.layout(), &c).len());
        let in_use = !permits_of(self.layout(), &leases).is_empty() || queued > 1;
        match recorded(&data) {
            Some(r) if in_use => Err(permits_mismatch(name, r, permits)),
            // Someone else's data, in use: left as it is (kazoo ignores it too).
            None if in_use => Ok(()),
            _ => self.write_count(client, name, node, &count).await,
        }
    }

    async fn write_count(
        &self,
        client: &zk::Client,
        name: &LockName,
        node: &str,
        count: &str,
    ) -> Result<()> {
        const OP: &str = "record the semaphore's count";
        match timed(self.limit(), client.set_data(node, count.as_bytes(), None)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(zk_error(OP, Some(name), e)),
            Err(()) => Err(no_answer(OP, Some(name), self.limit())),
        }
    }

    /// The holders and waiters of `name`'s semaphore (see
    /// [`DistributedLock::inspect_semaphore`](lockcore::DistributedLock::inspect_semaphore)).
    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        const OP: &str = "inspect a semaphore";
        let paths = self.sem_paths(name)?;
        let layout = self.layout();
        let client = self.inner.session.client().await?;
        self.caught_up(&client, &paths.leases, name, OP).await?;
        let children = self.children(&client, &paths.leases, name, OP).await?;
        let data = match timed(self.limit(), client.get_data(&paths.count)).await {
            Ok(Ok((data, _))) => Some(data),
            Ok(Err(zk::Error::NoNode)) => None,
            Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
            Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
        };
        let mutex_queue = match &paths.mutex {
            Some(m) => {
                let parent = names::lock_path(layout, &self.inner.base, m)?;
                self.children(&client, &parent, name, OP)
                    .await?
                    .map(|c| names::queue(layout, &c))
            }
            None => None,
        };
        if children.is_none() && mutex_queue.is_none() {
            return Ok(None);
        }
        let mut nodes = permits_of(layout, &children.unwrap_or_default());
        let count = data.as_deref().and_then(recorded);
        let waiters = match &mutex_queue {
            // The internal mutex's queue: its head waits for a lease (or is taking one).
            Some(q) => {
                if layout == Layout::Curator
                    && let Some(head) = q.first().and_then(|h| h.owner)
                {
                    // A dlock head's pending lease node carries its owner id.
                    nodes.retain(|n| n.owner != Some(head));
                }
                q.len()
            }
            None => {
                let holding = count.map_or(nodes.len(), |c| nodes.len().min(c as usize));
                let waiting = nodes.len() - holding;
                nodes.truncate(holding);
                waiting
            }
        };
        let stats: Vec<_> = nodes
            .iter()
            .map(|n| client.check_stat(&format!("{}/{}", paths.leases, n.node)))
            .collect();
        let mut holders = Vec::new();
        for (n, stat) in nodes.iter().zip(stats) {
            let stat = match timed(self.limit(), stat).await {
                Ok(Ok(Some(stat))) => stat,
                Ok(Ok(None)) => continue,
                Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
            };
            holders.push(PermitHolder {
                owner: n.owner.map_or_else(|| n.node.clone(), |o| o.to_string()),
                token: FencingToken(stat.czxid as u64),
                remaining: None,
            });
        }
        holders.sort_by_key(|h| h.token);
        let in_use = !holders.is_empty() || waiters > 0;
        let permits = count.filter(|_| in_use).and_then(|c| u32::try_from(c).ok());
        Ok(Some(SemaphoreInfo::new(
            name,
            permits,
            holders,
            Some(waiters),
        )))
    }
}

#[cfg(test)]
mod tests;
