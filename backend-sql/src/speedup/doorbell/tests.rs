//! Doorbells: the addresses, a ring between two sockets, and on a SQLite file (the dialect whose
//! clients always share one host) the release that rings the head of the queue; with the same
//! set-up, a queue that a retried join left a second row in, the retried join that finds the
//! row its lost try committed, and the retried release that finds the row its lost try freed.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{AcquireOptions, KeepAlive, LockName, OwnerId, Released, Wait};

use super::*;
use crate::client::{Client, QUEUED};
use crate::dialect::sqlite::Sqlite;
use crate::queue::{Kind, LIVENESS};
use crate::statement::Args;

#[test]
fn addresses_differ_by_store_and_ticket_and_fit_an_abstract_name() {
    let a = address("sqlite:///tmp/a.db#dlock_leases", 7);
    assert_eq!(a, address("sqlite:///tmp/a.db#dlock_leases", 7));
    assert_ne!(a, address("sqlite:///tmp/b.db#dlock_leases", 7));
    assert_ne!(a, address("sqlite:///tmp/a.db#dlock_leases", 8));
    let long = address(&"x".repeat(4096), i64::MAX);
    assert!(long.len() < 107, "{long}");
}

/// Fails instead of hanging.
const LIMIT: Duration = Duration::from_secs(30);

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_ring_wakes_the_bound_waiter_and_only_it() {
    let key = format!("test-{}", OwnerId::random());
    let doorbell = Doorbell::bind(&key, 1).expect("bound");
    let other = Doorbell::bind(&key, 2).expect("bound");
    // The address is taken while the first is bound.
    assert!(Doorbell::bind(&key, 1).is_none());
    assert!(ring(&key, 1), "a bound doorbell takes the ring");
    assert!(ring(&key, 1));
    tokio::time::timeout(LIMIT, doorbell.rung())
        .await
        .expect("rung");
    // Both rings were taken by the one wake-up; the other waiter heard nothing (a ring is
    // queued at its receiver before `ring` returns, so no wait is needed to tell).
    assert!(!doorbell.try_rung());
    assert!(!other.try_rung());
    // Unbound when dropped: the address can be bound again, and ringing nobody is fine.
    drop(doorbell);
    assert!(!ring(&key, 1), "nobody took the ring");
    assert!(Doorbell::bind(&key, 1).is_some());
}

async fn sqlite_client(dir: &tempfile::TempDir) -> Arc<Client<Sqlite>> {
    let url = format!("sqlite://{}/doorbell.db", dir.path().display());
    let config = crate::config::SqlConfig::parse(&url).expect("a SQLite URL");
    Arc::new(Client::<Sqlite>::connect(&config).await.expect("connect"))
}

/// A SQLite client on a database of its own (gone with the directory), and a name.
async fn fresh(name: &str) -> (tempfile::TempDir, Arc<Client<Sqlite>>, LockName) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let client = sqlite_client(&dir).await;
    (dir, client, LockName::new(name).expect("a name"))
}

/// `name`'s lock, taken by a plain attempt.
async fn plain_lock(client: &Arc<Client<Sqlite>>, name: &LockName) -> lockcore::Lease {
    let taken = client.try_acquire(name, &opts(Wait::No)).await;
    taken.expect("try").expect("free")
}

fn opts(wait: Wait) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(Duration::from_secs(30))
        .keep_alive(KeepAlive::Off)
        .wait(wait)
}

/// The waiter rows of `name`, live or not.
async fn waiters(client: &Client<Sqlite>, name: &LockName) -> i64 {
    queue_rows(client, name, false).await
}

/// The rows of `name` in the lock's queue or, with `permits`, the permit queue, live or not.
async fn queue_rows(client: &Client<Sqlite>, name: &LockName, permits: bool) -> i64 {
    let query = match permits {
        true => "SELECT count(*) FROM dlock_leases_permit_queue WHERE name = ?1",
        false => "SELECT count(*) FROM dlock_leases_waiters WHERE name = ?1",
    };
    sqlx::query_scalar(query)
        .bind(name.as_str())
        .fetch_one(&client.runner.pool)
        .await
        .expect("count the queue's rows")
}

type Waiting = tokio::task::JoinHandle<lockcore::Result<Option<lockcore::Lease>>>;

/// A waiting acquire of `kind` on `name` by this process, spawned, once its row is queued.
async fn queued_waiter(client: &Arc<Client<Sqlite>>, name: &LockName, kind: Kind) -> Waiting {
    let task = spawn_waiter(client, name, kind, opts(Wait::Forever));
    until_rows(client, name, matches!(kind, Kind::Permits(_)), 1).await;
    task
}

/// A waiting acquire of `kind` on `name` with `opts`, spawned.
fn spawn_waiter(
    client: &Arc<Client<Sqlite>>,
    name: &LockName,
    kind: Kind,
    opts: AcquireOptions,
) -> Waiting {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { crate::queue::acquire(&client, &name, kind, &opts, None).await })
}

/// Waits until `name`'s queue (with `permits`, its permit queue) holds at least `n` rows.
async fn until_rows(client: &Client<Sqlite>, name: &LockName, permits: bool, n: i64) {
    let queued = async {
        while queue_rows(client, name, permits).await < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(LIMIT, queued).await.expect("queued");
}

/// The lease a [`queued_waiter`] was granted.
async fn granted_to(waiter: Waiting) -> lockcore::Lease {
    tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("granted in time")
        .expect("task")
        .expect("no store error")
        .expect("a lease")
}

/// Queues a waiter row as a waiter in another process would; its ticket.
async fn foreign_waiter(client: &Client<Sqlite>, name: &LockName) -> i64 {
    enqueued_as(client, name, OwnerId::random()).await
}

/// Queues a waiter row of `owner` with the lock queue's join statement alone; its ticket.
async fn enqueued_as(client: &Client<Sqlite>, name: &LockName, owner: OwnerId) -> i64 {
    let args = Args::of(name).owner(owner).ttl(LIVENESS);
    let reply = client.runner.reply("enqueue", &client.sql.enqueue, args);
    reply.await.expect("enqueue").value().expect("a ticket")
}

/// The release of a lock granted from the queue rings the doorbell of the head its grant named,
/// and only its; the waiter's grant left the queue in the same statement (SQLite's triggers),
/// so the head is the next waiter, not the one just granted. A lock granted by a plain attempt
/// rings nobody.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_release_from_the_queue_rings_the_head_in_another_process() {
    let (_dir, client, name) = fresh("rung").await;
    let first = plain_lock(&client, &name).await;
    assert_ne!(first.handle(), Some(QUEUED));
    let waiter = queued_waiter(&client, &name, Kind::Lock).await;
    // Another process's waiters, queued behind: the first one is the head once the waiter
    // here is granted.
    let (head, behind) = (
        foreign_waiter(&client, &name).await,
        foreign_waiter(&client, &name).await,
    );
    let (head_bell, behind_bell) = (
        client.doorbell(head, false).expect("the head's doorbell"),
        client.doorbell(behind, false).expect("a doorbell"),
    );
    // A plain grant's release rings nobody.
    assert_eq!(
        client
            .release_row(&client.sql.release, &first, false)
            .await
            .unwrap(),
        Released::Released
    );
    let granted = granted_to(waiter).await;
    // The plain grant's release did not take the branch that rings (the one that also notes
    // the name as contended); the queued grant's release below does.
    assert!(!client.joins_first(&name));
    // The grant named the waiter it left at the head.
    let named = format!("{QUEUED} {head}");
    assert_eq!(granted.handle(), Some(named.as_str()));
    assert_eq!(
        waiters(&client, &name).await,
        2,
        "the grant left only the other process's waiters queued"
    );
    // The head's row goes (its doorbell stays bound): a release that looked the head up now
    // would ring the one behind; the one the grant named is rung without a look.
    delete_waiter(&client, head).await;

    let released = client.release_row(&client.sql.release, &granted, false);
    assert_eq!(released.await.unwrap(), Released::Released);
    tokio::time::timeout(LIMIT, head_bell.rung())
        .await
        .expect("the head was rung");
    // One ring, sent to the head alone.
    assert!(!behind_bell.try_rung());
    assert!(client.joins_first(&name));
}

/// When nobody is bound at the doorbell the grant named any more (that waiter left), the
/// release looks up the live head and rings it instead.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_release_whose_named_head_left_rings_the_live_head() {
    let (_dir, client, name) = fresh("left").await;
    let held = plain_lock(&client, &name).await;
    let (gone, live) = (
        foreign_waiter(&client, &name).await,
        foreign_waiter(&client, &name).await,
    );
    delete_waiter(&client, gone).await;
    let live_bell = client.doorbell(live, false).expect("a doorbell");
    // As if granted from the queue with `gone` then at its head.
    let held = held.with_handle(crate::client::queued(Some(gone)));
    let released = client.release_row(&client.sql.release, &held, false);
    assert_eq!(released.await.unwrap(), Released::Released);
    tokio::time::timeout(LIMIT, live_bell.rung())
        .await
        .expect("the live head was rung after the look-up");
}

/// Deletes the waiter row with `ticket`, as its leaving the queue would.
async fn delete_waiter(client: &Client<Sqlite>, ticket: i64) {
    sqlx::query("DELETE FROM dlock_leases_waiters WHERE ticket = ?1")
        .bind(ticket)
        .execute(&client.runner.pool)
        .await
        .expect("delete the waiter row");
}

/// After releasing a lock granted from the queue, a waiting acquire of the name joins the queue
/// without its plain attempt, and is granted all the same when nobody else waits; an acquire
/// that would not wait still makes its attempt.
#[tokio::test]
async fn after_a_contended_release_a_waiting_acquire_joins_first_and_is_granted() {
    let (_dir, client, name) = fresh("joins-first").await;
    let contended = |client: &Client<Sqlite>| {
        let now = std::time::Instant::now();
        let lease = crate::client::granted(&name, OwnerId::random(), 1, now, &opts(Wait::No))
            .with_handle(QUEUED);
        // As if that lease had just been released: what the release records.
        client.note_contended(&lease);
    };

    contended(&client);
    assert!(client.joins_first(&name));
    assert!(!client.joins_first(&name), "remembered once");

    contended(&client);
    let forever = opts(Wait::Forever);
    let waited = crate::queue::acquire(&client, &name, Kind::Lock, &forever, None);
    let lease = tokio::time::timeout(LIMIT, waited)
        .await
        .expect("granted in time")
        .expect("no store error")
        .expect("a lease");
    assert_eq!(
        lease.handle(),
        Some(QUEUED),
        "granted from the queue it joined"
    );
    assert_eq!(waiters(&client, &name).await, 0);
    client
        .release_row(&client.sql.release, &lease, false)
        .await
        .unwrap();

    contended(&client);
    let now = Some(std::time::Instant::now());
    let no = opts(Wait::No);
    let tried = crate::queue::acquire(&client, &name, Kind::Lock, &no, now);
    let lease = tried
        .await
        .expect("no store error")
        .expect("the plain attempt");
    assert_ne!(lease.handle(), Some(QUEUED));
}

/// A permit granted from the queue rings, on release, the doorbell of the permit queue's live
/// head, a waiter of another process: at the permit queue's address, not at the lock queue's
/// address of the same ticket. A release that hands the permit to this process's own waiter
/// rings nobody.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_permit_from_the_queue_rings_the_permit_queues_head() {
    let (_dir, client, name) = fresh("permits-rung").await;
    let first = client
        .try_acquire_permit(&name, 1, &opts(Wait::No))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(first.handle(), Some(crate::client::PERMIT));
    let waiter = queued_waiter(&client, &name, Kind::Permits(1)).await;
    // Another process's permit waiter, behind this one.
    let args = Args::of(&name)
        .owner(OwnerId::random())
        .ttl(LIVENESS)
        .permits(1);
    let enqueue = client
        .runner
        .reply("enqueue", &client.sql.permits.enqueue, args);
    let foreign = enqueue.await.expect("enqueue").value().expect("a ticket");
    let foreign_bell = client.doorbell(foreign, true).expect("a permit doorbell");
    let same_ticket_in_lock_queue = client.doorbell(foreign, false).expect("a lock doorbell");

    // Handed to the waiter here, in the release's own transaction: nobody is rung.
    client.release_permit(&first).await.expect("release");
    let granted = granted_to(waiter).await;
    assert_eq!(granted.handle(), Some(crate::client::PERMIT_QUEUED));
    assert!(!foreign_bell.try_rung());

    client.release_permit(&granted).await.expect("release");
    tokio::time::timeout(LIMIT, foreign_bell.rung())
        .await
        .expect("the permit queue's head was rung");
    assert!(!same_ticket_in_lock_queue.try_rung());
}

/// A read hold granted from the queue rings, on release, the doorbell of the lock queue's live
/// head (a writer of another process waiting for the readers to leave); a writer's plain
/// grant, released, rings nobody.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_read_hold_from_the_queue_rings_the_writer_behind() {
    let (_dir, client, name) = fresh("readers-rung").await;
    let writer = plain_lock(&client, &name).await;
    let reading = queued_waiter(&client, &name, Kind::Read).await;
    // A writer of another process, behind the reader.
    let behind = foreign_waiter(&client, &name).await;
    let behind_bell = client.doorbell(behind, false).expect("a doorbell");

    let released = client.release_row(&client.sql.release, &writer, false);
    assert_eq!(released.await.unwrap(), Released::Released);
    let reader = granted_to(reading).await;
    assert_eq!(reader.handle(), Some(crate::client::READ_QUEUED));
    assert!(!behind_bell.try_rung(), "the plain grant's release rang");

    let released = client.release_read(&reader).await.expect("release");
    assert_eq!(released, Released::Released);
    tokio::time::timeout(LIMIT, behind_bell.rung())
        .await
        .expect("the writer behind was rung");
}

/// A join sent again after a lost reply leaves an earlier row of the same waiter in the queue
/// (the first statement committed; the session died before its answer came). That row runs
/// out, since only the row with the waiter's own ticket is refreshed, and the queue moves on
/// in order. While such a row was kept alive, the waiter queued behind it counted it ahead, and
/// its owner counted that waiter ahead of itself: neither was ever granted (seen as a 60 s
/// stall in `mariadb_semaphore_survives_killed_sessions`).
#[tokio::test]
async fn a_second_row_left_by_a_retried_join_runs_out_and_the_queue_moves() {
    let (_dir, client, name) = fresh("joined-twice").await;
    let holder = plain_lock(&client, &name).await;
    // The row the lost reply left: `a`'s, first in the queue.
    let a = OwnerId::random();
    enqueued_as(&client, &name, a).await;
    // `b` queues behind it; then `a` waits, with the row its join makes, behind `b`.
    let b = spawn_waiter(&client, &name, Kind::Lock, opts(Wait::Forever));
    until_rows(&client, &name, false, 2).await;
    let a_waits = spawn_waiter(&client, &name, Kind::Lock, opts(Wait::Forever).owner(a));
    until_rows(&client, &name, false, 3).await;
    let release = |lease| client.release_row(&client.sql.release, lease, false);
    assert_eq!(release(&holder).await.expect("release"), Released::Released);
    // `b` first: `a`'s old row ran out instead of holding the queue, and `a` is behind `b`.
    let b = granted_to(b).await;
    assert!(!a_waits.is_finished(), "a was granted ahead of b");
    assert_eq!(release(&b).await.expect("release"), Released::Released);
    let a_lease = granted_to(a_waits).await;
    assert_eq!(a_lease.owner(), a);
    assert_eq!(
        waiters(&client, &name).await,
        0,
        "a's rows left with its grant"
    );
}

/// A retried join hands back the ticket of the row its lost try committed, in the lock's queue
/// and in the permit queue, rather than joining a second time; a first try, another owner and a
/// row that ran out get none.
#[tokio::test]
async fn a_retried_join_finds_the_row_its_lost_try_committed() {
    use crate::statement::rejoin;
    let (_dir, client, name) = fresh("rejoined").await;
    let (a, other, gone) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    for permits in [false, true] {
        let (enqueue, own) = match permits {
            false => (&client.sql.enqueue, &client.sql.own_ticket),
            true => (&client.sql.permits.enqueue, &client.sql.permits.own_ticket),
        };
        let mut tickets = Vec::new();
        for (owner, ttl) in [(a, LIVENESS), (gone, Duration::ZERO)] {
            let args = Args::of(&name).owner(owner).ttl(ttl).permits(2);
            let reply = client.runner.reply("enqueue", enqueue, args).await;
            tickets.push(reply.expect("enqueue").value().expect("a ticket"));
        }
        let mut conn = client.runner.pool.acquire().await.expect("a connection");
        for (owner, retry, expected) in [
            (a, true, Some(tickets[0])),
            // A first try looks for nothing.
            (a, false, None),
            (other, true, None),
            // A row that ran out.
            (gone, true, None),
        ] {
            let args = Args::of(&name).owner(owner);
            let found = rejoin::<sqlx::Sqlite>(&mut conn, own, &args, retry).await;
            assert_eq!(
                found.expect("look"),
                expected,
                "permits {permits}, retry {retry}"
            );
        }
    }
}

/// A release sent again after its first reply was lost frees nothing; the row then tells whether
/// the lost try freed it: free at the lease's fence. A lease that ran out (its owner stays on
/// the row) or was taken over and released since (a higher fence) reads as not freed.
#[tokio::test]
async fn a_retried_release_tells_its_lost_try_from_a_lost_lease() {
    let (_dir, client, name) = fresh("released-once").await;
    let lease = plain_lock(&client, &name).await;
    let released = client.release_row(&client.sql.release, &lease, false).await;
    assert_eq!(released.expect("release"), Released::Released);
    assert!(client.freed_at_fence(&lease).await.expect("look"));

    let short = opts(Wait::No).ttl(Duration::from_millis(20));
    let short = client.try_acquire(&name, &short).await.expect("try");
    let short = short.expect("free");
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        !client.freed_at_fence(&short).await.expect("look"),
        "ran out"
    );

    let next = plain_lock(&client, &name).await;
    assert!(next.token() > short.token());
    let released = client.release_row(&client.sql.release, &next, false).await;
    assert_eq!(released.expect("release"), Released::Released);
    assert!(
        !client.freed_at_fence(&short).await.expect("look"),
        "taken over"
    );
    assert!(client.freed_at_fence(&next).await.expect("look"));
}
