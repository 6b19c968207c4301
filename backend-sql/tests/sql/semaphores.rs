//! Counting semaphores on every dialect.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::within;
use lockcore::{DistributedLock, Error, FencingToken, Lease, LockExt, LockName, OwnerId, Released};

use crate::support::*;

impl Raw {
    /// The semaphore `name`'s fence, if it has a row.
    pub(crate) async fn semaphore_fence(&self, name: &str) -> Option<i64> {
        let sql = self.sql(&format!(
            "SELECT fence FROM {{q}}{SEMAPHORES}{{q}} WHERE name = $1"
        ));
        on_pool!(self, pool => sqlx::query_scalar(sql).bind(name).fetch_optional(pool).await)
            .expect("raw semaphore row")
    }

    /// Queues a permit waiter row by hand for a semaphore of `permits`, as a waiter in another
    /// process would, live for `secs` more seconds by the database's clock.
    pub(crate) async fn insert_permit_waiter(&self, name: &str, permits: i64, secs: f64) {
        let columns =
            format!("INSERT INTO {{q}}{PERMIT_QUEUE}{{q}} (name, waiter, permits, expires_at)");
        let sql = self.sql_of(
            &format!(
                "{columns} VALUES ($1, $2, $3, clock_timestamp() + $4::bigint * interval '1 microsecond')"
            ),
            &format!("{columns} VALUES ($1, $2, $3, NOW(6) + INTERVAL $4 MICROSECOND)"),
            &format!(
                "{columns} VALUES ($1, $2, $3, CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) + $4 / 1000)"
            ),
        );
        let waiter = OwnerId::random().to_string();
        let micros = (secs * 1e6) as i64;
        on_pool!(self, pool => sqlx::query(sql)
            .bind(name)
            .bind(&waiter)
            .bind(permits)
            .bind(micros)
            .execute(pool)
            .await
            .map(|_| ()))
        .expect("raw permit waiter row");
    }
}

/// A waiting permit acquire through lockcore (the way applications call it).
async fn wait_permit(
    c: &Arc<dyn DistributedLock>,
    n: &LockName,
    permits: u32,
    limit: Duration,
) -> lockcore::Result<lockcore::PermitGuard> {
    use lockcore::SemaphoreExt;
    c.semaphore(n.as_str(), permits)?
        .acquire(&waiting(limit))
        .await
}

/// Waits until `inspect_semaphore` reports `waiters` live permit waiters on `name`.
async fn until_permit_waiters(c: &Arc<dyn DistributedLock>, n: &LockName, waiters: usize) {
    within(Duration::from_secs(30), "permit waiters queued", async {
        loop {
            let info = c.inspect_semaphore(n).await.expect("inspect_semaphore");
            if info.and_then(|i| i.waiters) == Some(waiters) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

per_dialect!(
    semaphore_and_lock_of_a_name_are_apart,
    permit_count_checked_while_in_use_only,
    permit_tokens_increase_across_release_and_expiry,
    dropped_permit_waits_leave_no_rows,
    permit_leases_extend_and_release_owner_checked,
    idle_semaphore_is_forgotten,
    concurrent_tries_never_exceed_the_count,
    a_release_hands_its_permit_over_only_in_queue_order,
);

/// The same store as `url`, named another way, so that a client of it has its own wake-up and
/// hand-over registry, as a client in another process has.
fn as_another_process(url: &str) -> String {
    match url.strip_prefix("sqlite://") {
        Some(path) => {
            let (dir, file) = path.rsplit_once('/').expect("a file path");
            format!("sqlite://{dir}/./{file}")
        }
        None => url.replacen("127.0.0.1", "localhost", 1),
    }
}

/// A permit's release hands the freed permit to a waiter of its own process only when the
/// store's queue says it is next: a waiter of another process that queued first gets the
/// permit first, and the local waiter gets it when that one releases.
async fn a_release_hands_its_permit_over_only_in_queue_order(kind: Kind) {
    let url = fresh_url(kind).await;
    let n = name("hand-over-order");
    let holder = client(&url).await;
    let held = permit(&holder, &n, 1, opts(Duration::from_secs(30)))
        .await
        .expect("try a permit")
        .expect("a free permit");
    let remote = client(&as_another_process(&url)).await;
    let limit = Duration::from_secs(60);
    let first = {
        let (remote, n) = (remote.clone(), n.clone());
        tokio::spawn(async move { wait_permit(&remote, &n, 1, limit).await })
    };
    until_permit_waiters(&holder, &n, 1).await;
    let local = client(&url).await;
    let second = {
        let (local, n) = (local.clone(), n.clone());
        tokio::spawn(async move { wait_permit(&local, &n, 1, limit).await })
    };
    until_permit_waiters(&holder, &n, 2).await;
    assert_eq!(holder.release(&held).await.unwrap(), Released::Released);
    let first = within(Duration::from_secs(30), "the first waiter's permit", first)
        .await
        .expect("the first waiter's task")
        .expect("the first waiter's permit");
    // The store's only holder is the first waiter; the local one still waits in the queue.
    let info = holder
        .inspect_semaphore(&n)
        .await
        .expect("inspect_semaphore")
        .expect("the semaphore's row");
    let owners: Vec<&str> = info.holders.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(owners, [first.lease().owner().to_string().as_str()]);
    assert_eq!(info.waiters, Some(1));
    assert!(!second.is_finished(), "the local waiter returned early");
    let first_token = first.lease().token();
    assert!(first_token > held.token());
    first.release().await.expect("release the first permit");
    let second = within(
        Duration::from_secs(30),
        "the second waiter's permit",
        second,
    )
    .await
    .expect("the second waiter's task")
    .expect("the second waiter's permit");
    assert!(second.lease().token() > first_token);
    second.release().await.expect("release the second permit");
}

/// Twelve clients (twelve pools) try for a permit of three at the same moment, for several
/// rounds: never more than three grants at once, and each grant's token is unique (the grant
/// transaction serialises on the semaphore row).
async fn concurrent_tries_never_exceed_the_count(kind: Kind) {
    crowd_a_semaphore(&fresh_url(kind).await).await;
}

/// On a PostgreSQL database whose sessions default to REPEATABLE READ, a grant that meets
/// another committed after its snapshot fails with a serialization error, which is retried:
/// still never more than three grants at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_semaphore_under_a_repeatable_read_default() {
    let url = fresh_url(Kind::Postgres).await;
    let Raw::Pg(pool) = Raw::connect(&url).await else {
        unreachable!("a PostgreSQL URL")
    };
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{db}\" SET default_transaction_isolation TO 'repeatable read'"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let Raw::Pg(fresh) = Raw::connect(&url).await else {
        unreachable!()
    };
    let level: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&fresh)
        .await
        .unwrap();
    assert_eq!(level, "repeatable read", "new sessions' default");
    crowd_a_semaphore(&url).await;
}

/// A new client on `url` takes a permit of a semaphore of two named after `prefix`, and
/// releases it.
async fn take_and_release_a_permit(url: &str, prefix: &str) {
    let c = client(url).await;
    let p = permit(&c, &name(prefix), 2, opts(Duration::from_secs(60)))
        .await
        .expect("a permit")
        .expect("free");
    assert_eq!(c.release(&p).await.unwrap(), Released::Released);
}

/// A database where another version left a function under the same base name (other argument
/// names, other text) still serves semaphores: each version's functions carry a hash of their
/// text, so neither replaces the other's, and PostgreSQL never has to rename an argument.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_functions_of_another_version_are_left_alone() {
    let url = fresh_url(Kind::Postgres).await;
    let raw = Raw::connect(&url).await;
    let other = "CREATE FUNCTION \"dlock_leases_grant_permit\"(p_name text, p_owner text, \
                 p_ttl bigint, p_floor bigint, p_permits bigint, p_ticket bigint, \
                 OUT o_outcome bigint, OUT o_fence bigint, OUT o_ahead bigint, \
                 OUT o_left bigint, OUT o_recorded bigint) \
                 LANGUAGE plpgsql AS $F$ BEGIN o_outcome := 1; END $F$";
    raw.exec(other).await;
    take_and_release_a_permit(&url, "versions").await;
    let Raw::Pg(pool) = &raw else {
        unreachable!("a PostgreSQL URL")
    };
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc WHERE proname = 'dlock_leases_grant_permit'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        left, 1,
        "the other version's function was replaced or dropped"
    );
}

/// On MariaDB, an account that may create routines gets the semaphore's three procedures
/// (grant, join, hand-over), each named with the hash of its text, and nothing for the lock,
/// whose queued grant is plain statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_creates_the_semaphore_procedures_and_none_for_the_lock() {
    let url = fresh_url(Kind::MariaDb).await;
    let raw = Raw::connect(&url).await;
    take_and_release_a_permit(&url, "procedures").await;
    let Raw::My(pool) = &raw else {
        unreachable!("a MariaDB URL")
    };
    let mut names: Vec<String> = sqlx::query_scalar(
        "SELECT ROUTINE_NAME FROM information_schema.ROUTINES \
         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    names.sort();
    let bases: Vec<&str> = names
        .iter()
        .map(|n| n.rsplit_once('_').map_or(n.as_str(), |(base, _hash)| base))
        .collect();
    assert_eq!(
        bases,
        [
            "dlock_leases_grant_permit",
            "dlock_leases_hand_permit",
            "dlock_leases_join_permits"
        ],
        "procedures created: {names:?}"
    );
}

/// Twelve clients try for a permit of three at once, five rounds (see
/// `concurrent_tries_never_exceed_the_count`).
async fn crowd_a_semaphore(url: &str) {
    let url = url.to_owned();
    let n = name("crowded");
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(client(&url).await);
    }
    let mut tokens = std::collections::BTreeSet::new();
    for round in 0..5 {
        let start = Arc::new(tokio::sync::Barrier::new(clients.len()));
        let tries: Vec<_> = clients
            .iter()
            .map(|c| {
                let (c, n, start) = (c.clone(), n.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    let got = permit(&c, &n, 3, opts(Duration::from_secs(60))).await;
                    (c, got.expect("try_acquire_permit"))
                })
            })
            .collect();
        let mut granted = Vec::new();
        for t in tries {
            let (c, got) = within(Duration::from_secs(60), "a try", t).await.unwrap();
            if let Some(lease) = got {
                assert!(
                    tokens.insert(lease.token()),
                    "token {:?} twice",
                    lease.token()
                );
                granted.push((c, lease));
            }
        }
        assert!(
            (1..=3).contains(&granted.len()),
            "round {round}: {} grants of a semaphore of three",
            granted.len()
        );
        for (c, lease) in granted {
            assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
        }
    }
}

/// A semaphore and the lock of the same name do not exclude each other, and neither's queue
/// holds up the other: a queued lock waiter does not stop a permit's single attempt, and a
/// queued permit waiter does not stop the lock's.
async fn semaphore_and_lock_of_a_name_are_apart(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let n = name("both");
    let ttl = Duration::from_secs(60);
    let lock = take(&a, &n, ttl).await.expect("the lock");
    let p1 = permit(&b, &n, 2, opts(ttl))
        .await
        .expect("permit")
        .expect("a permit while the lock of the name is held");
    // A lock waiter queues; the semaphore does not see it.
    let lock_waiter = {
        let (c, n) = (client(&url).await, n.clone());
        tokio::spawn(async move { c.lock(n.as_str(), &waiting(Duration::from_secs(60))).await })
    };
    until_queued(&a, &n, 1).await;
    let p2 = permit(&b, &n, 2, opts(ttl))
        .await
        .expect("permit")
        .expect("a permit while a lock waiter is queued");
    let info = b.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.waiters, Some(0), "{info:?}");
    assert_eq!(info.holders.len(), 2, "{info:?}");
    // A permit waiter queues; the lock does not see it.
    let permit_waiter = {
        let (c, n) = (client(&url).await, n.clone());
        tokio::spawn(async move { wait_permit(&c, &n, 2, Duration::from_secs(60)).await })
    };
    until_permit_waiters(&a, &n, 1).await;
    let info = a.inspect(&n).await.unwrap().expect("lock row");
    assert_eq!(info.waiters, Some(1), "the lock's queue: {info:?}");
    a.release(&lock).await.unwrap();
    let g = within(Duration::from_secs(30), "the lock waiter", lock_waiter)
        .await
        .expect("task")
        .expect("the lock waiter gets the lock");
    g.release().await.unwrap();
    // Free and nobody queued for the lock: a try gets it past the permit waiter.
    let lock = take(&a, &n, ttl)
        .await
        .expect("the lock is not held up by a permit waiter");
    assert_eq!(b.release(&p1).await.unwrap(), Released::Released);
    let g = within(Duration::from_secs(30), "the permit waiter", permit_waiter)
        .await
        .expect("task")
        .expect("the permit waiter gets the released permit");
    assert!(g.fencing_token() > p2.token(), "the semaphore's own tokens");
    g.release().await.unwrap();
    assert_eq!(b.release(&p2).await.unwrap(), Released::Released);
    a.release(&lock).await.unwrap();
}

/// The count is recorded while the semaphore is in use (a live holder or a live waiter), and
/// another count is refused then, by a single attempt and by a waiting acquire alike; once
/// nobody holds or waits, the next caller's count is the semaphore's.
async fn permit_count_checked_while_in_use_only(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("counted");
    let ttl = Duration::from_secs(60);
    fn is_mismatch<T>(r: &lockcore::Result<T>) -> bool {
        matches!(
            r,
            Err(Error::InvalidArgument {
                argument: "permits",
                ..
            })
        )
    }
    let p = permit(&c, &n, 2, opts(ttl)).await.unwrap().expect("permit");
    let info = c.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.permits, Some(2));
    let other = permit(&c, &n, 3, opts(ttl)).await;
    assert!(is_mismatch(&other), "a try with another count: {other:?}");
    let other = wait_permit(&c, &n, 3, Duration::from_secs(5)).await;
    assert!(is_mismatch(&other), "a waiting acquire with another count");
    assert_eq!(raw.rows_of(PERMIT_QUEUE, n.as_str()).await, 0);
    assert_eq!(c.release(&p).await.unwrap(), Released::Released);
    let info = c.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.permits, None, "idle: no count recorded: {info:?}");

    // Idle: the next caller's count is the semaphore's.
    let p = permit(&c, &n, 3, opts(ttl))
        .await
        .unwrap()
        .expect("a permit of the new count once idle");
    assert!(is_mismatch(&permit(&c, &n, 2, opts(ttl)).await));
    c.release(&p).await.unwrap();

    // In use by a live waiter alone (as one in another process leaves): refused too, and a
    // try of the same count does not jump it; an expired waiter is no use.
    raw.insert_permit_waiter(n.as_str(), 4, 60.0).await;
    assert!(is_mismatch(&permit(&c, &n, 3, opts(ttl)).await));
    assert!(
        permit(&c, &n, 4, opts(ttl)).await.unwrap().is_none(),
        "a try jumped a live permit waiter"
    );
    raw.delete_rows(PERMIT_QUEUE, n.as_str()).await;
    raw.insert_permit_waiter(n.as_str(), 4, -1.0).await;
    let p = permit(&c, &n, 5, opts(ttl))
        .await
        .unwrap()
        .expect("an expired waiter neither records a count nor holds anyone up");
    c.release(&p).await.unwrap();
}

/// A semaphore's fence is never reset: tokens keep increasing across release and expiry (and
/// new clients), a token minimum lifts them, and a refused attempt leaves the fence as it was.
async fn permit_tokens_increase_across_release_and_expiry(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b, raw) = (
        client(&url).await,
        client(&url).await,
        Raw::connect(&url).await,
    );
    let n = name("tokens");
    let p1 = permit(&a, &n, 1, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("first");
    assert_eq!(a.release(&p1).await.unwrap(), Released::Released);
    // A 1 s ttl, not less: the refusal below needs p2 still held (a stalled test process once
    // outlasted a 200 ms one).
    let p2 = permit(&b, &n, 1, opts(Duration::from_secs(1)))
        .await
        .unwrap()
        .expect("second");
    // The store counted p2's ttl from a moment before this one.
    let p2_ends_by = Instant::now() + Duration::from_secs(1);
    assert!(p2.token() > p1.token());
    // Full: refused, and the refused attempt's bump is rolled back.
    assert!(
        permit(&a, &n, 1, opts(Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        raw.semaphore_fence(n.as_str()).await,
        Some(p2.token().0 as i64)
    );
    // Expired without release: the next grant gets a higher token; the old lease is dead.
    tokio::time::sleep_until((p2_ends_by + Duration::from_millis(100)).into()).await;
    match b.extend(&p2, Duration::from_secs(30)).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend of an expired permit resurrected it: {other:?}"),
    }
    let p3 = permit(&a, &n, 1, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("third, after the expiry");
    assert!(p3.token() > p2.token());
    assert_eq!(b.release(&p2).await.unwrap(), Released::NotHeld);
    assert_eq!(a.release(&p3).await.unwrap(), Released::Released);
    // A token minimum lifts the fence; later grants continue above it.
    let raised = opts(Duration::from_secs(30)).min_token(FencingToken(1000));
    let p4 = permit(&a, &n, 1, raised).await.unwrap().expect("raised");
    assert_eq!(p4.token(), FencingToken(1000));
    a.release(&p4).await.unwrap();
    let c = client(&url).await;
    let p5 = permit(&c, &n, 1, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("a new client");
    assert_eq!(p5.token(), FencingToken(1001));
    assert_eq!(raw.semaphore_fence(n.as_str()).await, Some(1001));
    c.release(&p5).await.unwrap();
    assert_eq!(
        raw.rows_of(PERMITS, n.as_str()).await,
        0,
        "released permits keep no row (expired ones go with the next grant)"
    );
}

/// Permit acquires dropped while they wait, or around the moment a permit frees, leave no waiter
/// row and no permit row behind (the clean-ups spawned at once delete them); a wait that times
/// out leaves its row before it returns.
async fn dropped_permit_waits_leave_no_rows(kind: Kind) {
    let url = fresh_url(kind).await;
    let (holder, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("dropped");
    let long = opts(Duration::from_secs(60));
    let held = permit(&holder, &n, 1, long.clone())
        .await
        .unwrap()
        .expect("the only permit");
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (c, n) = (client(&url).await, n.clone());
        tasks.push(tokio::spawn(async move {
            wait_permit(&c, &n, 1, Duration::from_secs(600)).await
        }));
    }
    until_permit_waiters(&holder, &n, 3).await;
    assert_eq!(raw.rows_of(PERMIT_QUEUE, n.as_str()).await, 3);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.is_err_and(|e| e.is_cancelled()), "not cancelled");
    }
    until_no_rows(
        &raw,
        PERMIT_QUEUE,
        &n,
        "dropped permit waiters' rows deleted",
    )
    .await;
    assert_eq!(raw.rows_of(PERMITS, n.as_str()).await, 1, "the holder's");

    let c = client(&url).await;
    match wait_permit(&c, &n, 1, Duration::from_millis(300)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        raw.rows_of(PERMIT_QUEUE, n.as_str()).await,
        0,
        "a timed-out permit waiter left its row"
    );
    holder.release(&held).await.unwrap();

    // Dropped at varying points around a release: some drops land after the grant, whose
    // permit the clean-up then frees. Once this process's clean-ups (the interrupted
    // statement finished in the background, then undone) have ended, nothing is left.
    let w = client(&url).await;
    for round in 0..12u64 {
        let held = permit(&holder, &n, 1, long.clone())
            .await
            .unwrap()
            .expect("free again");
        let pending = {
            let (w, n) = (w.clone(), n.clone());
            tokio::spawn(async move { wait_permit(&w, &n, 1, Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        holder.release(&held).await.unwrap();
        tokio::time::sleep(Duration::from_micros(round * 400)).await;
        pending.abort();
        if let Ok(Ok(g)) = pending.await {
            g.release().await.unwrap();
        }
        assert!(
            lockcore::cleanup::settle(Duration::from_secs(30)).await,
            "clean-ups still running after 30 s"
        );
        for table in [PERMIT_QUEUE, PERMITS] {
            let left = raw.rows_of(table, n.as_str()).await;
            assert_eq!(
                left, 0,
                "round {round}: {table} rows left by a dropped acquire"
            );
        }
    }
}

/// A permit's lease extends and releases like a lock's, owner- and token-checked: another
/// owner's lease, a stale token, or the lock's lease of the same name and owner cannot release
/// or extend it; keep-alive's batch extends permits and locks together.
async fn permit_leases_extend_and_release_owner_checked(kind: Kind) {
    let url = fresh_url(kind).await;
    let (a, b) = (client(&url).await, client(&url).await);
    let n = name("permit-owned");
    let ttl = Duration::from_secs(30);
    let p = permit(&a, &n, 2, opts(ttl)).await.unwrap().expect("permit");
    assert_eq!(p.handle(), Some("permit"));
    let forged = |owner: OwnerId, token: u64| {
        Lease::new(
            n.clone(),
            owner,
            FencingToken(token),
            Instant::now(),
            ttl,
            Duration::ZERO,
        )
    };
    let other_owner = forged(OwnerId::random(), p.token().0).with_handle("permit");
    let stale_token = forged(p.owner(), p.token().0 - 1).with_handle("permit");
    let as_lock = forged(p.owner(), p.token().0);
    for lease in [&other_owner, &stale_token, &as_lock] {
        assert_eq!(b.release(lease).await.unwrap(), Released::NotHeld);
        match b.extend(lease, ttl).await {
            Err(Error::LockLost { .. }) => {}
            other => panic!("extend with a forged lease: {other:?}"),
        }
    }
    let info = a.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.holders.len(), 1, "a forged release freed it: {info:?}");
    // A chosen owner id acquiring again takes its own permit over with a newer token (as a
    // lock's acquire does): one place, and the older lease of it is stale.
    let chosen = OwnerId::random();
    let first = permit(&b, &n, 2, opts(ttl).owner(chosen))
        .await
        .unwrap()
        .expect("permit");
    let again = permit(&b, &n, 2, opts(ttl).owner(chosen))
        .await
        .unwrap()
        .expect("the chosen owner's own permit");
    assert!(again.token() > first.token());
    let info = a.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.holders.len(), 2, "one place per owner: {info:?}");
    assert_eq!(b.release(&first).await.unwrap(), Released::NotHeld);
    assert_eq!(b.release(&again).await.unwrap(), Released::Released);
    // Extended from any client: the lease keeps its token and handle, the row its new expiry.
    let longer = b
        .extend(&p, Duration::from_secs(300))
        .await
        .expect("extend by the owner");
    assert_eq!(longer.token(), p.token());
    assert_eq!(longer.handle(), Some("permit"));
    let left = a
        .inspect_semaphore(&n)
        .await
        .unwrap()
        .expect("semaphore")
        .holders[0]
        .remaining;
    assert!(
        left.is_some_and(|l| l > Duration::from_secs(60)),
        "the row's expiry: {left:?}"
    );
    // Keep-alive's batch: a permit and a lock of the same name, each extended in its table.
    let lock = take(&a, &n, ttl).await.expect("the lock of the same name");
    let done = b
        .extend_many(&[
            (lock.clone(), ttl),
            (p.clone(), ttl),
            (other_owner.clone(), ttl),
        ])
        .await;
    assert!(done[0].is_ok(), "{:?}", done[0]);
    assert_eq!(
        done[1].as_ref().map(Lease::handle).ok(),
        Some(Some("permit"))
    );
    assert!(
        matches!(done[2], Err(Error::LockLost { .. })),
        "{:?}",
        done[2]
    );
    assert_eq!(b.release(&p).await.unwrap(), Released::Released);
    assert_eq!(a.release(&p).await.unwrap(), Released::NotHeld);
    match a.extend(&p, ttl).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("extend after release: {other:?}"),
    }
    assert!(
        a.inspect(&n).await.unwrap().unwrap().holder.is_some(),
        "the permit's release freed the lock"
    );
    a.release(&lock).await.unwrap();
}

/// `forget` leaves nothing of a semaphore nobody holds or waits for (its fence included), and
/// keeps one in use; `inspect_semaphore` then reports it unknown.
async fn idle_semaphore_is_forgotten(kind: Kind) {
    let url = fresh_url(kind).await;
    let (c, raw) = (client(&url).await, Raw::connect(&url).await);
    let n = name("forgotten");
    assert!(c.inspect_semaphore(&n).await.unwrap().is_none());
    let p = permit(&c, &n, 2, opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("permit");
    let q = permit(&c, &n, 2, opts(Duration::from_millis(50)))
        .await
        .unwrap()
        .expect("permit");
    let info = c.inspect_semaphore(&n).await.unwrap().expect("semaphore");
    assert_eq!(info.permits, Some(2));
    assert_eq!(info.holders.len(), 2);
    assert_eq!(info.holders[0].owner, p.owner().to_string(), "oldest first");
    assert_eq!(info.holders[0].token, p.token());
    assert!(!c.forget(&n).await.unwrap(), "forgot a semaphore in use");
    assert!(raw.semaphore_fence(n.as_str()).await.is_some());
    c.release(&p).await.unwrap();
    // `q`'s ttl runs out: expired permits do not keep a semaphore in use.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(q.token().0, p.token().0 + 1);
    assert!(
        c.forget(&n).await.unwrap(),
        "an idle semaphore is forgotten"
    );
    assert!(c.inspect_semaphore(&n).await.unwrap().is_none());
    for table in [SEMAPHORES, PERMITS, PERMIT_QUEUE] {
        assert_eq!(raw.rows_of(table, n.as_str()).await, 0, "{table}");
    }
}
