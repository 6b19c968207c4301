//! Waiting: timeouts that leave nothing behind, dropped acquires, long waits, FIFO order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{AcquireOptions, Error, KeepAlive, LockExt, LockName, Released, Wait};

use super::{SEC, is_free, lease_opts, ms, promise_kept, within};
use crate::Ctx;

/// `Wait::For(200 ms)` on a held lock returns `Timeout` and leaves nothing behind: once the holder
/// releases, a third client gets the lock at once.
pub async fn wait_for_timeout_leaves_no_trace(ctx: Ctx) {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let ga = a.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
    match b
        .lock(&n, &lease_opts(30 * SEC).wait(Wait::For(ms(200))))
        .await
    {
        Err(Error::Timeout { waited, .. }) => assert_eq!(waited, ms(200)),
        other => panic!("expected Timeout, got {other:?}"),
    }
    ga.release().await.expect("release");
    let info = c
        .inspect(&LockName::new(&n).unwrap())
        .await
        .expect("inspect");
    if let Some(w) = info.as_ref().and_then(|i| i.waiters) {
        assert_eq!(w, 0, "a timed-out waiter is still queued");
    }
    assert!(
        is_free(&c, &n).await,
        "the lock is not free after the holder released and the waiter timed out"
    );
}

/// Dropping a pending acquire (while waiting, and racing a release) leaves no lock or queue
/// entry behind: the next acquirer does not wait out a ttl.
pub async fn dropped_acquire_leaves_nothing(ctx: Ctx) {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let long = AcquireOptions::new()
        .ttl(60 * SEC)
        .keep_alive(KeepAlive::Off);
    // Dropped while queued behind a holder.
    let ga = a
        .lock(&n, &long.clone().wait(Wait::No))
        .await
        .expect("acquire");
    let waiter = {
        let (b, n, long) = (b.clone(), n.clone(), long.clone());
        tokio::spawn(async move { b.lock(&n, &long.wait(Wait::Forever)).await })
    };
    tokio::time::sleep(ms(100)).await;
    waiter.abort();
    assert!(
        waiter.await.is_err_and(|e| e.is_cancelled()),
        "the waiter should have been cancelled"
    );
    ga.release().await.expect("release");
    let g = within(
        30 * SEC,
        "next acquirer",
        c.lock(&n, &long.clone().wait(Wait::For(10 * SEC))),
    )
    .await
    .expect("the next acquirer must not wait out the ttl of a dropped acquire");
    g.release().await.expect("release");
    // Dropped at varying points around a release, so some drops land after the grant.
    for round in 0..20u64 {
        let ga = a
            .lock(&n, &long.clone().wait(Wait::For(10 * SEC)))
            .await
            .expect("acquire");
        let pending = {
            let (b, n, long) = (b.clone(), n.clone(), long.clone());
            tokio::spawn(async move { b.lock(&n, &long.wait(Wait::Forever)).await })
        };
        tokio::time::sleep(ms(5)).await;
        ga.release().await.expect("release");
        tokio::time::sleep(Duration::from_micros(round * 250)).await;
        pending.abort();
        if let Ok(Ok(g)) = pending.await {
            // It won before the abort; releasing it is the normal path.
            g.release().await.expect("release");
        }
        let g = within(
            30 * SEC,
            "acquirer after a dropped waiter",
            c.lock(&n, &long.clone().wait(Wait::For(10 * SEC))),
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: a dropped acquire left the lock held: {e}"));
        g.release().await.expect("release");
    }
}

/// A waiter that waited longer than twice its ttl gets a lease counted from the request that
/// granted it, not from when it began to wait: it then holds for two more ttls with renewal, and
/// nobody else gets in meanwhile.
pub async fn long_waiter_keeps_its_lease(ctx: Ctx) {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    // Renewed every 500 ms: a renewal may be almost a second late (a busy SQLite file on a
    // loaded machine) before a lease is lost; with 800 ms it could be under half a second.
    let ttl = ms(1500);
    let renewed = AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew());
    let ga = a
        .lock(&n, &renewed.clone().wait(Wait::No))
        .await
        .expect("a acquires a free lock");
    let waiter = {
        let (b, n, opts) = (b.clone(), n.clone(), renewed.clone());
        tokio::spawn(async move {
            let asked = Instant::now();
            let g = b.lock(&n, &opts.wait(Wait::For(60 * SEC))).await;
            (asked, g)
        })
    };
    // The holder keeps the lock (renewed) for more than two of the waiter's ttls.
    tokio::time::sleep(3 * ttl).await;
    assert!(
        ga.is_held(),
        "the holder lost a renewed lock while b waited"
    );
    ga.release().await.expect("release");
    let (asked, gb) = within(60 * SEC, "the waiter's acquire", waiter)
        .await
        .expect("waiter task panicked");
    let gb = gb.expect("the waiter gets the lock once the holder releases");
    let granted = Instant::now();
    assert!(
        granted.duration_since(asked) > 2 * ttl,
        "the case needs a wait longer than 2 × ttl"
    );
    assert!(
        gb.lease().valid_until() > granted,
        "the waiter's lease was already over when it was granted: validity counted from the \
         start of the wait ({:?} before the grant), not from the granting request",
        granted.saturating_duration_since(gb.lease().valid_until())
    );
    promise_kept(&b, &gb.lease()).await;
    let token = gb.fencing_token();
    let until = granted + 2 * ttl;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 4).await;
        assert_eq!(
            gb.lost_reason(),
            None,
            "the waiter lost its lock {:?} after the grant",
            granted.elapsed()
        );
        assert!(gb.is_held(), "the waiter's lease ran out while renewed");
        assert!(
            !is_free(&c, &n).await,
            "a third client got the lock while the waiter held it"
        );
    }
    assert_eq!(gb.fencing_token(), token, "renewals changed the token");
    assert_eq!(gb.release().await.expect("release"), Released::Released);
}

/// On a FIFO backend, blocked acquirers are served in arrival order and `try_lock` does not jump
/// a non-empty queue.
pub async fn fifo_waiters_served_in_order(ctx: Ctx) {
    let holder = ctx.client().await;
    let n = ctx.name("x");
    let name = LockName::new(&n).unwrap();
    let g = holder
        .lock(&n, &lease_opts(60 * SEC))
        .await
        .expect("acquire");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let c = ctx.client().await;
        let (n, order) = (n.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new()
                .ttl(30 * SEC)
                .keep_alive(KeepAlive::Off)
                .wait(Wait::For(60 * SEC));
            let g = c.lock(&n, &opts).await.expect("queued acquire");
            order.lock().unwrap().push(i);
            tokio::time::sleep(ms(5)).await;
            g.release().await.expect("release");
        }));
        // Wait until this waiter is queued before starting the next, so arrival order is known.
        within(30 * SEC, "waiter queued", async {
            loop {
                let q = holder
                    .inspect(&name)
                    .await
                    .expect("inspect")
                    .and_then(|i| i.waiters);
                if q == Some(i + 1) {
                    break;
                }
                tokio::time::sleep(ms(5)).await;
            }
        })
        .await;
    }
    let intruder = ctx.client().await;
    g.release().await.expect("release");
    // Right after the release the queue is non-empty: a try_lock must not jump it.
    if let Some(stolen) = intruder
        .try_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("try_lock")
    {
        stolen.release().await.expect("release");
        panic!("try_lock jumped a non-empty FIFO queue");
    }
    for t in tasks {
        within(60 * SEC, "waiter", t).await.expect("task panicked");
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1, 2, 3, 4],
        "waiters were not served in arrival order"
    );
}
