//! [`ZkLock`], the client of one ensemble, as a [`DistributedLock`]: its state (the session,
//! the nodes it holds and the reaper that deletes those whose lease ran out) and the trait's
//! methods. The recipe an acquisition follows is in `recipe.rs`, the renewals in `renew.rs`,
//! the deletes that must get through in `cleanup.rs`, and the semaphore's permits in
//! `semaphore.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use lockcore::async_trait;
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, LostReason, Released, Result, SemaphoreInfo,
    WaitMechanism,
};
use tokio::sync::Notify;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::acl::ParentAcls;
use crate::cleanup::{delete_eventually, session_ended};
use crate::config::ZkConfig;
use crate::names::{self, Child, Layout, NodeKind, Request};
use crate::session::{Session, no_answer, timed, zk_error};

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
    /// With credentials: whose nodes are safe, and the parents found safe (see `acl.rs`).
    pub(crate) acls: Option<ParentAcls>,
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

/// The data a holder writes to its exclusive node in the same transaction that deletes it, on
/// release: the waiter watching that node sees a data change instead of a deletion, and knows
/// the node held the lock, so that nothing is left below it and it may hold without reading the
/// queue again. Only a holder's release writes to a lock node; every other way a node goes (a
/// waiter giving up, a session ending, an operator's delete, a lease this client let run out)
/// is a plain delete, after which the waiter reads the queue.
pub(crate) const RELEASED_MARK: &[u8] = b"released";

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

/// The limit on a lease: the session timeout as negotiated, so that a lease is never trusted
/// for longer than the server would keep a silent session alive.
pub(crate) fn effective_ttl(ttl: Duration, session_timeout: Duration) -> Duration {
    ttl.min(session_timeout)
}

pub(crate) fn drift_for(opts: &AcquireOptions, ttl: Duration) -> Duration {
    let drift = if ttl == opts.ttl_value() {
        opts.drift_value()
    } else {
        lockcore::backend_support::default_drift(ttl)
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
    /// [`Error::Backend`] when no server answers; [`Error::AccessDenied`] when authentication
    /// fails, or (with credentials) the base node lets another identity do more than read it.
    pub async fn connect(config: &ZkConfig) -> Result<Self> {
        let session = Session::connect(config).await?;
        let wake_reaper = Arc::new(Notify::new());
        let inner = Arc::new(Inner {
            session,
            config: config.clone(),
            base: config.base_path(),
            acls: ParentAcls::of(config),
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
    pub(crate) fn lock_path(&self, name: &LockName) -> Result<String> {
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

pub(crate) fn parse_handle(handle: &str) -> Option<(i64, &str)> {
    let (session, path) = handle.split_once(':')?;
    Some((u64::from_str_radix(session, 16).ok()? as i64, path))
}

/// The `ephemeralOwner` ZooKeeper reports for a CONTAINER node.
pub(crate) const CONTAINER: i64 = i64::MIN;

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
        // The token is the node's czxid, which the server assigns: it cannot carry a minimum.
        .min_token(false)
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
        lockcore::backend_support::check_ttl(ttl)?;
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
        self.renew_many(leases).await
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
}
