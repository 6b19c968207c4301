//! A pass-through backend wrapper that counts calls, so cases can prove that bad input was
//! rejected before any I/O.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Lease, LockInfo,
    LockName, LostReason, RawFloor, Released, Result, async_trait,
};

/// Counts every trait call that would reach the store.
#[derive(Debug)]
pub struct CountingLock {
    inner: Arc<dyn DistributedLock>,
    calls: AtomicUsize,
}

impl CountingLock {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn DistributedLock>) -> Arc<Self> {
        Arc::new(CountingLock {
            inner,
            calls: AtomicUsize::new(0),
        })
    }

    /// Calls so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn hit(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

// Every method forwarded: a default left in place would test the default, not the backend.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl DistributedLock for CountingLock {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }
    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.hit();
        self.inner.try_acquire(name, opts).await
    }
    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.hit();
        self.inner.acquire_wait(name, opts, deadline).await
    }
    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.hit();
        self.inner.wait_for_release(name, until).await
    }
    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.hit();
        self.inner.try_acquire_shared(name, opts).await
    }
    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.hit();
        self.inner.acquire_shared_wait(name, opts, deadline).await
    }
    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.hit();
        self.inner.try_acquire_permit(name, permits, opts).await
    }
    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.hit();
        self.inner
            .acquire_permit_wait(name, permits, opts, deadline)
            .await
    }
    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.inner.lost_reason(lease, error)
    }
    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.hit();
        self.inner.release(lease).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.hit();
        self.inner.extend(lease, ttl).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.hit();
        self.inner.inspect(name).await
    }
    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        self.hit();
        self.inner.extend_many(leases).await
    }
    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<lockcore::SemaphoreInfo>> {
        self.hit();
        self.inner.inspect_semaphore(name).await
    }
    async fn forget(&self, name: &LockName) -> Result<bool> {
        self.hit();
        self.inner.forget(name).await
    }
    async fn names(&self) -> Result<Vec<LockName>> {
        self.hit();
        self.inner.names().await
    }
    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.inner.raw_floor()
    }
    fn fenced_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.inner.fenced_floor()
    }
}
