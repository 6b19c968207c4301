//! Fencing tokens: every acquisition of a name gets a larger token, across expiry, and a token
//! a token minimum carries the counter (or is refused where the store cannot carry it).

use std::sync::Arc;

use lockcore::{DistributedLock, Error, FencingToken, LockExt, Wait};

use super::{SEC, lease_opts, ms, within};
use crate::Ctx;

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

/// A store that honours token minimums
/// ([`AcquireOptions::min_token`](lockcore::AcquireOptions::min_token)) hands out a token
/// of at least the minimum and moves its counter there, so plain acquisitions after it get
/// higher tokens; a minimum below the counter changes nothing.
pub async fn min_token_carries_the_counter(ctx: Ctx) {
    let c = ctx.client().await;
    let n = ctx.name("x");
    let first = c.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
    let min_token = FencingToken(first.fencing_token().0 + 1_000_000);
    first.release().await.expect("release");

    let lifted = c
        .lock(&n, &lease_opts(30 * SEC).min_token(min_token))
        .await
        .expect("acquire with a min_token");
    assert!(
        lifted.fencing_token() >= min_token,
        "token {} is below the min_token {min_token}",
        lifted.fencing_token()
    );
    let lifted_token = lifted.fencing_token();
    lifted.release().await.expect("release");

    let after = c.lock(&n, &lease_opts(30 * SEC)).await.expect("acquire");
    assert!(
        after.fencing_token() > lifted_token,
        "token {} after a raised grant is not above {lifted_token}: the counter was not carried",
        after.fencing_token()
    );
    let after_token = after.fencing_token();
    after.release().await.expect("release");

    let low = c
        .lock(&n, &lease_opts(30 * SEC).min_token(FencingToken(1)))
        .await
        .expect("acquire with a low min_token");
    assert!(
        low.fencing_token() > after_token,
        "a min_token below the counter moved tokens backwards: {} after {after_token}",
        low.fencing_token()
    );
    low.release().await.expect("release");
}

/// A store that cannot carry a token minimum refuses one with `Unsupported` before any I/O.
pub async fn min_token_unsupported_says_so(ctx: Ctx) {
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let n = ctx.name("x");
    let err = c
        .try_lock(&n, &lease_opts(30 * SEC).min_token(FencingToken(7)))
        .await
        .expect_err("a token minimum on a store that cannot carry it");
    assert!(
        matches!(err, Error::Unsupported { .. }),
        "expected Unsupported, got {err}"
    );
    assert_eq!(
        counting.calls(),
        0,
        "an unsupported call reached the backend"
    );
}
