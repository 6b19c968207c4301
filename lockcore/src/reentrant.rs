//! Reentrancy, written once for every backend: an explicit [`Owner`] handle may take a name it
//! already holds again; acquisitions and releases balance and the token stays the same.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{
    AcquireOptions, DistributedLock, Error, FencingToken, LeaseWatch, LockGuard, LockName,
    LostReason, Released, Result,
};

#[derive(Default)]
struct Slot {
    /// Serialises this owner's acquisitions of one name.
    acquiring: tokio::sync::Mutex<()>,
    /// The real guard and how many reentrant holds it has.
    held: Mutex<Option<(LockGuard, usize)>>,
}

/// A reentrant owner. Identity is this handle (and its clones), never a thread: two `Owner`s from
/// the same process exclude each other like any two clients.
#[derive(Clone)]
pub struct Owner {
    backend: Arc<dyn DistributedLock>,
    slots: Arc<Mutex<HashMap<LockName, Arc<Slot>>>>,
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Owner {
    /// A new owner on `backend`.
    pub fn new(backend: Arc<dyn DistributedLock>) -> Self {
        Owner {
            backend,
            slots: Arc::default(),
        }
    }

    fn slot(&self, name: &LockName) -> Arc<Slot> {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name.clone())
            .or_default()
            .clone()
    }

    /// How many holds this owner has on `name` (0 if none).
    pub fn hold_count(&self, name: &str) -> usize {
        let Ok(name) = LockName::new(name) else {
            return 0;
        };
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name)
            .cloned();
        slot.and_then(|s| {
            s.held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .map(|(_, n)| *n)
        })
        .unwrap_or(0)
    }

    /// Acquires `name`, or takes another hold on it if this owner already holds it.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the hold count unchanged and no lock behind.
    ///
    /// # Errors
    /// As [`LockExt::lock`](crate::LockExt::lock); [`Error::LockLost`] when re-entering a lock this
    /// owner held but has lost.
    pub async fn lock(&self, name: &str, opts: &AcquireOptions) -> Result<ReentrantGuard> {
        let name = LockName::new(name)?;
        let opts = crate::acquire::resolve(&self.backend, opts)?;
        let slot = self.slot(&name);
        let _serial = slot.acquiring.lock().await;
        {
            let mut held = slot.held.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((guard, count)) = held.as_mut() {
                if !guard.is_held() {
                    return Err(Error::lock_lost(
                        self.backend.capabilities().backend,
                        &name,
                        "reentrant lock",
                    ));
                }
                *count += 1;
                tracing::trace!(lock = %name, holds = *count, "reentrant hold taken");
                return Ok(ReentrantGuard {
                    slot: slot.clone(),
                    watch: guard.watch(),
                    done: false,
                });
            }
        }
        let guard = crate::acquire::lock_resolved(&self.backend, &name, &opts).await?;
        let watch = guard.watch();
        *slot.held.lock().unwrap_or_else(PoisonError::into_inner) = Some((guard, 1));
        Ok(ReentrantGuard {
            slot: slot.clone(),
            watch,
            done: false,
        })
    }
}

/// One hold taken through an [`Owner`]. The lock is released when the last hold ends.
#[must_use = "dropping a ReentrantGuard ends this hold at once"]
pub struct ReentrantGuard {
    slot: Arc<Slot>,
    watch: LeaseWatch,
    done: bool,
}

impl fmt::Debug for ReentrantGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReentrantGuard")
            .field("lease", &self.watch.lease())
            .finish()
    }
}

impl ReentrantGuard {
    /// The fencing token (the same for every hold of one acquisition).
    pub fn fencing_token(&self) -> FencingToken {
        self.watch.fencing_token()
    }

    /// Local validity check.
    pub fn is_held(&self) -> bool {
        self.watch.is_held()
    }

    /// Resolves when the underlying lock is lost.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.watch.lost().await
    }

    /// Takes one hold off; `Some(guard)` when it was the last, which the caller must release.
    fn end_hold(&mut self) -> Option<LockGuard> {
        self.done = true;
        let mut held = self
            .slot
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = held.as_mut().map(|(_, n)| {
            *n -= 1;
            *n
        });
        if count == Some(0) {
            held.take().map(|(g, _)| g)
        } else {
            None
        }
    }

    /// Ends this hold; the last one releases the lock. Returns `None` while other holds remain.
    ///
    /// # Cancel safety
    /// The hold count is updated before the first await; a dropped release of the last hold is
    /// finished in the background.
    ///
    /// # Errors
    /// Store failures from the final release.
    pub async fn release(mut self) -> Result<Option<Released>> {
        match self.end_hold() {
            Some(guard) => guard.release().await.map(Some),
            None => Ok(None),
        }
    }
}

impl Drop for ReentrantGuard {
    fn drop(&mut self) {
        if !self.done {
            // Dropping the last guard spawns its release (LockGuard's own Drop).
            drop(self.end_hold());
        }
    }
}
