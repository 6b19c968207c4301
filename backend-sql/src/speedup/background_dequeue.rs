//! After a hand-over on MySQL: the new holder's waiter rows, deleted in the background, and
//! its release, which waits for that delete (see the "Hand-over" part of `crate::queue`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};

use lockcore::{LockName, OwnerId};

use crate::client::{Client, Leaving};
use crate::dialect::SqlDialect;
use crate::queue::Kind;

impl<D: SqlDialect> Client<D> {
    /// After a hand-over, deletes `waiter`'s rows off the new holder's path, in the
    /// background. Until they are gone they keep plain attempts out, as the held lock does
    /// anyway, and the release of this lease skips them (their waiter is the releaser); but
    /// the release of a later holder would hand the lock to them again, to an owner id that
    /// nobody waits as any more, and the lock would stay taken until that lease ran out. So
    /// the holder's release first waits for this (see [`settle_leaving`](Self::settle_leaving)).
    /// Counted, so that a program that settles its clean-ups before it exits (the binary does)
    /// leaves no waiter row behind.
    pub(crate) fn dequeue_later(self: &Arc<Self>, name: &LockName, waiter: OwnerId, kind: Kind) {
        let (q, name) = (self.clone(), name.clone());
        let deleted = Arc::new(AtomicBool::new(false));
        let done = deleted.clone();
        // Held while the task is spawned and recorded: the task forgets itself only after.
        let mut leaving = self.leaving.lock().unwrap_or_else(PoisonError::into_inner);
        let task = lockcore::cleanup::spawn_counted(async move {
            if let Err(e) = q.dequeue(&name, waiter, kind).await {
                // Left recorded, for the holder's release to see.
                tracing::debug!(backend = D::BACKEND, lock = %name, error = %e, "leaving the queue after a hand-over failed; the holder's release tries again");
                return;
            }
            done.store(true, Ordering::Release);
            let mut leaving = q.leaving.lock().unwrap_or_else(PoisonError::into_inner);
            leaving.remove(&waiter);
        });
        if let Some(task) = task {
            leaving.insert(waiter, Leaving { task, deleted });
        }
    }

    /// Waits until the background delete of `name`'s waiter rows of `owner` after a
    /// hand-over (see [`dequeue_later`](Self::dequeue_later)) has ended, if one runs, for at
    /// most the client's timeout; where it failed, deletes them here (best effort). The release
    /// of `owner`'s lease calls it first.
    ///
    /// # Cancel safety
    /// Cancel safe: a running delete goes on without the wait.
    pub(crate) async fn settle_leaving(&self, name: &LockName, owner: OwnerId) {
        let leaving = {
            let mut leaving = self.leaving.lock().unwrap_or_else(PoisonError::into_inner);
            leaving.remove(&owner)
        };
        let Some(Leaving { task, deleted }) = leaving else {
            return;
        };
        let ended = tokio::time::timeout(self.runner.timeout, task)
            .await
            .is_ok();
        if ended && !deleted.load(Ordering::Acquire) {
            let _ = self.dequeue(name, owner, Kind::Lock).await;
        }
    }
}
