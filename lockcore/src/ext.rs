//! The convenient, user-facing API on top of [`DistributedLock`]: waiting acquires that return
//! guards, `with_lock`, multi-lock and reentrant owners.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::acquire::{acquire, lock_name};
use crate::{
    AcquireOptions, DistributedLock, Error, FencingToken, LockGuard, LockName, MultiGuard, Owner,
    Result, Wait,
};

/// Convenience methods on a connected backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lockcore::Result<()> {
/// use std::sync::Arc;
/// use lockcore::{AcquireOptions, DistributedLock, LockExt, MemoryLock};
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("doc"));
/// let guard = locks.lock("reports/daily", &AcquireOptions::new()).await?;
/// println!("token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait LockExt {
    /// Acquires `name`, waiting per `opts` (default: forever).
    ///
    /// # Cancel safety
    /// Dropping the future leaves no lock or queue entry behind beyond an immediate best-effort
    /// cleanup.
    ///
    /// While waiting (`Wait::For`, `Wait::Forever`), retryable store errors such as a server
    /// restart are ridden out with backoff (up to 2 s between tries) until the deadline.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::InvalidArgument`] before any I/O; [`Error::Timeout`] if
    /// the wait policy ran out (including `Wait::No` on a held lock); a store failure that is not
    /// retryable, or a retryable one still happening when the deadline passes.
    async fn lock(&self, name: &str, opts: &AcquireOptions) -> Result<LockGuard>;

    /// One attempt, whatever the wait policy says: `Ok(None)` if another owner holds it.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    /// As [`lock`](Self::lock), without `Timeout`.
    async fn try_lock(&self, name: &str, opts: &AcquireOptions) -> Result<Option<LockGuard>>;

    /// Runs `work(token)` under the lock and releases it afterwards. If the lock is lost while
    /// the work runs, the work future is dropped and [`Error::LockLost`] is returned.
    ///
    /// A failure to release after the work finished is logged, not returned: the work's result is
    /// kept and the lease ends at its ttl.
    ///
    /// # Cancel safety
    /// Dropping the future drops the work and releases the lock in the background.
    ///
    /// # Errors
    /// As [`lock`](Self::lock), plus [`Error::LockLost`].
    async fn with_lock<F, Fut, T>(&self, name: &str, opts: &AcquireOptions, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send;

    /// Acquires every name in `names`, all or nothing, in a canonical order (sorted by bytes,
    /// duplicates removed) so two callers asking for the same set never deadlock. The wait policy
    /// applies to the whole set. On failure, timeout or cancellation what was taken is released.
    ///
    /// # Cancel safety
    /// Dropping the future releases the locks already taken, in the background.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); every name is validated before any I/O.
    async fn lock_many(&self, names: &[&str], opts: &AcquireOptions) -> Result<MultiGuard>;

    /// A reentrant owner handle: it may acquire a name again while it holds it.
    fn owner(&self) -> Owner;
}

#[async_trait]
impl LockExt for Arc<dyn DistributedLock> {
    async fn lock(&self, name: &str, opts: &AcquireOptions) -> Result<LockGuard> {
        let name = LockName::new(name)?;
        lock_name(self, &name, opts).await
    }

    async fn try_lock(&self, name: &str, opts: &AcquireOptions) -> Result<Option<LockGuard>> {
        let name = LockName::new(name)?;
        acquire(self, &name, &opts.clone().wait(Wait::No)).await
    }

    async fn with_lock<F, Fut, T>(&self, name: &str, opts: &AcquireOptions, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let guard = self.lock(name, opts).await?;
        let token = guard.fencing_token();
        let outcome = tokio::select! {
            out = work(token) => Ok(out),
            reason = guard.lost() => Err(reason),
        };
        match outcome {
            Ok(out) => {
                if let Err(e) = guard.release().await {
                    tracing::warn!(lock = name, error = %e, "with_lock: release after the work failed");
                }
                Ok(out)
            }
            Err(reason) => {
                tracing::warn!(lock = name, %reason, "with_lock: lock lost, work cancelled");
                drop(guard);
                Err(Error::LockLost {
                    backend: self.capabilities().backend,
                    name: name.to_owned(),
                    operation: "with_lock",
                })
            }
        }
    }

    async fn lock_many(&self, names: &[&str], opts: &AcquireOptions) -> Result<MultiGuard> {
        crate::multi::lock_many(self, names, opts).await
    }

    fn owner(&self) -> Owner {
        Owner::new(self.clone())
    }
}
