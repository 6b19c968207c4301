//! [`Mutated`]: any backend with one defect laid over it, so that the suite can be shown to
//! catch a defect on a real store as well as on the in-memory one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Lease, LockInfo,
    LockName, LostReason, OwnerId, Released, Result, SemaphoreInfo, async_trait,
};

use crate::{Connect, Target};

/// What a [`Mutated`] backend gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Twist {
    /// The token minimum of an acquisition is dropped before the store sees it.
    MinTokenIgnored,
    /// The store keeps a permit for an hour whatever its ttl (the client still counts the ttl).
    PermitsNeverExpire,
    /// A lease's validity is counted from the reply, which comes late, not from the request.
    ValidityFromReply,
    /// A lease claims a thousand times its ttl, far past what the store keeps it for.
    ValidityOverclaimed,
    /// Extend keeps the lease in the store for a hundred times the ttl asked for (the client
    /// counts the ttl it asked for): a lease whose renewals stop still outlives its last one.
    ExtendOverreaches,
    /// Extend reports success without asking the store.
    ExtendSkipsStore,
    /// The owner id the caller chose is replaced by a random one.
    OwnerIgnored,
    /// The store keeps every lease for a quarter of its ttl (the client counts the whole ttl).
    ExpiresEarly,
}

impl Twist {
    /// Every twist.
    pub const ALL: [Twist; 8] = [
        Twist::MinTokenIgnored,
        Twist::PermitsNeverExpire,
        Twist::ValidityFromReply,
        Twist::ValidityOverclaimed,
        Twist::ExtendOverreaches,
        Twist::ExtendSkipsStore,
        Twist::OwnerIgnored,
        Twist::ExpiresEarly,
    ];
}

/// How late the reply of [`Twist::ValidityFromReply`] comes.
const LATE_REPLY: Duration = Duration::from_millis(300);

/// A backend with one [`Twist`]; every call the twist does not touch goes to `inner` as is.
/// A lease with a handle is taken for a permit (the memory store marks permits so).
#[derive(Debug)]
pub struct Mutated {
    inner: Arc<dyn DistributedLock>,
    twist: Twist,
}

impl Mutated {
    /// `inner` with `twist`.
    pub fn new(inner: Arc<dyn DistributedLock>, twist: Twist) -> Self {
        Mutated { inner, twist }
    }

    /// The ttl the store is sent for a lease (a permit's if `permit`) of `ttl`.
    fn store_ttl(&self, ttl: Duration, permit: bool) -> Duration {
        match self.twist {
            Twist::PermitsNeverExpire if permit => Duration::from_secs(3600),
            Twist::ExpiresEarly => ttl / 4,
            _ => ttl,
        }
    }

    /// The options the store is sent.
    fn sent(&self, opts: &AcquireOptions, permit: bool) -> AcquireOptions {
        let ttl = self.store_ttl(opts.ttl_value(), permit);
        match self.twist {
            Twist::MinTokenIgnored => opts.clone().without_min_token(),
            Twist::OwnerIgnored => opts.clone().owner(OwnerId::random()),
            _ if ttl != opts.ttl_value() => opts.clone().ttl(ttl).drift(opts.drift_value()),
            _ => opts.clone(),
        }
    }

    /// The lease the caller is handed for `got`, granted by a request sent at `sent` for `ttl`.
    async fn handed(&self, got: Option<Lease>, sent: Instant, ttl: Duration) -> Option<Lease> {
        let lease = got?;
        let claim = match self.twist {
            Twist::PermitsNeverExpire | Twist::ExpiresEarly if lease.ttl() != ttl => (sent, ttl),
            Twist::ValidityFromReply => {
                tokio::time::sleep(LATE_REPLY).await;
                (Instant::now(), ttl)
            }
            Twist::ValidityOverclaimed => (sent, ttl * 1000),
            _ => return Some(lease),
        };
        Some(relabel(&lease, claim.0, claim.1))
    }
}

/// `lease` as if granted at `started` for `ttl`.
fn relabel(lease: &Lease, started: Instant, ttl: Duration) -> Lease {
    let out = Lease::new(
        lease.name().clone(),
        lease.owner(),
        lease.token(),
        started,
        ttl,
        lease.drift(),
    );
    match lease.handle() {
        Some(h) => out.with_handle(h.to_owned()),
        None => out,
    }
}

#[async_trait]
impl DistributedLock for Mutated {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        let sent = Instant::now();
        let got = self
            .inner
            .try_acquire(name, &self.sent(opts, false))
            .await?;
        Ok(self.handed(got, sent, opts.ttl_value()).await)
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let got = self
            .inner
            .acquire_wait(name, &self.sent(opts, false), deadline)
            .await?;
        // The granting request was the last one; its send is unknown here, so the grant's
        // own start stands (only the late reply or the overclaim is added).
        let sent = got.as_ref().map_or_else(Instant::now, Lease::acquired_at);
        Ok(self.handed(got, sent, opts.ttl_value()).await)
    }

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.inner.wait_for_release(name, until).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let sent = Instant::now();
        let got = self
            .inner
            .try_acquire_shared(name, &self.sent(opts, false))
            .await?;
        Ok(self.handed(got, sent, opts.ttl_value()).await)
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let got = self
            .inner
            .acquire_shared_wait(name, &self.sent(opts, false), deadline)
            .await?;
        let sent = got.as_ref().map_or_else(Instant::now, Lease::acquired_at);
        Ok(self.handed(got, sent, opts.ttl_value()).await)
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let sent = Instant::now();
        let got = self
            .inner
            .try_acquire_permit(name, permits, &self.sent(opts, true))
            .await?;
        Ok(self.handed(got, sent, opts.ttl_value()).await)
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let sent = Instant::now();
        let got = self
            .inner
            .acquire_permit_wait(name, permits, &self.sent(opts, true), deadline)
            .await?;
        let sent = got.as_ref().map_or(sent, Lease::acquired_at);
        Ok(self.handed(got, sent, opts.ttl_value()).await)
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let sent = Instant::now();
        match self.twist {
            Twist::ExtendSkipsStore => Ok(lease.renewed(sent, ttl)),
            // The store's lease is extended as the twist says; the caller is handed what a
            // correct extend of `lease` to `ttl` would hand it (its drift too), or the overclaim.
            Twist::ExtendOverreaches => {
                self.inner.extend(lease, ttl * 100).await?;
                Ok(lease.renewed(sent, ttl))
            }
            Twist::PermitsNeverExpire | Twist::ExpiresEarly => {
                let stored = self.store_ttl(ttl, lease.handle().is_some());
                self.inner.extend(lease, stored).await?;
                Ok(lease.renewed(sent, ttl))
            }
            Twist::ValidityOverclaimed => {
                self.inner.extend(lease, ttl).await?;
                Ok(lease.renewed(sent, ttl * 1000))
            }
            _ => self.inner.extend(lease, ttl).await,
        }
    }

    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.inner.lost_reason(lease, error)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        self.inner.inspect_semaphore(name).await
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        self.inner.forget(name).await
    }

    async fn names(&self) -> Result<Vec<LockName>> {
        self.inner.names().await
    }
}

/// `target`'s store, each client with `twist` (label `mutant-<label>-<twist>`).
pub fn mutated_target(
    label: &str,
    url: impl Into<String>,
    connect: Connect,
    twist: Twist,
) -> Target {
    Target::new(&format!("mutant-{label}-{twist:?}"), url, move |url| {
        let connect = connect.clone();
        async move {
            let inner = connect(url).await?;
            Ok(Arc::new(Mutated::new(inner, twist)) as Arc<dyn DistributedLock>)
        }
    })
}

/// The memory store with `twist` (label `mutant-memory-<twist>`).
pub fn memory_target(twist: Twist) -> Target {
    let connect: Connect = Arc::new(|url: String| {
        Box::pin(async move {
            Ok(Arc::new(lockcore::MemoryLock::new(&url)) as Arc<dyn DistributedLock>)
        })
    });
    mutated_target("memory", format!("mutant-memory-{twist:?}"), connect, twist)
}
