//! Scenarios that blackhole the link between a holder and the store.

use super::*;

/// The holder's replies are blackholed through a proxy in front of each of the store's servers
/// (its requests arrive, nothing comes back) for longer than the ttl. Its `lost()` fires; a client on a direct link takes over with
/// a higher token only once the holder's lease is over; the holder's late write is refused;
/// when the link heals, its client works again and its stale release frees nothing.
pub async fn holder_replies_blackholed_past_ttl(ctx: Ctx) {
    holder_blackholed(ctx, Fault::BlackholeReplies, Primitive::Lock).await;
}

/// [`holder_replies_blackholed_past_ttl`] with a reader cut off: a writer on a direct link gets
/// in only once the reader's lease is over, with a higher token.
pub async fn rw_reader_blackholed_past_ttl(ctx: Ctx) {
    holder_blackholed(ctx, Fault::BlackholeReplies, Primitive::Read).await;
}

/// As [`holder_replies_blackholed_past_ttl`], with the holder's requests lost instead (nothing
/// it sends arrives): its renewals never reach the store.
pub async fn holder_requests_blackholed_past_ttl(ctx: Ctx) {
    holder_blackholed(ctx, Fault::BlackholeRequests, Primitive::Lock).await;
}

/// The holder of `primitive` (the lock, or a read hold) cut off by `fault`; a writer takes
/// over. See [`holder_replies_blackholed_past_ttl`].
async fn holder_blackholed(ctx: Ctx, fault: Fault, primitive: Primitive) {
    let spawned = spawn(&ctx, Persistence::Durable).await;
    let proxied = Proxied::start(&spawned).await;
    let holder = ctx
        .connect(&with_query(&proxied.url, "timeout=500ms"))
        .await;
    let other = ctx.connect(&spawned.url).await;
    let name = ctx.name("blackholed");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut findings = Findings::default();

    let (guard, held_at) =
        first_hold(&holder, &name, primitive, &held(1500 * ms(1)), "the holder").await;
    let stale = guard.fencing_token();
    fenced.write(stale, 1).expect("the holder writes");

    let taker = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let g = other
                .lock(&name, &plain(5 * SEC, 60 * SEC))
                .await
                .expect("the other client takes over");
            (g, Instant::now())
        })
    };
    tokio::time::sleep(ms(300)).await;
    assert!(!taker.is_finished(), "taken while the holder renews");

    proxied.set(fault);
    let reason = within(30 * SEC, "the holder's lost()", guard.lost()).await;
    assert!(unreachable_reason(reason), "lost() said {reason:?}");
    history.push(hold_of(1, &guard, held_at, None));
    let (taken, taken_at) = within(90 * SEC, "the takeover", taker)
        .await
        .expect("taker task");
    findings.new_holder_writes(&fenced, taken.fencing_token(), 2);
    findings.old_holder_writes_late(&fenced, stale);

    proxied.set(Fault::PassThrough);
    stale_release_frees_nothing(&holder, &guard).await;
    let info = other
        .inspect(&LockName::new(&name).expect("name"))
        .await
        .expect("inspect")
        .expect("the lock is known");
    assert_eq!(
        info.holder,
        Some(taken.lease().owner().to_string()),
        "the stale release changed the holder"
    );
    history.push(hold_of(2, &taken, taken_at, Some(Instant::now())));
    taken.release().await.expect("release");
    findings.history(&history);
    drop(guard);
    verdict(&ctx, findings);
}
