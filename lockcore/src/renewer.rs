//! Keep-alive for every guard of one backend client, in one task, in batches.
//!
//! Each backend client (`Arc<dyn DistributedLock>`) gets at most one renewer task per process
//! while it has guards to renew. On each wake-up the renewer gathers every lease that is due (or
//! nearly due: renewing a little early is harmless) and hands them to
//! [`DistributedLock::extend_many`] as one batch, which a network backend can send as one
//! pipeline. So 10 000 held leases cost one task and a few round trips per tick, not 10 000 of
//! each. The task exits when it has had nothing to renew for a few seconds.
//!
//! A new guard is put in the task's inbox and wakes the task only when it is due before the
//! wake-up the task has planned, which a fresh guard rarely is: a service that takes and
//! releases short locks many times a second then costs the renewer nothing per lock (a wake-up
//! per registration, as a channel gives, cost another thread about 2 µs of CPU each). A
//! released guard's entry goes at the task's next pass, whenever that is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::lease_state::{LostReason, Shared};
use crate::{DistributedLock, Error, Lease, MIN_TTL};

/// A guard's keep-alive policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    pub(crate) every: Option<Duration>,
    pub(crate) max_renewals: Option<u32>,
    pub(crate) max_hold: Option<Duration>,
}

struct Entry {
    shared: Weak<Shared>,
    policy: Policy,
    every: Duration,
    renewals: u32,
    /// When the next renewal is due.
    next: Instant,
    /// The lease's `valid_until` as last seen (a hand-made `extend` may have moved it later, which
    /// only makes this entry wake early and look again).
    valid_until: Instant,
}

/// What a renewer task and the guards registering with it share.
#[derive(Default)]
struct Renewer {
    inbox: Mutex<Inbox>,
    /// Wakes the task before its planned time (a permit is kept if it is not waiting yet).
    wake: Notify,
    /// How many times the task took its inbox (tests count the passes a burst costs).
    #[cfg(test)]
    passes: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Inbox {
    /// Entries registered since the task last looked.
    entries: Vec<Entry>,
    /// When the task will look next on its own; `None` while it has nothing to renew (then any
    /// registration wakes it).
    planned: Option<Instant>,
    /// The task is gone (it exited idle, or its runtime dropped it): start another.
    closed: bool,
}

impl Renewer {
    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a renewer task owns. Dropping it marks the renewer closed, however the task ends (a
/// runtime that shuts down drops the task without running it to its end), and only then lets
/// the backend go: the registry's key is the backend's address, which a new backend may reuse
/// once it is freed, and it must then find this renewer closed.
struct Task {
    renewer: Arc<Renewer>,
    backend: Arc<dyn DistributedLock>,
}

impl Drop for Task {
    fn drop(&mut self) {
        self.renewer.inbox().closed = true;
    }
}

type Registry = Mutex<HashMap<usize, Arc<Renewer>>>;

fn registry() -> MutexGuard<'static, HashMap<usize, Arc<Renewer>>> {
    static R: OnceLock<Registry> = OnceLock::new();
    let map = R.get_or_init(Default::default);
    map.lock().unwrap_or_else(PoisonError::into_inner)
}

fn key(backend: &Arc<dyn DistributedLock>) -> usize {
    Arc::as_ptr(backend) as *const () as usize
}

const IDLE_EXIT: Duration = Duration::from_secs(5);

/// How many registrations the inbox holds before they wake the task anyway, which then drops
/// the entries of guards already released: so memory stays bounded however fast guards come
/// and go between two renewals.
const INBOX_LIMIT: usize = 4096;

/// Registers a guard for renewal; `false` when there is no tokio runtime to run the renewer on.
pub(crate) fn register(
    backend: &Arc<dyn DistributedLock>,
    shared: &Arc<Shared>,
    policy: Policy,
) -> bool {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    let first = shared.lease();
    let every = policy.every.unwrap_or(first.ttl() / 3);
    let entry = Entry {
        shared: Arc::downgrade(shared),
        policy,
        every,
        renewals: 0,
        next: first.acquired_at() + every,
        valid_until: first.valid_until(),
    };
    let k = key(backend);
    let mut map = registry();
    if let Some(renewer) = map.get(&k) {
        let mut inbox = renewer.inbox();
        if !inbox.closed {
            let due = entry.wake_at();
            inbox.entries.push(entry);
            let sooner = inbox.planned.is_none_or(|planned| due < planned);
            if sooner {
                inbox.planned = Some(due);
            }
            if sooner || inbox.entries.len() == INBOX_LIMIT {
                drop(inbox);
                renewer.wake.notify_one();
            }
            return true;
        }
    }
    let renewer = Arc::new(Renewer::default());
    renewer.inbox().entries.push(entry);
    map.insert(k, renewer.clone());
    rt.spawn(run(backend.clone(), k, renewer));
    true
}

impl Entry {
    /// Whether its guard still holds (not dropped, not released).
    fn is_live(&self) -> bool {
        self.shared.upgrade().is_some_and(|s| !s.is_finished())
    }

    /// The lease ttl to ask for now, or `None` once a cap forbids another renewal.
    fn next_ttl(&self, lease: &Lease, now: Instant) -> Option<Duration> {
        if self.policy.max_renewals.is_some_and(|m| self.renewals >= m) {
            return None;
        }
        let mut ttl = lease.ttl();
        if let Some(max_hold) = self.policy.max_hold {
            let end = lease.acquired_at() + max_hold;
            ttl = ttl.min(end.saturating_duration_since(now));
        }
        (ttl >= MIN_TTL).then_some(ttl)
    }

    /// How long before its lease's end a renewal is abandoned: an eighth of the renewal
    /// interval, at least 1 ms and at most 250 ms.
    fn margin(&self) -> Duration {
        (self.every / 8).clamp(Duration::from_millis(1), Duration::from_millis(250))
    }

    /// When this entry needs attention: its renewal, or the end of its lease. No locking.
    fn wake_at(&self) -> Instant {
        self.next.min(self.valid_until)
    }

    /// Whether a pass at `now` should look at this entry (renewing up to an eighth of the
    /// interval early, rather than waking again a moment later).
    fn is_due(&self, now: Instant) -> bool {
        now >= self.valid_until || self.next <= now + self.every / 8
    }
}

/// Whole milliseconds, for log fields.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn run(backend: Arc<dyn DistributedLock>, key: usize, renewer: Arc<Renewer>) {
    let task = Task { renewer, backend };
    let (renewer, backend) = (&*task.renewer, &*task.backend);
    let mut entries: Vec<Entry> = Vec::new();
    let mut purge_at = INBOX_LIMIT;
    loop {
        #[cfg(test)]
        renewer
            .passes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Take what was registered, and say when this task looks next: a later registration
        // due before that wakes it. The scans run outside the inbox's lock; what arrives
        // meanwhile is taken with the plan, under it.
        entries.append(&mut renewer.inbox().entries);
        if entries.len() >= purge_at {
            entries.retain(Entry::is_live);
            purge_at = (2 * entries.len()).max(INBOX_LIMIT);
        }
        let mut wake = entries.iter().map(Entry::wake_at).min();
        {
            let mut inbox = renewer.inbox();
            for e in inbox.entries.drain(..) {
                wake = Some(wake.map_or(e.wake_at(), |w| w.min(e.wake_at())));
                entries.push(e);
            }
            inbox.planned = wake;
        }
        let Some(wake) = wake else {
            if tokio::time::timeout(IDLE_EXIT, renewer.wake.notified())
                .await
                .is_err()
            {
                // Exit under the registry's lock, so that no registration can slip in unseen.
                let mut map = registry();
                let mut inbox = renewer.inbox();
                if inbox.entries.is_empty() {
                    inbox.closed = true;
                    if map.get(&key).is_some_and(|r| std::ptr::eq(&**r, renewer)) {
                        map.remove(&key);
                    }
                    return;
                }
            }
            continue;
        };
        tokio::select! {
            () = renewer.wake.notified() => continue,
            () = tokio::time::sleep_until(wake.into()) => {}
        }
        renew_due(backend, &mut entries).await;
    }
}

/// Renews every entry that is due, drops released guards, and ends leases that ran out or whose
/// cap was reached.
async fn renew_due(backend: &dyn DistributedLock, entries: &mut Vec<Entry>) {
    let now = Instant::now();
    let mut batch: Vec<(usize, Lease, Duration)> = Vec::new();
    let mut done: Vec<usize> = Vec::new();
    for (i, e) in entries.iter_mut().enumerate() {
        // Released guards go at every pass, due or not, so that a service taking many short
        // locks keeps only those of the last pass's interval.
        let Some(shared) = e.shared.upgrade().filter(|s| !s.is_finished()) else {
            done.push(i);
            continue;
        };
        if !e.is_due(now) {
            continue;
        }
        let lease = shared.lease();
        e.valid_until = lease.valid_until();
        if now >= lease.valid_until() {
            shared.set_lost(shared.fallback());
            done.push(i);
            continue;
        }
        if !e.is_due(now) {
            continue;
        }
        match e.next_ttl(&lease, now) {
            // Too late for an answer to arrive before the lease ends: wait for the end, keeping
            // the reason the last attempt left.
            Some(_) if lease.valid_until() <= now + e.margin() => e.next = lease.valid_until(),
            Some(ttl) => {
                tracing::trace!(
                    lock = %lease.name(),
                    token = lease.token().0,
                    left_ms = millis(lease.valid_until().saturating_duration_since(now)),
                    late_ms = millis(now.saturating_duration_since(e.next)),
                    "renewal sent"
                );
                batch.push((i, lease, ttl))
            }
            None => {
                shared.set_fallback(LostReason::RenewalLimit);
                // Nothing more to renew: wake only when the lease runs out.
                e.next = lease.valid_until();
            }
        }
    }
    if !batch.is_empty() {
        // Give up on the batch a margin before the first of its leases ends, so a renewal that
        // never answers is marked `ConnectionLost` before `lost()` sees the lease run out
        // (giving up at the very end raced with it and could report `Expired`).
        let deadline = batch
            .iter()
            .map(|(i, l, _)| {
                let end = l.valid_until();
                end.checked_sub(entries[*i].margin()).unwrap_or(end)
            })
            .min()
            .unwrap_or(now);
        // While a renewal is out, a lease that runs out did so because the store did not
        // answer in time: say so before sending, so that `lost()` reports that even when this
        // task is scheduled late (on a loaded machine the timeout below could fire after the
        // lease's end, and `lost()` then found the reason of the previous, answered renewal).
        for (i, _, _) in &batch {
            if let Some(shared) = entries[*i].shared.upgrade() {
                shared.set_fallback(LostReason::ConnectionLost);
            }
        }
        let requests: Vec<(Lease, Duration)> =
            batch.iter().map(|(_, l, t)| (l.clone(), *t)).collect();
        let started = Instant::now();
        let results = tokio::time::timeout(
            deadline.saturating_duration_since(started),
            backend.extend_many(&requests),
        )
        .await;
        match results {
            Ok(results) => {
                for ((i, lease, asked), result) in batch.iter().zip(results) {
                    let e = &mut entries[*i];
                    let Some(shared) = e.shared.upgrade() else {
                        continue;
                    };
                    match result {
                        Ok(mut new) => {
                            if let Some(max_hold) = e.policy.max_hold {
                                let cap = new.acquired_at() + max_hold;
                                new = new.valid_no_later_than(cap);
                            }
                            e.renewals += 1;
                            e.next = started + e.every;
                            e.valid_until = new.valid_until();
                            if !shared.is_finished() {
                                tracing::trace!(
                                    lock = %new.name(),
                                    renewals = e.renewals,
                                    took_ms = millis(started.elapsed()),
                                    left_ms = millis(new.remaining()),
                                    "lease renewed"
                                );
                                shared.store_lease(new);
                            }
                            // A renewal shortened by max_hold, or the last one allowed, is the
                            // cap's doing when the lease later runs out.
                            let capped = *asked < lease.ttl()
                                || e.policy.max_renewals.is_some_and(|m| e.renewals >= m);
                            shared.set_fallback(if capped {
                                LostReason::RenewalLimit
                            } else {
                                LostReason::Expired
                            });
                        }
                        Err(err @ Error::LockLost { .. }) => {
                            // A guard released while this batch was out had its lease taken
                            // away by that release, not lost.
                            if !shared.is_finished() {
                                shared.set_lost(backend.lost_reason(lease, &err));
                            }
                            done.push(*i);
                        }
                        Err(err) => {
                            tracing::warn!(
                                lock = %lease.name(),
                                error = %err,
                                took_ms = millis(started.elapsed()),
                                left_ms = millis(lease.remaining()),
                                "renewal failed; retrying until the lease runs out"
                            );
                            shared.set_fallback(LostReason::from_error(&err));
                            e.next = Instant::now() + (e.every / 4).max(Duration::from_millis(10));
                        }
                    }
                }
            }
            Err(_elapsed) => {
                for (i, lease, _) in &batch {
                    tracing::debug!(
                        lock = %lease.name(),
                        took_ms = millis(started.elapsed()),
                        left_ms = millis(lease.remaining()),
                        "renewal unanswered; retrying while the lease lasts"
                    );
                    if let Some(shared) = entries[*i].shared.upgrade() {
                        shared.set_fallback(LostReason::ConnectionLost);
                    }
                    // Try again at once if there is time left, else wait for the lease's end.
                    entries[*i].next = Instant::now();
                }
            }
        }
    }
    done.sort_unstable();
    done.dedup();
    for i in done.into_iter().rev() {
        entries.swap_remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcquireOptions, KeepAlive, LockExt, LockGuard, MemoryLock, Wait};

    /// The entries waiting in `backend`'s renewer inbox (`None`: no renewer).
    fn inbox_len(backend: &Arc<dyn DistributedLock>) -> Option<usize> {
        let renewer = registry().get(&key(backend)).cloned()?;
        Some(renewer.inbox().entries.len())
    }

    async fn lock(backend: &Arc<dyn DistributedLock>, name: &str, ttl: Duration) -> LockGuard {
        let opts = AcquireOptions::new()
            .ttl(ttl)
            .keep_alive(KeepAlive::renew())
            .wait(Wait::No);
        backend.lock(name, &opts).await.expect("free")
    }

    /// Waits (at most 10 s) until the renewer took everything from its inbox.
    async fn drained(backend: &Arc<dyn DistributedLock>) {
        let empty = async {
            while inbox_len(backend) != Some(0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), empty)
            .await
            .expect("the renewer never took its inbox");
    }

    const MINUTE: Duration = Duration::from_secs(60);

    /// A backend of namespace `ns` whose renewer holds one guard, due in 20 s and taken from
    /// the inbox: the renewer plans its next pass then.
    async fn planned(ns: &str) -> (Arc<dyn DistributedLock>, LockGuard) {
        let backend: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new(ns));
        let first = lock(&backend, "first", MINUTE).await;
        drained(&backend).await;
        (backend, first)
    }

    /// Guards due after the renewer's planned pass wait in its inbox without waking it; one
    /// due before that wakes it, and it takes them all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_guard_due_before_the_planned_pass_wakes_the_renewer() {
        let (backend, first) = planned("renewer-inbox").await;
        let mut later = Vec::new();
        for i in 0..50 {
            later.push(lock(&backend, &format!("later-{i}"), 2 * MINUTE).await);
        }
        // Time enough for a woken task to take them.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            inbox_len(&backend),
            Some(50),
            "a later guard woke the renewer"
        );

        let sooner = lock(&backend, "sooner", Duration::from_millis(1500)).await;
        drained(&backend).await;
        // And it is renewed in time, though the plan was 20 s away.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(sooner.is_held(), "the sooner guard's lease lapsed");
        for g in later.into_iter().chain([first, sooner]) {
            g.release().await.expect("release");
        }
    }

    /// A burst of guards (5 000, as a service taking many locks at once) waits in the inbox and
    /// is taken by one pass of the renewer, not one pass per guard: each pass takes the whole
    /// inbox, and then scans only cached instants.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_guards_is_taken_in_one_pass() {
        let (backend, first) = planned("renewer-burst").await;
        let renewer = registry().get(&key(&backend)).cloned().expect("a renewer");
        let passes = || renewer.passes.load(std::sync::atomic::Ordering::Relaxed);
        let before = passes();
        let mut burst = Vec::new();
        for i in 0..5000 {
            burst.push(lock(&backend, &format!("burst-{i}"), 2 * MINUTE).await);
        }
        let sooner = lock(&backend, "sooner", Duration::from_millis(1500)).await;
        drained(&backend).await;
        // One when the inbox filled (`INBOX_LIMIT`), one for the sooner guard.
        let taken = passes() - before;
        assert!(
            (1..=3).contains(&taken),
            "{taken} passes took a burst of 5 001 guards"
        );
        for g in burst.into_iter().chain([first, sooner]) {
            g.release().await.expect("release");
        }
    }

    /// However fast guards come and go between two passes, the inbox wakes the renewer every
    /// `INBOX_LIMIT` registrations rather than growing without bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_inbox_wakes_the_renewer() {
        let (backend, held) = planned("renewer-full").await;
        for _ in 0..INBOX_LIMIT + 10 {
            let g = lock(&backend, "churn", 2 * MINUTE).await;
            g.release().await.expect("release");
        }
        // The renewer's plan is 20 s away: only the full inbox can have woken it.
        let taken = async {
            while inbox_len(&backend).expect("a renewer") >= INBOX_LIMIT {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let taken = tokio::time::timeout(Duration::from_secs(10), taken).await;
        assert!(taken.is_ok(), "a full inbox did not wake the renewer");
        held.release().await.expect("release");
    }
}
