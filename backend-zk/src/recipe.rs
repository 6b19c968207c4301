//! The lock recipe: one EPHEMERAL_SEQUENTIAL node per attempt under the lock's CONTAINER parent. A
//! write (exclusive) request holds when its node is the lowest and watches only the node just below
//! it; a read request holds when no write node is below it and watches only the nearest write node
//! below it. Leases are bounded by the session timeout, and an unrenewed lease's node is deleted by
//! this client when its ttl runs out.
//!
//! The `getChildren` that decides an attempt goes out right behind its `create` (one session's
//! requests are served in order), in every layout. In dlock's own layout two more shortcuts save
//! the re-read of the children when a waiter wakes; both are sound because no node can ever be
//! created below an existing one, and because only dlock clients queue there. A waiter holds
//! without reading again when the node it watched was the lowest it saw, or was an exclusive node
//! released by its holder, which writes [`RELEASED_MARK`](crate::lock::RELEASED_MARK) in the
//! transaction that deletes it when it had waited (a node that held at once was the head for every
//! waiter that ever listed behind it; see [`Held::mark`](crate::lock::Held::mark) and
//! docs/design/backend-zk.md, "Round trips").
//!
//! In Curator's and kazoo's layouts other clients queue too. They never write the mark, and they
//! may write to a held node for other reasons (Curator's revocation writes `__REVOKE__` to it),
//! which would read as the mark; so the mark is off there. The head's-successor shortcut goes with
//! it, so that in those layouts a waiter holds only on a listing that shows it first, the rule the
//! other clients follow too.

use std::time::Instant;

use lockcore::cleanup::CleanupGuard;
use lockcore::{AcquireOptions, Error, FencingToken, Lease, LockName, OwnerId, Result};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::cleanup::{Attempt, Nodes, arm_attempt};
use crate::lock::{CONTAINER, ZkLock, drift_for, effective_ttl, handle, parse_handle};
use crate::names::{self, Child, Layout, NodeKind, Request};
use crate::session::{AclReply, acls, no_answer, read_acl, timed, until, zk_error};

/// How many times a create is retried when the lock's parent vanishes in between (the server
/// removes empty containers).
pub(crate) const PARENT_RETRIES: usize = 10;

/// A lock's queue nodes, for the clean-up of an acquisition that ends without the lock.
const LOCK_REQUESTS: Nodes = Nodes {
    node_of: queued_node_of,
    what: "abandoned lock request",
};

/// [`Nodes::node_of`] for a lock's queue.
fn queued_node_of(layout: Layout, children: &[String], owner: OwnerId) -> Option<String> {
    names::queue(layout, children)
        .into_iter()
        .find(|c| c.owner == Some(owner))
        .map(|c| c.node)
}

/// Why [`ZkLock::wait_for`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// The watched predecessor was deleted, and this request's node still stood.
    BlockerGone,
    /// The watched predecessor, an exclusive node, was released by its holder (it carried
    /// [`RELEASED_MARK`](crate::lock::RELEASED_MARK)), and this request's node still stood.
    BlockerReleasedByHolder,
    /// Anything else: the own node changed, a session event, the deadline.
    Other,
}

/// An attempt's node, as [`ZkLock::create_request`] made (or found) it.
struct Created {
    /// The node's path.
    path: String,
    /// The create's stat, when the reply carried a valid one (its czxid is the token).
    stat: Option<zk::Stat>,
    /// The parent's children, listed right after the create on the same session.
    children: Option<Vec<String>>,
}

impl ZkLock {
    /// Brings this session's server up to date with the ensemble's leader (`sync`), so that the
    /// reads that follow see every change that completed before, also one another client made
    /// through another server (a follower may otherwise serve a read from before it). For the
    /// reads that report state to a caller, not for the recipe's own (its writes order them).
    pub(crate) async fn caught_up(
        &self,
        client: &zk::Client,
        path: &str,
        name: &LockName,
        op: &'static str,
    ) -> Result<()> {
        match timed(self.limit(), client.sync(path)).await {
            Ok(Ok(()) | Err(zk::Error::NoNode)) => Ok(()),
            Ok(Err(e)) => Err(zk_error(op, Some(name), e)),
            Err(()) => Err(no_answer(op, Some(name), self.limit())),
        }
    }

    /// Lists `parent`'s children; `Ok(None)` when the parent does not exist.
    pub(crate) async fn children(
        &self,
        client: &zk::Client,
        parent: &str,
        name: &LockName,
        op: &'static str,
    ) -> Result<Option<Vec<String>>> {
        match timed(self.limit(), client.list_children(parent)).await {
            Ok(Ok(c)) => Ok(Some(c)),
            Ok(Err(zk::Error::NoNode)) => Ok(None),
            Ok(Err(e)) => Err(zk_error(op, Some(name), e)),
            Err(()) => Err(no_answer(op, Some(name), self.limit())),
        }
    }

    /// Finds the node of `owner` in `parent` after a create whose reply was lost.
    async fn find_own(
        &self,
        client: &zk::Client,
        parent: &str,
        name: &LockName,
        owner: OwnerId,
    ) -> Result<Option<String>> {
        let children = self.children(client, parent, name, "acquire").await?;
        Ok(children.and_then(|c| {
            names::queue(self.layout(), &c)
                .into_iter()
                .find(|c| c.owner == Some(owner))
                .map(|c| format!("{parent}/{}", c.node))
        }))
    }

    /// Creates the attempt's node, making the parent if needed; after a connection loss it
    /// looks for its own node (by owner id) before creating again, so one attempt never leaves
    /// two nodes.
    ///
    /// The `getChildren` that decides the attempt is sent right behind the `create`, without
    /// waiting for its reply: ZooKeeper serves a session's requests in the order it sent them,
    /// so the listing already contains the new node and every lower one still there, exactly
    /// as a listing sent after the reply would. An uncontended acquire thus costs two round
    /// trips, not three.
    ///
    /// In the path layouts the node holds the owner id as its data, where Curator keeps its
    /// client's address and kazoo its `identifier`, so that their tools see who queued.
    async fn create_request(
        &self,
        client: &zk::Client,
        name: &LockName,
        parent: &str,
        request: Request,
        guard: &mut CleanupGuard<Attempt>,
    ) -> Result<Created> {
        let owner = guard.state().owner;
        let layout = self.layout();
        let prefix = format!("{parent}/{}", names::request_prefix(layout, request, owner));
        let data = if layout.names_are_paths() {
            owner.to_string().into_bytes()
        } else {
            Vec::new()
        };
        let node_opts = zk::CreateMode::EphemeralSequential.with_acls(acls(&self.inner.config));
        for _ in 0..PARENT_RETRIES {
            // Every request is on the wire once the calls return. With credentials, a parent
            // not checked yet has its ACL read first, in the same round trip.
            let acl = self.acl_unknown(parent).then(|| client.get_acl(parent));
            let create = client.create(&prefix, &data, &node_opts);
            let list = client.get_children(parent);
            let acl = async {
                match acl {
                    Some(read) => Some(timed(self.limit(), read).await),
                    None => None,
                }
            };
            let (acl, created, listed) =
                tokio::join!(acl, timed(self.limit(), create), timed(self.limit(), list));
            match created {
                Ok(Ok((stat, seq))) => {
                    let path = format!("{prefix}{seq}");
                    guard.state_mut().path = Some(path.clone());
                    // A listing that failed (the connection dropped between the two replies,
                    // say) is simply taken again.
                    let (children, seen) = match listed {
                        Ok(Ok((children, parent_stat))) => {
                            (Some(children), Some(parent_stat.czxid))
                        }
                        _ => (None, None),
                    };
                    // Refused: the armed guard deletes the node.
                    self.check_parent(client, "acquire", parent, name, seen, acl)
                        .await?;
                    // CREATE2's stat is right on its own on 3.8.0 (only inside a MULTI is it
                    // invalid, ZOOKEEPER-4026); an invalid one is read again with `exists`.
                    return Ok(Created {
                        path,
                        stat: (stat.czxid > 0).then_some(stat),
                        children,
                    });
                }
                Ok(Err(zk::Error::NoNode)) => self.make_parent(client, parent, name).await?,
                Ok(Err(e)) if crate::session::is_connection_loss(&e) => {
                    // The create may or may not have been applied: look before trying again.
                    if let Some(path) = self.find_own(client, parent, name, owner).await? {
                        guard.state_mut().path = Some(path.clone());
                        self.check_parent(client, "acquire", parent, name, None, None)
                            .await?;
                        return Ok(Created {
                            path,
                            stat: None,
                            children: None,
                        });
                    }
                }
                Ok(Err(e)) => return Err(zk_error("acquire", Some(name), e)),
                // Still pending in the client: the armed guard finds and deletes it by owner.
                Err(()) => return Err(no_answer("acquire", Some(name), self.limit())),
            }
        }
        Err(Error::backend(
            BACKEND,
            "acquire",
            Some(name),
            true,
            "the lock's parent node kept disappearing",
        ))
    }

    /// Makes a lock's parent node as the layout's library would: in dlock's layout one
    /// CONTAINER under the base node; in Curator's, the path and every missing ancestor as
    /// CONTAINERs (`creatingParentContainersIfNeeded`); in kazoo's, the path as a PERSISTENT
    /// node (`ensure_path`: a kazoo `Lock` remembers that its path exists and would fail if the
    /// server removed an empty container behind it), its missing ancestors as CONTAINERs, so
    /// that nothing of a forgotten name stays behind.
    pub(crate) async fn make_parent(
        &self,
        client: &zk::Client,
        parent: &str,
        name: &LockName,
    ) -> Result<()> {
        const OP: &str = "create the lock's node";
        let config = &self.inner.config;
        let containers = zk::CreateMode::Container.with_acls(acls(config));
        let create = |mode: &zk::CreateOptions<'_>| {
            let sent = client.create(parent, &[], mode);
            async move { timed(self.limit(), sent).await.map(|r| r.map(drop)) }
        };
        let made = match self.layout() {
            Layout::Dlock => create(&containers).await,
            Layout::Curator => timed(self.limit(), client.mkdir(parent, &containers)).await,
            Layout::Kazoo => {
                let persistent = zk::CreateMode::Persistent.with_acls(acls(config));
                let ancestor = &parent[..parent.rfind('/').unwrap_or(0)];
                match create(&persistent).await {
                    Ok(Err(zk::Error::NoNode)) if !ancestor.is_empty() => {
                        match timed(self.limit(), client.mkdir(ancestor, &containers)).await {
                            Ok(Ok(()) | Err(zk::Error::NodeExists)) => create(&persistent).await,
                            failed => failed,
                        }
                    }
                    made => made,
                }
            }
        };
        match made {
            Ok(Ok(()) | Err(zk::Error::NodeExists)) => Ok(()),
            Ok(Err(e)) => Err(zk_error(OP, Some(name), e)),
            Err(()) => Err(no_answer(OP, Some(name), self.limit())),
        }
    }

    /// Withdraws a request that does not hold (a single try, or a wait that reached its
    /// deadline): deletes its node at `path` now, so that the queue is clean when the call
    /// returns. If the delete does not get through, `guard` goes on armed and its undo deletes
    /// the node in the background.
    pub(crate) async fn withdraw(
        &self,
        client: &zk::Client,
        path: &str,
        guard: CleanupGuard<Attempt>,
    ) {
        if let Ok(Ok(()) | Err(zk::Error::NoNode)) =
            timed(self.limit(), client.delete(path, None)).await
        {
            guard.disarm();
        }
    }

    /// The node's stat (its czxid is the fencing token), with a separate `exists`: for a node
    /// found after a lost create reply, and to check a lease's node.
    pub(crate) async fn czxid(
        &self,
        client: &zk::Client,
        path: &str,
        name: &LockName,
    ) -> Result<Option<zk::Stat>> {
        match timed(self.limit(), client.check_stat(path)).await {
            Ok(Ok(stat)) => Ok(stat),
            Ok(Err(e)) => Err(zk_error("read the lock node", Some(name), e)),
            Err(()) => Err(no_answer("read the lock node", Some(name), self.limit())),
        }
    }

    /// One acquisition of `request`: create the node, then until nothing blocks it (or
    /// `deadline`, or after one look when `wait` is false) watch the node that blocks it.
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
        wait: bool,
        request: Request,
    ) -> Result<Option<Lease>> {
        let parent = self.lock_path(name)?;
        let client = self.inner.session.client().await?;
        let owner = opts.owner_or_random();
        let layout = self.layout();
        let kind = request.kind();
        let mut guard = arm_attempt(name, &client, layout, &parent, owner, &LOCK_REQUESTS);
        let Created {
            path,
            stat: created,
            children: mut listed,
        } = self
            .create_request(&client, name, &parent, request, &mut guard)
            .await?;
        let me = path.rsplit('/').next().unwrap_or_default().to_owned();
        // Set when the node this request waited for was the lowest in the queue and went away:
        // no node can be created below it, so nothing blocks this request any more and there
        // is nothing to read again. Only in dlock's layout (see the module docs).
        let mut head_gone = false;
        // Whether this request has waited: only then can a waiter behind it have listed the
        // queue with nodes below this one (see `Held::mark`).
        let mut waited = false;
        loop {
            let checked_at = Instant::now();
            let blocker = if head_gone {
                None
            } else {
                let children = match listed.take() {
                    Some(children) => children,
                    None => self
                        .children(&client, &parent, name, "acquire")
                        .await?
                        .unwrap_or_default(),
                };
                let queue = names::queue(layout, &children);
                let Some(at) = queue.iter().position(|c| c.node == me) else {
                    guard.disarm();
                    return Err(own_node_gone(
                        name,
                        "while it waited (by an operator, or with its session)",
                    ));
                };
                // A writer waits for the node just below it; a reader only for the nearest
                // writer below it (readers between them hold together).
                let blocker = match kind {
                    NodeKind::Exclusive => at.checked_sub(1),
                    NodeKind::Shared => queue[..at]
                        .iter()
                        .rposition(|c| c.kind == NodeKind::Exclusive),
                };
                blocker.map(|b| {
                    let exclusive = queue[b].kind == NodeKind::Exclusive;
                    (b == 0, exclusive, format!("{parent}/{}", queue[b].node))
                })
            };
            let Some((blocker_is_head, blocker_exclusive, blocker)) = blocker else {
                let stat = match created {
                    Some(stat) => Some(stat),
                    None => self.czxid(&client, &path, name).await?,
                };
                let Some(stat) = stat else {
                    guard.disarm();
                    return Err(own_node_gone(name, "as it became the holder"));
                };
                let ttl = effective_ttl(opts.ttl_value(), client.session_timeout());
                self.register(&path, checked_at + ttl, waited);
                guard.disarm();
                let lease = Lease::new(
                    name.clone(),
                    owner,
                    FencingToken(stat.czxid as u64),
                    checked_at,
                    ttl,
                    drift_for(opts, ttl),
                )
                .with_handle(handle(stat.ephemeral_owner, &path));
                return Ok(Some(lease));
            };
            if !wait || deadline.is_some_and(|d| Instant::now() >= d) {
                self.withdraw(&client, &path, guard).await;
                return Ok(None);
            }
            waited = true;
            let woke = self
                .wait_for(&client, name, &path, &blocker, deadline)
                .await?;
            // An exclusive node that held had nothing below it; nothing can be created below
            // it later either. (A shared one may have had readers below it.)
            head_gone = layout == Layout::Dlock
                && match woke {
                    Woke::BlockerGone => blocker_is_head,
                    Woke::BlockerReleasedByHolder => blocker_exclusive,
                    Woke::Other => false,
                };
        }
    }

    /// Waits until the node at `predecessor` changes (usually: is deleted), this request's own
    /// node `mine` changes (an operator deleted it), the session breaks, or `deadline` passes.
    /// Only the immediate predecessor is watched, so a release wakes one waiter, not all.
    ///
    /// Says [`Woke::BlockerGone`] (or [`Woke::BlockerReleasedByHolder`]) only when the
    /// predecessor is known deleted (or released by its holder) while this request's node is
    /// known to exist: the client hands a session's watch events over in the server's order, so
    /// a deletion of `mine` that came first is seen first.
    async fn wait_for(
        &self,
        client: &zk::Client,
        name: &LockName,
        mine: &str,
        predecessor: &str,
        deadline: Option<Instant>,
    ) -> Result<Woke> {
        // Both watches are on the wire before either reply is awaited. The predecessor is read
        // first: if it is gone and this request's node is there after, then at the moment the
        // predecessor was read this node stood and nothing was below it.
        let pred = client.check_and_watch_stat(predecessor);
        let own = client.check_and_watch_stat(mine);
        let (pred, own) = tokio::join!(self.watched(name, pred), self.watched(name, own));
        let ((pred, pred_watcher), (own, own_watcher)) = (pred?, own?);
        if own.is_none() {
            return Ok(Woke::Other);
        }
        if pred.is_none() {
            return Ok(Woke::BlockerGone);
        }
        let own_changed = own_watcher.changed();
        let pred_changed = pred_watcher.changed();
        tokio::pin!(own_changed, pred_changed);
        let changed = async {
            tokio::select! {
                // Own first: when both events are already in, the deletion of this request's
                // node must not be missed.
                biased;
                _ = &mut own_changed => Woke::Other,
                event = &mut pred_changed => match event.event_type {
                    zk::EventType::NodeDeleted => Woke::BlockerGone,
                    // Only a holder's release writes to a lock node (see `RELEASED_MARK`).
                    zk::EventType::NodeDataChanged => Woke::BlockerReleasedByHolder,
                    _ => Woke::Other,
                }
            }
        };
        Ok(until(deadline, changed).await.unwrap_or(Woke::Other))
    }

    /// Awaits the reply of a `check_and_watch_stat` already sent (the client sends a request
    /// when it is called, so the order of the calls is the order on the wire).
    pub(crate) async fn watched(
        &self,
        name: &LockName,
        sent: impl Future<
            Output = std::result::Result<(Option<zk::Stat>, zk::OneshotWatcher), zk::Error>,
        >,
    ) -> Result<(Option<zk::Stat>, zk::OneshotWatcher)> {
        match timed(self.limit(), sent).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(zk_error("watch the queue", Some(name), e)),
            Err(()) => Err(no_answer("watch the queue", Some(name), self.limit())),
        }
    }

    /// The lock paths under the chroot (see [`DistributedLock::names`](lockcore::DistributedLock::names)), one level of the tree
    /// per round trip: the listings of a level are sent together.
    pub(crate) async fn lock_paths(&self, client: &zk::Client) -> Result<Vec<LockName>> {
        let base = &self.inner.base;
        let mut found = Vec::new();
        let mut level = vec![base.clone()];
        while !level.is_empty() {
            let listings: Vec<_> = level.iter().map(|p| client.get_children(p)).collect();
            let mut next = Vec::new();
            for (path, listing) in level.iter().zip(listings) {
                let (children, stat) = match timed(self.limit(), listing).await {
                    Ok(Ok(listed)) => listed,
                    // Gone since its parent was listed.
                    Ok(Err(zk::Error::NoNode)) => continue,
                    Ok(Err(e)) => return Err(zk_error("list names", None, e)),
                    Err(()) => return Err(no_answer("list names", None, self.limit())),
                };
                let contenders = names::queue(self.layout(), &children);
                let free_container = children.is_empty() && stat.ephemeral_owner == CONTAINER;
                if path != base && (!contenders.is_empty() || free_container) {
                    let relative = &path[base.len() + 1..];
                    if let Ok(name) = LockName::new(relative) {
                        found.push(name);
                    }
                }
                for child in &children {
                    // Lock nodes have no children; without a chroot, the server's own
                    // `/zookeeper` is not walked.
                    let skip = contenders.iter().any(|c| &c.node == child)
                        || base.is_empty() && child == "zookeeper";
                    if !skip {
                        next.push(format!("{path}/{child}"));
                    }
                }
            }
            level = next;
        }
        Ok(found)
    }

    /// The node a lease names: its handle, or (for a lease made elsewhere) the node in the
    /// queue carrying its owner id.
    pub(crate) async fn node_of(
        &self,
        client: &zk::Client,
        lease: &Lease,
        op: &'static str,
    ) -> Result<Option<String>> {
        if let Some((_, path)) = lease.handle().and_then(parse_handle) {
            return Ok(Some(path.to_owned()));
        }
        let parent = self.lock_path(lease.name())?;
        let children = self.children(client, &parent, lease.name(), op).await?;
        Ok(children.and_then(|c| {
            names::queue(self.layout(), &c)
                .into_iter()
                .find(|c: &Child| c.owner == Some(lease.owner()))
                .map(|c| format!("{parent}/{}", c.node))
        }))
    }
}

/// An acquire whose own queue node was deleted behind its back (`when` says at which point):
/// not retryable, since whatever deleted it may do so again.
pub(crate) fn own_node_gone(name: &LockName, when: &str) -> Error {
    Error::backend(
        BACKEND,
        "acquire",
        Some(name),
        false,
        format!("this request's node was deleted {when}"),
    )
}

/// With credentials, the check of the nodes that hold contender nodes (see `acl.rs`).
impl ZkLock {
    /// Whether a use of `parent` should read its ACL (sent along with the create, so that the
    /// first use costs no extra round trip): credentials are on and it was never checked.
    pub(crate) fn acl_unknown(&self, parent: &str) -> bool {
        self.inner.acls.as_ref().is_some_and(|a| !a.knows(parent))
    }

    /// With credentials, refuses `parent` unless the node a listing saw there (`seen`: its
    /// `czxid`) was found safe: now, from `read` (a `getACL` of it sent earlier) or from one
    /// read made here. Without credentials, does nothing.
    ///
    /// `seen` is `None` when no listing's stat is at hand; the ACL read here is then of the
    /// node that stands now, which holds the caller's node if it still stands.
    ///
    /// # Errors
    /// [`Error::AccessDenied`] for an unsafe or unreadable ACL; a retryable error when the node
    /// was replaced between the listing and the read (the caller's node went with it).
    pub(crate) async fn check_parent(
        &self,
        client: &zk::Client,
        operation: &'static str,
        parent: &str,
        name: &LockName,
        seen: Option<i64>,
        read: Option<AclReply>,
    ) -> Result<()> {
        let Some(acls) = &self.inner.acls else {
            return Ok(());
        };
        if seen.is_some_and(|czxid| acls.is_safe(parent, czxid)) {
            return Ok(());
        }
        // An earlier read counts if it is of the node the listing saw.
        let earlier = match read {
            Some(reply) => read_acl(reply, operation, parent, Some(name), self.limit())
                .ok()
                .flatten()
                .filter(|(_, stat)| seen == Some(stat.czxid)),
            None => None,
        };
        let (found, stat) = match earlier {
            Some(read) => read,
            None => {
                let reply = timed(self.limit(), client.get_acl(parent)).await;
                match read_acl(reply, operation, parent, Some(name), self.limit())? {
                    Some(read) => read,
                    None => return Err(replaced(operation, name, parent)),
                }
            }
        };
        if seen.is_some_and(|czxid| czxid != stat.czxid) {
            return Err(replaced(operation, name, parent));
        }
        acls.check(operation, parent, &found)?;
        acls.remember(parent, stat.czxid);
        Ok(())
    }
}

/// The parent a listing saw was deleted (and perhaps made again) before its ACL was read.
fn replaced(operation: &'static str, name: &LockName, parent: &str) -> Error {
    Error::backend(
        BACKEND,
        operation,
        Some(name),
        true,
        format!("{parent} was deleted while its ACL was being checked"),
    )
}
