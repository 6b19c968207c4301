//! Keep-alive for every guard of one backend client, in one task, in batches.
//!
//! Each backend client (`Arc<dyn DistributedLock>`) gets at most one renewer task per process
//! while it has guards to renew. On each wake-up the renewer gathers every lease that is due (or
//! nearly due: renewing a little early is harmless) and hands them to
//! [`DistributedLock::extend_many`] as one batch, which a network backend can send as one
//! pipeline. So 10 000 held leases cost one task and a few round trips per tick, not 10 000 of
//! each. The task exits when it has had nothing to renew for a few seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::held::{LostReason, Shared};
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

type Registry = Mutex<HashMap<usize, mpsc::UnboundedSender<Entry>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn key(backend: &Arc<dyn DistributedLock>) -> usize {
    Arc::as_ptr(backend) as *const () as usize
}

const IDLE_EXIT: Duration = Duration::from_secs(5);

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
    let mut map = registry().lock().unwrap_or_else(PoisonError::into_inner);
    let entry = match map.get(&k) {
        Some(tx) => match tx.send(entry) {
            Ok(()) => return true,
            // The renewer's runtime is gone: start a new one here.
            Err(mpsc::error::SendError(entry)) => entry,
        },
        None => entry,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(entry);
    map.insert(k, tx);
    rt.spawn(run(backend.clone(), k, rx));
    true
}

impl Entry {
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

async fn run(
    backend: Arc<dyn DistributedLock>,
    key: usize,
    mut rx: mpsc::UnboundedReceiver<Entry>,
) {
    let mut entries: Vec<Entry> = Vec::new();
    loop {
        if entries.is_empty() {
            match tokio::time::timeout(IDLE_EXIT, rx.recv()).await {
                Ok(Some(e)) => entries.push(e),
                Ok(None) => return,
                Err(_) => {
                    // Exit under the registry lock so no registration can slip in unseen.
                    let mut map = registry().lock().unwrap_or_else(PoisonError::into_inner);
                    match rx.try_recv() {
                        Ok(e) => entries.push(e),
                        Err(_) => {
                            map.remove(&key);
                            return;
                        }
                    }
                }
            }
        }
        // Take every registration that is waiting, so a burst of guards costs one pass.
        while let Ok(e) = rx.try_recv() {
            entries.push(e);
        }
        let wake = entries
            .iter()
            .map(Entry::wake_at)
            .min()
            .unwrap_or_else(Instant::now);
        tokio::select! {
            e = rx.recv() => {
                if let Some(e) = e {
                    entries.push(e);
                }
                continue;
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        renew_due(&*backend, &mut entries).await;
    }
}

/// Renews every entry that is due, drops released guards, and ends leases that ran out or whose
/// cap was reached.
async fn renew_due(backend: &dyn DistributedLock, entries: &mut Vec<Entry>) {
    let now = Instant::now();
    let mut batch: Vec<(usize, Lease, Duration)> = Vec::new();
    let mut done: Vec<usize> = Vec::new();
    for (i, e) in entries.iter_mut().enumerate() {
        if !e.is_due(now) {
            continue;
        }
        let Some(shared) = e.shared.upgrade().filter(|s| !s.is_finished()) else {
            done.push(i);
            continue;
        };
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
            Some(ttl) => batch.push((i, lease, ttl)),
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
                                tracing::trace!(lock = %new.name(), renewals = e.renewals, "lease renewed");
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
                            tracing::warn!(lock = %lease.name(), error = %err, "renewal failed; retrying until the lease runs out");
                            shared.set_fallback(LostReason::from_error(&err));
                            e.next = Instant::now() + (e.every / 4).max(Duration::from_millis(10));
                        }
                    }
                }
            }
            Err(_elapsed) => {
                for (i, _, _) in &batch {
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
