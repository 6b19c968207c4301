//! Mutual exclusion: one holder at a time, owner-checked release and extend, recorded histories.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use lockcore::{
    AcquireOptions, Error, FencingToken, KeepAlive, Lease, LockExt, LockName, OwnerId, Released,
    Wait,
};

use super::{SEC, is_free, lease_opts, ms, within};
use crate::{Ctx, FencedResource, History};

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
