//! The in-memory reference backend (`memory://namespace`): process-local, strict fencing, FIFO
//! waiters woken by [`Notify`], TTL expiry, read-write locks, counting semaphores. It is the contract's executable
//! specification and the conformance suite's own test subject.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::backend_support::Access;
use crate::cleanup::{CleanupGuard, Undo};
use crate::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, NativePrimitives, OwnerId, PermitHolder,
    Released, Result, SemaphoreInfo, WaitMechanism,
};

const BACKEND: &str = "memory";

/// What the memory backend offers besides the mutex: read-write locks and semaphores.
pub const NATIVE: NativePrimitives = NativePrimitives::new(false, true, true);

struct Holder {
    owner: OwnerId,
    token: u64,
    expires: Instant,
}

#[derive(Default)]
struct Entry {
    /// The exclusive (write) holder.
    holder: Option<Holder>,
    /// Shared (read) holders, or a semaphore's permit holders; their leases may have run out
    /// (see `live_readers`).
    readers: Vec<Holder>,
    /// A semaphore's count, as its first caller while in use gave it.
    permits: u32,
    /// Last token handed out; entries are never removed (but by `forget`), so the fence never
    /// resets.
    fence: u64,
    queue: VecDeque<(u64, Access, Arc<Notify>)>,
}

impl Entry {
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires > now)
    }

    /// Drops readers whose leases ran out; whether any reader is left.
    fn live_readers(&mut self, now: Instant) -> bool {
        self.readers.retain(|r| r.expires > now);
        !self.readers.is_empty()
    }

    /// Whether `access` may be granted now to a request that is not behind anyone in the
    /// queue.
    fn admits(&mut self, access: Access, now: Instant) -> bool {
        let writer = self.live_holder(now).is_some();
        match access {
            Access::Exclusive => !writer && !self.live_readers(now),
            Access::Shared => !writer,
            Access::Permit(n) => {
                self.live_readers(now);
                self.readers.len() < n as usize
            }
        }
    }

    /// For a semaphore: records `asked` as its count when nobody holds or waits; else refuses
    /// another count than the recorded one.
    fn check_count(&mut self, name: &LockName, access: Access, now: Instant) -> Result<()> {
        let Access::Permit(asked) = access else {
            return Ok(());
        };
        if self.live_readers(now) || !self.queue.is_empty() {
            if self.permits != asked {
                return Err(crate::semaphore::permits_mismatch(
                    name,
                    self.permits.into(),
                    asked,
                ));
            }
        } else {
            self.permits = asked;
        }
        Ok(())
    }

    /// When the earliest current hold that blocks `access` runs out.
    fn blocked_until(&self, access: Access, now: Instant) -> Option<Instant> {
        let writer = self.live_holder(now).map(|h| h.expires);
        let readers = match access {
            Access::Exclusive => self
                .readers
                .iter()
                .filter(|r| r.expires > now)
                .map(|r| r.expires)
                .min(),
            Access::Shared => None,
            // The earliest permit to run out, when all are taken.
            Access::Permit(n) if self.readers.len() >= n as usize => self
                .readers
                .iter()
                .filter(|r| r.expires > now)
                .map(|r| r.expires)
                .min(),
            Access::Permit(_) => None,
        };
        match (writer, readers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn grant_as(
        &mut self,
        access: Access,
        name: &LockName,
        opts: &AcquireOptions,
        started: Instant,
        now: Instant,
    ) -> Lease {
        let lease = self.grant(name, opts, started, now);
        if access != Access::Exclusive
            && let Some(h) = self.holder.take()
        {
            self.readers.push(h);
        }
        match access {
            Access::Permit(_) => lease.with_handle(PERMIT),
            _ => lease,
        }
    }

    fn grant(
        &mut self,
        name: &LockName,
        opts: &AcquireOptions,
        started: Instant,
        now: Instant,
    ) -> Lease {
        self.fence = (self.fence + 1).max(opts.min_token_value().map_or(0, |f| f.0));
        let owner = opts.owner_or_random();
        let ttl = opts.ttl_value();
        self.holder = Some(Holder {
            owner,
            token: self.fence,
            expires: now + ttl,
        });
        Lease::new(
            name.clone(),
            owner,
            FencingToken(self.fence),
            started,
            ttl,
            opts.drift_value(),
        )
    }

    fn wake_head(&self) {
        if let Some((_, _, n)) = self.queue.front() {
            n.notify_one();
        }
    }
}

#[derive(Default)]
struct Namespace {
    entries: Mutex<HashMap<LockName, Entry>>,
    /// Semaphores: objects apart from the locks of the same names.
    semaphores: Mutex<HashMap<LockName, Entry>>,
    next_waiter: AtomicU64,
}

impl Namespace {
    fn entries(&self) -> MutexGuard<'_, HashMap<LockName, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn semaphores(&self) -> MutexGuard<'_, HashMap<LockName, Entry>> {
        self.semaphores
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The locks, or the semaphores for a permit.
    fn of(&self, access: Access) -> MutexGuard<'_, HashMap<LockName, Entry>> {
        match access {
            Access::Permit(_) => self.semaphores(),
            _ => self.entries(),
        }
    }

    /// The map a lease's hold lives in.
    fn of_lease(&self, lease: &Lease) -> MutexGuard<'_, HashMap<LockName, Entry>> {
        if lease.handle() == Some(PERMIT) {
            self.semaphores()
        } else {
            self.entries()
        }
    }
}

/// The handle of a permit's lease.
const PERMIT: &str = "permit";

fn registry() -> &'static Mutex<HashMap<String, Arc<Namespace>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Namespace>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// A client of one process-local namespace. Clients created with the same namespace name share
/// locks; nothing is shared across processes.
#[derive(Clone)]
pub struct MemoryLock {
    namespace: String,
    ns: Arc<Namespace>,
    defaults: ClientDefaults,
}

impl std::fmt::Debug for MemoryLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLock")
            // A namespace is any text after `memory://`: hide what reads as a password in it.
            .field(
                "namespace",
                &&crate::redact_url(&format!("memory://{}", self.namespace))["memory://".len()..],
            )
            .finish()
    }
}

impl MemoryLock {
    /// A client of namespace `namespace` (created on first use, kept for the process lifetime).
    pub fn new(namespace: &str) -> Self {
        let ns = registry()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(namespace.to_owned())
            .or_default()
            .clone();
        MemoryLock {
            namespace: namespace.to_owned(),
            ns,
            defaults: ClientDefaults::default(),
        }
    }

    /// Parses `memory://namespace[?ttl=..&drift=..&timeout=..]`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another scheme, an empty namespace or an unknown option.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("memory://").ok_or_else(|| {
            Error::invalid_config(BACKEND, "expected a URL of the form memory://namespace")
        })?;
        let (namespace, query) = rest.split_once('?').unwrap_or((rest, ""));
        if namespace.is_empty() {
            return Err(Error::invalid_config(
                BACKEND,
                "memory:// needs a namespace name, e.g. memory://default",
            ));
        }
        let mut client = MemoryLock::new(namespace);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if !client.defaults.apply(BACKEND, k, v)? {
                return Err(Error::invalid_config(
                    BACKEND,
                    format!("unknown option `{k}`; memory:// accepts ttl, drift, timeout"),
                ));
            }
        }
        Ok(client)
    }

    /// Sets the connection defaults.
    pub fn with_defaults(mut self, defaults: ClientDefaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// One attempt: granted when nobody is queued and the current holds admit `access`.
    fn try_as(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        access: Access,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let mut entries = self.ns.of(access);
        let e = entries.entry(name.clone()).or_default();
        let now = Instant::now();
        e.check_count(name, access, now)?;
        Ok((e.queue.is_empty() && e.admits(access, now))
            .then(|| e.grant_as(access, name, opts, started, now)))
    }

    /// Queues for `access` and waits to reach the head of the queue with the holds admitting
    /// it. A reader granted at the head wakes the next entry, so consecutive readers get in
    /// together; a writer in the queue holds back every reader behind it.
    async fn wait_as(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
        access: Access,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let id = self.ns.next_waiter.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        {
            let mut entries = self.ns.of(access);
            let e = entries.entry(name.clone()).or_default();
            let now = Instant::now();
            e.check_count(name, access, now)?;
            if e.queue.is_empty() && e.admits(access, now) {
                return Ok(Some(e.grant_as(access, name, opts, started, now)));
            }
            e.queue.push_back((id, access, notify.clone()));
        }
        let cleanup = CleanupGuard::arm(
            BACKEND,
            name,
            (self.ns.clone(), name.clone(), id, access),
            leave_queue,
        );
        loop {
            let wake_at = {
                let mut entries = self.ns.of(access);
                let e = entries.entry(name.clone()).or_default();
                let now = Instant::now();
                let at_head = e.queue.front().is_some_and(|(qid, _, _)| *qid == id);
                if at_head && e.admits(access, now) {
                    e.queue.pop_front();
                    let _ = cleanup.disarm();
                    // Counted from this grant, not from when the wait began.
                    let lease = e.grant_as(access, name, opts, now, now);
                    if access != Access::Exclusive {
                        e.wake_head();
                    }
                    return Ok(Some(lease));
                }
                // Head of the queue but blocked: wake when the blocking holds run out at the
                // latest.
                if at_head {
                    e.blocked_until(access, now)
                } else {
                    None
                }
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            let until = match (wake_at, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match until {
                Some(t) => {
                    tokio::select! {
                        _ = notify.notified() => {}
                        _ = tokio::time::sleep_until(t.into()) => {}
                    }
                }
                None => notify.notified().await,
            }
        }
    }
}

/// Removes waiter `id`'s queue entry of `name` in place (the undo of an interrupted wait).
fn leave_queue((ns, name, id, access): (Arc<Namespace>, LockName, u64, Access)) -> Undo {
    let mut entries = ns.of(access);
    if let Some(e) = entries.get_mut(&name) {
        let was_head = e.queue.front().is_some_and(|(qid, _, _)| *qid == id);
        e.queue.retain(|(qid, _, _)| *qid != id);
        if was_head {
            e.wake_head();
        }
    }
    Undo::Done
}

#[async_trait]
impl DistributedLock for MemoryLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            Fencing::Strict,
            Expiry::Ttl,
            Fairness::Fifo,
            WaitMechanism::Notify,
        )
        .native(NATIVE)
        .shared_across_processes(false)
        .min_token(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.try_as(name, opts, Access::Exclusive)
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_as(name, opts, deadline, Access::Exclusive).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.try_as(name, opts, Access::Shared)
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_as(name, opts, deadline, Access::Shared).await
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.try_as(name, opts, Access::Permit(permits))
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_as(name, opts, deadline, Access::Permit(permits))
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let mut entries = self.ns.of_lease(lease);
        let Some(e) = entries.get_mut(lease.name()) else {
            return Ok(Released::NotHeld);
        };
        let now = Instant::now();
        let is_it = |h: &Holder| h.owner == lease.owner() && h.token == lease.token().0;
        if e.live_holder(now).is_some_and(is_it) {
            e.holder = None;
            e.wake_head();
            return Ok(Released::Released);
        }
        e.live_readers(now);
        if let Some(at) = e.readers.iter().position(is_it) {
            e.readers.remove(at);
            e.wake_head();
            return Ok(Released::Released);
        }
        Ok(Released::NotHeld)
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        crate::options::check_ttl(ttl)?;
        let started = Instant::now();
        let mut entries = self.ns.of_lease(lease);
        let now = Instant::now();
        let is_it = |h: &&mut Holder| {
            h.expires > now && h.owner == lease.owner() && h.token == lease.token().0
        };
        let holder = entries.get_mut(lease.name()).and_then(|e| {
            let Entry {
                holder, readers, ..
            } = e;
            holder
                .as_mut()
                .filter(is_it)
                .or_else(|| readers.iter_mut().find(is_it))
        });
        match holder {
            Some(h) => {
                h.expires = now + ttl;
                Ok(lease.renewed(started, ttl))
            }
            None => Err(Error::lock_lost(BACKEND, lease.name(), "extend")),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let mut entries = self.ns.entries();
        let now = Instant::now();
        Ok(entries.get_mut(name).map(|e| {
            e.live_readers(now);
            let holder = e.live_holder(now).or(e.readers.first());
            let queued_readers = e.queue.iter().filter(|(_, a, _)| *a == Access::Shared);
            let queued_readers = queued_readers.count();
            LockInfo::new(
                name,
                holder.map(|h| h.owner.to_string()),
                holder
                    .map(|h| FencingToken(h.token))
                    .or((e.fence > 0).then_some(FencingToken(e.fence))),
                holder.map(|h| h.expires.saturating_duration_since(now)),
                Some(e.queue.len()),
            )
            .with_readers(e.readers.len(), queued_readers)
        }))
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        let mut semaphores = self.ns.semaphores();
        let now = Instant::now();
        Ok(semaphores.get_mut(name).map(|e| {
            let in_use = e.live_readers(now) || !e.queue.is_empty();
            let holders = e
                .readers
                .iter()
                .map(|h| PermitHolder {
                    owner: h.owner.to_string(),
                    token: FencingToken(h.token),
                    remaining: Some(h.expires.saturating_duration_since(now)),
                })
                .collect();
            let permits = in_use.then_some(e.permits);
            SemaphoreInfo::new(name, permits, holders, Some(e.queue.len()))
        }))
    }

    /// Forgets the lock `name` and the semaphore `name`, each unless it is in use.
    async fn forget(&self, name: &LockName) -> Result<bool> {
        let now = Instant::now();
        let mut forgotten = true;
        for map in [&self.ns.entries, &self.ns.semaphores] {
            let mut entries = map.lock().unwrap_or_else(PoisonError::into_inner);
            let busy = entries.get_mut(name).is_some_and(|e| {
                e.live_holder(now).is_some() || e.live_readers(now) || !e.queue.is_empty()
            });
            if !busy {
                entries.remove(name);
            }
            forgotten &= !busy;
        }
        Ok(forgotten)
    }

    async fn names(&self) -> Result<Vec<LockName>> {
        Ok(self.ns.entries().keys().cloned().collect())
    }
}
