//! Counting semaphores: never more holders than permits, permits that come back (released,
//! expired, dropped), waiters woken and served in order, tokens of their own, a count that
//! callers must agree on, bad counts and stores without semaphores refused before any I/O.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    AcquireOptions, DistributedLock, Error, KeepAlive, LockName, MAX_PERMITS, PermitGuard,
    Released, SemaphoreExt, Wait,
};

use super::{SEC, is_free, lease_opts, ms, within};
use crate::{Ctx, History};

/// One permit of `name` (a semaphore of `permits`) for `c`, at once or not at all.
async fn try_permit(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    permits: u32,
    ttl: Duration,
) -> Option<PermitGuard> {
    c.semaphore(name, permits)
        .expect("semaphore")
        .try_acquire(&lease_opts(ttl))
        .await
        .expect("try_acquire a permit")
}

/// Waits (up to a minute) until the store lists `n` waiters for the semaphore `name`.
async fn until_waiters(c: &Arc<dyn DistributedLock>, name: &str, n: usize) {
    let name = LockName::new(name).unwrap();
    within(30 * SEC, "the waiter to be queued", async {
        loop {
            let info = c.inspect_semaphore(&name).await.expect("inspect_semaphore");
            if info.and_then(|i| i.waiters) == Some(n) {
                break;
            }
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
}

/// Three clients each get a permit of a semaphore of three, with tokens that increase; a fourth
/// is refused until one is released. The lock of the same name stays free throughout (a
/// semaphore is an object of its own), and `inspect_semaphore` lists the holders.
pub async fn sem_permits_fill_then_refuse(ctx: Ctx) {
    let clients = [
        ctx.client().await,
        ctx.client().await,
        ctx.client().await,
        ctx.client().await,
    ];
    let n = ctx.name("x");
    let mut held = Vec::new();
    for c in &clients[..3] {
        let p = try_permit(c, &n, 3, 30 * SEC)
            .await
            .expect("a permit while fewer than three are taken");
        if let Some(last) = held.last() {
            let last: &PermitGuard = last;
            assert!(
                p.fencing_token() > last.fencing_token(),
                "a later grant got token {} after {}",
                p.fencing_token(),
                last.fencing_token()
            );
        }
        held.push(p);
    }
    assert!(
        try_permit(&clients[3], &n, 3, 30 * SEC).await.is_none(),
        "a fourth holder got a permit of three"
    );
    assert!(
        is_free(&clients[3], &n).await,
        "the lock of the same name is taken by the semaphore's holders"
    );
    let info = clients[3]
        .inspect_semaphore(&LockName::new(&n).unwrap())
        .await
        .expect("inspect_semaphore")
        .expect("the store knows the semaphore");
    let mut owners: Vec<String> = info.holders.iter().map(|h| h.owner.clone()).collect();
    let mut expected: Vec<String> = held.iter().map(|p| p.lease().owner().to_string()).collect();
    owners.sort();
    expected.sort();
    assert_eq!(owners, expected, "inspect_semaphore's holders");
    assert!(
        matches!(info.permits, Some(3) | None),
        "recorded count {:?}",
        info.permits
    );
    let last_token = held.last().map(|p| p.fencing_token()).unwrap();
    let first = held.remove(0);
    assert_eq!(first.release().await.expect("release"), Released::Released);
    let fourth = try_permit(&clients[3], &n, 3, 30 * SEC)
        .await
        .expect("a permit once one was released");
    assert!(fourth.fencing_token() > last_token, "token after a release");
    fourth.release().await.expect("release");
    for p in held {
        assert_eq!(p.release().await.expect("release"), Released::Released);
    }
}

/// Eight clients take turns on a semaphore of three for several rounds: the recorded history
/// never has more than three holders at once, and no token is handed out twice.
pub async fn sem_history_never_exceeds_permits(ctx: Ctx) {
    let n = ctx.name("x");
    let history = Arc::new(History::new());
    let mut tasks = Vec::new();
    for client in 0..8usize {
        let c = ctx.client().await;
        let (n, history) = (n.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let semaphore = c.semaphore(&n, 3).expect("semaphore");
            let opts = lease_opts(30 * SEC).wait(Wait::For(60 * SEC));
            for round in 0..4u64 {
                let p = semaphore.acquire(&opts).await.expect("a permit in time");
                let id = history.acquired(client, &p.lease());
                tokio::time::sleep(ms(5 + (client as u64 * 7 + round * 3) % 20)).await;
                history.ended(id);
                p.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        within(120 * SEC, "a contending client", t)
            .await
            .expect("client task");
    }
    assert_eq!(history.holds().len(), 32, "every round recorded");
    history.assert_at_most(3);
}

/// A waiting acquire gets a permit as soon as one is released, not later than its wait.
pub async fn sem_waiter_woken_when_a_permit_frees(ctx: Ctx) {
    let (a, b, w) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let pa = try_permit(&a, &n, 2, 60 * SEC).await.expect("first permit");
    let pb = try_permit(&b, &n, 2, 60 * SEC)
        .await
        .expect("second permit");
    let waiting = {
        let (w, n) = (w.clone(), n.clone());
        tokio::spawn(async move {
            let opts = lease_opts(30 * SEC).wait(Wait::For(60 * SEC));
            w.semaphore(&n, 2).expect("semaphore").acquire(&opts).await
        })
    };
    tokio::time::sleep(ms(200)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter got a permit while both were held"
    );
    pa.release().await.expect("release");
    let p = within(30 * SEC, "the waiter after a release", waiting)
        .await
        .expect("task")
        .expect("the waiter gets the released permit");
    assert!(p.fencing_token() > pb.fencing_token());
    p.release().await.expect("release");
    pb.release().await.expect("release");
}

/// With one permit of two held throughout, waiters take the other in arrival order, and a try
/// does not jump them.
pub async fn sem_fifo_waiters_served_in_order(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let kept = try_permit(&a, &n, 2, 120 * SEC).await.expect("permit kept");
    let rotating = try_permit(&b, &n, 2, 120 * SEC)
        .await
        .expect("the other permit");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4usize {
        let c = ctx.client().await;
        let order = order.clone();
        let sem = c.semaphore(&n, 2).expect("semaphore");
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new()
                .ttl(30 * SEC)
                .keep_alive(KeepAlive::Off)
                .wait(Wait::For(60 * SEC));
            let p = sem.acquire(&opts).await.expect("queued acquire");
            order.lock().unwrap().push(i);
            tokio::time::sleep(ms(5)).await;
            p.release().await.expect("release");
        }));
        until_waiters(&a, &n, i + 1).await;
    }
    let intruder = ctx.client().await;
    rotating.release().await.expect("release");
    if let Some(stolen) = try_permit(&intruder, &n, 2, 30 * SEC).await {
        stolen.release().await.expect("release");
        panic!("a try jumped a non-empty FIFO queue of permit waiters");
    }
    for t in tasks {
        within(60 * SEC, "waiter", t).await.expect("task panicked");
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1, 2, 3],
        "permit waiters were not served in arrival order"
    );
    kept.release().await.expect("release");
}

/// A permit whose holder never releases it comes back when its ttl runs out; a renewed one
/// does not.
pub async fn sem_expired_permit_comes_back(ctx: Ctx) {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    // Renewed every second, so a renewal may be two seconds late before the permit is lost.
    // With 1.5 s (half a second between renewals, a second of slack) one CI run lost it on
    // SQLite, whose every commit waits for the disk (`synchronous=full`): that machine spent
    // 2.5 % of its CPU time in iowait over the session, and a commit queued behind other
    // processes' writes can take a second there. Instrumented runs of the whole SQL suite on
    // it found no writer holding SQLite's write turn for 100 ms and no renewal 150 ms late,
    // so the slack is for the disk, not for a queue in this crate.
    let renewed_ttl = 3 * SEC;
    let renewed_opts = AcquireOptions::new()
        .ttl(renewed_ttl)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let renewed = a
        .semaphore(&n, 2)
        .expect("semaphore")
        .acquire(&renewed_opts)
        .await
        .expect("renewed permit");
    let renewed_at = std::time::Instant::now();
    let abandoned = try_permit(&b, &n, 2, SEC).await.expect("abandoned permit");
    let valid_until = abandoned.lease().valid_until();
    let opts = lease_opts(30 * SEC).wait(Wait::For(30 * SEC));
    let sem = c.semaphore(&n, 2).expect("semaphore");
    let p = within(60 * SEC, "a permit after expiry", sem.acquire(&opts))
        .await
        .expect("the abandoned permit must come back at its ttl");
    assert!(
        std::time::Instant::now() >= valid_until,
        "a permit came back before the abandoned lease's valid_until"
    );
    assert!(p.fencing_token() > abandoned.fencing_token());
    // The renewed permit is still held a second past its first ttl (after three renewals):
    // the semaphore is full.
    let past = renewed_at + renewed_ttl + SEC;
    tokio::time::sleep_until(past.into()).await;
    assert!(renewed.is_held(), "keep-alive lost a permit");
    assert!(
        try_permit(&b, &n, 2, 30 * SEC).await.is_none(),
        "keep-alive let the renewed permit go"
    );
    p.release().await.expect("release");
    assert_eq!(
        renewed.release().await.expect("release"),
        Released::Released
    );
    std::mem::forget(abandoned);
}

/// Callers that disagree on the count of a semaphore in use get an error naming it; once
/// nobody holds or waits, the next caller's count is the semaphore's.
pub async fn sem_mismatched_permits_rejected(ctx: Ctx) {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let two = try_permit(&a, &n, 2, 30 * SEC)
        .await
        .expect("permit of two");
    let three = b
        .semaphore(&n, 3)
        .expect("semaphore")
        .try_acquire(&lease_opts(30 * SEC))
        .await;
    match three {
        Err(Error::InvalidArgument { argument, reason }) => {
            assert_eq!(argument, "permits");
            assert!(
                reason.contains('2') && reason.contains('3'),
                "the error names both counts: {reason}"
            );
        }
        Err(other) => panic!("another count while in use: {other}"),
        Ok(Some(_)) => panic!("another count while in use got a permit"),
        Ok(None) => panic!("another count while in use was only refused, not rejected"),
    }
    two.release().await.expect("release");
    let three = try_permit(&b, &n, 3, 30 * SEC)
        .await
        .expect("a new count once the semaphore is idle");
    let again = a
        .semaphore(&n, 2)
        .expect("semaphore")
        .try_acquire(&lease_opts(30 * SEC))
        .await;
    assert!(
        matches!(again, Err(Error::InvalidArgument { .. })),
        "the old count while the new one is in use: {again:?}"
    );
    three.release().await.expect("release");
}

/// A permit acquire dropped while it waits, or at varying points around a release, leaves
/// neither a queue entry nor a permit behind: the next acquirer does not wait out a ttl.
pub async fn sem_dropped_acquire_leaves_nothing(ctx: Ctx) {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let long = AcquireOptions::new()
        .ttl(60 * SEC)
        .keep_alive(KeepAlive::Off);
    let one = |c: &Arc<dyn DistributedLock>| c.semaphore(&n, 1).expect("semaphore");
    // Dropped while queued behind the holder.
    let pa = one(&a)
        .acquire(&long.clone().wait(Wait::No))
        .await
        .expect("acquire");
    let waiter = {
        let (sem, long) = (one(&b), long.clone());
        tokio::spawn(async move { sem.acquire(&long.wait(Wait::Forever)).await })
    };
    until_waiters(&a, &n, 1).await;
    waiter.abort();
    assert!(
        waiter.await.is_err_and(|e| e.is_cancelled()),
        "the waiter should have been cancelled"
    );
    pa.release().await.expect("release");
    let p = within(
        30 * SEC,
        "next acquirer",
        one(&c).acquire(&long.clone().wait(Wait::For(10 * SEC))),
    )
    .await
    .expect("the next acquirer must not wait out the ttl of a dropped acquire");
    p.release().await.expect("release");
    // Dropped at varying points around a release, so some drops land after the grant.
    for round in 0..20u64 {
        let pa = a
            .semaphore(&n, 1)
            .expect("semaphore")
            .acquire(&long.clone().wait(Wait::For(30 * SEC)))
            .await
            .expect("acquire");
        let pending = {
            let (b, n, long) = (b.clone(), n.clone(), long.clone());
            tokio::spawn(async move {
                let sem = b.semaphore(&n, 1).expect("semaphore");
                sem.acquire(&long.wait(Wait::Forever)).await
            })
        };
        tokio::time::sleep(ms(5)).await;
        pa.release().await.expect("release");
        tokio::time::sleep(Duration::from_micros(round * 250)).await;
        pending.abort();
        if let Ok(Ok(p)) = pending.await {
            // It won before the abort; releasing it is the normal path.
            p.release().await.expect("release");
        }
        let sem = c.semaphore(&n, 1).expect("semaphore");
        let p = within(
            30 * SEC,
            "acquirer after a dropped permit waiter",
            sem.acquire(&long.clone().wait(Wait::For(20 * SEC))),
        )
        .await
        .expect("a dropped acquire left a permit or a queue entry behind");
        p.release().await.expect("release");
    }
}

/// A count of 0 or above [`MAX_PERMITS`] is refused before any I/O, on every store.
pub async fn sem_bad_count_rejected_before_io(ctx: Ctx) {
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let n = ctx.name("x");
    for bad in [0, MAX_PERMITS + 1] {
        assert!(
            matches!(c.semaphore(&n, bad), Err(Error::InvalidArgument { .. })),
            "a count of {bad}"
        );
    }
    assert_eq!(counting.calls(), 0, "a bad count reached the store");
}

/// A store without semaphores says so before any I/O. (Not applicable to a store with them:
/// the other `sem_` cases test those.)
pub async fn sem_unsupported_says_so(ctx: Ctx) {
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let n = ctx.name("x");
    assert!(
        matches!(c.semaphore(&n, 2), Err(Error::Unsupported { .. })),
        "semaphore on a store without semaphores"
    );
    assert_eq!(counting.calls(), 0, "the refusal reached the store");
}
