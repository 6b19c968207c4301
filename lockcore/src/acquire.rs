//! Acquiring, written once: options validated and resolved once, the guard-returning acquire
//! with its time limits, the waiting loop that rides out store outages, and the `Timeout` error.
//! [`ext`](crate::LockExt), multi-lock, read-write locks and reentrancy all build on this module,
//! which imports none of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::{AcquireOptions, DistributedLock, Error, LockGuard, LockName, Result, Wait};

/// Exclusive (write), shared (read) or counted (semaphore permit) access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// One holder: a mutex, or the write side of a read-write lock.
    Exclusive,
    /// Many holders at once, none of them a writer.
    Shared,
    /// One of at most this many holders of a counting semaphore.
    Permit(u32),
}

/// Options completed with the backend's defaults and validated, by [`resolve`] only: every
/// acquire path takes these, so each call checks its options exactly once, before any I/O.
#[derive(Clone, Debug)]
pub(crate) struct Resolved(AcquireOptions);

impl Resolved {
    /// The same options with another wait policy (a multi-lock's share of its deadline).
    pub(crate) fn with_wait(&self, wait: Wait) -> Resolved {
        Resolved(self.0.clone().wait(wait))
    }

    /// The options themselves.
    pub(crate) fn options(&self) -> &AcquireOptions {
        &self.0
    }
}

/// Completes `opts` with `backend`'s defaults and validates them (ttl, drift, keep-alive), and
/// checks that a token minimum is only asked of a backend that can carry one. No I/O.
///
/// # Errors
/// [`Error::InvalidArgument`] for bad options; [`Error::Unsupported`] for a token minimum on a
/// backend without them.
pub(crate) fn resolve(
    backend: &Arc<dyn DistributedLock>,
    opts: &AcquireOptions,
) -> Result<Resolved> {
    let opts = opts.clone().with_defaults(&backend.defaults());
    opts.validate()?;
    if opts.min_token_value().is_some() {
        let capabilities = backend.capabilities();
        if !capabilities.min_token {
            return Err(Error::Unsupported {
                operation: "token minimum",
                backend: capabilities.backend,
            });
        }
    }
    Ok(Resolved(opts))
}

/// "Not acquired within the wait policy" for `name`.
pub(crate) fn timeout(
    backend: &Arc<dyn DistributedLock>,
    name: &str,
    opts: &AcquireOptions,
) -> Error {
    Error::Timeout {
        backend: backend.capabilities().backend,
        name: name.to_owned(),
        waited: match opts.wait_value() {
            Wait::For(d) => d,
            _ => Duration::ZERO,
        },
    }
}

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
    let opts = resolve(backend, opts)?;
    acquire_resolved(backend, name, &opts, Access::Exclusive).await
}

/// [`acquire`] with `Timeout` for "not acquired in time".
///
/// # Cancel safety
/// As [`acquire`].
///
/// # Errors
/// As [`LockExt::lock`](crate::LockExt::lock).
pub async fn lock_name(
    backend: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: &AcquireOptions,
) -> Result<LockGuard> {
    let opts = resolve(backend, opts)?;
    lock_resolved(backend, name, &opts).await
}

/// [`lock_name`] with options already resolved.
pub(crate) async fn lock_resolved(
    backend: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: &Resolved,
) -> Result<LockGuard> {
    acquire_resolved(backend, name, opts, Access::Exclusive)
        .await?
        .ok_or_else(|| timeout(backend, name.as_str(), opts.options()))
}

/// [`acquire`] with options already resolved, for any [`Access`] (shared needs a read-write
/// backend, a permit a semaphore backend; the caller checks the capability).
pub(crate) async fn acquire_resolved(
    backend: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: &Resolved,
    access: Access,
) -> Result<Option<LockGuard>> {
    let opts = &opts.0;
    let capabilities = backend.capabilities();
    let backend_name = capabilities.backend;
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
                try_once(backend.as_ref(), name, opts, access).await?
            }
            Wait::No => {
                match tokio::time::timeout(
                    round_trip,
                    try_once(backend.as_ref(), name, opts, access),
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
                    opts,
                    Some(started + d),
                    round_trip,
                    access,
                )
                .await?
            }
            Wait::Forever => {
                wait_through_outages(backend.as_ref(), name, opts, None, round_trip, access).await?
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
/// the store is still failing. Non-retryable errors return at once.
///
/// A failed attempt's clean-up deletes whatever its owner id holds or queued. A retry under a
/// caller-chosen owner id (an [`Owner`](crate::Owner)) reuses that id, so it starts only once
/// every clean-up the failed attempt spawned has ended (see `cleanup::Attempt`): a clean-up
/// still on its way could otherwise delete the retry's grant. If they have not ended by the
/// deadline, the store error is returned. Without a chosen id every attempt draws a fresh one.
async fn wait_through_outages(
    backend: &dyn DistributedLock,
    name: &LockName,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
    round_trip: Duration,
    access: Access,
) -> Result<Option<crate::Lease>> {
    let mut backoff = crate::wait::Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let cleanups = std::sync::Arc::new(crate::cleanup::Attempt::default());
        let attempt = cleanups.run(async {
            match access {
                Access::Exclusive => backend.acquire_wait(name, opts, deadline).await,
                Access::Shared => backend.acquire_shared_wait(name, opts, deadline).await,
                Access::Permit(n) => backend.acquire_permit_wait(name, n, opts, deadline).await,
            }
        });
        let outcome = match deadline {
            // Backstop: a store that stops answering must not stretch a bounded wait.
            Some(d) => match tokio::time::timeout_at((d + round_trip).into(), attempt).await {
                Ok(r) => r,
                Err(_) => return Ok(None),
            },
            None => attempt.await,
        };
        match outcome {
            Err(e) if e.is_retryable() => {
                if opts.owner_value().is_some() && !cleanups.settle(deadline).await {
                    tracing::debug!(lock = %name, "the failed attempt's clean-up outlived the wait; not retrying under its owner id");
                    return Err(e);
                }
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
        Access::Permit(n) => backend.try_acquire_permit(name, n, opts).await,
    }
}

fn no_answer(backend: &'static str, name: &LockName, timeout: Duration) -> Error {
    Error::backend(
        backend,
        "acquire",
        Some(name),
        true,
        format!("no answer within the connection timeout of {timeout:?}"),
    )
}
