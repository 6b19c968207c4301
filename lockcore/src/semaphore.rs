//! Counting semaphores: at most `permits` holders of a name at once, on backends whose
//! capabilities say [`NativePrimitives::semaphore`](crate::NativePrimitives).
//!
//! A permit behaves like a lock: its guard renews it, reports `lost()` with a reason, releases
//! on drop, and a crashed holder's permit comes back by the backend's own expiry rule (its ttl,
//! or its session). Waiters queue in arrival order where the backend queues.
//!
//! **Fencing.** Every permit grant gets a fencing token, unique and increasing per semaphore
//! (a semaphore's tokens are its own, apart from the lock of the same name). With N holders at
//! once, a resource that refuses lower tokens would refuse every holder but the latest, so a
//! permit's token fences what that permit alone guards (a slot, a partition, a worker's share),
//! not one resource that all holders write.
//!
//! **The count.** Where the store records it (SQL, Redis, the memory backend, ZooKeeper's own
//! and kazoo's layouts), callers that ask for another count while the semaphore is in use (a
//! permit held or a waiter queued) get [`Error::InvalidArgument`]; once nobody holds or waits,
//! the next caller's count is the semaphore's. Elsewhere is said in the backend's docs.

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{Access, acquire_resolved, resolve, timeout};
use crate::guard::guard_type;
use crate::{AcquireOptions, DistributedLock, Error, FencingToken, LockName, Result, Wait};

/// The largest count a semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;

guard_type!(PermitGuard, "semaphore permit");

/// Checks a semaphore's count: 1 ..= [`MAX_PERMITS`]. No I/O.
///
/// # Errors
/// [`Error::InvalidArgument`] for 0 or more than [`MAX_PERMITS`].
pub fn check_permits(permits: u32) -> Result<()> {
    if (1..=MAX_PERMITS).contains(&permits) {
        Ok(())
    } else {
        Err(Error::invalid_argument(
            "permits",
            format!("{permits} is out of range: a semaphore has 1 ..= {MAX_PERMITS} permits"),
        ))
    }
}

/// The error for a count that differs from the one the store records for a semaphore in use.
pub fn permits_mismatch(name: &LockName, recorded: u64, asked: u32) -> Error {
    Error::invalid_argument(
        "permits",
        format!(
            "semaphore {:?} is in use with {recorded} permits; this caller asked for {asked} \
             (a count changes only once nobody holds or waits)",
            name.as_str()
        ),
    )
}

/// One holder of a semaphore's permit, as [`SemaphoreInfo`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PermitHolder {
    /// The holder's owner id.
    pub owner: String,
    /// The permit's fencing token.
    pub token: FencingToken,
    /// Time left on the permit's lease as the store sees it (`None` for a session-bound one).
    pub remaining: Option<Duration>,
}

/// What [`DistributedLock::inspect_semaphore`] reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The semaphore's name.
    pub name: String,
    /// The count the store records while the semaphore is in use (`None` where it records
    /// none, or nobody holds or waits).
    pub permits: Option<u32>,
    /// The current holders, oldest grant first.
    pub holders: Vec<PermitHolder>,
    /// Clients queued for a permit, where the backend queues.
    pub waiters: Option<usize>,
}

impl SemaphoreInfo {
    /// Builds a report (backends call this).
    pub fn new(
        name: &LockName,
        permits: Option<u32>,
        holders: Vec<PermitHolder>,
        waiters: Option<usize>,
    ) -> Self {
        SemaphoreInfo {
            name: name.as_str().to_owned(),
            permits,
            holders,
            waiters,
        }
    }
}

/// A counting semaphore of a connected backend, made by [`SemaphoreExt::semaphore`] (which
/// checked the name, the count and the backend before any I/O). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Semaphore {
    backend: Arc<dyn DistributedLock>,
    name: LockName,
    permits: u32,
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Takes a permit, waiting per `opts` (its `wait`; FIFO where the backend queues).
    ///
    /// # Cancel safety
    /// Dropping the future leaves no permit or queue entry behind beyond the backend's
    /// immediate best-effort clean-up.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options (before any I/O) or a count that differs from
    /// the one recorded for the semaphore in use; [`Error::Timeout`] when no permit came within
    /// the wait; store failures.
    pub async fn acquire(&self, opts: &AcquireOptions) -> Result<PermitGuard> {
        self.get(opts)
            .await?
            .ok_or_else(|| timeout(&self.backend, self.name.as_str(), opts))
    }

    /// One attempt at a permit: `Ok(None)` when all are taken (or others queue first).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), without `Timeout`.
    pub async fn try_acquire(&self, opts: &AcquireOptions) -> Result<Option<PermitGuard>> {
        self.get(&opts.clone().wait(Wait::No)).await
    }

    async fn get(&self, opts: &AcquireOptions) -> Result<Option<PermitGuard>> {
        let opts = resolve(&self.backend, opts)?;
        let access = Access::Permit(self.permits);
        let guard = acquire_resolved(&self.backend, &self.name, &opts, access).await?;
        Ok(guard.map(PermitGuard))
    }
}

/// Counting semaphores on a connected backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lockcore::Result<()> {
/// use std::sync::Arc;
/// use lockcore::{AcquireOptions, DistributedLock, MemoryLock, SemaphoreExt};
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("semaphore-doc"));
/// let partner_api = locks.semaphore("partner-api", 2)?;
/// let a = partner_api.acquire(&AcquireOptions::new()).await?;
/// let b = partner_api.acquire(&AcquireOptions::new()).await?;
/// assert!(partner_api.try_acquire(&AcquireOptions::new()).await?.is_none());
/// assert!(b.fencing_token() > a.fencing_token());
/// a.release().await?;
/// b.release().await?;
/// # Ok(()) }
/// ```
pub trait SemaphoreExt {
    /// The semaphore `name` with `permits` permits. No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::InvalidArgument`] for a count outside
    /// 1 ..= [`MAX_PERMITS`], [`Error::Unsupported`] on a backend without semaphores.
    fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore>;
}

impl SemaphoreExt for Arc<dyn DistributedLock> {
    fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        let name = LockName::new(name)?;
        check_permits(permits)?;
        let caps = self.capabilities();
        caps.require(caps.native.semaphore, "semaphore")?;
        Ok(Semaphore {
            backend: self.clone(),
            name,
            permits,
        })
    }
}
