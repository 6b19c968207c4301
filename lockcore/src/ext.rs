//! The convenient, user-facing API on top of [`DistributedLock`]: waiting acquires that return
//! guards, `with_lock`, multi-lock and reentrant owners.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tracing::Instrument;

use crate::rw::Access;
use crate::{
    AcquireOptions, DistributedLock, Error, FencingToken, LockGuard, LockName, MultiGuard, Owner,
    Result, Wait,
};

/// Acquires `name` on `backend` per `opts` and wraps the lease in a guard.
///
/// `Ok(None)` when the lock could not be had within the wait policy. Names and options are
/// validated before any I/O.
///
/// # Cancel safety
/// Dropping the future leaves no lock or queue entry behind beyond the backend's immediate
/// best-effort cleanup.
///
/// # Errors
/// [`Error::InvalidArgument`] for bad options; store failures.
pub async fn acquire(
    backend: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: &AcquireOptions,
) -> Result<Option<LockGuard>> {
    acquire_as(backend, name, opts, Access::Exclusive).await
}

/// [`acquire`] for exclusive or shared access (shared needs a read-write backend; the caller
/// checks the capability).
pub(crate) async fn acquire_as(
    backend: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: &AcquireOptions,
    access: Access,
) -> Result<Option<LockGuard>> {
    let opts = opts.clone().with_defaults(&backend.defaults());
    opts.validate()?;
    let capabilities = backend.capabilities();
    let backend_name = capabilities.backend;
    if opts.token_floor_value().is_some() && !capabilities.token_floor {
        return Err(Error::Unsupported {
            operation: "token floor",
            backend: backend_name,
        });
    }
    let span = tracing::debug_span!("dlock.acquire", backend = backend_name, lock = %name, wait = ?opts.wait_value());
    async {
        let started = Instant::now();
        // Dropping the backend's future on a timeout is covered by its cancel-safety contract.
        let round_trip = backend.defaults().timeout;
        let lease = match opts.wait_value() {
            // A backend whose requests carry their own timeout is not wrapped in a second timer:
            // on a multi-threaded runtime registering one can wake the parked timer thread,
            // which costs more than the request's own bookkeeping.
            Wait::No if capabilities.bounded_requests => {
                try_once(backend.as_ref(), name, &opts, access).await?
            }
            Wait::No => {
                match tokio::time::timeout(
                    round_trip,
                    try_once(backend.as_ref(), name, &opts, access),
                )
                .await
                {
                    Ok(r) => r?,
                    Err(_) => return Err(no_answer(backend_name, name, round_trip)),
                }
            }
            Wait::For(d) => {
                wait_through_outages(
                    backend.as_ref(),
                    name,
                    &opts,
                    Some(started + d),
                    round_trip,
                    access,
                )
                .await?
            }
            Wait::Forever => {
                wait_through_outages(backend.as_ref(), name, &opts, None, round_trip, access)
                    .await?
            }
        };
        match lease {
            Some(lease) => {
                tracing::debug!(
                    token = lease.token().0,
                    waited_us = started.elapsed().as_micros() as u64,
                    "lock acquired"
                );
                Ok(Some(LockGuard::new(
                    backend.clone(),
                    lease,
                    opts.keep_alive_value(),
                )))
            }
            None => {
                tracing::debug!(
                    waited_us = started.elapsed().as_micros() as u64,
                    "lock not acquired in time"
                );
                Ok(None)
            }
        }
    }
    .instrument(span)
    .await
}

/// A waiting acquire: retryable store errors (a restart, a dropped connection) are ridden out
/// with backoff until the deadline; the last such error is returned if the deadline passes while
/// the store is still failing. Non-retryable errors return at once, and so does every error of
/// an acquisition whose caller chose the owner id: a retry would reuse that id while the failed
/// attempt's clean-up (which deletes whatever that id holds) may still be on its way.
async fn wait_through_outages(
    backend: &dyn DistributedLock,
    name: &LockName,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
    round_trip: std::time::Duration,
    access: Access,
) -> Result<Option<crate::Lease>> {
    let mut backoff = crate::wait::Backoff::new(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(2),
    );
    loop {
        let attempt = async {
            match access {
                Access::Exclusive => backend.acquire_wait(name, opts, deadline).await,
                Access::Shared => backend.acquire_shared_wait(name, opts, deadline).await,
            }
        };
        let outcome = match deadline {
            // Backstop: a store that stops answering must not stretch a bounded wait.
            Some(d) => match tokio::time::timeout_at((d + round_trip).into(), attempt).await {
                Ok(r) => r,
                Err(_) => return Ok(None),
            },
            None => attempt.await,
        };
        match outcome {
            Err(e) if e.is_retryable() && opts.owner_value().is_none() => {
                let now = Instant::now();
                let pause = backoff.next_delay();
                let until = deadline.map_or(now + pause, |d| d.min(now + pause));
                if deadline.is_some_and(|d| until >= d) {
                    return Err(e);
                }
                tracing::warn!(lock = %name, error = %e, retry_in_ms = pause.as_millis() as u64, "store error while waiting; retrying");
                tokio::time::sleep_until(until.into()).await;
            }
            other => return other,
        }
    }
}

async fn try_once(
    backend: &dyn DistributedLock,
    name: &LockName,
    opts: &AcquireOptions,
    access: Access,
) -> Result<Option<crate::Lease>> {
    match access {
        Access::Exclusive => backend.try_acquire(name, opts).await,
        Access::Shared => backend.try_acquire_shared(name, opts).await,
    }
}

fn no_answer(backend: &'static str, name: &LockName, timeout: std::time::Duration) -> Error {
    Error::backend(
        backend,
        "acquire",
        Some(name),
        true,
        format!("no answer within the connection timeout of {timeout:?}"),
    )
}

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

/// [`acquire`] with `Timeout` for "not acquired in time".
///
/// # Cancel safety
/// As [`acquire`].
///
/// # Errors
/// As [`LockExt::lock`].
pub async fn lock_name(
    backend: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: &AcquireOptions,
) -> Result<LockGuard> {
    match acquire(backend, name, opts).await? {
        Some(guard) => Ok(guard),
        None => Err(Error::Timeout {
            backend: backend.capabilities().backend,
            name: name.as_str().to_owned(),
            waited: match opts.wait_value() {
                Wait::For(d) => d,
                _ => std::time::Duration::ZERO,
            },
        }),
    }
}
