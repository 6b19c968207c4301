//! Faults only a composite has: one of its two stores unreachable while the other is held,
//! and one side's connection lost under a holder. The stores are a kit ZooKeeper server and a
//! kit Redis server, each behind the kit's proxy where the scenario cuts the link. (A dual
//! client killed -9 is in dlock/tests/cli_dual.rs, which has the `dlock` binary to kill.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::kit::{Fault, Proxy, Redis, ZooKeeper};
use conformance_tests::{FencedResource, History};
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LostReason, Wait};

use common::dual_url;

const SEC: Duration = Duration::from_secs(1);

async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: did not finish within {limit:?}"))
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
