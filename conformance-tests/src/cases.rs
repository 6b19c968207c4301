//! One `pub async fn` per conformance case. Each takes a [`Ctx`] (independent clients, unique
//! names) and panics with a message naming what went wrong.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, DistributedLock, Error, FencingToken, KeepAlive, Lease, LockExt, LockName,
    LostReason, OwnerId, Released, Wait,
};

use crate::{Ctx, FencedResource, History};

const SEC: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Options for a plain ttl lease: no keep-alive, one attempt.
fn lease_opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
}

/// Fails the case if `fut` does not finish within `limit` (a hang guard, not a timing goal).
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

async fn is_free(c: &Arc<dyn DistributedLock>, name: &str) -> bool {
    match c
        .try_lock(name, &lease_opts(10 * SEC))
        .await
        .expect("try_lock")
    {
        Some(g) => {
            g.release().await.expect("release");
            true
        }
        None => false,
    }
}

/// Two clients: while one holds, the other's attempts fail with "held", not an error; after
/// release the other gets it; `inspect` reports the holder.
pub async fn basic_exclusivity(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let ga = a
        .lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("a acquires a free lock");
    assert!(
        b.try_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_lock")
            .is_none(),
        "b acquired a held lock"
    );
    match b.lock(&n, &lease_opts(30 * SEC)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("lock with Wait::No on a held lock should be Timeout, got {other:?}"),
    }
    let info = b
        .inspect(&LockName::new(&n).unwrap())
        .await
        .expect("inspect")
        .expect("inspect sees the lock");
    assert_eq!(
        info.holder.as_deref(),
        Some(ga.lease().owner().to_string().as_str()),
        "inspect names the holder"
    );
    assert_eq!(
        info.token,
        Some(ga.fencing_token()),
        "inspect shows the holder's token"
    );
    assert_eq!(ga.release().await.expect("release"), Released::Released);
    let gb = b
        .try_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("try_lock")
        .expect("b acquires after release");
    assert!(gb.fencing_token() > FencingToken(0));
    gb.release().await.expect("release");
    let info = a
        .inspect(&LockName::new(&n).unwrap())
        .await
        .expect("inspect");
    assert!(
        info.as_ref().is_none_or(|i| !i.is_held()),
        "inspect shows a released lock as held: {info:?}"
    );
}

/// 50 tasks over 5 clients contend for one name; a shared counter of holders never exceeds 1 and
/// every task finishes.
pub async fn mutual_exclusion_50_tasks(ctx: Ctx) {
    let n = ctx.name("x");
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(ctx.client().await);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let history = Arc::new(History::new());
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (c, n, inside, max_seen, done, history) = (
            clients[i % 5].clone(),
            n.clone(),
            inside.clone(),
            max_seen.clone(),
            done.clone(),
            history.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new()
                .ttl(30 * SEC)
                .keep_alive(KeepAlive::Off)
                .wait(Wait::For(120 * SEC));
            let g = c.lock(&n, &opts).await.expect("acquire under contention");
            let id = history.acquired(i, &g.lease());
            let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
            max_seen.fetch_max(now_inside, Ordering::SeqCst);
            tokio::time::sleep(ms(1)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            history.ended(id);
            g.release().await.expect("release");
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    for t in tasks {
        within(150 * SEC, "contending task", t)
            .await
            .expect("task panicked");
    }
    assert_eq!(
        max_seen.load(Ordering::SeqCst),
        1,
        "two tasks held the lock at once"
    );
    assert_eq!(done.load(Ordering::SeqCst), 50, "not every task finished");
    history.assert_safe();
}

/// 16 simultaneous `try_lock`s from 4 clients: exactly one wins, the others get `None`.
pub async fn try_acquire_race(ctx: Ctx) {
    let n = ctx.name("x");
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(ctx.client().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (c, n, barrier) = (clients[i % 4].clone(), n.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.try_lock(&n, &lease_opts(30 * SEC)).await
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(Some(g)) => winners.push(g),
            Ok(None) => {}
            Err(e) => panic!("a losing try_lock must return None, not an error: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one try_lock must win");
    for g in winners {
        g.release().await.expect("release");
    }
}

/// Another owner's lease, a forged lease and a stale lease cannot release or extend the holder.
pub async fn owner_only_release(ctx: Ctx) {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let name = LockName::new(&n).unwrap();
    // A stale lease: a held it with a short ttl and it ran out; b holds it now.
    let stale = a
        .try_acquire(&name, &lease_opts(ms(100)))
        .await
        .expect("try_acquire")
        .expect("free");
    tokio::time::sleep(ms(300)).await;
    let gb = within(
        30 * SEC,
        "b acquires after expiry",
        b.lock(&n, &lease_opts(30 * SEC).wait(Wait::For(20 * SEC))),
    )
    .await
    .expect("b acquires after a's lease expired");
    assert_eq!(
        a.release(&stale).await.expect("release"),
        Released::NotHeld,
        "a stale lease released the holder"
    );
    assert!(
        matches!(
            a.extend(&stale, 30 * SEC).await,
            Err(Error::LockLost { .. })
        ),
        "a stale lease extended"
    );
    // A forged lease: right name and token, wrong owner.
    let forged = Lease::new(
        name.clone(),
        OwnerId::random(),
        gb.fencing_token(),
        Instant::now(),
        30 * SEC,
        ms(2),
    );
    assert_eq!(
        c.release(&forged).await.expect("release"),
        Released::NotHeld,
        "a forged owner released the holder"
    );
    assert!(
        matches!(
            c.extend(&forged, 30 * SEC).await,
            Err(Error::LockLost { .. })
        ),
        "a forged owner extended"
    );
    // Right owner, wrong token.
    let wrong_token = Lease::new(
        name.clone(),
        gb.lease().owner(),
        FencingToken(gb.fencing_token().0 + 1000),
        Instant::now(),
        30 * SEC,
        ms(2),
    );
    assert_eq!(
        c.release(&wrong_token).await.expect("release"),
        Released::NotHeld,
        "a wrong token released"
    );
    assert!(
        !is_free(&c, &n).await,
        "the holder lost the lock to another owner's release"
    );
    assert_eq!(gb.release().await.expect("release"), Released::Released);
}

/// Releasing twice: the first reports `Released`, the second `NotHeld`, and neither frees a later
/// holder.
pub async fn idempotent_release(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let g = a.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
    let lease = g.lease();
    assert_eq!(g.release().await.expect("release"), Released::Released);
    assert_eq!(
        a.release(&lease).await.expect("second release"),
        Released::NotHeld
    );
    let gb = b.lock(&n, &lease_opts(30 * SEC)).await.expect("b acquires");
    assert_eq!(
        a.release(&lease).await.expect("third release"),
        Released::NotHeld
    );
    assert!(
        !is_free(&a, &n).await,
        "an old lease's second release freed the new holder"
    );
    gb.release().await.expect("release");
}

/// A lease extended before it expires keeps a contender out past the original ttl, with the same
/// token.
pub async fn extend_keeps_contender_out(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let g = a.lock(&n, &lease_opts(SEC)).await.expect("acquire");
    let token = g.fencing_token();
    g.extend(30 * SEC).await.expect("extend before expiry");
    assert_eq!(g.fencing_token(), token, "extend changed the token");
    assert!(
        g.lease().valid_until() > g.lease().acquired_at() + 20 * SEC,
        "extend did not move valid_until"
    );
    tokio::time::sleep(ms(1500)).await;
    assert!(
        !is_free(&b, &n).await,
        "a contender got the lock after the original ttl despite the extension"
    );
    assert_eq!(g.release().await.expect("release"), Released::Released);
}

/// Tokens strictly increase across release and takeover by other clients.
pub async fn fencing_tokens_increase(ctx: Ctx) {
    let clients = [ctx.client().await, ctx.client().await, ctx.client().await];
    let n = ctx.name("x");
    let mut last = None;
    for round in 0..9 {
        let c = &clients[round % 3];
        let g = c.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
        let t = g.fencing_token();
        if let Some(prev) = last {
            assert!(
                t > prev,
                "round {round}: token {t} not above previous {prev}"
            );
        }
        last = Some(t);
        g.release().await.expect("release");
    }
}

/// Tokens strictly increase when a lease expires and another client takes over.
pub async fn fencing_tokens_increase_across_expiry(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let ga = a.lock(&n, &lease_opts(ms(100))).await.expect("acquire");
    let t1 = ga.fencing_token();
    std::mem::forget(ga); // never released: it must expire
    let gb = within(
        30 * SEC,
        "takeover",
        b.lock(&n, &lease_opts(30 * SEC).wait(Wait::For(20 * SEC))),
    )
    .await
    .expect("b takes over after expiry");
    assert!(
        gb.fencing_token() > t1,
        "takeover token {} not above {}",
        gb.fencing_token(),
        t1
    );
    gb.release().await.expect("release");
}

/// An owner handle takes a name again while holding it: same token, holds balance, others stay
/// out until the last release.
pub async fn reentrant_balance(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let owner = a.owner();
    let opts = lease_opts(30 * SEC);
    let g1 = owner.lock(&n, &opts).await.expect("first hold");
    let g2 = owner.lock(&n, &opts).await.expect("reentrant hold");
    let g3 = owner
        .clone()
        .lock(&n, &opts)
        .await
        .expect("reentrant hold through a clone of the owner");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    assert_eq!(g1.fencing_token(), g3.fencing_token());
    assert_eq!(owner.hold_count(&n), 3);
    let stranger = a.owner();
    assert!(
        matches!(stranger.lock(&n, &opts).await, Err(Error::Timeout { .. })),
        "another owner on the same client got a held lock"
    );
    assert_eq!(
        g3.release().await.expect("release"),
        None,
        "a non-final release must not release the lock"
    );
    drop(g2);
    assert_eq!(owner.hold_count(&n), 1);
    assert!(
        !is_free(&b, &n).await,
        "the lock was freed before the last hold ended"
    );
    assert_eq!(
        g1.release().await.expect("release"),
        Some(Released::Released)
    );
    assert_eq!(owner.hold_count(&n), 0);
    assert!(
        is_free(&b, &n).await,
        "the lock stayed held after the last hold ended"
    );
}

/// `lock_many` takes all names or none: with one name held elsewhere it fails and leaves the
/// others free; once free it takes them all.
pub async fn multi_lock_all_or_nothing(ctx: Ctx) {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let (x, y, z) = (ctx.name("x"), ctx.name("y"), ctx.name("z"));
    let gy = b.lock(&y, &lease_opts(30 * SEC)).await.expect("b holds y");
    let opts = lease_opts(30 * SEC).wait(Wait::For(ms(300)));
    match a.lock_many(&[&z, &y, &x], &opts).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("lock_many with one name held must time out, got {other:?}"),
    }
    assert!(
        is_free(&c, &x).await,
        "x was left held after a failed lock_many"
    );
    assert!(
        is_free(&c, &z).await,
        "z was left held after a failed lock_many"
    );
    gy.release().await.expect("release");
    let all = a
        .lock_many(&[&z, &y, &x, &y], &opts)
        .await
        .expect("lock_many when all are free");
    let names: Vec<String> = all
        .tokens()
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(names.len(), 3, "duplicates must be removed");
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "locks must be taken in canonical order");
    for n in [&x, &y, &z] {
        assert!(!is_free(&c, n).await, "{n} not held after lock_many");
    }
    all.release().await.expect("release all");
    assert!(is_free(&c, &y).await);
}

/// Two clients asking for the same set in opposite orders, many times, never deadlock and never
/// hold the set together.
pub async fn multi_lock_no_deadlock(ctx: Ctx) {
    let names = [ctx.name("p"), ctx.name("q"), ctx.name("r")];
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for reverse in [false, true] {
        let c = ctx.client().await;
        let mut ns = names.clone();
        if reverse {
            ns.reverse();
        }
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new()
                .ttl(30 * SEC)
                .keep_alive(KeepAlive::Off)
                .wait(Wait::For(60 * SEC));
            for _ in 0..15 {
                let refs: Vec<&str> = ns.iter().map(String::as_str).collect();
                let g = c.lock_many(&refs, &opts).await.expect("lock_many");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "both clients held the set"
                );
                tokio::time::sleep(ms(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        within(120 * SEC, "opposite-order lock_many", t)
            .await
            .expect("task panicked");
    }
}

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

/// Dropping a guard without calling release frees the lock promptly (not at its ttl).
pub async fn dropping_guard_releases(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let g = a.lock(&n, &lease_opts(120 * SEC)).await.expect("acquire");
    drop(g);
    let gb = b
        .lock(&n, &lease_opts(30 * SEC).wait(Wait::For(20 * SEC)))
        .await
        .expect("a dropped guard must release well before its 120 s ttl");
    gb.release().await.expect("release");
}

/// A lease with ttl 300 ms and keep-alive stays held for many ttls.
pub async fn keep_alive_holds_past_ttl(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let opts = AcquireOptions::new()
        .ttl(ms(600))
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let g = a.lock(&n, &opts).await.expect("acquire");
    let token = g.fencing_token();
    for _ in 0..6 {
        tokio::time::sleep(ms(300)).await;
        assert!(!is_free(&b, &n).await, "keep-alive let the lock go");
    }
    assert!(g.is_held(), "the guard thinks it lost a renewed lock");
    assert_eq!(g.fencing_token(), token, "renewals changed the token");
    assert_eq!(g.lost_reason(), None);
    assert_eq!(g.release().await.expect("release"), Released::Released);
}

/// A renewal cap stops keep-alive; `lost()` then reports `RenewalLimit` and the lock frees.
pub async fn keep_alive_renewal_cap_ends_lease(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let opts = AcquireOptions::new()
        .ttl(ms(300))
        .keep_alive(KeepAlive::max_renewals(2))
        .wait(Wait::No);
    let g = a.lock(&n, &opts).await.expect("acquire");
    let reason = within(30 * SEC, "lost() after the renewal cap", g.lost()).await;
    assert_eq!(reason, LostReason::RenewalLimit);
    assert!(!g.is_held());
    let gb = within(
        30 * SEC,
        "takeover",
        b.lock(&n, &lease_opts(30 * SEC).wait(Wait::For(20 * SEC))),
    )
    .await
    .expect("the lock frees after the capped lease runs out");
    gb.release().await.expect("release");
    drop(g);
}

/// A lease that is not renewed expires: the lock frees, but not before `valid_until`.
pub async fn ttl_expiry_frees_lock(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let ga = a.lock(&n, &lease_opts(SEC)).await.expect("acquire");
    let valid_until = ga.lease().valid_until();
    let gb = within(
        60 * SEC,
        "takeover after expiry",
        b.lock(&n, &lease_opts(30 * SEC).wait(Wait::For(30 * SEC))),
    )
    .await
    .expect("the lock must free after its ttl");
    let taken_at = Instant::now();
    assert!(
        taken_at >= valid_until,
        "another client got the lock before the first lease's valid_until (ttl − drift)"
    );
    assert!(gb.fencing_token() > ga.fencing_token());
    gb.release().await.expect("release");
    std::mem::forget(ga);
}

/// Extending an expired lease fails with `LockLost` and does not bring the lock back, whether or
/// not someone else took it meanwhile.
pub async fn extend_after_expiry_is_lock_lost(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let name = LockName::new(&n).unwrap();
    let l1 = a
        .try_acquire(&name, &lease_opts(ms(100)).with_defaults(&a.defaults()))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(ms(400)).await;
    assert!(
        matches!(a.extend(&l1, 30 * SEC).await, Err(Error::LockLost { .. })),
        "an expired lease was extended"
    );
    assert!(
        is_free(&b, &n).await,
        "a failed extend resurrected the lock"
    );
    let gb = b.lock(&n, &lease_opts(30 * SEC)).await.expect("b acquires");
    assert!(
        matches!(a.extend(&l1, 30 * SEC).await, Err(Error::LockLost { .. })),
        "a taken lease was extended"
    );
    assert!(!is_free(&a, &n).await, "b lost the lock to a's extend");
    gb.release().await.expect("release");
}

/// Without keep-alive, `lost()` resolves `Expired` once the lease runs out, and the store then
/// lets another client take the lock.
pub async fn lost_fires_expired(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let g = a.lock(&n, &lease_opts(ms(200))).await.expect("acquire");
    assert!(g.is_held());
    let reason = within(30 * SEC, "lost()", g.lost()).await;
    assert_eq!(reason, LostReason::Expired);
    assert!(!g.is_held());
    assert!(Instant::now() >= g.lease().valid_until());
    // The store must agree: the lease is really gone.
    let gb = within(
        30 * SEC,
        "takeover",
        b.lock(&n, &lease_opts(30 * SEC).wait(Wait::For(20 * SEC))),
    )
    .await
    .expect("lost() said Expired but the store still holds the lease");
    gb.release().await.expect("release");
    drop(g);
}

/// With keep-alive, `lost()` resolves `Taken` when a renewal finds the lock gone before the lease
/// ran out (here: released behind the guard's back and taken by another client).
pub async fn lost_fires_taken(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let opts = AcquireOptions::new()
        .ttl(3 * SEC)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let g = a.lock(&n, &opts).await.expect("acquire");
    assert_eq!(
        a.release(&g.lease())
            .await
            .expect("release behind the guard"),
        Released::Released
    );
    let gb = b
        .lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("b takes the lock");
    let reason = within(30 * SEC, "lost()", g.lost()).await;
    assert_eq!(reason, LostReason::Taken);
    assert!(!g.is_held());
    gb.release().await.expect("release");
    drop(g);
}

/// `with_lock` runs the work with the token, returns its value and releases.
pub async fn with_lock_returns_and_releases(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let seen = a
        .with_lock(&n, &lease_opts(30 * SEC), |token| async move { token })
        .await
        .expect("with_lock");
    assert!(seen > FencingToken(0));
    let g = b
        .lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("the lock is free after with_lock");
    assert!(g.fencing_token() > seen);
    g.release().await.expect("release");
}

/// `with_lock` drops the work future when the lock is lost and returns `LockLost`.
pub async fn with_lock_stops_work_when_lost(ctx: Ctx) {
    let a = ctx.client().await;
    let n = ctx.name("x");
    let finished = Arc::new(AtomicUsize::new(0));
    let f2 = finished.clone();
    let out = within(
        60 * SEC,
        "with_lock",
        a.with_lock(&n, &lease_opts(ms(300)), move |_| async move {
            tokio::time::sleep(30 * SEC).await;
            f2.fetch_add(1, Ordering::SeqCst);
        }),
    )
    .await;
    assert!(
        matches!(out, Err(Error::LockLost { .. })),
        "expected LockLost, got {out:?}"
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the work ran to completion after the lock was lost"
    );
}

/// Empty, NUL-bearing and 1025-byte names are rejected with `InvalidName` by every entry point,
/// before any call reaches the backend.
pub async fn bad_names_rejected_before_io(ctx: Ctx) {
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let long = "n".repeat(1025);
    let opts = lease_opts(30 * SEC);
    for bad in ["", "a\0b", long.as_str()] {
        assert!(
            matches!(c.lock(bad, &opts).await, Err(Error::InvalidName { .. })),
            "lock({bad:?})"
        );
        assert!(
            matches!(c.try_lock(bad, &opts).await, Err(Error::InvalidName { .. })),
            "try_lock"
        );
        assert!(
            matches!(
                c.lock_many(&["ok", bad], &opts).await,
                Err(Error::InvalidName { .. })
            ),
            "lock_many"
        );
        assert!(
            matches!(
                c.owner().lock(bad, &opts).await,
                Err(Error::InvalidName { .. })
            ),
            "owner.lock"
        );
        assert!(
            matches!(
                c.with_lock(bad, &opts, |_| async {}).await,
                Err(Error::InvalidName { .. })
            ),
            "with_lock"
        );
    }
    assert_eq!(counting.calls(), 0, "a bad name reached the backend");
}

/// ttl below 10 ms or above 7 days, drift ≥ ttl and a keep-alive interval ≥ the lease validity
/// are rejected with `InvalidArgument` before any call reaches the backend.
pub async fn bad_options_rejected_before_io(ctx: Ctx) {
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let n = ctx.name("x");
    let bad = [
        AcquireOptions::new().ttl(ms(9)),
        AcquireOptions::new().ttl(lockcore::MAX_TTL + ms(1)),
        AcquireOptions::new().ttl(SEC).drift(SEC),
        AcquireOptions::new()
            .ttl(SEC)
            .keep_alive(KeepAlive::every(2 * SEC)),
    ];
    for opts in &bad {
        for wait in [Wait::No, Wait::For(SEC), Wait::Forever] {
            let o = opts.clone().wait(wait);
            assert!(
                matches!(c.lock(&n, &o).await, Err(Error::InvalidArgument { .. })),
                "lock {o:?}"
            );
            assert!(
                matches!(
                    c.lock_many(&[&n], &o).await,
                    Err(Error::InvalidArgument { .. })
                ),
                "lock_many {o:?}"
            );
            assert!(
                matches!(
                    c.owner().lock(&n, &o).await,
                    Err(Error::InvalidArgument { .. })
                ),
                "owner {o:?}"
            );
        }
    }
    assert_eq!(counting.calls(), 0, "bad options reached the backend");
}

/// Names at the edges (1024 bytes, `/`, `.`, `..`, `zookeeper`, spaces, unicode, case variants,
/// escape look-alikes) are usable and stay distinct: all are held at once.
pub async fn unusual_names_usable_and_distinct(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let run = ctx.name("");
    let long_a = format!("{run}{}", "x".repeat(1024 - run.len()));
    let long_b = format!("{}y", &long_a[..1023]);
    assert_eq!(long_a.len(), 1024);
    let mut names = vec![long_a, long_b];
    for n in [
        "/",
        ".",
        "..",
        "zookeeper",
        "a b",
        "ünïcødé 🔒",
        "Case",
        "case",
        "CASE",
        "/a/b",
        "a/b",
        "a%2Fb",
        "a:b",
        "{x}",
        "*",
        "'; DROP TABLE x; --",
        "\\",
        "%",
        "%25",
    ] {
        names.push(format!("{run}{n}"));
    }
    for n in &names {
        ctx.note_name(n);
    }
    // Bare edge names too, outside the run's prefix (not on a user's store: see
    // `Target::bare_names`); ttl short so a crashed run cannot block the next for long.
    if ctx.target().allows_bare_names() {
        for n in [".", "..", "zookeeper", "/"] {
            names.push(n.to_owned());
        }
    }
    let opts = lease_opts(20 * SEC).wait(Wait::For(30 * SEC));
    let mut guards = Vec::new();
    for n in &names {
        let g = a
            .lock(n, &opts)
            .await
            .unwrap_or_else(|e| panic!("name {n:?} not usable: {e}"));
        guards.push(g);
    }
    for n in &names {
        assert!(
            !is_free(&b, n).await,
            "name {n:?} looks free while held: two names share a key"
        );
    }
    for g in guards {
        assert_eq!(g.release().await.expect("release"), Released::Released);
    }
    for n in &names {
        assert!(is_free(&b, n).await, "name {n:?} still held after release");
    }
}

/// Four clients contend with keep-alive off and write to a fenced resource while holding; the
/// recorded history has no overlapping holders, tokens increase, and the resource rejects nothing
/// (nobody wrote stale) and accepts no lower token.
pub async fn history_is_safe_under_contention(ctx: Ctx) {
    let n = ctx.name("x");
    let history = Arc::new(History::new());
    let resource = Arc::new(FencedResource::new());
    let mut tasks = Vec::new();
    for client in 0..4 {
        let c = ctx.client().await;
        let (n, history, resource) = (n.clone(), history.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new()
                .ttl(10 * SEC)
                .keep_alive(KeepAlive::Off)
                .wait(Wait::For(60 * SEC));
            for i in 0..10u64 {
                let g = c.lock(&n, &opts).await.expect("acquire");
                let id = history.acquired(client, &g.lease());
                resource
                    .write(g.fencing_token(), client as u64 * 100 + i)
                    .expect("a current holder was rejected");
                tokio::task::yield_now().await;
                history.ended(id);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        within(120 * SEC, "contending client", t)
            .await
            .expect("task panicked");
    }
    history.assert_safe();
    assert_eq!(history.holds().len(), 40);
    assert_eq!(resource.rejected(), 0);
    resource.assert_never_accepted_stale();
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

/// `forget` deletes every trace of a name (fence included) only when nobody holds it or waits
/// for it: held, it says `false` and the holder keeps the lock; free, it says `true` and
/// `inspect` no longer knows the name; the name is usable again afterwards.
pub async fn forget_removes_only_free_names(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let name = LockName::new(&n).unwrap();
    let g = a.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
    assert!(
        !b.forget(&name).await.expect("forget of a held name"),
        "forget removed a held lock"
    );
    assert!(
        b.try_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_lock")
            .is_none(),
        "forget freed a held lock"
    );
    assert_eq!(g.release().await.expect("release"), Released::Released);
    assert!(
        b.forget(&name).await.expect("forget of a free name"),
        "forget kept a free name"
    );
    let info = b.inspect(&name).await.expect("inspect");
    assert!(
        info.is_none(),
        "inspect still knows a forgotten name: {info:?}"
    );
    let g = b
        .try_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("try_lock")
        .expect("a forgotten name can be locked again");
    g.release().await.expect("release");
    assert!(b.forget(&name).await.expect("forget"), "second forget");
}

/// Several readers from different clients hold a name together; a writer (and `lock`, the
/// same exclusive hold) waits until the last reader releases.
pub async fn rw_readers_share_writer_waits(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let clients = [ctx.client().await, ctx.client().await, ctx.client().await];
    let writer = ctx.client().await;
    let n = ctx.name("x");
    let mut readers = Vec::new();
    for c in &clients {
        readers.push(
            c.try_read_lock(&n, &lease_opts(30 * SEC))
                .await
                .expect("try_read_lock")
                .expect("a reader must share with other readers"),
        );
    }
    assert!(
        writer
            .try_write_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_write_lock")
            .is_none(),
        "a writer got in while readers held"
    );
    assert!(
        writer
            .try_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_lock")
            .is_none(),
        "the exclusive lock got in while readers held"
    );
    let waiting = {
        let (writer, n) = (writer.clone(), n.clone());
        tokio::spawn(async move {
            writer
                .write_lock(&n, &lease_opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    let last = readers.pop().expect("three readers");
    for r in readers {
        assert_eq!(r.release().await.expect("release"), Released::Released);
    }
    tokio::time::sleep(ms(100)).await;
    assert!(
        !waiting.is_finished(),
        "the writer got in while a reader still held"
    );
    assert_eq!(last.release().await.expect("release"), Released::Released);
    let w = within(30 * SEC, "the writer after the readers", waiting)
        .await
        .expect("task")
        .expect("the writer gets the lock once the readers are gone");
    w.release().await.expect("release");
}

/// A writer excludes readers and other writers until it releases; then a reader gets in.
pub async fn rw_writer_excludes_readers_and_writers(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let w = a
        .write_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("write_lock on a free name");
    assert!(
        b.try_read_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_read_lock")
            .is_none(),
        "a reader got in while a writer held"
    );
    assert!(
        b.try_write_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_write_lock")
            .is_none(),
        "a second writer got in"
    );
    match b
        .read_lock(&n, &lease_opts(30 * SEC).wait(Wait::For(ms(200))))
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a bounded read_lock on a written name should time out, got {other:?}"),
    }
    assert_eq!(w.release().await.expect("release"), Released::Released);
    let r = b
        .try_read_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("try_read_lock")
        .expect("a reader gets in after the writer released");
    r.release().await.expect("release");
}

/// Readers keep coming (each overlapping the next) while a writer waits: once the writer is
/// queued, later readers queue behind it, so the writer gets the lock, and no reader holds
/// while it does.
pub async fn rw_no_writer_starvation(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let n = ctx.name("x");
    let writer = ctx.client().await;
    let inside_readers = Arc::new(AtomicUsize::new(0));
    let writer_inside = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let violations = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first = ctx
        .client()
        .await
        .read_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("the first reader");
    let mut stream = Vec::new();
    for _ in 0..3 {
        let c = ctx.client().await;
        let (n, inside, writer_inside, violations, stop) = (
            n.clone(),
            inside_readers.clone(),
            writer_inside.clone(),
            violations.clone(),
            stop.clone(),
        );
        stream.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let opts = lease_opts(30 * SEC).wait(Wait::For(60 * SEC));
                let r = c.read_lock(&n, &opts).await.expect("a reader");
                inside.fetch_add(1, Ordering::SeqCst);
                if writer_inside.load(Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(ms(30)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                r.release().await.expect("release");
            }
        }));
    }
    tokio::time::sleep(ms(100)).await;
    let waiting = {
        let (writer, n, inside, writer_inside, violations) = (
            writer.clone(),
            n.clone(),
            inside_readers.clone(),
            writer_inside.clone(),
            violations.clone(),
        );
        tokio::spawn(async move {
            let w = writer
                .write_lock(&n, &lease_opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
                .expect("the writer must not starve");
            writer_inside.store(true, Ordering::SeqCst);
            if inside.load(Ordering::SeqCst) > 0 {
                violations.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(ms(50)).await;
            writer_inside.store(false, Ordering::SeqCst);
            w.release().await.expect("release");
        })
    };
    tokio::time::sleep(ms(200)).await;
    first.release().await.expect("release");
    within(90 * SEC, "the writer under a stream of readers", waiting)
        .await
        .expect("writer task");
    stop.store(true, Ordering::SeqCst);
    for t in stream {
        within(90 * SEC, "a reader", t).await.expect("reader task");
    }
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "a reader and the writer held at once"
    );
}

/// Writers' tokens grow across writers, and a reader's token is above the writer's before it.
pub async fn rw_tokens_increase_across_writers(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let clients = [ctx.client().await, ctx.client().await];
    let n = ctx.name("x");
    let mut last = FencingToken(0);
    for round in 0..6 {
        let c = &clients[round % 2];
        let w = c
            .write_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("write_lock");
        assert!(
            w.fencing_token() > last,
            "round {round}: writer token {} not above {}",
            w.fencing_token(),
            last
        );
        last = w.fencing_token();
        w.release().await.expect("release");
        let r = clients[(round + 1) % 2]
            .read_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("read_lock");
        assert!(
            r.fencing_token() > last,
            "round {round}: reader token {} not above the writer's {}",
            r.fencing_token(),
            last
        );
        last = r.fencing_token();
        r.release().await.expect("release");
    }
}

/// A store without read-write locks says so: `read_lock` and `write_lock` fail with
/// `Unsupported` before any I/O; a store with them grants a read hold.
pub async fn rw_unsupported_says_so(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let n = ctx.name("x");
    if c.capabilities().native.read_write {
        let r = c
            .try_read_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_read_lock")
            .expect("a free name");
        r.release().await.expect("release");
        return;
    }
    assert!(
        matches!(
            c.read_lock(&n, &lease_opts(30 * SEC)).await,
            Err(Error::Unsupported { .. })
        ),
        "read_lock on a store without read-write locks"
    );
    assert!(
        matches!(
            c.try_write_lock(&n, &lease_opts(30 * SEC)).await,
            Err(Error::Unsupported { .. })
        ),
        "try_write_lock on a store without read-write locks"
    );
    assert_eq!(
        counting.calls(),
        0,
        "an unsupported call reached the backend"
    );
}

/// An owner id chosen by the caller ([`AcquireOptions::owner`]) is the one the lease carries and
/// the one `inspect` reports, so a composite that records one id on several stores can be
/// recognised on each; owner-checked release still works with it.
pub async fn chosen_owner_is_recorded(ctx: Ctx) {
    let c = ctx.client().await;
    let n = ctx.name("x");
    let owner = OwnerId::random();
    let g = c
        .lock(&n, &lease_opts(30 * SEC).owner(owner))
        .await
        .expect("acquire with a chosen owner");
    assert_eq!(g.lease().owner(), owner, "the lease carries another owner");
    let info = c
        .inspect(&LockName::new(&n).expect("name"))
        .await
        .expect("inspect")
        .expect("a held lock is known");
    assert_eq!(
        info.holder.as_deref(),
        Some(owner.to_string().as_str()),
        "inspect reports another holder"
    );
    assert_eq!(g.release().await.expect("release"), Released::Released);
    assert!(
        is_free(&c, &n).await,
        "the lock is still held after release"
    );
}

/// A store that honours token floors ([`AcquireOptions::token_floor`]) hands out a token of at
/// least the floor and moves its counter there, so plain acquisitions after it get higher
/// tokens; a floor below the counter changes nothing. Other stores refuse a floor with
/// `Unsupported` before any I/O.
pub async fn token_floor_carries_the_counter(ctx: Ctx) {
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let n = ctx.name("x");
    if !c.capabilities().token_floor {
        let err = c
            .try_lock(&n, &lease_opts(30 * SEC).token_floor(FencingToken(7)))
            .await
            .expect_err("a token floor on a store that cannot carry it");
        assert!(
            matches!(err, Error::Unsupported { .. }),
            "expected Unsupported, got {err}"
        );
        assert_eq!(
            counting.calls(),
            0,
            "an unsupported call reached the backend"
        );
        return;
    }
    let first = c.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
    let floor = FencingToken(first.fencing_token().0 + 1_000_000);
    first.release().await.expect("release");

    let lifted = c
        .lock(&n, &lease_opts(30 * SEC).token_floor(floor))
        .await
        .expect("acquire with a floor");
    assert!(
        lifted.fencing_token() >= floor,
        "token {} is below the floor {floor}",
        lifted.fencing_token()
    );
    let lifted_token = lifted.fencing_token();
    lifted.release().await.expect("release");

    let after = c.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
    assert!(
        after.fencing_token() > lifted_token,
        "token {} after a floored grant is not above {lifted_token}: the counter was not carried",
        after.fencing_token()
    );
    let after_token = after.fencing_token();
    after.release().await.expect("release");

    let low = c
        .lock(&n, &lease_opts(30 * SEC).token_floor(FencingToken(1)))
        .await
        .expect("acquire with a low floor");
    assert!(
        low.fencing_token() > after_token,
        "a floor below the counter moved tokens backwards: {} after {after_token}",
        low.fencing_token()
    );
    low.release().await.expect("release");
}
