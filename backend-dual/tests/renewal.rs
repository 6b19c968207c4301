//! How a dual client renews many leases: one batch per store, both stores at once, and each
//! lease's answer settled on its own.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use backend_dual::{DualConfig, DualLock};
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Lease, LockInfo,
    LockName, LostReason, MemoryLock, Released, Result, async_trait,
};

use common::dual_url;

/// A memory store that counts how it was asked to renew.
#[derive(Debug)]
struct Counted {
    inner: MemoryLock,
    single: AtomicUsize,
    batches: std::sync::Mutex<Vec<usize>>,
}

impl Counted {
    fn new(namespace: &str) -> Arc<Self> {
        Arc::new(Counted {
            inner: MemoryLock::new(namespace),
            single: AtomicUsize::new(0),
            batches: Default::default(),
        })
    }
}

#[async_trait]
impl DistributedLock for Counted {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }
    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.inner.try_acquire(name, opts).await
    }
    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.inner.release(lease).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.single.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(lease, ttl).await
    }
    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        self.batches.lock().unwrap().push(leases.len());
        self.inner.extend_many(leases).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

/// Three dual leases renewed together reach each store as one batch of three, never one
/// `extend` at a time; a lease whose second side was taken meanwhile comes back `LockLost`
/// (reported as taken) while the other two are renewed past their first validity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_are_renewed_in_one_batch_per_store() {
    let (first_ns, second_ns) = ("renew-batch-1", "renew-batch-2");
    let (first, second) = (Counted::new(first_ns), Counted::new(second_ns));
    let config = DualConfig::parse(&dual_url(
        &format!("memory://{first_ns}"),
        &format!("memory://{second_ns}"),
        "",
    ))
    .expect("dual config");
    let dual = DualLock::new(first.clone(), second.clone(), config).expect("compose");
    let ttl = Duration::from_secs(2);
    let mut leases = Vec::new();
    for name in ["a", "b", "c"] {
        let name = LockName::new(name).unwrap();
        let lease = dual
            .try_acquire(&name, &AcquireOptions::new().ttl(ttl))
            .await
            .expect("try_acquire")
            .expect("a free name");
        leases.push(lease);
    }
    // "b" is lost on the second store: its hold there is released behind the dual client.
    let b = LockName::new("b").unwrap();
    let info = second.inspect(&b).await.unwrap().expect("b held");
    let behind = Lease::new(
        b.clone(),
        leases[1].owner(),
        info.token.expect("a token"),
        Instant::now(),
        ttl,
        Duration::ZERO,
    );
    assert_eq!(second.release(&behind).await.unwrap(), Released::Released);

    let renew_ttl = Duration::from_secs(20);
    let asked: Vec<(Lease, Duration)> = leases.iter().map(|l| (l.clone(), renew_ttl)).collect();
    let answers = dual.extend_many(&asked).await;

    assert_eq!(answers.len(), 3, "one answer per lease");
    for (store, counted) in [("first", &first), ("second", &second)] {
        assert_eq!(
            *counted.batches.lock().unwrap(),
            vec![3],
            "the {store} store was not asked for one batch of three"
        );
        assert_eq!(
            counted.single.load(Ordering::SeqCst),
            0,
            "the {store} store was asked lease by lease"
        );
    }
    for (i, answer) in answers.iter().enumerate() {
        let name = leases[i].name().as_str();
        if name == "b" {
            let err = answer.as_ref().expect_err("b's second side was taken");
            assert!(matches!(err, Error::LockLost { .. }), "b: {err:?}");
            assert_eq!(dual.lost_reason(&leases[i], err), LostReason::Taken);
        } else {
            let renewed = answer
                .as_ref()
                .unwrap_or_else(|e| panic!("{name} not renewed: {e}"));
            assert!(
                renewed.valid_until() > leases[i].valid_until() + Duration::from_secs(10),
                "{name} not renewed for the new ttl"
            );
        }
    }
}
