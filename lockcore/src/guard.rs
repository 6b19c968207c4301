//! [`LockGuard`]: an owned handle on a held lock, with background keep-alive and a lost signal.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::lease_state::{LostReason, Shared, lock};
use crate::{DistributedLock, Error, FencingToken, KeepAlive, Lease, LockName, Released, Result};

/// A cheap, clonable view of a held lease: validity, token and the lost signal. Obtained from
/// [`LockGuard::watch`]; it does not keep the lock.
#[derive(Clone)]
pub struct LeaseWatch {
    shared: Arc<Shared>,
}

impl fmt::Debug for LeaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseWatch")
            .field("lease", &self.shared.lease())
            .finish()
    }
}

impl LeaseWatch {
    /// The current lease (its `valid_until` moves forward with each renewal).
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The fencing token to pass to protected resources.
    pub fn fencing_token(&self) -> FencingToken {
        lock(&self.shared.lease).token()
    }

    /// Cheap local check: not reported lost and `valid_until` still ahead. No I/O.
    pub fn is_held(&self) -> bool {
        self.shared.lost_reason().is_none() && lock(&self.shared.lease).is_valid()
    }

    /// The reason, if the lock is already known to be lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// Resolves as soon as the library knows, or must assume, that the lock is no longer held.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// The instant by which work under this lock must have stopped: the end of the lease as
    /// last renewed (the start of the request that granted or renewed it, plus its ttl, less
    /// the drift allowance). Each renewal moves it later. No I/O.
    pub fn deadline(&self) -> Instant {
        lock(&self.shared.lease).valid_until()
    }

    /// Resolves when less than `margin` is left before the [`deadline`](Self::deadline) and no
    /// renewal has moved it further by then, or as soon as the lock is lost, whichever comes
    /// first; with the reason the lock is lost for, or will be unless a renewal still gets
    /// through ([`LostReason::ConnectionLost`] after a failed renewal,
    /// [`LostReason::RenewalLimit`] at the keep-alive cap, [`LostReason::Expired`] without
    /// keep-alive).
    ///
    /// This is the signal to stop work that needs time to stop: select on it with `margin` at
    /// least that time, and have stopped by the deadline. Keep-alive renews at a third of the
    /// ttl, so while renewals succeed the deadline stays about two thirds of the ttl ahead, and
    /// a margin of up to a third of the ttl fires only when renewals fail, stall or are
    /// capped.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn expiring(&self, margin: Duration) -> LostReason {
        self.shared.expiring(margin).await
    }
}

/// An acquired lock. Owned and `'static`: move it into tasks freely.
///
/// End it with [`release`](Self::release), which reports errors. Dropping it without releasing
/// spawns a best-effort release on the current tokio runtime (never blocking); outside a runtime
/// the lease simply runs out at its ttl and a warning is logged.
///
/// With a keep-alive policy (the default), a background task renews the lease at ttl/3; when a
/// renewal finds the lock gone, or the lease runs out without one, [`lost`](Self::lost) resolves
/// with the reason.
#[must_use = "dropping a LockGuard releases the lock at once; keep it alive while the work runs"]
pub struct LockGuard {
    backend: Arc<dyn DistributedLock>,
    watch: LeaseWatch,
    keep_alive: bool,
    finished: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("backend", &self.watch.shared.backend)
            .field("lease", &self.watch.lease())
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}

impl LockGuard {
    /// Wraps a lease just acquired from `backend`, starting keep-alive per `policy`.
    ///
    /// Keep-alive needs a tokio runtime; without one the guard works without renewals.
    pub fn new(backend: Arc<dyn DistributedLock>, lease: Lease, policy: KeepAlive) -> Self {
        let shared = Arc::new(Shared::new(backend.capabilities().backend, lease));
        let keep_alive = match policy {
            KeepAlive::Renew {
                every,
                max_renewals,
                max_hold,
            } => {
                let registered = crate::renewer::register(
                    &backend,
                    &shared,
                    crate::renewer::Policy {
                        every,
                        max_renewals,
                        max_hold,
                    },
                );
                if !registered {
                    tracing::warn!(
                        "no tokio runtime: keep-alive disabled, the lease ends at its ttl"
                    );
                }
                registered
            }
            KeepAlive::Off => false,
        };
        LockGuard {
            backend,
            watch: LeaseWatch { shared },
            keep_alive,
            finished: false,
        }
    }

    /// The current lease.
    pub fn lease(&self) -> Lease {
        self.watch.lease()
    }

    /// The lock's name.
    pub fn name(&self) -> LockName {
        lock(&self.watch.shared.lease).name().clone()
    }

    /// The fencing token of this acquisition.
    pub fn fencing_token(&self) -> FencingToken {
        self.watch.fencing_token()
    }

    /// Cheap local check against `valid_until` and the lost signal. No I/O.
    pub fn is_held(&self) -> bool {
        self.watch.is_held()
    }

    /// The reason, if the lock is already known to be lost (no I/O, does not wait).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.watch.lost_reason()
    }

    /// A clonable view (token, validity, lost signal) that can outlive borrows of the guard.
    pub fn watch(&self) -> LeaseWatch {
        self.watch.clone()
    }

    /// Resolves with the reason as soon as the lock is known or must be assumed lost.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.watch.lost().await
    }

    /// The instant by which work under this lock must have stopped; see
    /// [`LeaseWatch::deadline`].
    pub fn deadline(&self) -> Instant {
        self.watch.deadline()
    }

    /// Resolves when the lease is within `margin` of its [`deadline`](Self::deadline) with no
    /// renewal in sight, or is lost; see [`LeaseWatch::expiring`].
    ///
    /// ```no_run
    /// # async fn demo(guard: lockcore::LockGuard) {
    /// use std::time::Duration;
    ///
    /// tokio::select! {
    ///     _ = work() => {}
    ///     reason = guard.expiring(Duration::from_secs(2)) => {
    ///         // Renewals are failing: stop, within the 2 s left before guard.deadline().
    ///         eprintln!("stopping: {reason}");
    ///     }
    /// }
    /// # }
    /// # async fn work() {}
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn expiring(&self, margin: Duration) -> LostReason {
        self.watch.expiring(margin).await
    }

    /// Extends the lease to `ttl` from now, by hand (keep-alive does this on its own).
    ///
    /// # Cancel safety
    /// If dropped, the lease may or may not have been extended; the guard keeps the older
    /// validity, which is the safe assumption.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a ttl out of range; [`Error::LockLost`] if the lock expired
    /// or was taken (the lost signal then fires); store failures.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::options::check_ttl(ttl)?;
        let lease = self.watch.lease();
        match self.backend.extend(&lease, ttl).await {
            Ok(new) => {
                tracing::debug!(lock = %lease.name(), ttl_ms = ttl.as_millis() as u64, "lease extended");
                *lock(&self.watch.shared.lease) = new;
                Ok(())
            }
            Err(e) => {
                if matches!(e, Error::LockLost { .. }) {
                    let reason = self.backend.lost_reason(&lease, &e);
                    self.watch.shared.set_lost(reason);
                }
                Err(e)
            }
        }
    }

    /// Releases the lock (owner-checked). `Released::NotHeld` if it had already expired or been
    /// taken.
    ///
    /// # Cancel safety
    /// If dropped before completion the release may not have reached the store; the lease then
    /// ends at its ttl.
    ///
    /// # Errors
    /// Store failures (the lock then ends at its ttl).
    pub async fn release(mut self) -> Result<Released> {
        self.finished = true;
        self.watch.shared.finished.store(true, Ordering::Release);
        let lease = self.watch.lease();
        let result = self.backend.release(&lease).await;
        match &result {
            Ok(outcome) => {
                tracing::debug!(lock = %lease.name(), token = lease.token().0, ?outcome, "lock released")
            }
            Err(e) => {
                tracing::warn!(lock = %lease.name(), error = %e, "release failed; the lease will end at its ttl")
            }
        }
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.watch.shared.finished.store(true, Ordering::Release);
        if self.finished {
            return;
        }
        let lease = self.watch.lease();
        let backend = self.backend.clone();
        let name = lease.name().clone();
        let spawned = crate::cleanup::spawn_counted(async move {
            match backend.release(&lease).await {
                Ok(outcome) => {
                    tracing::debug!(lock = %lease.name(), ?outcome, "lock released on drop")
                }
                Err(e) => {
                    tracing::warn!(lock = %lease.name(), error = %e, "release on drop failed; the lease will end at its ttl")
                }
            }
        });
        if spawned.is_none() {
            tracing::warn!(
                lock = %name,
                "LockGuard dropped outside a tokio runtime; the lock stays until its ttl runs out"
            );
        }
    }
}

/// A guard type for one kind of hold (read, write, permit): a [`LockGuard`] under a name that
/// says what it holds.
macro_rules! guard_type {
    ($name:ident, $what:literal) => {
        #[doc = concat!("A held ", $what, ": a [`LockGuard`](crate::LockGuard) (keep-alive, `lost()`, ")]
        #[doc = "`extend`, release on drop) under a type that says what it holds. Derefs to the guard."]
        #[must_use = "dropping the guard releases the lock at once; keep it alive while the work runs"]
        #[derive(Debug)]
        pub struct $name(crate::LockGuard);

        impl $name {
            /// Releases the hold (owner-checked; `Released::NotHeld` if it was already lost).
            ///
            /// # Cancel safety
            /// As [`LockGuard::release`](crate::LockGuard::release).
            ///
            /// # Errors
            /// Store failures (the hold then ends at its ttl).
            pub async fn release(self) -> crate::Result<crate::Released> {
                self.0.release().await
            }

            /// The plain guard.
            pub fn into_inner(self) -> crate::LockGuard {
                self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = crate::LockGuard;
            fn deref(&self) -> &crate::LockGuard {
                &self.0
            }
        }
    };
}

pub(crate) use guard_type;
