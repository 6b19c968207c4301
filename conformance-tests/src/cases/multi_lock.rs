//! Several holds: reentrancy through an `Owner`, and `lock_many` all or nothing without deadlock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lockcore::{AcquireOptions, Error, KeepAlive, LockExt, Released, Wait};

use super::{SEC, is_free, lease_opts, ms, within};
use crate::Ctx;

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
