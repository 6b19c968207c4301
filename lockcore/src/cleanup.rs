//! Clean-up after an interrupted acquire or a dropped guard, for backends: spawned at once on
//! the current tokio runtime (never `block_on` in a `Drop`), or, outside any runtime, a warning
//! that the lock's own expiry will have to end it.
//!
//! Every clean-up spawned here is counted until it ends, so a program about to exit can give
//! them a moment to reach the store with [`settle`]: a runtime shut down right after an acquire
//! future was dropped would otherwise cancel the clean-up, and a queue entry would stay until
//! its ttl or session ran out.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::{LockName, Result};

/// Clean-ups spawned and not yet finished, in this process.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// Woken whenever a clean-up finishes.
static FINISHED: Notify = Notify::const_new();

tokio::task_local! {
    /// The attempts whose clean-ups are being spawned, innermost first (see [`Attempt`]).
    static ATTEMPT: Arc<Scope>;
}

/// One [`Attempt`] in scope, and the one its run is nested in.
#[derive(Debug)]
struct Scope {
    attempt: Arc<Attempt>,
    outer: Option<Arc<Scope>>,
}

/// The clean-ups one acquire attempt spawned, so that a retry under the same owner id waits
/// until they have ended: a clean-up deletes what its owner id holds or queued, and must not
/// meet the retry's grant. Lockcore runs each attempt of a waiting acquire inside
/// [`Attempt::run`], and so does a composite that retries under one owner id (`dual://`);
/// every clean-up spawned while it runs (in the attempt, or as its future is dropped) is
/// counted here, in every attempt it is nested in, and process-wide.
#[derive(Debug, Default)]
pub struct Attempt {
    pending: AtomicUsize,
    finished: Notify,
}

impl Attempt {
    /// Runs `attempt` with this tracker in scope (also while the future is dropped).
    ///
    /// # Cancel safety
    /// As cancel safe as `attempt`: dropping the future drops `attempt` with the tracker still
    /// in scope, so what its drop spawns is counted.
    ///
    /// # Errors
    /// None of its own; `attempt`'s output is returned as it is.
    pub async fn run<F: Future>(self: &Arc<Self>, attempt: F) -> F::Output {
        let scope = Scope {
            attempt: self.clone(),
            outer: ATTEMPT.try_with(Arc::clone).ok(),
        };
        ATTEMPT.scope(Arc::new(scope), attempt).await
    }

    /// Waits until every clean-up this attempt spawned has ended, or `deadline` passes;
    /// `true` when none is left.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    ///
    /// # Errors
    /// None; a clean-up that fails logs its own warning.
    pub async fn settle(&self, deadline: Option<Instant>) -> bool {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                return true;
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d.into(), finished).await.is_err() {
                        return self.pending.load(Ordering::Acquire) == 0;
                    }
                }
                None => finished.await,
            }
        }
    }
}

/// Counts a clean-up task (process-wide, and for the attempts that spawned it) until it ends,
/// also when it is cancelled.
struct Counted {
    attempts: Vec<Arc<Attempt>>,
}

impl Counted {
    fn new() -> Self {
        PENDING.fetch_add(1, Ordering::AcqRel);
        let mut attempts = Vec::new();
        let mut scope = ATTEMPT.try_with(Arc::clone).ok();
        while let Some(s) = scope {
            s.attempt.pending.fetch_add(1, Ordering::AcqRel);
            attempts.push(s.attempt.clone());
            scope = s.outer.clone();
        }
        Counted { attempts }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        for a in &self.attempts {
            a.pending.fetch_sub(1, Ordering::AcqRel);
            a.finished.notify_waiters();
        }
        PENDING.fetch_sub(1, Ordering::AcqRel);
        FINISHED.notify_waiters();
    }
}

/// Spawns `work` on the current tokio runtime as a counted clean-up (see [`settle`]); `None`
/// (and `work` dropped unrun) when there is no runtime.
pub fn spawn_counted(
    work: impl Future<Output = ()> + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let rt = tokio::runtime::Handle::try_current().ok()?;
    let counted = Counted::new();
    Some(rt.spawn(async move {
        let _counted = counted;
        work.await;
    }))
}

/// How many counted clean-ups are still running in this process.
pub fn pending() -> usize {
    PENDING.load(Ordering::Acquire)
}

/// Waits until every counted clean-up has finished, or `limit` has passed; `true` when none is
/// left. A program calls it before it shuts its runtime down (the `dlock` binary does, on every
/// exit), so that what an interrupted acquire queued is removed now rather than at its ttl.
///
/// # Cancel safety
/// Cancel safe: it only observes.
///
/// # Errors
/// None; a clean-up that fails logs its own warning.
pub async fn settle(limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let finished = FINISHED.notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        if pending() == 0 {
            return true;
        }
        if tokio::time::timeout_at(deadline.into(), finished)
            .await
            .is_err()
        {
            return pending() == 0;
        }
    }
}

/// Spawns `undo` (the clean-up of an acquire whose caller went away) on the current tokio
/// runtime as a counted clean-up and logs how it ended; outside a runtime, logs that the lock
/// ends at its ttl instead. `undo` resolves to whether it found something to undo. Backends call
/// this from the `Drop` of their armed clean-up guards.
pub fn spawn_cleanup(
    backend: &'static str,
    name: &LockName,
    undo: impl Future<Output = Result<bool>> + Send + 'static,
) {
    let name = name.clone();
    let log_name = name.clone();
    let spawned = spawn_counted(async move {
        match undo.await {
            Ok(undone) => tracing::debug!(
                backend,
                lock = %name,
                undone,
                "clean-up after an interrupted acquire"
            ),
            Err(e) => tracing::warn!(
                backend,
                lock = %name,
                error = %e,
                "clean-up after an interrupted acquire failed; what it left ends at its ttl"
            ),
        }
    })
    .is_some();
    if !spawned {
        tracing::warn!(
            backend,
            lock = %log_name,
            "acquire interrupted outside a tokio runtime; what it left ends at its ttl"
        );
    }
}

/// What undoing an interrupted acquire takes, as [`CleanupGuard`]'s undo function returns it.
pub enum Undo {
    /// Already done, synchronously (an in-process queue entry removed under its lock).
    Done,
    /// Requests to finish on the runtime: spawned as a counted clean-up. Requests that must go
    /// out even without a runtime are sent while this future is built (a client that sends on
    /// call, as ZooKeeper's does), so building it is the part that never waits.
    Spawn(std::pin::Pin<Box<dyn Future<Output = Result<bool>> + Send + 'static>>),
}

impl fmt::Debug for Undo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Undo::Done => "Undo::Done",
            Undo::Spawn(_) => "Undo::Spawn(..)",
        })
    }
}

/// The one clean-up guard every cancel-safe acquire arms: while it is armed, dropping it (the
/// acquire future was dropped, or returned early) undoes what the attempt did so far, by
/// handing its state `S` (a queue entry's key, a node path, a lease) to the undo function; the
/// undo's requests run as a counted clean-up (see [`settle`]) on the current runtime, never
/// with `block_on`. Outside a runtime whatever the undo could not send ends at its ttl or
/// session, and a warning says so.
///
/// The attempt updates the state as it goes ([`state_mut`](Self::state_mut)), then
/// [`disarm`](Self::disarm)s on success, or [`run_now`](Self::run_now)s the undo when it wants
/// its outcome (a timed-out wait that must report a failed undo).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lockcore::LockName;
/// use lockcore::cleanup::{CleanupGuard, Undo};
/// let name = LockName::new("jobs").unwrap();
/// // The state: what the attempt queued (here just a number).
/// let guard = CleanupGuard::arm("demo", &name, 7_u64, |entry| {
///     Undo::Spawn(Box::pin(async move { Ok(entry == 7) }))
/// });
/// assert_eq!(guard.run_now().await.unwrap(), true);
/// # }
/// ```
#[must_use = "an armed clean-up guard undoes the attempt as soon as it is dropped"]
pub struct CleanupGuard<S: Send + 'static> {
    backend: &'static str,
    name: LockName,
    state: Option<S>,
    undo: fn(S) -> Undo,
}

impl<S: Send + 'static> fmt::Debug for CleanupGuard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CleanupGuard")
            .field("backend", &self.backend)
            .field("name", &self.name)
            .field("armed", &self.state.is_some())
            .finish()
    }
}

impl<S: Send + 'static> CleanupGuard<S> {
    /// Arms the undo of an attempt on `name` whose progress so far is `state`.
    pub fn arm(backend: &'static str, name: &LockName, state: S, undo: fn(S) -> Undo) -> Self {
        CleanupGuard {
            backend,
            name: name.clone(),
            state: Some(state),
            undo,
        }
    }

    /// What the attempt has done so far.
    pub fn state(&self) -> &S {
        self.state.as_ref().expect("armed until disarmed or run")
    }

    /// Records the attempt's progress (a node path learned, a lease renewed).
    pub fn state_mut(&mut self) -> &mut S {
        self.state.as_mut().expect("armed until disarmed or run")
    }

    /// The attempt succeeded: nothing is undone; its state is handed back.
    pub fn disarm(mut self) -> S {
        self.state.take().expect("armed until disarmed or run")
    }

    /// Undoes the attempt now and reports how that went (`true`: something was undone).
    ///
    /// # Cancel safety
    /// Dropping the future drops the undo's requests where they are; what they did not reach
    /// ends at its ttl or session.
    ///
    /// # Errors
    /// The undo's own store errors.
    pub async fn run_now(mut self) -> Result<bool> {
        let state = self.state.take().expect("armed until disarmed or run");
        match (self.undo)(state) {
            Undo::Done => Ok(true),
            Undo::Spawn(undo) => undo.await,
        }
    }
}

impl<S: Send + 'static> Drop for CleanupGuard<S> {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            match (self.undo)(state) {
                Undo::Done => {
                    tracing::debug!(backend = self.backend, lock = %self.name, "clean-up after an interrupted acquire, done in place")
                }
                Undo::Spawn(undo) => spawn_cleanup(self.backend, &self.name, undo),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn settle_waits_for_counted_cleanups_only_up_to_its_limit() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        assert!(
            spawn_counted(async move {
                let _ = rx.await;
            })
            .is_some()
        );
        assert!(pending() >= 1);
        assert!(
            !settle(Duration::from_millis(50)).await,
            "settle reported done while a clean-up was still running"
        );
        let waiter = tokio::spawn(settle(Duration::from_secs(30)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "settle returned before the clean-up ended"
        );
        tx.send(()).unwrap();
        assert!(waiter.await.unwrap(), "settle did not see the clean-up end");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_guard_undoes_and_a_disarmed_one_does_not() {
        use std::sync::atomic::AtomicBool;
        static UNDONE: AtomicBool = AtomicBool::new(false);
        let name = LockName::new("guard").unwrap();
        let undo = |flag: &'static AtomicBool| {
            Undo::Spawn(Box::pin(async move {
                flag.store(true, Ordering::SeqCst);
                Ok(true)
            }))
        };
        let guard = CleanupGuard::arm("test", &name, &UNDONE, undo);
        assert!(std::ptr::eq(guard.disarm(), &UNDONE));
        assert!(settle(Duration::from_secs(10)).await);
        assert!(
            !UNDONE.load(Ordering::SeqCst),
            "a disarmed guard undid the attempt"
        );
        let guard = CleanupGuard::arm("test", &name, &UNDONE, undo);
        drop(guard);
        assert!(settle(Duration::from_secs(10)).await);
        assert!(
            UNDONE.load(Ordering::SeqCst),
            "a dropped guard did not undo the attempt"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nested_attempts_cleanup_counts_for_the_outer_one_too() {
        let (outer, inner) = (Arc::new(Attempt::default()), Arc::new(Attempt::default()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        outer
            .run(inner.run(async move {
                spawn_counted(async move {
                    let _ = rx.await;
                })
            }))
            .await
            .expect("a runtime");
        let soon = Some(Instant::now() + Duration::from_millis(20));
        assert!(!inner.settle(soon).await, "the inner attempt missed it");
        assert!(!outer.settle(soon).await, "the outer attempt missed it");
        tx.send(()).unwrap();
        assert!(inner.settle(None).await && outer.settle(None).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_aborted_cleanup_is_no_longer_pending() {
        let counted = Counted::new();
        let task = tokio::spawn(async move {
            let _counted = counted;
            std::future::pending::<()>().await;
        });
        assert!(!settle(Duration::from_millis(20)).await);
        task.abort();
        let _ = task.await;
        // Other tests of this binary may have clean-ups of their own in flight; they end soon.
        assert!(
            settle(Duration::from_secs(10)).await,
            "an aborted clean-up still counts as pending"
        );
    }
}
