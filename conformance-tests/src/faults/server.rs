//! Scenarios that kill or pause the server, or kill the store's connections.

use super::*;

/// The server killed -9 and restarted while a client holds `primitive` (the lock, or a read
/// hold) and two writers wait; see [`server_killed_and_restarted`].
async fn kill9_and_restart(ctx: Ctx, persistence: Persistence, primitive: Primitive) {
    let spawned = spawn(&ctx, persistence).await;
    let url = with_query(&spawned.url, "timeout=1s");
    let name = ctx.name("crashed");
    let history = Arc::new(History::new());
    let fenced = Arc::new(FencedResource::new());
    let findings = Arc::new(std::sync::Mutex::new(Findings::default()));

    let holder = ctx.connect(&url).await;
    bump(&holder, &name, 3).await;
    let (guard, held_at) =
        first_hold(&holder, &name, primitive, &held(2 * SEC), "the holder").await;
    let holder_token = guard.fencing_token();
    fenced.write(holder_token, 0).expect("the first write");

    let mut waiters = tokio::task::JoinSet::new();
    for id in 1..=2 {
        let c = ctx.connect(&url).await;
        waiters.spawn(waiter(
            id,
            c,
            name.clone(),
            history.clone(),
            fenced.clone(),
            findings.clone(),
        ));
    }
    tokio::time::sleep(ms(500)).await;
    assert!(
        guard.is_held(),
        "the holder lost the lock while the server was up"
    );
    assert!(
        waiters.try_join_next().is_none(),
        "a waiter got a held lock"
    );

    spawned.server.kill9();
    let reason = within(30 * SEC, "the holder's lost() after kill -9", guard.lost()).await;
    assert!(
        unreachable_reason(reason),
        "lost() said {reason:?} after kill -9"
    );
    assert!(
        !guard.is_held(),
        "a guard that was told it lost still claims the lock"
    );
    history.push(hold_of(0, &guard, held_at, None));
    assert_eq!(
        fenced.accepted().len(),
        1,
        "someone wrote while the server was down"
    );

    spawned.server.restart().await.expect("restart");
    let mut tokens = Vec::new();
    while let Some(r) = within(
        180 * SEC,
        "the waiters after the restart",
        waiters.join_next(),
    )
    .await
    {
        tokens.push(r.expect("waiter task"));
    }
    assert_eq!(
        tokens.len(),
        2,
        "both waiters got the lock after the restart"
    );
    let mut findings = std::mem::take(&mut *findings.lock().unwrap_or_else(|p| p.into_inner()));
    findings.old_holder_writes_late(&fenced, holder_token);
    findings.history(&history);
    stale_release_frees_nothing(&holder, &guard).await;
    drop(guard);
    verdict(&ctx, findings);
}

/// The server is killed -9 while one client holds the lock (keep-alive on) and two wait for
/// it, then restarted with its data. The holder's `lost()` fires; nobody gets the lock while
/// the server is down; both waiters get it after the restart, with tokens above the holder's;
/// the holder's late write is refused and its stale release frees nothing.
pub async fn server_killed_and_restarted(ctx: Ctx) {
    kill9_and_restart(ctx, Persistence::Durable, Primitive::Lock).await;
}

/// [`server_killed_and_restarted`] with a reader holding: after the restart the waiting writers
/// get in, each with a token above the reader's, and the reader's late action is refused.
pub async fn rw_reader_server_killed_and_restarted(ctx: Ctx) {
    kill9_and_restart(ctx, Persistence::Durable, Primitive::Read).await;
}

/// As [`server_killed_and_restarted`], on a server that keeps nothing across a restart. A
/// backend whose fencing counter lives only in memory shows the token reset here: the next
/// holder's token is lower than the old holder's, its writes are refused and the old holder's
/// late write is accepted (declare it documented unsafe).
pub async fn server_killed_and_restarted_without_persistence(ctx: Ctx) {
    kill9_and_restart(ctx, Persistence::None, Primitive::Lock).await;
}

/// The server is stopped (SIGSTOP) for longer than the ttl while a client holds the lock: the
/// holder's renewals time out and `lost()` fires by the end of its lease; after SIGCONT the
/// store has expired the lease (its own clock ran on), another client gets the lock with a
/// higher token, and the holder's renewals queued during the pause never bring it back. The
/// holder's client works again on its own.
pub async fn server_paused_past_ttl(ctx: Ctx) {
    let spawned = spawn(&ctx, Persistence::Durable).await;
    let url = with_query(&spawned.url, "timeout=1s");
    let name = ctx.name("paused");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut findings = Findings::default();

    let a = ctx.connect(&url).await;
    let (ga, a_at) = first_hold(&a, &name, Primitive::Lock, &held(2 * SEC), "A").await;
    fenced.write(ga.fencing_token(), 1).expect("A writes");

    spawned.server.pause();
    let paused_at = Instant::now();
    let reason = within(
        30 * SEC,
        "A's lost() while the server is stopped",
        ga.lost(),
    )
    .await;
    assert!(unreachable_reason(reason), "lost() said {reason:?}");
    history.push(hold_of(0, &ga, a_at, None));
    // Stopped for well over the ttl in total.
    let stopped_for = paused_at.elapsed();
    if stopped_for < 4 * SEC {
        tokio::time::sleep(4 * SEC - stopped_for).await;
    }
    spawned.server.resume();

    let b = ctx.connect(&url).await;
    let (gb, b_at) =
        acquire_through_errors(&b, &name, &plain(10 * SEC, 5 * SEC), 90 * SEC, "B").await;
    findings.new_holder_writes(&fenced, gb.fencing_token(), 2);
    findings.old_holder_writes_late(&fenced, ga.fencing_token());
    history.push(hold_of(1, &gb, b_at, Some(Instant::now())));
    gb.release().await.expect("B releases");
    findings.history(&history);

    // A's client recovers once the server answers again.
    let again = ctx.name("paused-after");
    let (g, _) =
        acquire_through_errors(&a, &again, &plain(5 * SEC, 5 * SEC), 60 * SEC, "A again").await;
    g.release().await.expect("release");
    drop(ga);
    verdict(&ctx, findings);
}

/// The server ends every client connection from its side (`CLIENT KILL`,
/// `pg_terminate_backend`, `KILL CONNECTION`), four times, while one client holds the lock
/// (keep-alive on) and another waits. A lease is not a connection: the holder keeps the lock
/// and renews it over new connections (an explicit extend may meet a dead connection once, with
/// a retryable error), the waiter does not get it meanwhile, and gets it with a higher token
/// when the holder releases.
pub async fn store_connections_killed(ctx: Ctx) {
    let spawned = spawn(&ctx, Persistence::Durable).await;
    let url = spawned.url.clone();
    let name = ctx.name("killed-connections");
    let history = Arc::new(History::new());
    let fenced = Arc::new(FencedResource::new());
    let mut findings = Findings::default();

    let holder = ctx.connect(&url).await;
    let waiter_client = ctx.connect(&url).await;
    // A 2 s lease, renewed every 667 ms: the scenario is about connections, so a renewal may
    // be over a second late (a stalled machine) before the lease runs out.
    let (guard, held_at) = first_hold(
        &holder,
        &name,
        Primitive::Lock,
        &held(2 * SEC),
        "the holder",
    )
    .await;
    let token = guard.fencing_token();
    fenced.write(token, 1).expect("the holder writes");
    let waiting = {
        let (name, history) = (name.clone(), history.clone());
        tokio::spawn(async move {
            let (g, at) = acquire_through_errors(
                &waiter_client,
                &name,
                &plain(5 * SEC, 60 * SEC),
                120 * SEC,
                "the waiter",
            )
            .await;
            let token = g.fencing_token();
            history.push(hold_of(2, &g, at, Some(Instant::now())));
            g.release().await.expect("release");
            token
        })
    };
    let mut killed = 0;
    for _ in 0..4 {
        tokio::time::sleep(ms(700)).await;
        killed += spawned
            .server
            .kill_client_connections()
            .await
            .expect("kill the clients' connections");
    }
    assert!(killed >= 2, "only {killed} connections were killed");
    assert!(
        guard.lost_reason().is_none() && guard.is_held(),
        "the holder lost the lock because its connections were killed: {:?}",
        guard.lost_reason()
    );
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    // The first request on a connection the server ended may fail; a retryable error says so,
    // and the next attempt goes over a new connection.
    within(30 * SEC, "extend after the kills", async {
        loop {
            match guard.extend(2 * SEC).await {
                Ok(()) => break,
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(50)).await,
                Err(e) => panic!("extend after the kills: {e}"),
            }
        }
    })
    .await;
    history.push(hold_of(1, &guard, held_at, Some(Instant::now())));
    guard.release().await.expect("release");
    let next = within(120 * SEC, "the waiter", waiting)
        .await
        .expect("waiter task");
    findings.new_holder_writes(&fenced, next, 2);
    findings.history(&history);
    verdict(&ctx, findings);
}
