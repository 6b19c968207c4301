//! Faults only a composite has: one of its two stores unreachable while the other is held,
//! one side's connection lost under a holder, and the first store's hold lost while the second
//! is awaited. The stores are a kit ZooKeeper server and a kit Redis server, each behind the
//! kit's proxy where the scenario cuts the link, or memory stores wrapped to misbehave on cue.
//! (A dual client killed -9 is in dlock-cli/tests/cli_dual.rs, which has the `dlock` binary to
//! kill.)

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use backend_dual::{DualConfig, DualLock};
use conformance_tests::kit::{Fault, Proxy, Redis, ZooKeeper};
use conformance_tests::within;
use conformance_tests::{FencedResource, History};
use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, KeepAlive, Lease,
    LockExt, LockInfo, LockName, LostReason, MemoryLock, OwnerId, Released, Result, Wait,
    async_trait,
};

use common::dual_url;

const SEC: Duration = Duration::from_secs(1);

/// Keep-alive on the pair the suite's `dual_redis_zk` target runs (Redis first, ZooKeeper
/// second), with every byte to and from ZooKeeper delayed past what is left of a 2 s lease: each
/// renewal comes back too late, so the lock goes, as it must. What must hold is the order: the
/// guard stops claiming the lock (its deadline passes, `lost()` says `ConnectionLost`) before
/// another client can take it. (A loaded machine once let the suite's keep-alive case lose its
/// lock this way; here the delay is the proxy's, every time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_answered_too_late_end_the_lease_before_the_lock_is_free() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let redis = Redis::shared().await.expect("kit Redis");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let behind = zk.url().replacen(
        &format!(":{}", zk.port()),
        &format!(":{}", proxy.addr().port()),
        1,
    );
    let first = format!("{}?prefix=dual-late", redis.url());
    let holder = common::dual(dual_url(&first, &format!("{behind}/dual-late"), ""))
        .await
        .expect("connect the holder");
    let other = common::dual(dual_url(&first, &format!("{}/dual-late", zk.url()), ""))
        .await
        .expect("connect another client");
    let n = "late-renewals";
    let opts = AcquireOptions::new()
        .ttl(2 * SEC)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let g = holder.lock(n, &opts).await.expect("acquire");
    proxy.set(Fault::Latency(3 * SEC));
    let taken = within(60 * SEC, "another client's grant", async {
        loop {
            let try_opts = opts.clone().keep_alive(KeepAlive::Off);
            if let Some(got) = other.try_lock(n, &try_opts).await.expect("try") {
                break (Instant::now(), got);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        g.deadline() <= taken.0,
        "the guard's lease ran {:?} past the moment another client got the lock",
        g.deadline().saturating_duration_since(taken.0)
    );
    assert!(!g.is_held());
    assert_eq!(g.lost_reason(), Some(LostReason::ConnectionLost));
    taken.1.release().await.expect("release");
}

/// With the second store refusing connections, or silent, a dual acquire fails with an error
/// (not a grant, not a hang) and gives the first store's hold back at once: a ZooKeeper-only
/// client gets the name right after. When the link is back, dual clients work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_store_unreachable_fails_cleanly_and_frees_the_first() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let redis = Redis::shared().await.expect("kit Redis");
    let proxy = Proxy::start(redis.addr()).await.expect("proxy");
    let zk_url = format!("{}/dual-unreachable", zk.url());
    let url = dual_url(
        &zk_url,
        &format!(
            "{}?prefix=dual-unreachable&timeout=1s",
            redis.url_via(proxy.addr())
        ),
        "",
    );
    let dual = common::dual(url).await.expect("connect dual");
    let zk_only = common::store(zk_url).await.expect("connect zk");
    let opts = AcquireOptions::new()
        .ttl(10 * SEC)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::For(3 * SEC));
    for (i, fault) in [Fault::Down, Fault::BlackholeReplies]
        .into_iter()
        .enumerate()
    {
        let name = format!("unreachable-{i}");
        proxy.set(fault);
        let got = within(
            30 * SEC,
            "a dual acquire with the second store cut off",
            dual.lock(&name, &opts),
        )
        .await;
        assert!(
            got.is_err(),
            "{fault:?}: the acquire did not fail: {:?}",
            got.map(|g| g.fencing_token())
        );
        // The first store's hold was given back before the error was returned.
        let free = zk_only
            .try_lock(&name, &opts.clone().wait(Wait::No))
            .await
            .expect("zk try_lock")
            .expect("the first store still holds the name after the failed dual acquire");
        free.release().await.expect("release");
        proxy.set(Fault::PassThrough);
        let g = within(60 * SEC, "a dual acquire after the link is back", async {
            loop {
                match dual.lock(&name, &opts).await {
                    Ok(g) => break g,
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        })
        .await;
        g.release().await.expect("release");
    }
}

/// One side's link is cut under a holder with keep-alive: `lost()` fires, and another dual
/// client gets the lock afterwards, without anyone releasing the lost lease, by each store's
/// own expiry (the ZooKeeper session or node, the Redis ttl), with a higher token; the old
/// holder's late write is refused by the fenced resource.
async fn side_lost(which: &str) {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let redis = Redis::shared().await.expect("kit Redis");
    let zk_proxy = Proxy::start(zk.addr()).await.expect("zk proxy");
    let redis_proxy = Proxy::start(redis.addr()).await.expect("redis proxy");
    let chroot = format!("dual-lost-{which}");
    let via_proxies = dual_url(
        &format!(
            "zk://127.0.0.1:{}/{chroot}?session_timeout=4s&timeout=1s",
            zk_proxy.port()
        ),
        &format!(
            "{}?prefix={chroot}&timeout=1s",
            redis.url_via(redis_proxy.addr())
        ),
        "",
    );
    let direct = dual_url(
        &format!("{}/{chroot}?session_timeout=4s", zk.url()),
        &format!("{}?prefix={chroot}", redis.url()),
        "",
    );
    let a: Arc<dyn DistributedLock> = common::dual(via_proxies).await.expect("connect A");
    let b: Arc<dyn DistributedLock> = common::dual(direct).await.expect("connect B");
    let history = History::new();
    let fenced = FencedResource::new();
    let name = "lost";
    let ga = a
        .lock(
            name,
            &AcquireOptions::new()
                .ttl(3 * SEC)
                .keep_alive(KeepAlive::renew())
                .wait(Wait::No),
        )
        .await
        .expect("A acquires");
    let a_hold = history.acquired(0, &ga.lease());
    fenced.write(ga.fencing_token(), 1).expect("A writes");
    match which {
        "first" => zk_proxy.set(Fault::BlackholeReplies),
        _ => redis_proxy.set(Fault::BlackholeReplies),
    }
    let reason = within(30 * SEC, "A's lost() after its link was cut", ga.lost()).await;
    assert!(
        matches!(
            reason,
            LostReason::ConnectionLost | LostReason::Expired | LostReason::SessionExpired
        ),
        "lost() said {reason:?}"
    );
    assert!(!ga.is_held(), "the guard still says it holds");
    history.extended(a_hold, &ga.lease());
    let gb = within(60 * SEC, "B acquires after A's side was lost", async {
        loop {
            match b
                .lock(
                    name,
                    &AcquireOptions::new()
                        .ttl(10 * SEC)
                        .keep_alive(KeepAlive::Off)
                        .wait(Wait::For(5 * SEC)),
                )
                .await
            {
                Ok(g) => break g,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    history.acquired(1, &gb.lease());
    assert!(
        gb.fencing_token() > ga.fencing_token(),
        "B's token {} is not above A's {}",
        gb.fencing_token(),
        ga.fencing_token()
    );
    fenced.write(gb.fencing_token(), 2).expect("B writes");
    assert!(
        fenced.write(ga.fencing_token(), 3).is_err(),
        "A's late write was accepted"
    );
    history.assert_safe();
    gb.release().await.expect("release");
    zk_proxy.set(Fault::PassThrough);
    redis_proxy.set(Fault::PassThrough);
    drop(ga);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_side_connection_lost_fires_lost() {
    side_lost("first").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_side_connection_lost_fires_lost() {
    side_lost("second").await;
}

/// A memory store that misbehaves on cue: its next renewal, once armed, finds the lease lost;
/// and its interrupted waits are cleaned up the way a networked backend's are (by owner id:
/// whatever the id holds on the name is released), and late: the clean-up reaches the store
/// right after the store's next grant, or a second after the wait was dropped.
#[derive(Debug)]
struct Rigged {
    inner: MemoryLock,
    namespace: String,
    lose_next_renewal: AtomicBool,
    lost: tokio::sync::Notify,
    grants: tokio::sync::watch::Sender<u64>,
}

impl Rigged {
    fn new(namespace: &str) -> Arc<Self> {
        Arc::new(Rigged {
            inner: MemoryLock::new(namespace),
            namespace: namespace.to_owned(),
            lose_next_renewal: AtomicBool::new(false),
            lost: tokio::sync::Notify::new(),
            grants: tokio::sync::watch::Sender::new(0),
        })
    }
}

/// The state of a [`Rigged`] wait: what its clean-up needs.
type Waiting = (String, LockName, OwnerId, tokio::sync::watch::Receiver<u64>);

fn release_late((ns, name, owner, mut grants): Waiting) -> Undo {
    Undo::Spawn(Box::pin(async move {
        let _ = tokio::time::timeout(Duration::from_secs(1), grants.changed()).await;
        let store = MemoryLock::new(&ns);
        let Some(LockInfo {
            holder: Some(holder),
            token: Some(token),
            ..
        }) = store.inspect(&name).await?
        else {
            return Ok(false);
        };
        if holder != owner.to_string() {
            return Ok(false);
        }
        let lease = Lease::new(name, owner, token, Instant::now(), SEC, Duration::ZERO);
        Ok(store.release(&lease).await? == Released::Released)
    }))
}

#[async_trait]
impl DistributedLock for Rigged {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }
    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.inner.try_acquire(name, opts).await
    }
    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let owner = opts
            .owner_value()
            .expect("dual names its owner on both stores");
        let mut grants = self.grants.subscribe();
        grants.mark_unchanged();
        let armed = CleanupGuard::arm(
            "rigged",
            name,
            (self.namespace.clone(), name.clone(), owner, grants),
            release_late,
        );
        let got = self.inner.acquire_wait(name, opts, deadline).await;
        let _ = armed.disarm();
        if matches!(got, Ok(Some(_))) {
            self.grants.send_modify(|n| *n += 1);
        }
        got
    }
    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.inner.release(lease).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if self.lose_next_renewal.swap(false, Ordering::SeqCst) {
            self.lost.notify_one();
            return Err(Error::lock_lost("memory", lease.name(), "extend"));
        }
        self.inner.extend(lease, ttl).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

/// The first store's hold is lost while a dual acquire waits for the second store; the acquire
/// starts over, while the abandoned wait's clean-up on the second store (which frees whatever
/// its owner id holds there) is still on its way and lands just after the second store's next
/// grant. The new round's hold survives it, with an owner id of its own or, under one the
/// caller chose, by starting only once that clean-up has ended (and keeping the caller's id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_given_up_after_the_first_hold_was_lost_does_not_free_the_next() {
    for chosen in [None, Some(OwnerId::random())] {
        let tag = if chosen.is_some() { "chosen" } else { "fresh" };
        let (first_ns, second_ns) = (format!("first-lost-1-{tag}"), format!("first-lost-2-{tag}"));
        let (first, second) = (Rigged::new(&first_ns), Rigged::new(&second_ns));
        first.lose_next_renewal.store(true, Ordering::SeqCst);
        let config = DualConfig::parse(&dual_url(
            &format!("memory://{first_ns}"),
            &format!("memory://{second_ns}"),
            "",
        ))
        .expect("dual config");
        let dual = DualLock::new(first.clone(), second.clone(), config).expect("compose");
        let name = LockName::new("job").unwrap();
        let ttl = 3 * SEC;
        // A second-only client holds the name, so the dual acquire waits on the second store.
        let blocker = MemoryLock::new(&second_ns)
            .try_acquire(&name, &AcquireOptions::new().ttl(60 * SEC))
            .await
            .expect("blocker")
            .expect("the second store is free");
        let mut opts = AcquireOptions::new().ttl(ttl);
        if let Some(owner) = chosen {
            opts = opts.owner(owner);
        }
        let deadline = Instant::now() + 60 * SEC;
        let acquiring = tokio::spawn(async move {
            let got = dual.acquire_wait(&name, &opts, Some(deadline)).await;
            (dual, got)
        });
        within(
            30 * SEC,
            "the first hold's lost renewal",
            first.lost.notified(),
        )
        .await;
        assert_eq!(
            MemoryLock::new(&second_ns).release(&blocker).await.unwrap(),
            Released::Released
        );
        let (dual, got) = within(30 * SEC, "the dual acquire", acquiring)
            .await
            .unwrap();
        let lease = got
            .expect("the dual acquire")
            .expect("granted once the blocker left");
        if let Some(owner) = chosen {
            assert_eq!(
                lease.owner(),
                owner,
                "{tag}: the caller's owner id was not kept"
            );
        }
        assert!(
            lockcore::cleanup::settle(30 * SEC).await,
            "{tag}: clean-ups still running"
        );
        let held = second.inspect(lease.name()).await.unwrap();
        assert_eq!(
            held.as_ref().and_then(|i| i.holder.clone()),
            Some(lease.owner().to_string()),
            "{tag}: the abandoned round's clean-up freed the new round's hold on the second store: {held:?}"
        );
        let renewed = dual
            .extend(&lease, ttl)
            .await
            .unwrap_or_else(|e| panic!("{tag}: the dual lease cannot be renewed: {e}"));
        assert_eq!(dual.release(&renewed).await.unwrap(), Released::Released);
    }
}
