//! The fault scenarios for counting semaphores, on stores that have them and a server the
//! runner may break: the recorded history must never hold more permits at once than the count,
//! every holder's `lost()` fires, permits come back once the store does, and each permit's
//! token fences the slot that permit guarded (a holder that lost its permit cannot write to its
//! slot after the slot's next holder did).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, DistributedLock, KeepAlive, LockGuard, Released, SemaphoreExt, Wait,
};

use crate::cases::within;
use crate::faults::{
    Findings, PERMITS, Primitive, Proxied, hold_of, paused_past_ttl, take_through_errors, verdict,
    with_query,
};
use crate::kit::Fault;
use crate::{Ctx, FencedResource, History, Persistence};

const SEC: Duration = Duration::from_secs(1);

fn renewed(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No)
}

/// A permit of `name` for `c`, riding out retryable store errors until `limit`.
async fn permit_through_errors(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    limit: Duration,
    who: &str,
) -> (LockGuard, Instant) {
    let opts = AcquireOptions::new()
        .ttl(10 * SEC)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::For(5 * SEC));
    take_through_errors(c, name, Primitive::Permit, &opts, limit, who).await
}

/// The findings of a permit history: more holders than permits, a token given twice.
fn permit_history(findings: &mut Findings, history: &History) {
    for v in crate::check_permits(&history.holds(), PERMITS as usize) {
        findings.push(v.to_string());
    }
}

/// The two permits of a semaphore are held (keep-alive on) while two clients wait; the server
/// is killed -9 and restarted with its data. Both holders' `lost()` fire; both waiters get a
/// permit after the restart, each with a token above both old holders' (the semaphore's counter
/// survived), so each old holder's late write to its slot is refused.
pub async fn sem_server_killed_and_restarted(ctx: Ctx) {
    let spawned = ctx
        .target()
        .spawn(Persistence::Durable)
        .await
        .unwrap_or_else(|e| panic!("cannot start a server for {}: {e}", ctx.case()));
    let url = with_query(&spawned.url, "timeout=1s");
    let name = ctx.name("sem-crashed");
    let history = History::new();
    let slots = [FencedResource::new(), FencedResource::new()];
    let mut findings = Findings::default();

    let mut holders = Vec::new();
    for (slot, resource) in slots.iter().enumerate() {
        let c = ctx.connect(&url).await;
        let p = c
            .semaphore(&name, PERMITS)
            .expect("semaphore")
            .acquire(&renewed(2 * SEC))
            .await
            .expect("a holder takes a permit")
            .into_inner();
        resource
            .write(p.fencing_token(), slot as u64)
            .expect("first write");
        holders.push((c, p, Instant::now()));
    }
    let mut waiters = tokio::task::JoinSet::new();
    for id in 0..2usize {
        let c = ctx.connect(&url).await;
        let name = name.clone();
        waiters.spawn(async move {
            let got = permit_through_errors(&c, &name, 150 * SEC, &format!("waiter {id}")).await;
            (c, got)
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        waiters.try_join_next().is_none(),
        "a waiter got a permit of a full semaphore"
    );

    spawned.server.kill9();
    for (slot, (_, p, at)) in holders.iter().enumerate() {
        let reason = within(30 * SEC, "a holder's lost() after kill -9", p.lost()).await;
        assert!(
            !p.is_held(),
            "holder {slot} still claims its permit after {reason:?}"
        );
        history.push(hold_of(slot, p, *at, None));
    }
    spawned.server.restart().await.expect("restart");

    let mut slot = 0;
    while let Some(r) = within(
        180 * SEC,
        "the waiters after the restart",
        waiters.join_next(),
    )
    .await
    {
        let (c, (p, at)) = r.expect("waiter task");
        findings.new_holder_writes(&slots[slot], p.fencing_token(), 10 + slot as u64);
        history.push(hold_of(2 + slot, &p, at, Some(Instant::now())));
        assert_eq!(p.release().await.expect("release"), Released::Released);
        drop(c);
        slot += 1;
    }
    assert_eq!(slot, 2, "both waiters got a permit after the restart");
    for (slot, (_, p, _)) in holders.iter().enumerate() {
        findings.old_holder_writes_late(&slots[slot], p.fencing_token());
    }
    permit_history(&mut findings, &history);
    verdict(&ctx, findings);
}

/// One permit's holder reaches the store through proxies (one per server) whose replies are then blackholed for
/// longer than the ttl, while another client holds the other permit and a third waits. The
/// cut-off holder's `lost()` fires; the waiter gets a permit only once that holder's lease is
/// over (the history never has three holders), with a token above it, so the cut-off holder's
/// late write to its slot is refused; when the link heals, its stale release frees nothing.
pub async fn sem_holder_blackholed_past_ttl(ctx: Ctx) {
    let spawned = ctx
        .target()
        .spawn(Persistence::Durable)
        .await
        .unwrap_or_else(|e| panic!("cannot start a server for {}: {e}", ctx.case()));
    let proxied = Proxied::start(&spawned).await;
    let cut = ctx
        .connect(&with_query(&proxied.url, "timeout=500ms"))
        .await;
    let steady = ctx.connect(&spawned.url).await;
    let waiter = ctx.connect(&spawned.url).await;
    let name = ctx.name("sem-blackholed");
    let history = History::new();
    let slot = FencedResource::new();
    let mut findings = Findings::default();

    let sem = |c: &Arc<dyn DistributedLock>| c.semaphore(&name, PERMITS).expect("semaphore");
    let a = sem(&cut)
        .acquire(&renewed(1500 * Duration::from_millis(1)))
        .await
        .expect("the cut-off holder takes a permit")
        .into_inner();
    let a_at = Instant::now();
    slot.write(a.fencing_token(), 1).expect("first write");
    let b = sem(&steady)
        .acquire(&renewed(10 * SEC))
        .await
        .expect("the steady holder takes the other permit")
        .into_inner();
    let b_at = Instant::now();

    let taker = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { permit_through_errors(&waiter, &name, 90 * SEC, "waiter").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !taker.is_finished(),
        "a permit was taken while both holders renewed"
    );

    proxied.set(Fault::BlackholeReplies);
    within(30 * SEC, "the cut-off holder's lost()", a.lost()).await;
    history.push(hold_of(0, &a, a_at, None));
    let (c, c_at) = within(90 * SEC, "the waiter's permit", taker)
        .await
        .expect("waiter task");
    findings.new_holder_writes(&slot, c.fencing_token(), 2);
    findings.old_holder_writes_late(&slot, a.fencing_token());
    assert!(b.is_held(), "the steady holder lost its permit");

    proxied.set(Fault::PassThrough);
    let released = within(30 * SEC, "the cut-off holder's stale release", async {
        loop {
            match cut.release(&a.lease()).await {
                Ok(r) => break r,
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("the stale release: {e}"),
            }
        }
    })
    .await;
    if released != Released::NotHeld {
        findings.push("a permit that had run out was released by its old holder's lease");
    }
    history.push(hold_of(2, &c, c_at, Some(Instant::now())));
    history.push(hold_of(1, &b, b_at, Some(Instant::now())));
    assert_eq!(c.release().await.expect("release"), Released::Released);
    assert_eq!(b.release().await.expect("release"), Released::Released);
    permit_history(&mut findings, &history);
    drop(a);
    verdict(&ctx, findings);
}

/// A permit's holder is paused past its ttl while another client holds the other permit (see
/// `faults::client_paused_past_ttl`): a third client gets a permit only once the paused one has
/// run out, with a higher token, so the paused holder's late write to its slot is refused; the
/// resumed holder's guard says it is lost, its release frees nothing, and the history never
/// has more holders than permits.
pub async fn sem_client_paused_past_ttl(ctx: Ctx) {
    paused_past_ttl(ctx, Primitive::Permit).await;
}
