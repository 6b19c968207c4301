//! The lock recipe: one EPHEMERAL_SEQUENTIAL node per attempt under the lock's CONTAINER
//! parent. A write (exclusive) request holds when its node is the lowest and watches only the
//! node just below it; a read request holds when no write node is below it and watches only the
//! nearest write node below it. Leases are bounded by the session timeout, and an unrenewed
//! lease's node is deleted by this client when its ttl runs out.
//!
//! The `getChildren` that decides an attempt goes out right behind its `create` (one session's
//! requests are served in order), in every layout. In dlock's own layout two more shortcuts
//! save the re-read of the children when a waiter wakes; both are sound because no node can
//! ever be created below an existing one, and because only dlock clients queue there. A waiter
//! holds without reading again when the node it watched was the lowest it saw, or was an
//! exclusive node released by its holder, which writes [`RELEASED_MARK`] in the transaction
//! that deletes it when it had waited (a node that held at once was the head for every waiter
//! that ever listed behind it; see [`Held::mark`] and the crate README, "Round trips").
//!
//! In Curator's and kazoo's layouts other clients queue too. They never write the mark, and
//! they may write to a held node for other reasons (Curator's revocation writes `__REVOKE__`
//! to it), which would read as the mark; so the mark is off there. The head's-successor
//! shortcut goes with it, so that in those layouts a waiter holds only on a listing that shows
//! it first, the rule the other clients follow too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use lockcore::async_trait;
use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, LostReason, OwnerId, RawFloor, Released,
    Result, SemaphoreInfo, WaitMechanism,
};
use tokio::sync::Notify;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::config::ZkConfig;
use crate::names::{self, Child, Layout, NodeKind, Request};
use crate::session::{Session, acls, no_answer, timed, until, zk_error};

/// How many times a create is retried when the lock's parent vanishes in between (the server
/// removes empty containers).
const PARENT_RETRIES: usize = 10;

/// A client of one ZooKeeper ensemble (`zk://`). Cheap to share behind an `Arc`; every clone of
/// the handle uses the same session.
#[derive(Clone)]
pub struct ZkLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) session: Session,
    pub(crate) config: ZkConfig,
    pub(crate) base: String,
    /// Node path → when its lease runs out unless renewed, and how to release it. ZooKeeper
    /// keeps an ephemeral node as long as the session, so this client deletes a node whose
    /// lease it stopped renewing.
    held: Mutex<HashMap<String, Held>>,
    wake_reaper: Arc<Notify>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Lets the reaper see that the client is gone and end.
        self.wake_reaper.notify_one();
    }
}

impl std::fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLock")
            .field("url", &self.inner.config.redacted())
            .finish_non_exhaustive()
    }
}

/// A node this client holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    /// When its lease runs out unless renewed.
    pub(crate) until: Instant,
    /// Whether its release writes [`RELEASED_MARK`]: a waiter may have listed the queue while
    /// nodes were still below this one. Not for a node that was the lowest when it was created
    /// (its first listing showed nothing below it, and no node can be created below an
    /// existing one): every waiter behind it saw it as the head, and holds on its plain delete.
    pub(crate) mark: bool,
}

/// What an acquisition (of a lock or of a permit) has created under `parent` so far: the state
/// of its clean-up guard.
pub(crate) struct Attempt {
    pub(crate) client: zk::Client,
    pub(crate) layout: Layout,
    pub(crate) parent: String,
    pub(crate) owner: OwnerId,
    /// The attempt's node, once the create's reply (or a search after a lost one) named it.
    pub(crate) path: Option<String>,
    /// Among `parent`'s children, the node that `owner` created, if any: how the clean-up finds
    /// the node when the create's reply never came.
    pub(crate) node_of: fn(Layout, &[String], OwnerId) -> Option<String>,
    /// What the node is, for the clean-up's log lines.
    pub(crate) what: &'static str,
}

/// [`Attempt::node_of`] for a lock's queue.
fn queued_node_of(layout: Layout, children: &[String], owner: OwnerId) -> Option<String> {
    names::queue(layout, children)
        .into_iter()
        .find(|c| c.owner == Some(owner))
        .map(|c| c.node)
}

/// Undoes an acquisition that ends without the lock: deletes its node or, if the create's reply
/// never came, the node carrying its owner id. The delete of a known node is sent right here
/// (the client sends a request when it is called), so it goes out even where no runtime is left
/// to await its reply; awaiting it, retrying while the connection is down, and finding a node by
/// its owner id run as a counted clean-up.
pub(crate) fn undo_attempt(attempt: Attempt) -> Undo {
    let Attempt {
        client,
        layout,
        parent,
        owner,
        path,
        node_of,
        what,
    } = attempt;
    if let Some(path) = path {
        let sent = client.delete(&path, None);
        return Undo::Spawn(Box::pin(async move {
            let first = sent.await;
            Ok(retry_delete(client, path, first, what).await)
        }));
    }
    Undo::Spawn(Box::pin(async move {
        let found = loop {
            match client.list_children(&parent).await {
                Ok(children) => {
                    break node_of(layout, &children, owner).map(|n| format!("{parent}/{n}"));
                }
                Err(zk::Error::NoNode) => break None,
                Err(e) if retry_cleanup(&client, &e) => tokio::time::sleep(CLEANUP_RETRY).await,
                Err(_) => break None,
            }
        };
        Ok(match found {
            Some(path) => delete_eventually(client, path, what).await,
            None => false,
        })
    }))
}

/// The data a holder writes to its exclusive node in the same transaction that deletes it, on
/// release: the waiter watching that node sees a data change instead of a deletion, and knows
/// the node held the lock, so that nothing is left below it and it may hold without reading the
/// queue again. Only a holder's release writes to a lock node; every other way a node goes (a
/// waiter giving up, a session ending, an operator's delete, a lease this client let run out)
/// is a plain delete, after which the waiter reads the queue.
const RELEASED_MARK: &[u8] = b"released";

/// Deletes a held lease's node. In dlock's layout (nodes created empty, so at version 0): an
/// exclusive node that `mark`s (see [`Held::mark`]) in one transaction with [`RELEASED_MARK`]
/// written first; a shared one, or one that does not mark, with a plain delete (a reader that
/// held may still have readers below it). In the path layouts, a plain delete: the other
/// libraries' waiters know no mark.
async fn delete_held(
    client: &zk::Client,
    layout: Layout,
    path: &str,
    mark: bool,
) -> std::result::Result<(), zk::Error> {
    if layout.names_are_paths() {
        return client.delete(path, None).await;
    }
    let exclusive = path
        .rsplit('/')
        .next()
        .and_then(|node| names::parse_child(layout, node))
        .is_some_and(|c| c.kind == NodeKind::Exclusive);
    if !exclusive || !mark {
        return client.delete(path, Some(0)).await;
    }
    let mut multi = client.new_multi_writer();
    multi.add_set_data(path, RELEASED_MARK, Some(0))?;
    multi.add_delete(path, Some(1))?;
    multi.commit().await.map(drop).map_err(zk::Error::from)
}

/// Why [`ZkLock::wait_for`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// The watched predecessor was deleted, and this request's node still stood.
    BlockerGone,
    /// The watched predecessor, an exclusive node, was released by its holder (it carried
    /// [`RELEASED_MARK`]), and this request's node still stood.
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

/// The limit on a lease: the session timeout as negotiated, so that a lease is never trusted
/// for longer than the server would keep a silent session alive.
/// Nodes read per multi-read when renewing many leases (each answer is a stat of about 100
/// bytes, far below the server's 1 MB packet limit).
const MULTI_READ: usize = 1000;

pub(crate) fn effective_ttl(ttl: Duration, session_timeout: Duration) -> Duration {
    ttl.min(session_timeout)
}

pub(crate) fn drift_for(opts: &AcquireOptions, ttl: Duration) -> Duration {
    let drift = if ttl == opts.ttl_value() {
        opts.drift_value()
    } else {
        lockcore::default_drift(ttl)
    };
    drift.min(ttl / 2)
}

impl ZkLock {
    /// Connects to the ensemble of `config` and makes its base node.
    ///
    /// # Cancel safety
    /// Dropping the future closes the session it opened; nothing is held yet.
    ///
    /// # Errors
    /// [`Error::Backend`] when no server answers or authentication fails.
    pub async fn connect(config: &ZkConfig) -> Result<Self> {
        let session = Session::connect(config).await?;
        let wake_reaper = Arc::new(Notify::new());
        let inner = Arc::new(Inner {
            session,
            config: config.clone(),
            base: config.base_path(),
            held: Mutex::new(HashMap::new()),
            wake_reaper: wake_reaper.clone(),
        });
        tokio::spawn(reaper(Arc::downgrade(&inner), wake_reaper));
        Ok(ZkLock { inner })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The session timeout the server granted to the current session.
    pub fn session_timeout(&self) -> Duration {
        self.inner.session.peek().session_timeout()
    }

    /// The id of the current session (for tests and diagnostics).
    pub fn session_id(&self) -> i64 {
        self.inner.session.peek().session_id().0
    }

    /// The `zookeeper-client` handle of the current session, for diagnostics and tests (for
    /// example to look at the lock nodes). Deleting this crate's nodes through it breaks the
    /// locks they stand for.
    pub fn zk_client(&self) -> zk::Client {
        self.inner.session.peek()
    }

    /// The znode that holds `name`'s queue: `{chroot}/{prefix}/n-{escaped name}` in dlock's
    /// layout, `{chroot}/{name}` in Curator's and kazoo's. (There a name that is no znode path,
    /// which every acquisition refuses, gets the path it would have had.)
    pub fn parent_path(&self, name: &LockName) -> String {
        self.lock_path(name)
            .unwrap_or_else(|_| format!("{}/{}", self.inner.base, name.as_str()))
    }

    /// The layout this client's locks use.
    pub fn layout(&self) -> Layout {
        self.inner.config.layout
    }

    /// [`parent_path`](Self::parent_path), or [`Error::InvalidName`] in the path layouts for a
    /// name that is no znode path (checked before any I/O).
    fn lock_path(&self, name: &LockName) -> Result<String> {
        names::lock_path(self.layout(), &self.inner.base, name)
    }

    pub(crate) fn limit(&self) -> Duration {
        self.inner.session.timeout()
    }

    pub(crate) fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the node at `path` as held until `until` (see [`Held`]).
    pub(crate) fn register(&self, path: &str, until: Instant, mark: bool) {
        self.held().insert(path.to_owned(), Held { until, mark });
        self.inner.wake_reaper.notify_one();
    }

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
            // Both requests are on the wire once the two calls return.
            let create = client.create(&prefix, &data, &node_opts);
            let list = client.list_children(parent);
            let (created, listed) =
                tokio::join!(timed(self.limit(), create), timed(self.limit(), list));
            match created {
                Ok(Ok((stat, seq))) => {
                    let path = format!("{prefix}{seq}");
                    guard.state_mut().path = Some(path.clone());
                    // CREATE2's stat is right on its own on 3.8.0 (only inside a MULTI is it
                    // invalid, ZOOKEEPER-4026); an invalid one is read again with `exists`.
                    return Ok(Created {
                        path,
                        stat: (stat.czxid > 0).then_some(stat),
                        // A listing that failed (the connection dropped between the two
                        // replies, say) is simply taken again.
                        children: listed.ok().and_then(|l| l.ok()),
                    });
                }
                Ok(Err(zk::Error::NoNode)) => self.make_parent(client, parent, name).await?,
                Ok(Err(e)) if crate::session::is_connection_loss(&e) => {
                    // The create may or may not have been applied: look before trying again.
                    if let Some(path) = self.find_own(client, parent, name, owner).await? {
                        guard.state_mut().path = Some(path.clone());
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

    /// Whether this client may renew its node `path` of a lease made in session `of` (`None`:
    /// not known): it still holds it, in the current `session` (a node of an earlier session
    /// ended with that session, and is forgotten).
    fn may_renew(&self, path: &str, of: Option<i64>, session: i64) -> bool {
        if of.is_some_and(|of| of != session) {
            self.held().remove(path);
            return false;
        }
        self.held()
            .get(path)
            .is_some_and(|held| held.until > Instant::now())
    }

    /// The end of a renewal of `lease`, whose node `path` a read started at `started` found
    /// with `stat` (`None`: gone): renewed for `ttl` when the node is still the lease's (its
    /// `czxid` the token, its ephemeral owner `session`) and this client still holds it; else
    /// `LockLost`, and a node that is no longer the lease's is forgotten.
    fn renewed(
        &self,
        lease: &Lease,
        path: &str,
        stat: Option<&zk::Stat>,
        session: i64,
        started: Instant,
        ttl: Duration,
    ) -> Result<Lease> {
        let lost = || Error::lock_lost(BACKEND, lease.name(), "extend");
        let ours =
            stat.is_some_and(|s| s.czxid as u64 == lease.token().0 && s.ephemeral_owner == session);
        let mut held = self.held();
        if !ours {
            held.remove(path);
            return Err(lost());
        }
        match held.get_mut(path) {
            Some(Held { until, .. }) if *until > Instant::now() => {
                *until = started + ttl;
                Ok(lease.renewed(started, ttl))
            }
            _ => Err(lost()),
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
        let attempt = Attempt {
            client: client.clone(),
            layout,
            parent: parent.clone(),
            owner,
            path: None,
            node_of: queued_node_of,
            what: "abandoned lock request",
        };
        let mut guard = CleanupGuard::arm(BACKEND, name, attempt, undo_attempt);
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

    /// The lock paths under the chroot (see [`DistributedLock::names`]), one level of the tree
    /// per round trip: the listings of a level are sent together.
    async fn lock_paths(&self, client: &zk::Client) -> Result<Vec<LockName>> {
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
    async fn node_of(
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

/// How many nodes at the head of `queue` hold the lock: a writer alone, or the readers before
/// the first writer.
fn holding(queue: &[Child]) -> usize {
    match queue.first() {
        None => 0,
        Some(c) if c.kind == NodeKind::Exclusive => 1,
        Some(_) => queue
            .iter()
            .position(|c| c.kind == NodeKind::Exclusive)
            .unwrap_or(queue.len()),
    }
}

/// The exclusive request `opts` asks for: a write lock's, or a plain lock's.
fn exclusive(opts: &AcquireOptions) -> Request {
    if opts.is_write_side() {
        Request::Write
    } else {
        Request::Mutex
    }
}

/// A lease's handle: the session that created its node, and the node's path.
pub(crate) fn handle(session: i64, path: &str) -> String {
    format!("{session:x}:{path}")
}

fn parse_handle(handle: &str) -> Option<(i64, &str)> {
    let (session, path) = handle.split_once(':')?;
    Some((u64::from_str_radix(session, 16).ok()? as i64, path))
}

pub(crate) fn session_ended(state: zk::SessionState) -> bool {
    matches!(
        state,
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
    )
}

/// The `ephemeralOwner` ZooKeeper reports for a CONTAINER node.
const CONTAINER: i64 = i64::MIN;

/// Pause between clean-up attempts while the session is disconnected.
const CLEANUP_RETRY: Duration = Duration::from_millis(200);

/// Whether a clean-up step that failed with `e` is worth trying again: the session is still
/// alive (disconnected, say), so its nodes stay until someone deletes them.
fn retry_cleanup(client: &zk::Client, e: &zk::Error) -> bool {
    crate::session::is_retryable(e) && !session_ended(client.state())
}

/// Deletes `path`, retrying while the connection is down and the session lives (a node left
/// behind would block the queue for the session's whole life); gives up when the session
/// ends, which deletes the node anyway. `true` when this call deleted the node.
pub(crate) async fn delete_eventually(
    client: zk::Client,
    path: String,
    what: &'static str,
) -> bool {
    let first = client.delete(&path, None).await;
    retry_delete(client, path, first, what).await
}

/// [`delete_eventually`] for a delete already sent, which answered `result`.
async fn retry_delete(
    client: zk::Client,
    path: String,
    mut result: std::result::Result<(), zk::Error>,
    what: &'static str,
) -> bool {
    loop {
        match result {
            Ok(()) => {
                tracing::debug!(node = %path, "{what} node deleted");
                return true;
            }
            Err(zk::Error::NoNode) => return false,
            Err(e) if retry_cleanup(&client, &e) => {
                tokio::time::sleep(CLEANUP_RETRY).await;
                result = client.delete(&path, None).await;
            }
            Err(e) => {
                tracing::warn!(node = %path, error = %e, "{what} node not deleted; the session's end removes it");
                return false;
            }
        }
    }
}

/// Deletes the nodes whose leases ran out without a renewal; ends with the client.
async fn reaper(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let now = Instant::now();
            let mut held = inner.held.lock().unwrap_or_else(PoisonError::into_inner);
            let expired: Vec<String> = held
                .iter()
                .filter(|(_, h)| h.until <= now)
                .map(|(p, _)| p.clone())
                .collect();
            for p in &expired {
                held.remove(p);
            }
            let next = held.values().map(|h| h.until).min();
            drop(held);
            let client = inner.session.peek();
            for path in expired {
                tokio::spawn(delete_eventually(client.clone(), path, "lease ran out;"));
            }
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            Fencing::Strict,
            Expiry::Session,
            Fairness::Fifo,
            WaitMechanism::Watch,
        )
        .native(crate::NATIVE)
        .path_names(self.inner.config.layout.names_are_paths())
        // The token is the node's czxid, which the server assigns: it cannot carry a floor.
        .token_floor(false)
        .session_timeout(Some(self.session_timeout()))
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.config.defaults.clone()
    }

    /// `SessionExpired` when the session that acquired `lease` is no longer this client's live
    /// session; otherwise `Taken` while the lease was valid and `Expired` after.
    fn lost_reason(&self, lease: &Lease, _error: &Error) -> LostReason {
        let current = self.inner.session.peek();
        let ended = session_ended(current.state())
            || lease
                .handle()
                .and_then(parse_handle)
                .is_some_and(|(session, _)| session != current.session_id().0);
        if ended {
            LostReason::SessionExpired
        } else if lease.is_valid() {
            LostReason::Taken
        } else {
            LostReason::Expired
        }
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.acquire(name, opts, None, false, exclusive(opts)).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.acquire(name, opts, deadline, true, exclusive(opts))
            .await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.acquire(name, opts, None, false, Request::Read).await
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.acquire(name, opts, deadline, true, Request::Read)
            .await
    }

    /// See the crate README, "Semaphores": the layout's recipe (`semaphore.rs`).
    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.acquire_permit(name, permits, opts, None, false).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.acquire_permit(name, permits, opts, deadline, true)
            .await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        self.inspect_permits(name).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let client = self.inner.session.client().await?;
        let Some(path) = self.node_of(&client, lease, "release").await? else {
            return Ok(Released::NotHeld);
        };
        // A lease this backend handed out names its node, whose path carries the acquisition's
        // owner id and can never be created again: deleting that path is the owner check, in
        // one round trip. A lease made elsewhere (no handle) is checked against the czxid first.
        if lease.handle().and_then(parse_handle).is_none() {
            let Some(stat) = self.czxid(&client, &path, lease.name()).await? else {
                return Ok(Released::NotHeld);
            };
            if stat.czxid as u64 != lease.token().0 {
                return Ok(Released::NotHeld);
            }
        }
        // A lease this client let run out is not released (its node goes anyway). A node this
        // client does not know (another instance's lease) is marked, as it may have waited.
        let (expired, mark) = match self.held().remove(&path) {
            Some(held) => (held.until <= Instant::now(), held.mark),
            None => (false, true),
        };
        // Lock nodes are created empty and written only as their holder releases them.
        let delete = delete_held(&client, self.layout(), &path, mark);
        match timed(self.limit(), delete).await {
            Ok(Ok(())) if !expired => Ok(Released::Released),
            Ok(Ok(()) | Err(zk::Error::NoNode | zk::Error::BadVersion)) => Ok(Released::NotHeld),
            Ok(Err(e)) => {
                if crate::session::is_retryable(&e) {
                    lockcore::cleanup::spawn_counted(async move {
                        delete_eventually(client, path, "released").await;
                    });
                }
                Err(zk_error("release", Some(lease.name()), e))
            }
            Err(()) => {
                lockcore::cleanup::spawn_counted(async move {
                    delete_eventually(client, path, "released").await;
                });
                Err(no_answer("release", Some(lease.name()), self.limit()))
            }
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::check_ttl(ttl)?;
        let lost = || Error::lock_lost(BACKEND, lease.name(), "extend");
        let client = self.inner.session.client().await?;
        let Some(path) = self.node_of(&client, lease, "extend").await? else {
            return Err(lost());
        };
        let session = client.session_id().0;
        let of = lease.handle().and_then(parse_handle).map(|(of, _)| of);
        if !self.may_renew(&path, of, session) {
            return Err(lost());
        }
        let started = Instant::now();
        let stat = self.czxid(&client, &path, lease.name()).await?;
        let ttl = effective_ttl(ttl, client.session_timeout());
        self.renewed(lease, &path, stat.as_ref(), session, started, ttl)
    }

    /// Renews many leases with one multi-read per `MULTI_READ` nodes, where `extend` reads
    /// each node's stat with a request of its own: a keep-alive batch of 10,000 leases is 10
    /// round trips, not 10,000. The checks are `extend`'s: the node is still this session's
    /// (its `czxid` is the lease's token and its ephemeral owner this session), and the client
    /// still holds it. A lease whose node this client cannot name (no handle) goes through
    /// `extend`.
    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let lost = |lease: &Lease| Error::lock_lost(BACKEND, lease.name(), "extend");
        let mut out: Vec<Option<Result<Lease>>> = leases.iter().map(|_| None).collect();
        let client = match self.inner.session.client().await {
            Ok(c) => c,
            Err(e) => {
                let retryable = e.is_retryable();
                let why = e.to_string();
                return leases
                    .iter()
                    .map(|(l, _)| {
                        Err(Error::backend(
                            BACKEND,
                            "extend",
                            Some(l.name()),
                            retryable,
                            why.clone(),
                        ))
                    })
                    .collect();
            }
        };
        let session = client.session_id().0;
        // (index, node path) of the leases to read.
        let mut reads = Vec::new();
        for (i, (lease, ttl)) in leases.iter().enumerate() {
            if let Err(e) = lockcore::check_ttl(*ttl) {
                out[i] = Some(Err(e));
                continue;
            }
            let Some((of, path)) = lease.handle().and_then(parse_handle) else {
                out[i] = Some(self.extend(lease, *ttl).await);
                continue;
            };
            if !self.may_renew(path, Some(of), session) {
                out[i] = Some(Err(lost(lease)));
                continue;
            }
            reads.push((i, path.to_owned()));
        }
        for chunk in reads.chunks(MULTI_READ) {
            let started = Instant::now();
            let mut reader = client.new_multi_reader();
            let added = chunk
                .iter()
                .try_for_each(|(_, path)| reader.add_get_data(path));
            let answered = match added {
                Ok(()) => timed(self.limit(), reader.commit()).await,
                Err(e) => Ok(Err(e)),
            };
            let results = match answered {
                Ok(Ok(results)) if results.len() == chunk.len() => results,
                failed => {
                    for (i, _) in chunk {
                        let name = leases[*i].0.name();
                        out[*i] = Some(Err(match &failed {
                            Ok(Err(e)) => zk_error("renew the lock nodes", Some(name), e.clone()),
                            Ok(Ok(_)) => Error::backend(
                                BACKEND,
                                "extend",
                                Some(name),
                                true,
                                "a multi-read answered for another count of nodes",
                            ),
                            Err(()) => no_answer("renew the lock nodes", Some(name), self.limit()),
                        }));
                    }
                    continue;
                }
            };
            let session_timeout = client.session_timeout();
            for ((i, path), result) in chunk.iter().zip(results) {
                let (lease, ttl) = &leases[*i];
                let stat = match result {
                    zk::MultiReadResult::Data { stat, .. } => Some(stat),
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    } => None,
                    zk::MultiReadResult::Error { err } => {
                        let name = Some(lease.name());
                        out[*i] = Some(Err(zk_error("renew the lock node", name, err)));
                        continue;
                    }
                    // Only data was asked for (the enum is non-exhaustive).
                    _ => None,
                };
                let ttl = effective_ttl(*ttl, session_timeout);
                out[*i] = Some(self.renewed(lease, path, stat.as_ref(), session, started, ttl));
            }
        }
        out.into_iter()
            .zip(leases)
            .map(|(r, (lease, _))| r.unwrap_or_else(|| Err(lost(lease))))
            .collect()
    }

    /// The holder is the first node's owner id; in the path layouts, the node's data when it
    /// has some (what Curator records there: its client's address; kazoo: its `identifier`;
    /// dlock: the owner id), else the id in its name.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let parent = self.lock_path(name)?;
        let client = self.inner.session.client().await?;
        self.caught_up(&client, &parent, name, "inspect").await?;
        let Some(children) = self.children(&client, &parent, name, "inspect").await? else {
            return Ok(None);
        };
        let queue = names::queue(self.layout(), &children);
        let Some(first) = queue.first() else {
            // Free: the parent's pzxid (the zxid of the last change to its children) is at
            // least every token handed out for this name and below every later one, which is
            // what `dlock migrate prepare` carries into another store's counter.
            let pzxid = self
                .czxid(&client, &parent, name)
                .await?
                .map(|s| FencingToken(s.pzxid as u64));
            return Ok(Some(LockInfo::new(name, None, pzxid, None, Some(0))));
        };
        let node = format!("{parent}/{}", first.node);
        let from_name = || {
            first
                .owner
                .map_or_else(|| first.node.clone(), |o| o.to_string())
        };
        let holder = if self.layout().names_are_paths() {
            match timed(self.limit(), client.get_data(&node)).await {
                Ok(Ok((data, stat))) => Some((
                    String::from_utf8(data)
                        .ok()
                        .filter(|d| !d.is_empty())
                        .unwrap_or_else(from_name),
                    stat,
                )),
                Ok(Err(zk::Error::NoNode)) => None,
                Ok(Err(e)) => return Err(zk_error("read the lock node", Some(name), e)),
                Err(()) => return Err(no_answer("read the lock node", Some(name), self.limit())),
            }
        } else {
            self.czxid(&client, &node, name)
                .await?
                .map(|stat| (from_name(), stat))
        };
        let held = holding(&queue);
        let readers = |nodes: &[Child]| nodes.iter().filter(|c| c.kind == NodeKind::Shared).count();
        let info = LockInfo::new(
            name,
            holder.as_ref().map(|(h, _)| h.clone()),
            holder.map(|(_, s)| FencingToken(s.czxid as u64)),
            None,
            Some(queue.len() - held),
        );
        Ok(Some(info.with_readers(
            readers(&queue[..held]),
            readers(&queue[held..]),
        )))
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        let parent = self.lock_path(name)?;
        let client = self.inner.session.client().await?;
        match self.children(&client, &parent, name, "forget").await? {
            None => return Ok(true),
            Some(c) if !c.is_empty() => return Ok(false),
            Some(_) => {}
        }
        match timed(self.limit(), client.delete(&parent, None)).await {
            Ok(Ok(()) | Err(zk::Error::NoNode)) => Ok(true),
            Ok(Err(zk::Error::NotEmpty)) => Ok(false),
            Ok(Err(e)) => Err(zk_error("forget", Some(name), e)),
            Err(()) => Err(no_answer("forget", Some(name), self.limit())),
        }
    }

    /// In dlock's layout: the children of the lock root that are lock parents, decoded; hashed
    /// (very long) names are left out. In the path layouts: every path under the chroot that
    /// has contender nodes, or is an empty CONTAINER (what Curator and dlock leave of a free
    /// lock until the server removes it), found by walking the tree.
    async fn names(&self) -> Result<Vec<LockName>> {
        let client = self.inner.session.client().await?;
        if self.layout().names_are_paths() {
            return self.lock_paths(&client).await;
        }
        let children = match timed(self.limit(), client.list_children(&self.inner.base)).await {
            Ok(Ok(c)) => c,
            Ok(Err(zk::Error::NoNode)) => Vec::new(),
            Ok(Err(e)) => return Err(zk_error("list names", None, e)),
            Err(()) => return Err(no_answer("list names", None, self.limit())),
        };
        Ok(children
            .iter()
            .filter_map(|c| c.strip_prefix("n-"))
            .filter_map(LockName::from_escaped)
            .collect())
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(Floor { lock: self.clone() }))
    }

    fn recipe_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(RecipeFloor { lock: self.clone() }))
    }
}

/// The recipe's own three calls, bare: an EPHEMERAL_SEQUENTIAL create under a CONTAINER
/// parent with the parent's `getChildren` sent right behind it, then a plain `delete`, on the
/// same session; no owner id, no parse of the listing, no lease, no renewal.
struct RecipeFloor {
    lock: ZkLock,
}

#[async_trait]
impl RawFloor for RecipeFloor {
    fn description(&self) -> String {
        "create EPHEMERAL_SEQUENTIAL + getChildren behind it + delete on one session".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let client = self.lock.inner.session.client().await?;
        let inner = &self.lock.inner;
        let parent = format!("{}/recipe-floor-{}", inner.base, names::node_name(name));
        let opts = zk::CreateMode::EphemeralSequential.with_acls(acls(&inner.config));
        let failed = |e| zk_error("recipe floor", Some(name), e);
        let prefix = format!("{parent}/n-");
        for _ in 0..PARENT_RETRIES {
            let create = client.create(&prefix, &[], &opts);
            let list = client.list_children(&parent);
            match tokio::join!(create, list) {
                (Ok((_, seq)), listed) => {
                    listed.map_err(failed)?;
                    let path = format!("{prefix}{seq}");
                    return client.delete(&path, None).await.map_err(failed);
                }
                (Err(zk::Error::NoNode), _) => {
                    self.lock.make_parent(&client, &parent, name).await?;
                }
                (Err(e), _) => return Err(failed(e)),
            }
        }
        Err(Error::backend(
            BACKEND,
            "recipe floor",
            Some(name),
            true,
            "the floor's parent node kept disappearing",
        ))
    }
}

/// The floor: create an ephemeral node and delete it, on the same session.
struct Floor {
    lock: ZkLock,
}

#[async_trait]
impl RawFloor for Floor {
    fn description(&self) -> String {
        "create EPHEMERAL + delete on one session".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let client = self.lock.inner.session.client().await?;
        let path = format!("{}/floor-{}", self.lock.inner.base, names::node_name(name));
        let opts = zk::CreateMode::Ephemeral.with_acls(acls(&self.lock.inner.config));
        client
            .create(&path, &[], &opts)
            .await
            .map_err(|e| zk_error("floor create", Some(name), e))?;
        client
            .delete(&path, None)
            .await
            .map_err(|e| zk_error("floor delete", Some(name), e))
    }
}
