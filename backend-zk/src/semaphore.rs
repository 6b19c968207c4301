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

use std::time::Instant;

use lockcore::{
    AcquireOptions, Error, FencingToken, Lease, LockName, OwnerId, PermitHolder, Result,
    SemaphoreInfo, permits_mismatch,
};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::cleanup::{Nodes, arm_attempt, delete_eventually, session_ended};
use crate::lock::{ZkLock, drift_for, effective_ttl, handle};
use crate::names::{self, Layout, Request};
use crate::recipe::own_node_gone;
use crate::session::{acls, no_answer, timed, until, zk_error};

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

/// Up to this many permits, a waiter in dlock's layout watches the `permits` nodes right ahead
/// of its own (see [`ZkLock::wait_ahead`]); above it, the semaphore's children.
const WATCH_AHEAD_MAX: usize = 16;

/// The watches a waiter in dlock's layout keeps while it waits (see [`ZkLock::wait_ahead`]).
#[derive(Default)]
struct Watching {
    /// The nodes ahead with an `exists` watch not yet fired.
    nodes: std::collections::HashSet<String>,
    /// Their events, by node.
    changes: tokio::task::JoinSet<(String, zk::EventType)>,
    /// The watch on the waiter's own node, once set and until it fires.
    own: Option<std::pin::Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>>,
}

/// What ended one wait of [`ZkLock::wait_ahead`].
enum Woke {
    /// The waiter's own node changed.
    Own,
    /// A node ahead was found gone as its watch was set.
    FoundGone,
    /// A watched node ahead had this event.
    Node(String, zk::EventType),
    /// The watch task ended without an event (it never does unless the client goes away).
    Lost,
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

    /// dlock's layout: queue, and hold among the first `permits`.
    async fn dlock_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        paths: &Paths,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Lease>> {
        const OP: &str = "acquire a permit";
        let client = self.inner.session.client().await?;
        let owner = opts.owner_or_random();
        let parent = &paths.leases;
        let mut guard = arm_attempt(
            name,
            &client,
            Layout::Dlock,
            parent,
            owner,
            &PERMIT_REQUESTS,
        );
        let count = permits.to_string();
        let prefix = format!("{parent}/{DLOCK_PERMIT}{owner}-");
        let node_opts = zk::CreateMode::EphemeralSequential.with_acls(acls(&self.inner.config));
        // Admission: the count read with the children, written back in the transaction that
        // creates the node, at the version read (so any admission in between sends us round).
        // Whether this session's server was brought up to date before reporting a mismatch.
        let mut synced = false;
        let path = loop {
            let data = client.get_data(parent);
            let listed = client.get_children(parent);
            let (data, listed) =
                tokio::join!(timed(self.limit(), data), timed(self.limit(), listed));
            let (data, listed) = match (data, listed) {
                (Ok(Ok(d)), Ok(Ok(l))) => (d, l),
                (Ok(Err(zk::Error::NoNode)), _) | (_, Ok(Err(zk::Error::NoNode))) => {
                    let containers = zk::CreateMode::Container.with_acls(acls(&self.inner.config));
                    match timed(
                        self.limit(),
                        client.create(parent, count.as_bytes(), &containers),
                    )
                    .await
                    {
                        Ok(Ok(_) | Err(zk::Error::NodeExists)) => continue,
                        Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                        Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                    }
                }
                (Ok(Err(e)), _) | (_, Ok(Err(e))) => return Err(zk_error(OP, Some(name), e)),
                _ => return Err(no_answer(OP, Some(name), self.limit())),
            };
            let ((data, stat), (children, listed_stat)) = (data, listed);
            if stat.version != listed_stat.version {
                continue;
            }
            let in_use = !permits_of(Layout::Dlock, &children).is_empty();
            if let Some(r) = recorded(&data).filter(|r| in_use && *r != u64::from(permits)) {
                // A follower may still list holders that have left through another server: a
                // mismatch is reported only from what the session sees once caught up.
                if !synced {
                    self.caught_up(&client, parent, name, OP).await?;
                    synced = true;
                    continue;
                }
                return Err(permits_mismatch(name, r, permits));
            }
            let mut multi = client.new_multi_writer();
            multi
                .add_set_data(parent, count.as_bytes(), Some(stat.version))
                .and_then(|()| multi.add_create(&prefix, &[], &node_opts))
                .map_err(|e| zk_error(OP, Some(name), e))?;
            match timed(self.limit(), multi.commit()).await {
                Ok(Ok(results)) => match results.into_iter().nth(1) {
                    Some(zk::MultiWriteResult::Create { path, .. }) => {
                        guard.state_mut().path = Some(path.clone());
                        break path;
                    }
                    _ => {
                        return Err(Error::backend(
                            BACKEND,
                            OP,
                            Some(name),
                            false,
                            "the server's reply to the transaction lacks the create",
                        ));
                    }
                },
                Ok(Err(e)) => match zk::Error::from(e) {
                    zk::Error::BadVersion | zk::Error::NoNode => continue,
                    // The guard finds a node that was made after all by its owner id.
                    e => return Err(zk_error(OP, Some(name), e)),
                },
                Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
            }
        };
        let me = path.rsplit('/').next().unwrap_or_default().to_owned();
        // Few permits: watch the nodes right ahead (see `wait_ahead`); many: the children.
        let watch_children = permits as usize > WATCH_AHEAD_MAX;
        let mut stat = None;
        // Set when this request was the first waiter (exactly `permits` nodes ahead, all
        // watched) and one of them went while its node stood: fewer than `permits` are ahead
        // then, and no node can be created below an existing one, so it holds without reading
        // the children again (dlock's layout has only dlock clients).
        let mut ahead_gone = false;
        let mut watching = Watching::default();
        loop {
            let checked_at = Instant::now();
            let listed = if ahead_gone {
                Ok(Ok((vec![me.clone()], None)))
            } else if watch_children {
                let listed = timed(self.limit(), client.list_and_watch_children(parent)).await;
                listed.map(|r| r.map(|(children, w)| (children, Some(w))))
            } else {
                let listed = timed(self.limit(), client.list_children(parent)).await;
                listed.map(|r| r.map(|children| (children, None)))
            };
            let (children, watcher) = match listed {
                Ok(Ok(listed)) => listed,
                Ok(Err(zk::Error::NoNode)) => (Vec::new(), None),
                Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
            };
            let queue = permits_of(Layout::Dlock, &children);
            let Some(at) = queue.iter().position(|c| c.node == me) else {
                guard.disarm();
                return Err(node_gone(&client, name, "while it waited"));
            };
            if at < permits as usize {
                let stat = match stat.take() {
                    Some(stat) => Some(stat),
                    None => self.czxid(&client, &path, name).await?,
                };
                let Some(stat) = stat else {
                    guard.disarm();
                    return Err(node_gone(&client, name, "as it became a holder"));
                };
                let lease = self.permit_lease(&client, name, opts, &path, &stat, checked_at);
                guard.disarm();
                return Ok(Some(lease));
            }
            if !wait || deadline.is_some_and(|d| Instant::now() >= d) {
                self.withdraw(&client, &path, guard).await;
                return Ok(None);
            }
            // The node's stat (its czxid is the token) is read while waiting, once, so that it
            // is not a round trip between the release ahead and this grant. (The listing just
            // made shows the node stands; the stat a create returns cannot be trusted on every
            // server, see `czxid`.)
            if stat.is_none() {
                stat = self.czxid(&client, &path, name).await?;
            }
            match watcher {
                Some(watcher) => wait_change(watcher, deadline).await,
                None => {
                    let ahead = &queue[at - permits as usize..at];
                    let gone = self
                        .wait_ahead(&client, name, parent, ahead, &path, &mut watching, deadline)
                        .await?;
                    ahead_gone = gone && at == permits as usize;
                }
            }
        }
    }

    /// Waits, in dlock's layout, until one of the `ahead` nodes (the `permits` nodes right
    /// ahead of this request's node `mine`) or `mine` itself changes, the session breaks, or
    /// `deadline` passes; returns at once if one of them is gone already. Says `true` only
    /// when a node of `ahead` is known deleted while `mine` is known to stand.
    ///
    /// While all `permits` of them stand, at least `permits` nodes are ahead, so this request
    /// cannot hold, whatever happens further ahead; it can only move up once one of them goes.
    /// So a release wakes only the waiters that have the freed node among their `permits`
    /// predecessors, not every waiter (and a new request behind wakes nobody), where a watch
    /// on the children would wake every waiter at every change.
    ///
    /// The watches stay in `watching` across calls: a node stays among the `permits` right
    /// ahead until it goes (nodes ahead only ever go), so after a release a waiter sends one
    /// `exists` for the node that moved into its window, not one for each.
    ///
    /// `mine`'s own watch is looked at first, and the client hands a session's watch events
    /// and replies over in the server's order, so a deletion of `mine` that came before is
    /// seen first (as the lock's `wait_for` does).
    #[allow(clippy::too_many_arguments)]
    async fn wait_ahead(
        &self,
        client: &zk::Client,
        name: &LockName,
        parent: &str,
        ahead: &[PermitNode],
        mine: &str,
        watching: &mut Watching,
        deadline: Option<Instant>,
    ) -> Result<bool> {
        // Every new watch is on the wire before any reply is awaited, `mine` last: if a node
        // ahead is gone and `mine` stands after, `mine` stood when that node was read.
        let sent: Vec<_> = ahead
            .iter()
            .filter(|n| !watching.nodes.contains(&n.node))
            .map(|n| {
                let watch = client.check_and_watch_stat(&format!("{parent}/{}", n.node));
                (n.node.clone(), watch)
            })
            .collect();
        let own = watching
            .own
            .is_none()
            .then(|| client.check_and_watch_stat(mine));
        let mut gone = false;
        for (node, watch) in sent {
            let (stat, watcher) = self.watched(name, watch).await?;
            match stat {
                Some(_) => {
                    watching.nodes.insert(node.clone());
                    watching
                        .changes
                        .spawn(async move { (node, watcher.changed().await.event_type) });
                }
                None => gone = true,
            }
        }
        if let Some(own) = own {
            let (stat, watcher) = self.watched(name, own).await?;
            if stat.is_none() {
                return Ok(false);
            }
            watching.own = Some(Box::pin(watcher.changed()));
        }
        let Some(own_changed) = watching.own.as_mut() else {
            return Ok(false);
        };
        loop {
            // Own first: when both events are already in, the deletion of this request's node
            // must not be missed.
            let changed = async {
                tokio::select! {
                    biased;
                    _ = own_changed.as_mut() => Woke::Own,
                    () = std::future::ready(()), if gone => Woke::FoundGone,
                    event = watching.changes.join_next() => match event {
                        Some(Ok((node, event))) => Woke::Node(node, event),
                        _ => Woke::Lost,
                    },
                }
            };
            match until(deadline, changed).await {
                None | Some(Woke::Lost) => return Ok(false),
                Some(Woke::FoundGone) => return Ok(true),
                Some(Woke::Own) => {
                    // Its watch is spent.
                    watching.own = None;
                    return Ok(false);
                }
                Some(Woke::Node(node, event)) => {
                    watching.nodes.remove(&node);
                    // A node that went before the listing `ahead` comes from: nothing to do.
                    if ahead.iter().any(|n| n.node == node) {
                        return Ok(event == zk::EventType::NodeDeleted);
                    }
                }
            }
        }
    }

    /// Curator's and kazoo's layouts, with the internal mutex held.
    #[allow(clippy::too_many_arguments)]
    async fn library_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        paths: &Paths,
        mutex: &LockName,
        deadline: Option<Instant>,
        wait: bool,
        hold: &mut MutexHold,
    ) -> Result<Option<Lease>> {
        const OP: &str = "acquire a permit";
        let layout = self.layout();
        let client = hold.client.clone();
        let owner = opts.owner_or_random();
        let parent = &paths.leases;
        self.check_count(&client, name, permits, paths, mutex)
            .await?;
        let mut guard = arm_attempt(name, &client, layout, parent, owner, &PERMIT_REQUESTS);
        let data = owner.to_string().into_bytes();
        // Curator creates its lease first and counts it; kazoo counts, then creates.
        let mut created = None;
        if layout == Layout::Curator {
            let prefix = format!(
                "{parent}/{}{CURATOR_LEASE}",
                names::curator_protected(owner)
            );
            let node_opts = zk::CreateMode::EphemeralSequential.with_acls(acls(&self.inner.config));
            let (stat, seq) =
                match timed(self.limit(), client.create(&prefix, &data, &node_opts)).await {
                    Ok(Ok(made)) => made,
                    Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                    Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                };
            let path = format!("{prefix}{seq}");
            guard.state_mut().path = Some(path.clone());
            created = Some((path, stat));
        }
        loop {
            let checked_at = Instant::now();
            let (children, watcher) =
                match timed(self.limit(), client.list_and_watch_children(parent)).await {
                    Ok(Ok(listed)) => listed,
                    Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                    Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                };
            match &created {
                Some((path, stat)) => {
                    let me = path.rsplit('/').next().unwrap_or_default();
                    if !children.iter().any(|c| c == me) {
                        guard.disarm();
                        return Err(node_gone(&client, name, "while it waited"));
                    }
                    // Curator's rule: every child of `leases` counts, this one's included.
                    if children.len() <= permits as usize {
                        let lease = self.permit_lease(&client, name, opts, path, stat, checked_at);
                        hold.release(self).await;
                        guard.disarm();
                        return Ok(Some(lease));
                    }
                }
                None => {
                    let taken = permits_of(Layout::Kazoo, &children).len();
                    if taken < permits as usize {
                        let path = format!("{parent}/{owner}");
                        let node_opts =
                            zk::CreateMode::Ephemeral.with_acls(acls(&self.inner.config));
                        guard.state_mut().path = Some(path.clone());
                        let stat = match timed(
                            self.limit(),
                            client.create(&path, &data, &node_opts),
                        )
                        .await
                        {
                            Ok(Ok((stat, _))) => stat,
                            Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                            Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                        };
                        let lease =
                            self.permit_lease(&client, name, opts, &path, &stat, checked_at);
                        hold.release(self).await;
                        guard.disarm();
                        return Ok(Some(lease));
                    }
                }
            }
            if !wait || deadline.is_some_and(|d| Instant::now() >= d) {
                let withdrawn = match &created {
                    Some((path, _)) => matches!(
                        timed(self.limit(), client.delete(path, None)).await,
                        Ok(Ok(()) | Err(zk::Error::NoNode))
                    ),
                    None => true,
                };
                if withdrawn {
                    guard.disarm();
                }
                return Ok(None);
            }
            wait_change(watcher, deadline).await;
        }
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
mod tests {
    use super::*;

    #[test]
    fn permit_nodes_parse_in_each_layout() {
        let o = OwnerId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let dlock = format!("{DLOCK_PERMIT}{o}-0000000012");
        let p = parse_permit(Layout::Dlock, &dlock).unwrap();
        assert_eq!((p.owner, p.seq), (Some(o), Some(12)));
        let curator = format!("{}{CURATOR_LEASE}0000000003", names::curator_protected(o));
        let p = parse_permit(Layout::Curator, &curator).unwrap();
        assert_eq!((p.owner, p.seq), (Some(o), Some(3)));
        // Curator without protection: a lease, of no known owner.
        let p = parse_permit(Layout::Curator, "lease-0000000004").unwrap();
        assert_eq!((p.owner, p.seq), (None, Some(4)));
        let p = parse_permit(Layout::Kazoo, &o.to_string()).unwrap();
        assert_eq!((p.owner, p.seq), (Some(o), None));
        for (layout, junk) in [
            (Layout::Dlock, "write-0123-0000000001"),
            (Layout::Curator, "_c_x-lock-0000000001"),
            (
                Layout::Kazoo,
                "0123456789abcdef0011223344556677__lock__0000000001",
            ),
            (Layout::Kazoo, "lock"),
        ] {
            assert_eq!(parse_permit(layout, junk), None, "{junk}");
        }
        assert_eq!(recorded(b"3"), Some(3));
        assert_eq!(recorded(b""), None);
    }
}
