//! Input: bad names and options refused before any I/O, unusual names usable and distinct, `forget`.

use std::sync::Arc;

use lockcore::{
    AcquireOptions, DistributedLock, Error, KeepAlive, LockExt, LockName, Released, Wait,
};

use super::{SEC, is_free, lease_opts, ms};
use crate::Ctx;

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
