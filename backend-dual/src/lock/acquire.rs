//! One dual acquisition: the first store, then the second (a fixed order, so two dual clients
//! never deadlock), with the first store's lease kept alive while the second is awaited and
//! given back if the acquisition does not complete.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::cleanup::{self, CleanupGuard, Undo};
use lockcore::{
    AcquireOptions, DistributedLock, Error, FencingToken, Lease, LockName, Released, Result,
    backend_support::Access,
};

use super::{Attempt, DualLock, Pair};
use crate::BACKEND;

/// The first store's lease of an acquisition still in progress, and its store: released if the
/// acquisition does not complete (the state of its [`CleanupGuard`]).
type Armed = CleanupGuard<(Arc<dyn DistributedLock>, Lease)>;

/// Gives the first store's lease back (the undo of an acquisition that did not complete).
fn give_back((store, lease): (Arc<dyn DistributedLock>, Lease)) -> Undo {
    Undo::Spawn(Box::pin(async move {
        Ok(store.release(&lease).await? == Released::Released)
    }))
}

/// What waiting for the second store ended with.
enum SecondOutcome {
    Granted(Lease),
    TimedOut,
    /// The first store's lease was lost while the second was awaited.
    FirstLost,
}

impl DualLock {
    async fn take_on(
        store: &dyn DistributedLock,
        access: Access,
        name: &LockName,
        opts: &AcquireOptions,
        attempt: Attempt,
    ) -> Result<Option<Lease>> {
        match (access, attempt) {
            (Access::Exclusive, Attempt::Once) => store.try_acquire(name, opts).await,
            (Access::Exclusive, Attempt::Until(d)) => store.acquire_wait(name, opts, d).await,
            (Access::Shared, Attempt::Once) => store.try_acquire_shared(name, opts).await,
            (Access::Shared, Attempt::Until(d)) => store.acquire_shared_wait(name, opts, d).await,
            (Access::Permit(n), Attempt::Once) => store.try_acquire_permit(name, n, opts).await,
            (Access::Permit(n), Attempt::Until(d)) => {
                store.acquire_permit_wait(name, n, opts, d).await
            }
        }
    }

    /// Waits for the second store while keeping the first store's lease alive (it would
    /// otherwise run out while a second-only client holds the second store).
    async fn wait_second(
        &self,
        armed: &mut Armed,
        access: Access,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<SecondOutcome> {
        let ttl = opts.ttl_value();
        let every = (ttl / 3).max(Duration::from_millis(5));
        let waiting = Self::take_on(
            self.second.as_ref(),
            access,
            name,
            opts,
            Attempt::Until(deadline),
        );
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                got = &mut waiting => {
                    return Ok(match got? {
                        Some(lease) => SecondOutcome::Granted(lease),
                        None => SecondOutcome::TimedOut,
                    });
                }
                () = tokio::time::sleep(every) => {
                    match self.first.extend(&armed.state().1, ttl).await {
                        Ok(renewed) => armed.state_mut().1 = renewed,
                        Err(Error::LockLost { .. }) => return Ok(SecondOutcome::FirstLost),
                        Err(e) if armed.state().1.is_valid() => {
                            tracing::debug!(lock = %name, error = %e, "renewing the first store's lease failed; retrying");
                        }
                        Err(_) => return Ok(SecondOutcome::FirstLost),
                    }
                }
            }
        }
    }

    pub(super) async fn acquire(
        &self,
        access: Access,
        name: &LockName,
        opts: &AcquireOptions,
        attempt: Attempt,
    ) -> Result<Option<Lease>> {
        loop {
            // A round given up after the first store's lease was lost may still have a
            // clean-up of the second store in flight, which frees whatever its owner id holds:
            // every round draws a fresh owner, and under a caller-chosen one (kept, as the
            // caller asked) the next round starts only once that clean-up has ended.
            let owner = opts.owner_or_random();
            let base = opts.clone().owner(owner);
            let first_opts = base.clone().without_min_token();
            let Some(first) =
                Self::take_on(self.first.as_ref(), access, name, &first_opts, attempt).await?
            else {
                return Ok(None);
            };
            let min_token = first
                .token()
                .max(opts.min_token_value().unwrap_or(FencingToken(0)));
            let second_opts = if self.capabilities.min_token {
                base.clone().min_token(min_token)
            } else {
                base.clone()
            };
            let mut armed = Armed::arm(BACKEND, name, (self.first.clone(), first), give_back);
            let cleanups = Arc::new(cleanup::Attempt::default());
            let outcome = match attempt {
                Attempt::Once => {
                    Self::take_on(self.second.as_ref(), access, name, &second_opts, attempt)
                        .await
                        .map(|got| got.map_or(SecondOutcome::TimedOut, SecondOutcome::Granted))
                }
                Attempt::Until(deadline) => {
                    cleanups
                        .run(self.wait_second(&mut armed, access, name, &second_opts, deadline))
                        .await
                }
            };
            let second = match outcome {
                Ok(SecondOutcome::Granted(lease)) => lease,
                Ok(SecondOutcome::TimedOut) => {
                    armed.run_now().await?;
                    return Ok(None);
                }
                Ok(SecondOutcome::FirstLost) => {
                    tracing::warn!(lock = %name, "the first store's lease was lost while waiting for the second; starting over");
                    let _ = armed.run_now().await;
                    let deadline = match attempt {
                        Attempt::Until(d) => d,
                        Attempt::Once => Some(Instant::now()),
                    };
                    if opts.owner_value().is_some() && !cleanups.settle(deadline).await {
                        tracing::debug!(lock = %name, "the given-up round's clean-up outlived the wait; not starting over under its owner id");
                        return Ok(None);
                    }
                    continue;
                }
                Err(e) => {
                    if let Err(undo) = armed.run_now().await {
                        tracing::warn!(lock = %name, error = %undo, "releasing the first store after the second failed");
                    }
                    return Err(e);
                }
            };
            let (_, first) = armed.disarm();
            // Valid until the earlier of the two sides' own validities, each counted from the
            // request that granted or last renewed it (the first side's was renewed while the
            // second was awaited), never from when this acquisition began to wait.
            let valid_until = first.valid_until().min(second.valid_until());
            let lease = Lease::new(
                name.clone(),
                owner,
                second.token(),
                second.acquired_at(),
                opts.ttl_value(),
                opts.drift_value(),
            )
            .valid_no_later_than(valid_until);
            let now = Instant::now();
            let mut pairs = self.pairs();
            pairs.retain(|_, p| !p.stale(now));
            pairs.insert(
                owner,
                Pair {
                    first,
                    second,
                    lost: None,
                },
            );
            return Ok(Some(lease));
        }
    }
}
