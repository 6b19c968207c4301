//! The waiting mechanics of one dialect: PostgreSQL's notifications and queue tables, MariaDB's
//! hand-over.

use std::time::{Duration, Instant};

use conformance_tests::kit;
use conformance_tests::within;
use lockcore::{OwnerId, Released};

use crate::support::*;

/// A waiter on PostgreSQL is woken by the release's NOTIFY, long before its own deadline and the
/// holder's expiry (both a minute away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiter_woken_by_notify() {
    let url = fresh_url(Kind::Postgres).await;
    let (holder, waiter) = (client(&url).await, client(&url).await);
    let n = name("notified");
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    // The first wait starts the listener and returns once it listens.
    let warm = name("warm-up");
    tokio::time::timeout(
        Duration::from_secs(20),
        waiter.wait_for_release(&warm, Instant::now() + Duration::from_secs(10)),
    )
    .await
    .expect("listener start hangs")
    .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let wait = {
        let waiter = waiter.clone();
        let n = n.clone();
        tokio::spawn(async move { waiter.wait_for_release(&n, until).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !wait.is_finished(),
        "the waiter returned while the lock was held"
    );
    holder.release(&lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("the release did not wake the waiter")
        .expect("task")
        .expect("wait_for_release");
    assert!(take(&waiter, &n, Duration::from_secs(5)).await.is_some());
}

/// A role that may connect and nothing else (no right on dlock's tables) LISTENs on the table's
/// channel and NOTIFYs forged hand-overs while a holder holds and three waiters queue (each in a
/// client of its own, as processes are): for every waiter, every ticket the queue could have
/// given out, the waiters' ttl, in the form a hand-over had before it was tagged and with tags
/// of its own. No waiter takes one for a grant: after the holder's release the lock goes to the
/// waiters in queue order with increasing tokens. The hand-overs the store itself sends carry
/// the tag of the secret each waiter stored in its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_forged_hand_over_notifications_grant_nothing() {
    use sha2::{Digest, Sha256};

    let url = fresh_url(Kind::Postgres).await;
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let mut attacker_url = url::Url::parse(&url).expect("url");
    let database = attacker_url.path().trim_start_matches('/').to_owned();
    let (role, password) = (
        unique("mallory"),
        format!("{:032x}", rand::random::<u128>()),
    );
    pg.query(
        &database,
        &format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"),
    )
    .await
    .expect("create the role");
    attacker_url.set_username(&role).expect("user");
    attacker_url
        .set_password(Some(&password))
        .expect("password");
    let attacker_url = attacker_url.to_string();

    let (holder, raw) = (client(&url).await, Raw::connect(&url).await);
    let Raw::Pg(admin) = &raw else {
        unreachable!("a postgres URL")
    };
    let n = name("forged-hand-overs");
    let held = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("free");
    let ttl = Duration::from_secs(60);
    let owners = [OwnerId::random(), OwnerId::random(), OwnerId::random()];
    let mut tasks = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let c = client(&url).await;
        let opts = waiting(Duration::from_secs(60)).ttl(ttl).owner(*owner);
        tasks.push(spawn_wait(&c, &n, opts, false));
        until_queued(&holder, &n, i + 1).await;
    }

    let attacker = sqlx::PgPool::connect(&attacker_url)
        .await
        .expect("the role connects");
    let denied = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT waiter FROM \"{WAITERS}\""
    )))
    .fetch_all(&attacker)
    .await;
    assert!(
        denied.is_err_and(|e| e.to_string().contains("permission denied")),
        "the role can read the waiters"
    );
    let mut listener = sqlx::postgres::PgListener::connect(&attacker_url)
        .await
        .expect("the role listens");
    listener.listen(TABLE).await.expect("LISTEN");
    let ttl_us = ttl.as_micros();
    let mut forged = Vec::new();
    for owner in owners {
        for ticket in 1..=100 {
            forged.push(format!("H{owner}7,{ttl_us},{ticket},{n}"));
            forged.push(format!(
                "H{owner}7,{ttl_us},{ticket},{},{n}",
                "0".repeat(64)
            ));
            let tag = format!("{:064x}", rand::random::<u128>());
            forged.push(format!("H{owner}7,{ttl_us},{ticket},{tag},{n}"));
        }
    }
    sqlx::query("SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p")
        .bind(TABLE)
        .bind(&forged)
        .fetch_one(&attacker)
        .await
        .expect("the role notifies");
    // The waiters have had their forged grants when the last one reaches the role's own
    // listener: every listener gets a transaction's notifications together.
    within(Duration::from_secs(30), "the forged notifications", async {
        let mut seen = 0;
        while seen < forged.len() {
            listener.recv().await.expect("recv");
            seen += 1;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (owner, task) in owners.iter().zip(&tasks) {
        assert!(!task.is_finished(), "waiter {owner} took a forged grant");
    }
    let (row_owner, _, _) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(row_owner, Some(held.owner().to_string()));

    // What each waiter stored, to check the store's own hand-overs by.
    let secrets: Vec<(String, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT waiter, ticket, secret FROM \"{WAITERS}\" WHERE name = $1"
    )))
    .bind(n.as_str())
    .fetch_all(admin)
    .await
    .expect("the waiters' secrets");
    assert_eq!(secrets.len(), 3, "{secrets:?}");

    holder.release(&held).await.expect("release");
    let mut last = held.token();
    for (owner, task) in owners.iter().zip(tasks) {
        let lease = granted("a waiter's grant, in queue order", task).await;
        assert_eq!(lease.owner(), *owner, "granted out of queue order");
        assert!(
            lease.token() > last,
            "tokens went {last} then {}",
            lease.token()
        );
        last = lease.token();
        holder.release(&lease).await.expect("release");
    }
    // The second and third grants were hand-overs: the store's notification carries the tag
    // of the secret in the waiter's row.
    let mut genuine = 0;
    while let Ok(Ok(note)) = tokio::time::timeout(Duration::from_secs(2), listener.recv()).await {
        let Some(rest) = note.payload().strip_prefix('H') else {
            continue;
        };
        let (waiter, rest) = rest.split_at(32);
        let fields: Vec<&str> = rest.splitn(5, ',').collect();
        let (_, ticket, secret) = secrets
            .iter()
            .find(|(w, _, _)| w == waiter)
            .expect("a hand-over to a waiter");
        assert_eq!(fields[2], ticket.to_string(), "{}", note.payload());
        let signed = format!(
            "{secret},{},{},{},{waiter},{secret}",
            fields[0], fields[1], fields[2]
        );
        let tag: String = Sha256::digest(signed.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(fields[3], tag, "the store's tag of {}", note.payload());
        genuine += 1;
    }
    assert_eq!(genuine, 2, "hand-overs notified");
}

/// A waiters table made before waiters stored a secret gains the column when a client
/// connects, and only then: a table that has it is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiters_table_without_the_secret_gains_it() {
    let url = fresh_url(Kind::Postgres).await;
    let _first = client(&url).await;
    let Raw::Pg(pool) = Raw::connect(&url).await else {
        unreachable!("a postgres URL")
    };
    let columns = || async {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT attname::text FROM pg_attribute \
             WHERE attrelid = to_regclass('dlock_leases_waiters') AND attnum > 0 \
             AND NOT attisdropped ORDER BY attnum",
        )
        .fetch_all(&pool)
        .await
        .expect("columns");
        names
    };
    assert!(columns().await.contains(&"secret".to_owned()));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE \"{WAITERS}\" DROP COLUMN secret"
    )))
    .execute(&pool)
    .await
    .expect("an older table");
    assert!(!columns().await.contains(&"secret".to_owned()));
    let (a, b) = (client(&url).await, client(&url).await);
    assert_eq!(
        columns().await,
        ["ticket", "name", "waiter", "expires_at", "secret"]
    );
    // And the queue works on it: a hand-over from a queued lease to the next waiter.
    let n = name("gained-secret");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let waiter = spawn_wait(&a, &n, waiting(Duration::from_secs(30)), false);
    until_queued(&a, &n, 1).await;
    b.release(&held).await.expect("release");
    let next = granted("the next waiter", waiter).await;
    assert!(next.token() > held.token());
    a.release(&next).await.expect("release");
}

/// PostgreSQL's two queue tables (the lock's waiters and the permit waiters) are UNLOGGED, and
/// only they: holders, fences and read holds stay in logged tables. A crash empties an unlogged
/// table, which is here done by hand (`TRUNCATE`, as crash recovery does) while two waiters
/// queue behind a holder: each finds its row gone at its next refresh and joins again at the
/// tail, so the queue forms again (a `try_lock` is refused again, as a live queue requires), and
/// the holder's release hands the lock to the waiters in the order of their new rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_tables_are_unlogged_and_waiters_join_again_when_emptied() {
    let url = fresh_url(Kind::Postgres).await;
    let (holder, intruder, raw) = (
        client(&url).await,
        client(&url).await,
        Raw::connect(&url).await,
    );
    let Raw::Pg(pool) = &raw else {
        unreachable!("a postgres URL")
    };
    let kinds: Vec<(String, String)> = sqlx::query_as(
        "SELECT relname::text, relpersistence::text FROM pg_class \
         WHERE relkind = 'r' AND relname LIKE 'dlock_leases%' ORDER BY relname",
    )
    .fetch_all(pool)
    .await
    .expect("table kinds");
    let unlogged: Vec<&str> = kinds
        .iter()
        .filter(|(_, p)| p == "u")
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(
        unlogged,
        ["dlock_leases_permit_queue", "dlock_leases_waiters"],
        "{kinds:?}"
    );
    assert_eq!(kinds.len(), 6, "{kinds:?}");

    let n = name("emptied-queue");
    let ttl = Duration::from_secs(10);
    let lease = take(&holder, &n, Duration::from_secs(60))
        .await
        .expect("acquire");
    let ids = [OwnerId::random(), OwnerId::random()];
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let c = client(&url).await;
        let opts = waiting(Duration::from_secs(30)).owner(*id);
        tasks.push(spawn_wait(&c, &n, opts, false));
        until_queued(&holder, &n, i + 1).await;
    }
    let waiters = format!("\"{TABLE}_waiters\"");
    let before = raw.tickets(n.as_str()).await;
    assert_eq!(before.len(), 2, "{before:?}");
    sqlx::query(sqlx::AssertSqlSafe(format!("TRUNCATE {waiters}")))
        .execute(pool)
        .await
        .expect("truncate the waiters");
    assert!(
        take(&intruder, &n, ttl).await.is_none(),
        "the lock is still held"
    );
    // Both waiters join again within a refresh (1 s) or so.
    let queue: Vec<(i64, String)> =
        within(Duration::from_secs(20), "the waiters join again", async {
            loop {
                let rows: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT ticket, waiter FROM {waiters} WHERE name = $1 ORDER BY ticket"
                )))
                .bind(n.as_str())
                .fetch_all(pool)
                .await
                .expect("waiter rows");
                if rows.len() == 2 {
                    break rows;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    assert!(
        queue.iter().all(|(t, _)| before.iter().all(|b| t > b)),
        "new rows at the tail: {before:?} then {queue:?}"
    );
    holder.release(&lease).await.expect("release");
    assert!(
        take(&intruder, &n, ttl).await.is_none(),
        "a try_lock jumped the queue that formed again"
    );
    // The lease goes to the waiter whose new row is first, then to the other.
    let first = usize::from(queue[0].1 != ids[0].to_string());
    assert_eq!(queue[1 - first].1, ids[1 - first].to_string(), "{queue:?}");
    let mut tasks = tasks.into_iter();
    let (t0, t1) = (tasks.next().expect("task"), tasks.next().expect("task"));
    let (head, second) = if first == 0 { (t0, t1) } else { (t1, t0) };
    let head = granted("the head's grant", head).await;
    assert_eq!(head.owner(), ids[first]);
    assert!(
        !second.is_finished(),
        "the second waiter got in beside the head"
    );
    holder.release(&head).await.expect("release the head");
    let next = granted("the second grant", second).await;
    assert_eq!(next.owner(), ids[1 - first]);
    assert!(next.token() > head.token() && head.token() > lease.token());
    holder.release(&next).await.expect("release the second");
}

/// MySQL hands the lock over in the release, and the new holder deletes its waiter row in the
/// background. Here another session holds the waiters table with `LOCK TABLES .. READ`, so that
/// delete waits (reads, and so the hand-overs, go on) while the new holder releases: the release
/// waits for it. Had it not, the second waiter would be handed the lock at once, and the first
/// holder's row, still live, would head the queue: the second holder's release would hand the
/// lock to it, an owner id nobody waits as, and the lock would stay taken until that lease ran
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_handed_holder_leaves_the_queue_before_it_releases() {
    let url = fresh_url(Kind::MariaDb).await;
    let (a, b, c, d) = (
        client(&url).await,
        client(&url).await,
        client(&url).await,
        client(&url).await,
    );
    let raw = Raw::connect(&url).await;
    let Raw::My(pool) = &raw else {
        unreachable!("a MariaDB URL")
    };
    let n = name("handed-again");
    let held = queued_lease(&a, &b, &n, Duration::from_secs(30)).await;
    let (w, x) = (OwnerId::random(), OwnerId::random());
    let first = spawn_wait(&c, &n, waiting(Duration::from_secs(30)).owner(w), false);
    until_queued(&a, &n, 1).await;
    let mut second = spawn_wait(&d, &n, waiting(Duration::from_secs(30)).owner(x), false);
    until_queued(&a, &n, 2).await;

    let mut blocker = pool.acquire().await.expect("a connection");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLES `{TABLE}_waiters` READ"
    )))
    .execute(&mut *blocker)
    .await
    .expect("lock the waiters table for reading");
    assert_eq!(b.release(&held).await.expect("release"), Released::Released);
    let got = granted("the first waiter's grant", first).await;
    assert_eq!(got.owner(), w);
    let release = {
        let c = c.clone();
        tokio::spawn(async move { c.release(&got).await })
    };
    let early = tokio::time::timeout(Duration::from_millis(500), &mut second).await;
    assert!(
        early.is_err(),
        "the first holder released while its waiter row was still queued"
    );
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut *blocker)
        .await
        .expect("unlock");
    let released = within(Duration::from_secs(30), "the first release", release).await;
    assert_eq!(
        released.expect("task").expect("release"),
        Released::Released
    );
    let got = granted("the second waiter's grant", second).await;
    assert_eq!(got.owner(), x);
    assert_eq!(d.release(&got).await.expect("release"), Released::Released);
    let (owner, _, _) = raw.row(TABLE, n.as_str()).await.expect("row");
    assert_eq!(
        owner, None,
        "the lock went to the queue row of a holder that had left"
    );
}
