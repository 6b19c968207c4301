//! Deliberately broken backends, each with one defect, to show that the suite catches what it
//! claims to: a case that passes against the backend broken in the way the case is about
//! asserts nothing useful. Used by this crate's own tests and by `dlock check`'s.
//!
//! Never connect an application to these.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, LostReason, OwnerId, RawFloor, Released,
    Result, WaitMechanism, async_trait,
};

use crate::Target;

/// Which defect a toy backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// Every acquire succeeds, held or not.
    NotExclusive,
    /// Release frees the lock whoever asks.
    ReleaseIgnoresOwner,
    /// Every acquisition gets token 1.
    ConstantToken,
    /// Extend revives expired or taken leases.
    ExtendResurrects,
    /// Leases never expire.
    NeverExpires,
    /// Leases expire at half their ttl (before the client's valid_until).
    ExpiresEarly,
    /// Release does nothing (the lock stays until its ttl).
    ReleaseIsNoop,
    /// Extend reports success but changes nothing in the store.
    ExtendIsNoop,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerId,
    token: u64,
    expires: Instant,
}

#[derive(Debug, Default)]
struct State {
    holders: HashMap<LockName, Holder>,
    fence: HashMap<LockName, u64>,
}

/// A toy backend with one defect; every client with the same defect shares one store.
#[derive(Debug)]
pub struct Toy {
    defect: Defect,
    state: &'static Mutex<State>,
}

fn state(defect: Defect) -> &'static Mutex<State> {
    static STATES: OnceLock<Mutex<HashMap<String, &'static Mutex<State>>>> = OnceLock::new();
    let mut m = STATES.get_or_init(Default::default).lock().unwrap();
    m.entry(format!("{defect:?}"))
        .or_insert_with(|| Box::leak(Box::default()))
}

#[async_trait]
impl DistributedLock for Toy {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            "toy",
            Fencing::Strict,
            Expiry::Ttl,
            Fairness::Unordered,
            WaitMechanism::Poll,
        )
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        let started = Instant::now();
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let live = s
            .holders
            .get(name)
            .is_some_and(|h| self.defect == Defect::NeverExpires || h.expires > now);
        if live && self.defect != Defect::NotExclusive {
            return Ok(None);
        }
        let fence = s.fence.entry(name.clone()).or_default();
        *fence += 1;
        let token = if self.defect == Defect::ConstantToken {
            1
        } else {
            *fence
        };
        let owner = opts.owner_or_random();
        let ttl = opts.ttl_value();
        let life = if self.defect == Defect::ExpiresEarly {
            ttl / 2
        } else {
            ttl
        };
        s.holders.insert(
            name.clone(),
            Holder {
                owner,
                token,
                expires: now + life,
            },
        );
        Ok(Some(Lease::new(
            name.clone(),
            owner,
            FencingToken(token),
            started,
            ttl,
            opts.drift_value(),
        )))
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        if self.defect == Defect::ReleaseIsNoop {
            return Ok(Released::Released);
        }
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        let ok = s.holders.get(lease.name()).is_some_and(|h| {
            self.defect == Defect::ReleaseIgnoresOwner
                || (h.owner == lease.owner() && h.token == lease.token().0 && h.expires > now)
        });
        if ok {
            s.holders.remove(lease.name());
            Ok(Released::Released)
        } else {
            Ok(Released::NotHeld)
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let started = Instant::now();
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        if self.defect == Defect::ExtendIsNoop {
            return Ok(lease.renewed(started, ttl));
        }
        if self.defect == Defect::ExtendResurrects {
            s.holders.insert(
                lease.name().clone(),
                Holder {
                    owner: lease.owner(),
                    token: lease.token().0,
                    expires: now + ttl,
                },
            );
            return Ok(lease.renewed(started, ttl));
        }
        match s.holders.get_mut(lease.name()) {
            Some(h)
                if h.owner == lease.owner()
                    && (h.expires > now || self.defect == Defect::NeverExpires) =>
            {
                h.expires = now + ttl;
                Ok(lease.renewed(started, ttl))
            }
            _ => Err(Error::lock_lost("toy", lease.name(), "extend")),
        }
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        if s.holders.get(name).is_some_and(|h| h.expires > now) {
            return Ok(false);
        }
        s.holders.remove(name);
        s.fence.remove(name);
        Ok(true)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let s = self.state.lock().unwrap();
        let now = Instant::now();
        Ok(s.holders.get(name).filter(|h| h.expires > now).map(|h| {
            LockInfo::new(
                name,
                Some(h.owner.to_string()),
                Some(FencingToken(h.token)),
                None,
                None,
            )
        }))
    }
}

impl Defect {
    /// Every defect.
    pub const ALL: [Defect; 8] = [
        Defect::NotExclusive,
        Defect::ReleaseIgnoresOwner,
        Defect::ConstantToken,
        Defect::ExtendResurrects,
        Defect::NeverExpires,
        Defect::ExpiresEarly,
        Defect::ReleaseIsNoop,
        Defect::ExtendIsNoop,
    ];
}

impl Toy {
    /// A client of the shared store of toys with `defect`.
    pub fn new(defect: Defect) -> Self {
        Toy {
            defect,
            state: state(defect),
        }
    }
}

/// A target whose clients all have `defect` (label `mutant-<defect>`).
pub fn target(defect: Defect) -> Target {
    Target::new(&format!("mutant-{defect:?}"), "", move |_| async move {
        Ok(Arc::new(Toy::new(defect)) as Arc<dyn DistributedLock>)
    })
}

/// A read-write backend whose readers and writers do not see each other: shared holds live in a
/// store of their own (memory namespaces), so a writer gets in while readers hold and readers
/// get in while a writer holds. Everything else is the memory backend's.
#[derive(Debug)]
pub struct BlindReaders {
    writers: lockcore::MemoryLock,
    readers: lockcore::MemoryLock,
}

/// Marks a lease that came from the readers' store.
const READERS: &str = "blind-readers";

impl BlindReaders {
    /// A client of the shared (process-wide) blind-readers store.
    pub fn new() -> Self {
        BlindReaders {
            writers: lockcore::MemoryLock::new("mutant-blind-readers-w"),
            readers: lockcore::MemoryLock::new("mutant-blind-readers-r"),
        }
    }

    fn store_of(&self, lease: &Lease) -> &lockcore::MemoryLock {
        if lease.handle() == Some(READERS) {
            &self.readers
        } else {
            &self.writers
        }
    }
}

impl Default for BlindReaders {
    fn default() -> Self {
        Self::new()
    }
}

// A delegating double: every method forwarded, so only the defect differs from memory.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl DistributedLock for BlindReaders {
    fn capabilities(&self) -> Capabilities {
        self.writers.capabilities()
    }

    fn defaults(&self) -> ClientDefaults {
        self.writers.defaults()
    }

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.writers.wait_for_release(name, until).await
    }

    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.store_of(lease).lost_reason(lease, error)
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let mut out = Vec::with_capacity(leases.len());
        for (lease, ttl) in leases {
            out.push(self.store_of(lease).extend(lease, *ttl).await);
        }
        out
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<lockcore::SemaphoreInfo>> {
        self.writers.inspect_semaphore(name).await
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        Ok(self.writers.forget(name).await? && self.readers.forget(name).await?)
    }

    async fn names(&self) -> Result<Vec<LockName>> {
        let mut names = self.writers.names().await?;
        names.extend(self.readers.names().await?);
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        Ok(names)
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.writers.raw_floor()
    }

    fn fenced_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.writers.fenced_floor()
    }

    fn recipe_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.writers.recipe_floor()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.writers.try_acquire(name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.writers.acquire_wait(name, opts, deadline).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let lease = self.readers.try_acquire_shared(name, opts).await?;
        Ok(lease.map(|l| l.with_handle(READERS)))
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let lease = self
            .readers
            .acquire_shared_wait(name, opts, deadline)
            .await?;
        Ok(lease.map(|l| l.with_handle(READERS)))
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.writers.try_acquire_permit(name, permits, opts).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.writers
            .acquire_permit_wait(name, permits, opts, deadline)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.store_of(lease).release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.store_of(lease).extend(lease, ttl).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.writers.inspect(name).await
    }
}

/// A target whose clients all share one [`BlindReaders`] store (label `mutant-BlindReaders`).
pub fn blind_readers_target() -> Target {
    Target::new("mutant-BlindReaders", "", |_| async {
        Ok(Arc::new(BlindReaders::new()) as Arc<dyn DistributedLock>)
    })
}

/// What a [`SemaphoreMutant`] gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemaphoreDefect {
    /// Admits one holder more than the count.
    Overbooked,
    /// Ignores the caller's count (every semaphore has a thousand permits), so callers that
    /// disagree are never told.
    CountIgnored,
    /// A waiting acquire runs on in a task of its own when dropped, and keeps what it gets.
    LeakyWait,
}

/// The memory backend with one semaphore defect; clients with the same defect share a store.
#[derive(Debug)]
pub struct SemaphoreMutant {
    inner: lockcore::MemoryLock,
    defect: SemaphoreDefect,
}

impl SemaphoreMutant {
    /// A client of the store of `defect`.
    pub fn new(defect: SemaphoreDefect) -> Self {
        SemaphoreMutant {
            inner: lockcore::MemoryLock::new(&format!("mutant-semaphore-{defect:?}")),
            defect,
        }
    }

    fn count(&self, permits: u32) -> u32 {
        match self.defect {
            SemaphoreDefect::Overbooked => permits + 1,
            SemaphoreDefect::CountIgnored => 1000,
            SemaphoreDefect::LeakyWait => permits,
        }
    }
}

// A delegating double: every method forwarded, so only the defect differs from memory.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl DistributedLock for SemaphoreMutant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.inner.try_acquire(name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.inner.acquire_wait(name, opts, deadline).await
    }

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.inner.wait_for_release(name, until).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.inner.try_acquire_shared(name, opts).await
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.inner.acquire_shared_wait(name, opts, deadline).await
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let permits = self.count(permits);
        self.inner.try_acquire_permit(name, permits, opts).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let permits = self.count(permits);
        if self.defect != SemaphoreDefect::LeakyWait {
            return self
                .inner
                .acquire_permit_wait(name, permits, opts, deadline)
                .await;
        }
        let (inner, name, opts) = (self.inner.clone(), name.clone(), opts.clone());
        let detached = tokio::spawn(async move {
            inner
                .acquire_permit_wait(&name, permits, &opts, deadline)
                .await
        });
        detached.await.unwrap_or(Ok(None))
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await
    }

    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.inner.lost_reason(lease, error)
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        self.inner.extend_many(leases).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<lockcore::SemaphoreInfo>> {
        self.inner.inspect_semaphore(name).await
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        self.inner.forget(name).await
    }

    async fn names(&self) -> Result<Vec<LockName>> {
        self.inner.names().await
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.inner.raw_floor()
    }

    fn fenced_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.inner.fenced_floor()
    }

    fn recipe_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.inner.recipe_floor()
    }
}

/// A target whose clients share the [`SemaphoreMutant`] store of `defect`.
pub fn semaphore_target(defect: SemaphoreDefect) -> Target {
    Target::new(
        &format!("mutant-semaphore-{defect:?}"),
        "",
        move |_| async move { Ok(Arc::new(SemaphoreMutant::new(defect)) as Arc<dyn DistributedLock>) },
    )
}
