//! A pass-through backend wrapper that counts calls, so cases can prove that bad input was
//! rejected before any I/O; it also accounts for renewals (`extend`, `extend_many`), which
//! `dlock bench --mode hold` reports.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Lease, LockInfo,
    LockName, LostReason, Released, Result, async_trait,
};

/// Counts every trait call that would reach the store.
#[derive(Debug)]
pub struct CountingLock {
    inner: Arc<dyn DistributedLock>,
    calls: AtomicUsize,
    renewal_calls: AtomicUsize,
    renewed: AtomicUsize,
    renewals_failed: AtomicUsize,
    late: AtomicUsize,
}

/// What the renewals through a [`CountingLock`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Renewals {
    /// `extend` and `extend_many` calls (lockcore's keep-alive sends its batches through
    /// `extend_many`).
    pub calls: usize,
    /// Leases extended.
    pub renewed: usize,
    /// Leases an extend did not extend (lost, or a store error).
    pub failed: usize,
    /// Leases that had less than a third of their ttl left when their extend was called: at
    /// least one keep-alive interval (ttl/3) late.
    pub late: usize,
}

impl CountingLock {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn DistributedLock>) -> Arc<Self> {
        Arc::new(CountingLock {
            inner,
            calls: AtomicUsize::new(0),
            renewal_calls: AtomicUsize::new(0),
            renewed: AtomicUsize::new(0),
            renewals_failed: AtomicUsize::new(0),
            late: AtomicUsize::new(0),
        })
    }

    /// Calls so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The renewals so far.
    pub fn renewals(&self) -> Renewals {
        Renewals {
            calls: self.renewal_calls.load(Ordering::SeqCst),
            renewed: self.renewed.load(Ordering::SeqCst),
            failed: self.renewals_failed.load(Ordering::SeqCst),
            late: self.late.load(Ordering::SeqCst),
        }
    }

    fn hit(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }

    /// How many of `leases` are late as their extend is called (less than a third of the ttl
    /// left).
    fn late<'a>(leases: impl Iterator<Item = &'a Lease>) -> usize {
        leases.filter(|l| l.remaining() < l.ttl() / 3).count()
    }

    /// One renewal call that found `late` leases late and had these outcomes.
    fn renewed(&self, late: usize, outcomes: impl Iterator<Item = bool>) {
        self.renewal_calls.fetch_add(1, Ordering::SeqCst);
        self.late.fetch_add(late, Ordering::SeqCst);
        let (ok, failed) =
            outcomes.fold((0, 0), |(o, f), r| if r { (o + 1, f) } else { (o, f + 1) });
        self.renewed.fetch_add(ok, Ordering::SeqCst);
        self.renewals_failed.fetch_add(failed, Ordering::SeqCst);
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
        let late = Self::late(std::iter::once(lease));
        let extended = self.inner.extend(lease, ttl).await;
        self.renewed(late, std::iter::once(extended.is_ok()));
        extended
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.hit();
        self.inner.inspect(name).await
    }
    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        self.hit();
        // Judged as the call starts, not after its round trip.
        let late = Self::late(leases.iter().map(|(l, _)| l));
        let extended = self.inner.extend_many(leases).await;
        self.renewed(late, extended.iter().map(Result::is_ok));
        extended
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
}
