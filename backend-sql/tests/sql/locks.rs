//! Locks on every dialect: the queue and its hand-over, owner checks, fences, names, expiry in
//! database time, inspect, and busy errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance_tests::within;
use lockcore::{AcquireOptions, Error, FencingToken, Lease, LockExt, OwnerId, Released};

use crate::support::*;

per_dialect!(
    schema_creation_is_idempotent_under_concurrent_connects,
    release_and_extend_are_owner_checked,
    fence_survives_release_and_expiry,
    long_and_case_differing_names_stay_distinct,
    expiry_is_database_time,
    inspect_reports_holder_token_and_remaining,
    concurrent_clients_never_see_busy_errors,
    extend_many_reports_each_lease,
    try_lock_does_not_jump_a_live_queue,
    cancelled_waiters_leave_no_row,
    dead_waiter_blocks_only_until_its_liveness,
    min_token_and_chosen_owner_on_every_granting_statement,
    a_grant_from_the_queue_names_the_next_head,
    a_release_hands_the_lock_to_the_next_writer,
    a_hand_over_passes_over_readers_and_stale_waiters,
    a_dead_waiter_handed_the_lock_holds_it_for_the_lease,
);

/// The release of a lease granted from the queue hands the row to the next waiter in the
/// same statement: when `release` returns, the row is already the waiter's with the next
/// fence, before the waiter has looked (and on SQLite and PostgreSQL its waiter row is gone).
/// The waiter then returns that grant without writing it again (on PostgreSQL, from the
/// release's notification, or from its own attempt should that run first), with its own ttl
/// where it asked for another, and its waiter row goes.
async fn a_release_hands_the_lock_to_the_next_writer(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("hand-over");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let next = OwnerId::random();
    // Another ttl than the releaser's: the handed row is extended to this one.
    let opts = waiting(Duration::from_secs(30))
        .ttl(Duration::from_secs(10))
        .owner(next);
    let waiter = spawn_wait(&c, &n, opts, false);
    until_queued(&a, &n, 1).await;
    let fence = i64::try_from(held.token().0).expect("fence");
    assert_eq!(b.release(&held).await.expect("release"), Released::Released);
    let (owner, row_fence, _) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(owner, Some(next.to_string()), "handed over by the release");
    assert_eq!(row_fence, fence + 1);
    if kind != Kind::MariaDb {
        // SQLite's triggers and PostgreSQL's statement dequeue the new owner with the
        // hand-over; MySQL's new owner does so in the background.
        assert_eq!(
            raw.waiter_rows(n.as_str()).await,
            0,
            "the waiter row stayed"
        );
    }
    let got = granted("the next waiter's grant", waiter).await;
    assert_eq!(got.owner(), next);
    assert_eq!(got.token().0, u64::try_from(fence + 1).expect("fence"));
    assert_eq!(got.ttl(), Duration::from_secs(10));
    let (owner, row_fence, left) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!((owner, row_fence), (Some(next.to_string()), fence + 1));
    assert!(
        left > 8.0 && left <= 10.5,
        "the row runs for the new holder's ttl, not the releaser's: {left} s left"
    );
    within(Duration::from_secs(30), "the waiter row to go", async {
        while raw.waiter_rows(n.as_str()).await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(c.release(&got).await.expect("release"), Released::Released);
}

/// A hand-over goes only to a writer at the head that refreshed its liveness lately: with a
/// reader first in line, or a waiter whose row has less than 1.5 s left (one that stopped
/// refreshing), the release frees the row as a plain one does.
async fn a_hand_over_passes_over_readers_and_stale_waiters(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b, r) = (client(&url).await, client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("hand-over-skips");

    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let fence = i64::try_from(held.token().0).expect("fence");
    raw.insert_waiter(n.as_str(), 1.0).await;
    b.release(&held).await.expect("release");
    let row = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(
        (row.0, row.1),
        (None, fence),
        "a stale waiter is not handed the lock"
    );
    raw.delete_rows(WAITERS, n.as_str()).await;

    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let fence = i64::try_from(held.token().0).expect("fence");
    let reader = spawn_wait(&r, &n, waiting(Duration::from_secs(30)), true);
    until_queued(&a, &n, 1).await;
    b.release(&held).await.expect("release");
    let read = granted("the reader's grant", reader).await;
    let row = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_ne!(row.0, None, "the readers hold the row");
    assert!(row.1 > fence, "the reader's own grant bumped the fence");
    assert_ne!(row.0, Some(held.owner().to_string()));
    assert_eq!(r.release(&read).await.expect("release"), Released::Released);
}

/// The price of a hand-over, pinned down: a waiter that died in the 1.5 s after its last
/// refresh (here a row queued by hand with 2.5 s of liveness, which nobody refreshes) can be
/// handed the lock, which then stays taken until the handed lease (the releaser's ttl) runs
/// out, as when a holder dies; then anyone may take it.
async fn a_dead_waiter_handed_the_lock_holds_it_for_the_lease(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("hand-over-dead");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(2)).await;
    let dead = raw.insert_waiter(n.as_str(), 2.5).await;
    let released = Instant::now();
    b.release(&held).await.expect("release");
    let owner = raw.row(TABLE, n.as_str()).await.expect("row").0;
    assert_eq!(owner, Some(dead), "handed to the dead waiter");
    assert!(take(&a, &n, Duration::from_secs(30)).await.is_none());
    let lease = within(
        Duration::from_secs(30),
        "the handed lease to run out",
        async {
            loop {
                if let Some(lease) = take(&a, &n, Duration::from_secs(30)).await {
                    return lease;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    let waited = released.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "taken {waited:?} after a 2 s lease was handed over"
    );
    assert_eq!(
        a.release(&lease).await.expect("release"),
        Released::Released
    );
}

/// A waiter granted from the queue gets a lease marked as such, and where the grant reports it
/// (SQLite's), the mark names the live waiter left at the head, so that the release rings its
/// doorbell without looking it up (see the crate's `speedup::doorbell`). MySQL's grant reports
/// only the fence, and PostgreSQL notifies instead: their marks name none.
async fn a_grant_from_the_queue_names_the_next_head(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("named-head");
    let holder = a
        .try_lock(n.as_str(), &opts(Duration::from_secs(30)))
        .await
        .expect("try")
        .expect("free");
    let waiter = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move { b.lock(n.as_str(), &waiting(Duration::from_secs(30))).await })
    };
    until_queued(&a, &n, 1).await;
    // Behind it, a waiter in another process (never granted here: it only waits).
    raw.insert_waiter(n.as_str(), 60.0).await;
    let behind = *raw.tickets(n.as_str()).await.last().expect("a ticket");
    holder.release().await.expect("release");
    let got = within(Duration::from_secs(30), "the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("acquire");
    let expected = match kind {
        Kind::Postgres | Kind::MariaDb => "queued".to_owned(),
        Kind::Sqlite => format!("queued {behind}"),
    };
    assert_eq!(got.lease().handle(), Some(expected.as_str()));
    assert_eq!(raw.tickets(n.as_str()).await, [behind]);
    assert_eq!(got.release().await.expect("release"), Released::Released);
    raw.delete_rows(WAITERS, n.as_str()).await;
}

/// A token minimum and a chosen owner reach every statement that grants: the insert of a new row
/// and the take-over of the plain acquire, and a queued waiter's attempt. The fence column
/// holds the minimum afterwards, so plain grants continue above it; a minimum below the fence
/// changes nothing, and one that does not fit the column is refused before any I/O.
async fn min_token_and_chosen_owner_on_every_granting_statement(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("raised");
    let fence = || async { raw.row(TABLE, n.as_str()).await.map(|r| r.1) };
    let raised = |o: AcquireOptions, f: u64| o.min_token(FencingToken(f));

    // A name never used: the insert.
    let owner = OwnerId::random();
    let g = a
        .try_lock(
            n.as_str(),
            &raised(opts(Duration::from_secs(30)), 100).owner(owner),
        )
        .await
        .expect("try")
        .expect("free");
    assert_eq!(g.fencing_token(), FencingToken(100));
    assert_eq!(g.lease().owner(), owner);
    assert_eq!(fence().await, Some(100));
    g.release().await.expect("release");

    // The take-over of a free row, then a queued waiter granted when the holder releases.
    let holder = a
        .try_lock(n.as_str(), &raised(opts(Duration::from_secs(30)), 200))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(holder.fencing_token(), FencingToken(200));
    let waiter_owner = OwnerId::random();
    let waiter = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move {
            b.lock(
                n.as_str(),
                &raised(waiting(Duration::from_secs(30)), 500).owner(waiter_owner),
            )
            .await
        })
    };
    until_queued(&a, &n, 1).await;
    holder.release().await.expect("release");
    let got = within(Duration::from_secs(30), "the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("acquire");
    assert_eq!(got.fencing_token(), FencingToken(500));
    assert_eq!(got.lease().owner(), waiter_owner);
    let row = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(
        (row.0, row.1),
        (Some(waiter_owner.to_string()), 500),
        "the row records the waiter's owner and the min_token"
    );
    assert_eq!(
        raw.waiter_rows(n.as_str()).await,
        0,
        "the granted waiter left the queue before its acquire returned"
    );
    got.release().await.expect("release");

    // A low minimum changes nothing; plain grants continue above the minimum.
    let low = a
        .try_lock(n.as_str(), &raised(opts(Duration::from_secs(30)), 1))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(low.fencing_token(), FencingToken(501));
    low.release().await.expect("release");

    let err = a
        .try_lock(
            n.as_str(),
            &raised(opts(Duration::from_secs(30)), i64::MAX as u64 + 1),
        )
        .await
        .expect_err("a min_token beyond the fence column");
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                argument: "min_token",
                ..
            }
        ),
        "got {err}"
    );
    assert_eq!(
        raw.row(TABLE, n.as_str()).await.map(|r| (r.0, r.1)),
        Some((None, 501)),
        "the refused min_token touched the row"
    );
}

/// `try_acquire` never jumps a live queue: a live waiter row (as a waiter in another process
/// leaves) keeps even a free or never-used lock from being taken, an expired one does not; and
/// after a release, a `try_lock` gets nothing while the queued waiter has not had its turn.
async fn try_lock_does_not_jump_a_live_queue(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("queued");
    let ttl = Duration::from_secs(10);
    // PostgreSQL and SQLite gate even the insert of a new row; MySQL gates only the take-over
    // of an existing one (a real waiter only queues after finding the row held).
    if kind != Kind::MariaDb {
        raw.insert_waiter(n.as_str(), 60.0).await;
        assert!(
            take(&c, &n, ttl).await.is_none(),
            "a never-used lock was taken past a live waiter"
        );
        raw.delete_rows(WAITERS, n.as_str()).await;
    }
    let lease = take(&c, &n, ttl).await.expect("free, nobody queued");
    c.release(&lease).await.unwrap();

    raw.insert_waiter(n.as_str(), -1.0).await;
    let lease = take(&c, &n, ttl)
        .await
        .expect("an expired waiter row does not hold up the lock");
    c.release(&lease).await.unwrap();
    raw.insert_waiter(n.as_str(), 60.0).await;
    assert!(
        take(&c, &n, ttl).await.is_none(),
        "a free lock was taken past a live waiter"
    );
    let info = c.inspect(&n).await.unwrap().expect("row");
    assert_eq!(info.waiters, Some(1), "live waiters only: {info:?}");
    raw.delete_rows(WAITERS, n.as_str()).await;

    // A real queue: the holder releases; until the waiter has had its turn, try_lock gets nothing.
    let (holder, w, intruder) = (client(&url).await, client(&url).await, client(&url).await);
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    let (got_tx, mut got_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let waiter = {
        let n = n.clone();
        tokio::spawn(async move {
            let g = w
                .lock(n.as_str(), &waiting(Duration::from_secs(60)))
                .await
                .expect("queued waiter acquires");
            let _ = got_tx.send(());
            let _ = go_rx.await;
            g.release().await.expect("release");
        })
    };
    until_queued(&holder, &n, 1).await;
    holder.release(&lease).await.unwrap();
    within(Duration::from_secs(60), "the waiter's turn", async {
        loop {
            let got = got_rx.try_recv().is_ok();
            assert!(
                take(&intruder, &n, ttl).await.is_none(),
                "try_lock jumped the queue"
            );
            if got {
                break;
            }
        }
    })
    .await;
    let _ = go_tx.send(());
    within(Duration::from_secs(30), "waiter", waiter)
        .await
        .expect("waiter task");
    let lease = take(&intruder, &n, ttl)
        .await
        .expect("free once the queue is empty");
    intruder.release(&lease).await.unwrap();
}

/// Waiters that are dropped, or whose wait times out, leave no waiter row behind: a dropped
/// one's row goes with the cleanup spawned at once, a timed-out one's before the timeout is
/// returned. Then the lock is free for anyone as soon as the holder releases.
async fn cancelled_waiters_leave_no_row(kind: Kind) {
    let url = fresh_url(kind).await;
    let (holder, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("cancelled");
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (c, n) = (client(&url).await, n.clone());
        tasks.push(tokio::spawn(async move {
            c.lock(n.as_str(), &waiting(Duration::from_secs(600))).await
        }));
    }
    until_queued(&holder, &n, 3).await;
    assert_eq!(raw.waiter_rows(n.as_str()).await, 3);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.is_err_and(|e| e.is_cancelled()), "not cancelled");
    }
    within(
        Duration::from_secs(30),
        "dropped waiters' rows deleted",
        async {
            while raw.waiter_rows(n.as_str()).await > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;

    let c = client(&url).await;
    match c
        .lock(n.as_str(), &waiting(Duration::from_millis(300)))
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(
        raw.waiter_rows(n.as_str()).await,
        0,
        "a timed-out waiter left its row"
    );
    holder.release(&lease).await.unwrap();
    let lease = take(&c, &n, Duration::from_secs(10))
        .await
        .expect("free, nobody queued");
    c.release(&lease).await.unwrap();
}

/// A waiter that crashed (its row left behind, as by a kill -9 right after a refresh) holds up
/// the queue until its liveness runs out by the database's clock, and no longer: the next
/// waiter gets the lock, and the dead row is deleted on the way.
async fn dead_waiter_blocks_only_until_its_liveness(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("dead-waiter");
    let lease = take(&c, &n, Duration::from_secs(10)).await.expect("free");
    c.release(&lease).await.unwrap();
    let queued = Instant::now();
    raw.insert_waiter(n.as_str(), 2.0).await;
    assert!(
        take(&c, &n, Duration::from_secs(10)).await.is_none(),
        "the dead waiter's row is still live"
    );
    let g = within(
        Duration::from_secs(60),
        "acquire behind a dead waiter",
        c.lock(n.as_str(), &waiting(Duration::from_secs(60))),
    )
    .await
    .expect("the queue moves on once the dead waiter's liveness has run out");
    let waited = queued.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "granted {waited:?} after a waiter row live for 2 s was queued"
    );
    assert_eq!(
        raw.waiter_rows(n.as_str()).await,
        0,
        "the dead row and the granted waiter's row are gone"
    );
    g.release().await.unwrap();
}

/// Keep-alive's batch: every lease gets its own outcome, in order, with the same owner checks
/// as `extend`.
async fn extend_many_reports_each_lease(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let live = take(&c, &name("live"), Duration::from_secs(30))
        .await
        .unwrap();
    let released = take(&c, &name("released"), Duration::from_secs(30))
        .await
        .unwrap();
    c.release(&released).await.unwrap();
    let expired = take(&c, &name("expired"), Duration::from_millis(100))
        .await
        .unwrap();
    let forged = Lease::new(
        name("live"),
        OwnerId::random(),
        live.token(),
        Instant::now(),
        Duration::from_secs(30),
        Duration::ZERO,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let minute = Duration::from_secs(60);
    let out = c
        .extend_many(&[
            (live.clone(), minute),
            (released.clone(), minute),
            (expired.clone(), minute),
            (live.clone(), Duration::from_millis(1)),
            (forged, minute),
        ])
        .await;
    assert_eq!(out.len(), 5);
    let renewed = out[0].as_ref().expect("the live lease is extended");
    assert_eq!(renewed.token(), live.token());
    assert!(renewed.valid_until() > live.valid_until());
    for (i, what) in [(1, "released"), (2, "expired"), (4, "forged")] {
        assert!(
            matches!(out[i], Err(Error::LockLost { .. })),
            "{what}: {:?}",
            out[i]
        );
    }
    assert!(
        matches!(out[3], Err(Error::InvalidArgument { .. })),
        "{:?}",
        out[3]
    );
    let left = c
        .inspect(&name("live"))
        .await
        .unwrap()
        .unwrap()
        .remaining
        .unwrap();
    assert!(
        left > Duration::from_secs(45),
        "extended to a minute: {left:?}"
    );
    assert!(
        take(&c, &name("expired"), Duration::from_secs(5))
            .await
            .is_some()
    );
    assert_eq!(c.extend_many(&[]).await.len(), 0);
}

/// Eight clients connecting at once to a database without the table all succeed, and they then
/// share one table (one holds, the others see it held).
async fn schema_creation_is_idempotent_under_concurrent_connects(kind: Kind) {
    let url = with_query(&fresh_url(kind).await, "table=fresh_table");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let url = url.clone();
        tasks.spawn(async move { backend_sql::connect(&url).await });
    }
    let mut clients = Vec::new();
    while let Some(r) = tasks.join_next().await {
        clients.push(r.expect("task").expect("concurrent first connect"));
    }
    let n = name("shared");
    let lease = take(&clients[0], &n, Duration::from_secs(30))
        .await
        .expect("first client acquires");
    for c in &clients[1..] {
        assert!(
            take(c, &n, Duration::from_secs(30)).await.is_none(),
            "a client created concurrently uses another table"
        );
    }
    // Connecting again to the existing table is fine too.
    let again = client(&url).await;
    assert!(take(&again, &n, Duration::from_secs(30)).await.is_none());
    assert_eq!(
        clients[0].release(&lease).await.unwrap(),
        Released::Released
    );
}

/// Release and extend need the holder's owner id *and* token, and a live row.
async fn release_and_extend_are_owner_checked(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let n = name("owned");
    let ttl = Duration::from_secs(30);
    let lease = take(&a, &n, ttl).await.expect("acquire");
    let opts_ttl = Duration::from_secs(30);
    let forged_owner = Lease::new(
        n.clone(),
        OwnerId::random(),
        lease.token(),
        Instant::now(),
        ttl,
        Duration::ZERO,
    );
    let forged_token = Lease::new(
        n.clone(),
        lease.owner(),
        lockcore::FencingToken(lease.token().0 + 1),
        Instant::now(),
        ttl,
        Duration::ZERO,
    );
    for forged in [&forged_owner, &forged_token] {
        assert_eq!(b.release(forged).await.unwrap(), Released::NotHeld);
        match b.extend(forged, opts_ttl).await {
            Err(Error::LockLost { .. }) => {}
            other => panic!("extend with a forged lease: {other:?}"),
        }
    }
    assert!(
        take(&b, &n, ttl).await.is_none(),
        "forged release freed the lock"
    );
    // The real lease works from any client of the store.
    let extended = b.extend(&lease, ttl).await.expect("extend by the owner");
    assert_eq!(extended.token(), lease.token(), "extend keeps the token");
    assert_eq!(b.release(&lease).await.unwrap(), Released::Released);
    assert_eq!(a.release(&lease).await.unwrap(), Released::NotHeld);
    match a.extend(&lease, ttl).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend after release: {other:?}"),
    }
}

/// The row outlives release and expiry, and each acquisition's token beats every earlier one.
async fn fence_survives_release_and_expiry(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let raw = Raw::connect(&url).await;
    let n = name("fence");
    let l1 = take(&a, &n, Duration::from_secs(30)).await.expect("first");
    a.release(&l1).await.unwrap();
    let row = raw.row("dlock_leases", n.as_str()).await;
    assert!(
        matches!(row, Some((None, f, _)) if f == l1.token().0 as i64),
        "release must keep the row with its fence and clear the owner: {row:?}"
    );
    let l2 = take(&b, &n, Duration::from_millis(200))
        .await
        .expect("second");
    assert!(
        l2.token() > l1.token(),
        "{:?} !> {:?}",
        l2.token(),
        l1.token()
    );
    // Let it expire without release; the next holder takes the row over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    match b.extend(&l2, Duration::from_secs(30)).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend of an expired lease resurrected it: {other:?}"),
    }
    let l3 = take(&a, &n, Duration::from_secs(30)).await.expect("third");
    assert!(
        l3.token() > l2.token(),
        "{:?} !> {:?}",
        l3.token(),
        l2.token()
    );
    assert_eq!(
        b.release(&l2).await.unwrap(),
        Released::NotHeld,
        "the expired holder cannot free the new holder's lock"
    );
    // New clients (new pools) continue from the stored fence.
    let c = client(&url).await;
    a.release(&l3).await.unwrap();
    let l4 = take(&c, &n, Duration::from_secs(30)).await.expect("fourth");
    assert!(l4.token() > l3.token());
    c.release(&l4).await.unwrap();
}

/// 1024-byte names, names differing only in case or in their last byte, and multi-byte names are
/// distinct locks (MariaDB's default collation is case-insensitive; the name column must not be).
async fn long_and_case_differing_names_stay_distinct(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let names = [
        "a".repeat(1024),
        format!("{}b", "a".repeat(1023)),
        format!("{}A", "a".repeat(1023)),
        "Lock".to_owned(),
        "lock".to_owned(),
        "LOCK".to_owned(),
        "lock ".to_owned(),
        "ä".repeat(512),
        "a".repeat(1023),
        "ǅ/\u{1F512}/'; DROP TABLE dlock_leases; --".to_owned(),
    ];
    let mut leases = Vec::new();
    for n in &names {
        let lease = take(&c, &name(n), Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{:?}.. collides with another name", &n[..n.len().min(12)]));
        leases.push(lease);
    }
    for lease in &leases {
        let info = c.inspect(lease.name()).await.unwrap().expect("row exists");
        assert_eq!(info.name, lease.name().as_str());
        assert_eq!(info.holder, Some(lease.owner().to_string()));
        assert_eq!(info.token, Some(lease.token()));
    }
    for lease in &leases {
        assert_eq!(c.release(lease).await.unwrap(), Released::Released);
    }
}

/// `expires_at` is written by the database's clock: the row ends ttl after the database's
/// `now`, and the remaining time the backend reports is computed by the database.
async fn expiry_is_database_time(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let raw = Raw::connect(&url).await;
    let n = name("clock");
    let ttl = Duration::from_secs(3600);
    let lease = take(&c, &n, ttl).await.expect("acquire");
    let (owner, _, secs_left) = raw.row("dlock_leases", n.as_str()).await.expect("row");
    assert_eq!(owner, Some(lease.owner().to_string()));
    assert!(
        (3590.0..=3600.001).contains(&secs_left),
        "row expires {secs_left} s after the database's now, expected about 3600"
    );
    // Extend rewrites it from the database's now, to the new ttl.
    c.extend(&lease, Duration::from_secs(60)).await.unwrap();
    let (_, _, secs_left) = raw.row("dlock_leases", n.as_str()).await.expect("row");
    assert!(
        (50.0..=60.001).contains(&secs_left),
        "after extend(60s) the row expires in {secs_left} s"
    );
    c.release(&lease).await.unwrap();
}

async fn inspect_reports_holder_token_and_remaining(kind: Kind) {
    let url = fresh_url(kind).await;
    let c = client(&url).await;
    let n = name("inspected");
    assert!(c.inspect(&n).await.unwrap().is_none(), "never used: no row");
    let lease = take(&c, &n, Duration::from_secs(20))
        .await
        .expect("acquire");
    let info = c.inspect(&n).await.unwrap().expect("row");
    assert!(info.is_held());
    assert_eq!(info.holder, Some(lease.owner().to_string()));
    assert_eq!(info.token, Some(lease.token()));
    let left = info.remaining.expect("remaining");
    assert!(
        left > Duration::from_secs(10) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    c.release(&lease).await.unwrap();
    let info = c.inspect(&n).await.unwrap().expect("row kept");
    assert!(!info.is_held());
    assert_eq!(info.holder, None);
    assert_eq!(info.remaining, None);
    assert_eq!(
        info.token,
        Some(lease.token()),
        "the last token stays visible"
    );
}

/// Four clients (four pools) hammer one name: no error ever reaches the caller (SQLite's
/// "database is locked" and InnoDB deadlocks are retried inside), and no two hold at once.
async fn concurrent_clients_never_see_busy_errors(kind: Kind) {
    let url = fresh_url(kind).await;
    let holders = Arc::new(AtomicU64::new(0));
    let acquired = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..4 {
        let c = client(&url).await;
        let holders = holders.clone();
        let acquired = acquired.clone();
        tasks.spawn(async move {
            let n = name("hammered");
            let other = name(&format!("private-{i}"));
            for round in 0..60 {
                let lease = c
                    .try_acquire(&n, &opts(Duration::from_secs(10)))
                    .await
                    .unwrap_or_else(|e| panic!("client {i} round {round}: {e}"));
                if let Some(lease) = lease {
                    assert_eq!(
                        holders.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    acquired.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    let r = c.release(&lease).await;
                    assert_eq!(
                        r.unwrap_or_else(|e| panic!("client {i} release: {e}")),
                        Released::Released
                    );
                }
                // Writes to other rows compete for the same database lock.
                let own = c
                    .try_acquire(&other, &opts(Duration::from_secs(10)))
                    .await
                    .unwrap_or_else(|e| panic!("client {i} own lock: {e}"))
                    .expect("nobody else uses this name");
                c.release(&own)
                    .await
                    .unwrap_or_else(|e| panic!("client {i} own release: {e}"));
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("client task");
    }
    assert!(acquired.load(Ordering::SeqCst) > 0);
}
