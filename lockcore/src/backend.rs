//! The implementer trait.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::{
    AcquireOptions, Capabilities, ClientDefaults, Error, Lease, LockInfo, LockName, LostReason,
    Released, Result, SemaphoreInfo,
};

/// What a backend implements. Object-safe: `Arc<dyn DistributedLock>` is what `dlock::connect`
/// returns. Waiting, guards, keep-alive, reentrancy and multi-lock are written once on top of it
/// (see [`LockExt`](crate::LockExt)); a backend only provides single attempts, a wait hook,
/// owner-checked release and extend, and inspection.
///
/// Options passed in have been validated and completed with [`defaults`](Self::defaults) by the
/// caller in lockcore; backends read `ttl_value()` and `drift_value()` from them.
#[async_trait]
pub trait DistributedLock: Send + Sync + fmt::Debug + 'static {
    /// The backend's guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Defaults from the connection URL (`ttl`, `drift`, `timeout`).
    fn defaults(&self) -> ClientDefaults {
        ClientDefaults::default()
    }

    /// One attempt: `Ok(None)` when another owner holds the lock (or, on a fair backend, when
    /// others are queued for it).
    ///
    /// # Cancel safety
    /// Dropping the future must leave no lock behind beyond what the ttl bounds; backends arm a
    /// cleanup that releases a lock granted to a dropped request.
    ///
    /// # Errors
    /// [`Error::Backend`] when the store fails.
    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>>;

    /// Waits until the lock is acquired or `deadline` passes (`Ok(None)`); `None` means no deadline.
    ///
    /// The default loops over [`try_acquire`](Self::try_acquire) and
    /// [`wait_for_release`](Self::wait_for_release) with capped exponential backoff
    /// ([`crate::wait::acquire_with_hook`]). Fair backends override it with their own queue.
    ///
    /// # Cancel safety
    /// Dropping the future leaves no lock, queue entry or row behind beyond a best-effort cleanup
    /// that starts at once.
    ///
    /// # Errors
    /// Store failures; a timeout is `Ok(None)`, not an error, at this level.
    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        crate::wait::acquire_with_hook(self, name, opts, deadline).await
    }

    /// Resolves when `name` may have been released, or at `until` at the latest. The default just
    /// sleeps until `until` (polling); backends with a notification mechanism return early.
    ///
    /// # Cancel safety
    /// Safe to drop at any point.
    ///
    /// # Errors
    /// Store failures while subscribing.
    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        let _ = name;
        tokio::time::sleep_until(until.into()).await;
        Ok(())
    }

    /// One attempt at a shared (read) hold on `name`: `Ok(None)` when a writer holds it or is
    /// queued for it (readers never jump a waiting writer, so writers do not starve). Only for
    /// backends whose capabilities say [`NativePrimitives::read_write`](crate::NativePrimitives);
    /// on those, the exclusive lock of a name ([`try_acquire`](Self::try_acquire)) is its write
    /// lock. The lease is released and extended like any other.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    /// [`Error::Unsupported`] by default; store failures.
    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let _ = (name, opts);
        Err(crate::Error::Unsupported {
            operation: "read lock",
            backend: self.capabilities().backend,
        })
    }

    /// Waits for a shared (read) hold until `deadline` (`Ok(None)`); `None` means no deadline.
    /// Readers queue with writers in arrival order: a reader waits for the writers ahead of it.
    ///
    /// # Cancel safety
    /// As [`acquire_wait`](Self::acquire_wait).
    ///
    /// # Errors
    /// [`Error::Unsupported`] by default; store failures.
    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let _ = (name, opts, deadline);
        Err(crate::Error::Unsupported {
            operation: "read lock",
            backend: self.capabilities().backend,
        })
    }

    /// One attempt at a permit of the counting semaphore `name` with `permits` permits:
    /// `Ok(None)` when all are taken (or, on a fair backend, when others are queued). Only for
    /// backends whose capabilities say
    /// [`NativePrimitives::semaphore`](crate::NativePrimitives). A semaphore is its own object:
    /// it does not exclude the lock of the same name, and its fencing tokens are its own
    /// (unique and increasing per semaphore). The permit's lease is released and extended like
    /// any other. `permits` is checked by the caller (1 ..= [`MAX_PERMITS`](crate::MAX_PERMITS)).
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    /// [`Error::Unsupported`] by default;
    /// [`Error::InvalidArgument`] when the store records another
    /// count for `name` and the semaphore is in use; store failures.
    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let _ = (name, permits, opts);
        Err(crate::Error::Unsupported {
            operation: "semaphore",
            backend: self.capabilities().backend,
        })
    }

    /// Waits for a permit of the semaphore `name` until `deadline` (`Ok(None)`); `None` means no
    /// deadline. FIFO where the backend queues.
    ///
    /// # Cancel safety
    /// As [`acquire_wait`](Self::acquire_wait).
    ///
    /// # Errors
    /// As [`try_acquire_permit`](Self::try_acquire_permit).
    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let _ = (name, permits, opts, deadline);
        Err(crate::Error::Unsupported {
            operation: "semaphore",
            backend: self.capabilities().backend,
        })
    }

    /// Owner-checked release: frees the lock only if `lease` is still the current holder.
    /// Idempotent: a second call returns [`Released::NotHeld`].
    ///
    /// # Cancel safety
    /// The release either happened in the store or not; dropping the future cannot free someone
    /// else's lock.
    ///
    /// # Errors
    /// Store failures.
    async fn release(&self, lease: &Lease) -> Result<Released>;

    /// Owner-checked extension to `ttl` from now; the token does not change. Never resurrects an
    /// expired or taken lock.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease; the returned lease is the only
    /// proof of the new validity.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lease expired or was taken; store failures.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease>;

    /// Why `lease` is gone, given the [`Error::LockLost`] that
    /// [`extend`](Self::extend) returned for it; guards report it from `lost()`. The default
    /// says [`LostReason::Taken`] while the lease was still valid and [`LostReason::Expired`]
    /// after; a session-based backend says [`LostReason::SessionExpired`] when the session that
    /// held the lock ended. No I/O.
    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        let _ = error;
        if lease.is_valid() {
            LostReason::Taken
        } else {
            LostReason::Expired
        }
    }

    /// Extends many leases at once (keep-alive calls this with every lease that is due). The
    /// default extends them one after another; network backends override it to send one
    /// pipeline or batch. Results are in the order of `leases`.
    ///
    /// # Cancel safety
    /// As [`extend`](Self::extend), for each lease.
    ///
    /// # Errors
    /// Per lease, in the returned vector.
    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let mut out = Vec::with_capacity(leases.len());
        for (lease, ttl) in leases {
            out.push(self.extend(lease, *ttl).await);
        }
        out
    }

    /// Who holds `name`, its token and time left; `Ok(None)` when the store has never seen it.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    ///
    /// # Errors
    /// Store failures.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>>;

    /// The holders and waiters of the semaphore `name`; `Ok(None)` when the store has never
    /// seen it. For backends whose capabilities say
    /// [`NativePrimitives::semaphore`](crate::NativePrimitives).
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    ///
    /// # Errors
    /// [`Error::Unsupported`] by default; store failures.
    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        let _ = name;
        Err(crate::Error::Unsupported {
            operation: "semaphore",
            backend: self.capabilities().backend,
        })
    }

    /// Deletes every trace of `name` in the store, its fencing counter included, unless someone
    /// holds it or waits for it (`Ok(false)` then; `Ok(true)` when nothing of it is left).
    ///
    /// Only for names that will never be used again: a later acquisition of `name` starts the
    /// fencing counter afresh, below tokens handed out before, which breaks fencing for anyone
    /// still writing with those. `dlock check` uses it on the run-unique names of its cases.
    ///
    /// # Cancel safety
    /// Each step either happened or not; a dropped call leaves a name that is still usable.
    ///
    /// # Errors
    /// [`Error::Unsupported`] by default; store failures.
    async fn forget(&self, name: &LockName) -> Result<bool> {
        let _ = name;
        Err(crate::Error::Unsupported {
            operation: "forget",
            backend: self.capabilities().backend,
        })
    }

    /// Every lock name the store knows (held, waited for, or remembered with its fencing
    /// counter), in no particular order, for `dlock migrate` and reports. A store that keeps a
    /// name only as a hash (very long names) leaves it out.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    ///
    /// # Errors
    /// [`Error::Unsupported`] by default; store failures.
    async fn names(&self) -> Result<Vec<LockName>> {
        Err(crate::Error::Unsupported {
            operation: "list names",
            backend: self.capabilities().backend,
        })
    }
}
