//! Guard and acquire behaviour when the store misbehaves, using a memory backend wrapped with
//! switchable faults.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, KeepAlive, Lease,
    LockExt, LockInfo, LockName, LostReason, MemoryLock, Released, Result, Wait, async_trait,
};

#[derive(Debug)]
struct Faulty {
    inner: MemoryLock,
    hang_acquire: AtomicBool,
    fail_extend: AtomicBool,
    /// Renewals never answer (a store that is gone without refusing connections).
    hang_extend: AtomicBool,
    /// How many renewals have started hanging.
    hung: AtomicUsize,
    /// Each `extend_many` says it started (`batch_started`), then waits for `batch_gate`.
    gate_batches: AtomicBool,
    batch_started: tokio::sync::Notify,
    batch_gate: tokio::sync::Notify,
    batches: AtomicUsize,
    renewed: AtomicUsize,
    /// The next this many acquire attempts fail with a store error.
    fail_acquires: AtomicUsize,
    fail_retryable: AtomicBool,
    /// Answer every `try_acquire` only after this many milliseconds.
    slow_acquire_ms: AtomicU64,
    /// Declare `bounded_requests` in the capabilities.
    bounded: AtomicBool,
    /// When above zero, an injected acquire failure also spawns, as a backend's armed clean-up
    /// would, a clean-up that releases whatever the attempt's owner id holds on the name, this
    /// many milliseconds later (a slow network).
    cleanup_delay_ms: AtomicU64,
    namespace: String,
}

/// Releases whatever `owner` holds on `name` in the memory namespace `ns`, as a backend's
/// clean-up of an attempt does (by owner id, not by a lease it never got).
async fn release_owner(ns: String, name: LockName, owner: lockcore::OwnerId) -> Result<bool> {
    let store = MemoryLock::new(&ns);
    let Some(info) = store.inspect(&name).await? else {
        return Ok(false);
    };
    let (Some(holder), Some(token)) = (info.holder, info.token) else {
        return Ok(false);
    };
    if holder != owner.to_string() {
        return Ok(false);
    }
    let lease = Lease::new(
        name,
        owner,
        token,
        Instant::now(),
        Duration::from_secs(1),
        Duration::ZERO,
    );
    Ok(store.release(&lease).await? == Released::Released)
}

impl Faulty {
    fn injected_failure(&self, name: &LockName, opts: &AcquireOptions) -> Result<()> {
        let left = self.fail_acquires.load(Ordering::SeqCst);
        if left > 0 {
            self.fail_acquires.store(left - 1, Ordering::SeqCst);
            let delay = self.cleanup_delay_ms.load(Ordering::SeqCst);
            if let (true, Some(owner)) = (delay > 0, opts.owner_value()) {
                let (ns, name) = (self.namespace.clone(), name.clone());
                lockcore::backend_support::spawn_cleanup("faulty", &name.clone(), async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    release_owner(ns, name, owner).await
                });
            }
            let retryable = self.fail_retryable.load(Ordering::SeqCst);
            return Err(Error::backend(
                "faulty",
                "acquire",
                Some(name),
                retryable,
                "server restarting",
            ));
        }
        Ok(())
    }
}

impl Faulty {
    fn new(ns: &str) -> Arc<Self> {
        let mut defaults = ClientDefaults::default();
        defaults.timeout = Duration::from_millis(200);
        Arc::new(Faulty {
            inner: MemoryLock::new(ns).with_defaults(defaults),
            hang_acquire: AtomicBool::new(false),
            fail_extend: AtomicBool::new(false),
            hang_extend: AtomicBool::new(false),
            hung: AtomicUsize::new(0),
            gate_batches: AtomicBool::new(false),
            batch_started: tokio::sync::Notify::new(),
            batch_gate: tokio::sync::Notify::new(),
            batches: AtomicUsize::new(0),
            renewed: AtomicUsize::new(0),
            fail_acquires: AtomicUsize::new(0),
            fail_retryable: AtomicBool::new(true),
            slow_acquire_ms: AtomicU64::new(0),
            bounded: AtomicBool::new(false),
            cleanup_delay_ms: AtomicU64::new(0),
            namespace: ns.to_owned(),
        })
    }
}

// A delegating double: every method forwarded, so only the injected faults differ.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl DistributedLock for Faulty {
    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .bounded_requests(self.bounded.load(Ordering::SeqCst))
    }
    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }
    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        if self.hang_acquire.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let slow = self.slow_acquire_ms.load(Ordering::SeqCst);
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow)).await;
        }
        self.injected_failure(name, opts)?;
        self.inner.try_acquire(name, opts).await
    }
    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        d: Option<Instant>,
    ) -> Result<Option<Lease>> {
        if self.hang_acquire.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.injected_failure(name, opts)?;
        self.inner.acquire_wait(name, opts, d).await
    }
    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.inner.release(lease).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if self.hang_extend.load(Ordering::SeqCst) {
            self.hung.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        if self.fail_extend.load(Ordering::SeqCst) {
            return Err(Error::backend(
                "faulty",
                "extend",
                Some(lease.name()),
                true,
                "connection refused",
            ));
        }
        self.inner.extend(lease, ttl).await
    }
    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        if self.gate_batches.load(Ordering::SeqCst) {
            self.batch_started.notify_one();
            self.batch_gate.notified().await;
        }
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.renewed.fetch_add(leases.len(), Ordering::SeqCst);
        let mut out = Vec::new();
        for (l, ttl) in leases {
            out.push(self.extend(l, *ttl).await);
        }
        out
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.inner.wait_for_release(name, until).await
    }
    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.injected_failure(name, opts)?;
        self.inner.try_acquire_shared(name, opts).await
    }
    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        d: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.injected_failure(name, opts)?;
        self.inner.acquire_shared_wait(name, opts, d).await
    }
    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.injected_failure(name, opts)?;
        self.inner.try_acquire_permit(name, permits, opts).await
    }
    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        d: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.injected_failure(name, opts)?;
        self.inner.acquire_permit_wait(name, permits, opts, d).await
    }
    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.inner.lost_reason(lease, error)
    }
    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<lockcore::SemaphoreInfo>> {
        self.inner.inspect_semaphore(name).await
    }
    async fn forget(&self, name: &LockName) -> Result<bool> {
        self.inner.forget(name).await
    }
    async fn names(&self) -> Result<Vec<LockName>> {
        self.inner.names().await
    }
}

#[tokio::test]
async fn hung_store_cannot_stretch_a_bounded_wait() {
    let f = Faulty::new("hung");
    f.hang_acquire.store(true, Ordering::SeqCst);
    let locks: Arc<dyn DistributedLock> = f;
    let opts = AcquireOptions::new().wait(Wait::No);
    match tokio::time::timeout(Duration::from_secs(30), locks.lock("x", &opts))
        .await
        .expect("hang guard")
    {
        Err(e @ Error::Backend { .. }) => assert!(
            e.is_retryable(),
            "a store that does not answer is retryable"
        ),
        other => panic!("expected a retryable backend error, got {other:?}"),
    }
    let opts = AcquireOptions::new().wait(Wait::For(Duration::from_millis(100)));
    let out = tokio::time::timeout(Duration::from_secs(30), locks.lock("x", &opts))
        .await
        .expect("hang guard");
    assert!(matches!(out, Err(Error::Timeout { .. })), "got {out:?}");
}

/// A backend that bounds its own requests is trusted to answer: lockcore adds no timer of its
/// own, so a slow but answering store is not cut off at `timeout`. Without that declaration the
/// same store's answer comes too late and the acquire fails as unanswered.
#[tokio::test]
async fn only_backends_without_their_own_bound_get_a_backstop() {
    let opts = AcquireOptions::new()
        .wait(Wait::No)
        .keep_alive(KeepAlive::Off);
    for bounded in [false, true] {
        let f = Faulty::new(&format!("bounded-{bounded}"));
        // The timeout is 200 ms; the answer comes after 600 ms.
        f.slow_acquire_ms.store(600, Ordering::SeqCst);
        f.bounded.store(bounded, Ordering::SeqCst);
        let locks: Arc<dyn DistributedLock> = f;
        let outcome = locks.lock("slow", &opts).await;
        if bounded {
            let guard = outcome.expect("a bounded backend's late answer is taken");
            assert_eq!(guard.release().await.expect("release"), Released::Released);
        } else {
            let err = outcome.expect_err("an unbounded backend is cut off at its timeout");
            assert!(err.is_retryable(), "{err}");
            assert!(err.to_string().contains("no answer"), "{err}");
        }
    }
}

#[tokio::test]
async fn failing_renewals_report_connection_lost_when_the_lease_runs_out() {
    let f = Faulty::new("renew-fails");
    let locks: Arc<dyn DistributedLock> = f.clone();
    let opts = AcquireOptions::new()
        .ttl(Duration::from_millis(300))
        .keep_alive(KeepAlive::renew());
    let g = locks.lock("x", &opts).await.expect("acquire");
    f.fail_extend.store(true, Ordering::SeqCst);
    let reason = tokio::time::timeout(Duration::from_secs(30), g.lost())
        .await
        .expect("lost() fires");
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(!g.is_held());
    assert!(
        Instant::now() >= g.lease().valid_until(),
        "lost() fired before the lease could have run out"
    );
}

/// `expiring(margin)` is the holder's signal to stop in time: while renewals succeed, a margin
/// of a sixth of the ttl never fires (each renewal moves the deadline); once they fail, it fires
/// with `ConnectionLost` no earlier than `margin` before the deadline, and `lost()` follows,
/// with the same reason, no earlier than the deadline itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_warns_ahead_of_the_deadline_once_renewals_fail() {
    let f = Faulty::new("renew-warns");
    let locks: Arc<dyn DistributedLock> = f.clone();
    let (ttl, margin) = (Duration::from_secs(6), Duration::from_secs(1));
    let opts = AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew());
    let g = locks.lock("x", &opts).await.expect("acquire");
    let first = g.deadline();
    let quiet = tokio::time::timeout(Duration::from_secs(7), g.expiring(margin)).await;
    assert!(
        quiet.is_err(),
        "expiring fired while renewals succeeded: {quiet:?}"
    );
    assert!(g.deadline() > first, "renewals did not move the deadline");

    f.fail_extend.store(true, Ordering::SeqCst);
    let reason = tokio::time::timeout(Duration::from_secs(30), g.expiring(margin))
        .await
        .expect("expiring() fires");
    let warned = Instant::now();
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(
        warned + margin >= g.deadline(),
        "fired more than the margin before the deadline"
    );
    assert_eq!(g.deadline(), g.lease().valid_until());
    let lost = tokio::time::timeout(Duration::from_secs(30), g.lost())
        .await
        .expect("lost() fires");
    assert_eq!(lost, LostReason::ConnectionLost);
    assert!(Instant::now() >= g.deadline());
    assert!(!g.is_held());
}

/// A renewal that never answers (the store vanished without refusing connections) ends in
/// `ConnectionLost`, not `Expired`, every time: the renewer gives up on it before the lease's end,
/// so its verdict is in before `lost()` looks at the lease running out.
///
/// A round in which no renewal was sent before the lease ran out (the process was starved of
/// CPU for longer than the 120 ms lease, as `scripts/stall` makes it) tests something else: no
/// store failed, and `Expired` is the true answer there, which the round checks instead. Most
/// rounds must have sent one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_renewals_report_connection_lost_when_the_lease_runs_out() {
    let f = Faulty::new("renew-hangs");
    let locks: Arc<dyn DistributedLock> = f.clone();
    let opts = AcquireOptions::new()
        .ttl(Duration::from_millis(120))
        .keep_alive(KeepAlive::renew());
    let mut hung_rounds = 0;
    for round in 0..25 {
        f.hang_extend.store(false, Ordering::SeqCst);
        let g = locks
            .lock(&format!("x{round}"), &opts)
            .await
            .expect("acquire");
        let before = f.hung.load(Ordering::SeqCst);
        f.hang_extend.store(true, Ordering::SeqCst);
        let reason = tokio::time::timeout(Duration::from_secs(30), g.lost())
            .await
            .expect("lost() fires");
        if f.hung.load(Ordering::SeqCst) > before {
            hung_rounds += 1;
            assert_eq!(reason, LostReason::ConnectionLost, "round {round}");
        } else {
            assert_eq!(
                reason,
                LostReason::Expired,
                "round {round}, no renewal sent"
            );
        }
        assert!(Instant::now() >= g.lease().valid_until());
    }
    assert!(
        hung_rounds >= 15,
        "only {hung_rounds} of 25 rounds sent a renewal"
    );
}

#[tokio::test]
async fn renewals_survive_a_short_outage() {
    let f = Faulty::new("renew-blip");
    let locks: Arc<dyn DistributedLock> = f.clone();
    let opts = AcquireOptions::new()
        .ttl(Duration::from_millis(900))
        .keep_alive(KeepAlive::renew());
    let g = locks.lock("x", &opts).await.expect("acquire");
    tokio::time::sleep(Duration::from_millis(250)).await;
    f.fail_extend.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    f.fail_extend.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        g.is_held(),
        "a renewal outage shorter than the lease lost the lock"
    );
    assert_eq!(g.lost_reason(), None);
    assert_eq!(g.release().await.unwrap(), Released::Released);
}

#[test]
fn guard_dropped_outside_a_runtime_does_not_panic_and_the_ttl_frees_it() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("no-runtime"));
    let opts = AcquireOptions::new()
        .ttl(Duration::from_millis(200))
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No);
    let g = rt.block_on(locks.lock("x", &opts)).unwrap();
    drop(rt);
    drop(g); // no runtime here: must log, not panic or block
    let rt = tokio::runtime::Runtime::new().unwrap();
    let again = rt.block_on(async {
        let opts = opts.clone().wait(Wait::For(Duration::from_secs(20)));
        locks.lock("x", &opts).await
    });
    assert!(again.is_ok(), "the lease should have run out: {again:?}");
}

/// (A ttl of 1 s: a renewal may then be about 600 ms late, a stalled machine, before the lease
/// runs out as `Expired` ahead of the cap. With 300 ms, a 250 ms freeze of the test process
/// every 800 ms failed it every time.)
#[tokio::test]
async fn max_hold_caps_total_hold_time() {
    let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("max-hold"));
    let opts = AcquireOptions::new()
        .ttl(Duration::from_secs(1))
        .keep_alive(KeepAlive::max_hold(Duration::from_millis(2300)));
    let g = locks.lock("x", &opts).await.unwrap();
    let acquired = g.lease().acquired_at();
    let reason = tokio::time::timeout(Duration::from_secs(30), g.lost())
        .await
        .expect("lost() fires");
    assert_eq!(reason, LostReason::RenewalLimit);
    assert!(
        g.lease().valid_until() <= acquired + Duration::from_millis(2300),
        "renewed past max_hold"
    );
    assert!(
        g.lease().valid_until() > acquired + Duration::from_secs(1),
        "never renewed at all"
    );
}

/// (A ttl of 1.5 s, renewed every 500 ms: a pass may be almost a second late before a lease
/// lapses. With 600 ms, a 400 ms freeze of the test process could lapse one.)
#[tokio::test]
async fn renewals_of_many_guards_are_batched_in_one_task() {
    let f = Faulty::new("batched");
    let locks: Arc<dyn DistributedLock> = f.clone();
    let opts = AcquireOptions::new()
        .ttl(Duration::from_millis(1500))
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(locks.lock(&format!("lease-{i}"), &opts).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(
        guards.iter().all(|g| g.is_held()),
        "a batched renewal let a lease lapse"
    );
    let (batches, renewed) = (
        f.batches.load(Ordering::SeqCst),
        f.renewed.load(Ordering::SeqCst),
    );
    assert!(
        renewed >= 400,
        "expected each of 200 leases renewed at least twice, got {renewed} renewals"
    );
    assert!(
        batches * 20 <= renewed,
        "renewals were not batched: {batches} batches for {renewed} renewals"
    );
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Released);
    }
}

/// `out` is a store error, retryable or not as `retryable` says.
fn assert_store_error(out: &Result<lockcore::LockGuard>, retryable: bool) {
    assert!(
        matches!(out, Err(Error::Backend { retryable: r, .. }) if *r == retryable),
        "expected a store error (retryable: {retryable}), got {out:?}"
    );
}

#[tokio::test]
async fn waiting_acquire_rides_out_retryable_store_errors() {
    let f = Faulty::new("outage");
    let locks: Arc<dyn DistributedLock> = f.clone();
    f.fail_acquires.store(3, Ordering::SeqCst);
    let wait = AcquireOptions::new().wait(Wait::For(Duration::from_secs(20)));
    let g = locks
        .lock("x", &wait)
        .await
        .expect("three store errors within the wait are ridden out");
    assert_eq!(f.fail_acquires.load(Ordering::SeqCst), 0);
    g.release().await.unwrap();

    // One attempt only: the error is the caller's.
    f.fail_acquires.store(1, Ordering::SeqCst);
    let once = locks.lock("x", &AcquireOptions::new().wait(Wait::No)).await;
    assert_store_error(&once, true);

    // Not retryable: returned at once, even while waiting.
    f.fail_retryable.store(false, Ordering::SeqCst);
    f.fail_acquires.store(1, Ordering::SeqCst);
    let fatal = locks.lock("x", &wait).await;
    assert_store_error(&fatal, false);

    // A caller-chosen owner id: the retry reuses it, so it waits for the failed attempt's
    // clean-up, which releases whatever that id holds; a clean-up still on its way would
    // otherwise free the retry's grant.
    f.fail_retryable.store(true, Ordering::SeqCst);
    f.fail_acquires.store(1, Ordering::SeqCst);
    f.cleanup_delay_ms.store(400, Ordering::SeqCst);
    let owner = lockcore::OwnerId::random();
    let chosen = wait.clone().owner(owner);
    let g = locks
        .lock("x", &chosen)
        .await
        .expect("a store error under a chosen owner is ridden out too");
    assert_eq!(
        f.fail_acquires.load(Ordering::SeqCst),
        0,
        "the first attempt failed"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let info = locks.inspect(&LockName::new("x").unwrap()).await.unwrap();
    assert_eq!(
        info.as_ref().and_then(|i| i.holder.clone()),
        Some(owner.to_string()),
        "the failed attempt's clean-up freed the retry's lock: {info:?}"
    );
    assert_eq!(g.release().await.unwrap(), Released::Released);
    f.cleanup_delay_ms.store(0, Ordering::SeqCst);

    // Still failing when the deadline passes: the store error, not a bare Timeout.
    f.fail_retryable.store(true, Ordering::SeqCst);
    f.fail_acquires.store(usize::MAX, Ordering::SeqCst);
    let short = AcquireOptions::new().wait(Wait::For(Duration::from_millis(300)));
    let out = locks.lock("x", &short).await;
    assert_store_error(&out, true);
}

/// A guard released while a keep-alive batch with its lease is out is not reported lost when
/// that batch comes back finding the lease gone: the release took it, not another owner. A
/// lease taken behind its guard's back in the same batch is reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_while_its_renewal_is_out_is_not_reported_lost() {
    let f = Faulty::new("released-mid-renewal");
    let locks: Arc<dyn DistributedLock> = f.clone();
    let opts = AcquireOptions::new()
        .ttl(Duration::from_millis(900))
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let released = locks.lock("released", &opts).await.unwrap();
    let taken = locks.lock("taken", &opts).await.unwrap();
    let (released_watch, taken_watch) = (released.watch(), taken.watch());

    f.gate_batches.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), f.batch_started.notified())
        .await
        .expect("a keep-alive batch started");
    // While the batch is out: one guard releases, the other lease is taken from under its guard.
    assert_eq!(released.release().await.unwrap(), Released::Released);
    assert_eq!(
        f.inner.release(&taken_watch.lease()).await.unwrap(),
        Released::Released
    );
    f.gate_batches.store(false, Ordering::SeqCst);
    f.batch_gate.notify_one();

    let reason = tokio::time::timeout(Duration::from_secs(10), taken_watch.lost())
        .await
        .expect("the taken lease is reported lost");
    assert_eq!(reason, LostReason::Taken);
    // The batch that reported it came back for both leases.
    assert_eq!(released_watch.lost_reason(), None);
    drop(taken);
}
