//! The semaphore's reading of the routines' rows and of the state row, and the hand-over on
//! SQLite (the dialect that sends its statements one by one).

use super::*;
use crate::statement::Reply;

#[test]
fn the_hand_over_routines_row_reads_as_what_the_release_did() {
    let row = |[a, b, c]: [Option<i64>; 3]| {
        Handover::by_call(&Reply::with_row([a, b, c, None, None, None, None]))
    };
    assert_eq!(row([Some(0), None, None]), Handover::default());
    let not_handed = row([Some(1), None, None]);
    assert!(not_handed.freed && not_handed.fence.is_none());
    assert_eq!(
        row([Some(1), Some(9), Some(2)]),
        Handover {
            freed: true,
            fence: Some(9),
            free: 2
        }
    );
}

#[test]
fn the_grant_routines_row_reads_as_the_transactions_outcome() {
    let row = |cols: [Option<i64>; 6]| {
        let [a, b, c, d, e, f] = cols;
        granted_by_call(&Reply::with_row([a, b, c, d, e, f, None])).ok()
    };
    let granted = row([Some(0), Some(41), None, None, None, None]);
    assert_eq!(granted, Some(Grant::Granted(41)));
    let full = row([Some(1), None, Some(0), Some(1500), Some(4), None]);
    let holder_left = Some(Duration::from_micros(1500));
    assert_eq!(
        full,
        Some(Grant::Blocked {
            ahead: 0,
            holder_left
        })
    );
    let behind = row([Some(1), None, Some(2), None, Some(4), None]);
    let ahead = Grant::Blocked {
        ahead: 2,
        holder_left: None,
    };
    assert_eq!(behind, Some(ahead));
    assert_eq!(
        row([Some(2), None, None, None, Some(3), None]),
        Some(Grant::Mismatch(3))
    );
    // A grant without its fence, or an outcome the routine never gives, is an error.
    assert_eq!(row([Some(0), None, None, None, None, None]), None);
    assert_eq!(row([Some(7), None, None, None, None, None]), None);
}

#[test]
fn judge_reads_the_state_row_in_order() {
    let row = |cols: [Option<i64>; 6]| {
        let [a, b, c, d, e, f] = cols;
        Reply::with_row([a, b, c, d, e, f, Some(0)])
    };
    // Idle: free.
    let idle = row([None, Some(0), Some(0), None, None, Some(0)]);
    assert_eq!(judge(&idle, 2), Judged::Free { expired: false });
    // Our own permit from a first try wins over anything but another count.
    let mine = row([Some(2), Some(9), Some(9), Some(7), None, None]);
    assert_eq!(judge(&mine, 2), Judged::Mine);
    let mine_other = row([Some(3), Some(9), Some(9), Some(7), None, None]);
    assert_eq!(judge(&mine_other, 2), Judged::Mismatch(3));
    // Another count recorded.
    let other = row([Some(3), Some(1), Some(0), None, None, None]);
    assert_eq!(judge(&other, 2), Judged::Mismatch(3));
    // Full: blocked until the first holder runs out.
    let full = row([Some(2), Some(2), Some(0), None, Some(1500), Some(1)]);
    assert_eq!(
        judge(&full, 2),
        Judged::Blocked {
            ahead: 0,
            holder_left: Some(Duration::from_micros(1500))
        }
    );
    // Room, but a waiter ahead.
    let behind = row([Some(2), Some(1), Some(1), None, Some(1500), Some(0)]);
    assert_eq!(
        judge(&behind, 2),
        Judged::Blocked {
            ahead: 1,
            holder_left: None
        }
    );
    let room = row([Some(2), Some(1), Some(0), None, Some(1500), Some(4)]);
    assert_eq!(judge(&room, 2), Judged::Free { expired: true });
}

/// On SQLite, whose hand-over runs statement by statement (`hand_tx`, reading whether the
/// waiter is queued from the state row's last column), a release with a waiter of this process
/// queued grants it the permit in the release's own transaction: its lease is valid from
/// before the release returned. (Were it only woken, its own grant would start after: on this
/// single-threaded runtime the waiter cannot run until the test awaits.)
#[tokio::test]
async fn a_release_on_sqlite_hands_the_permit_to_the_waiter_here() {
    use crate::dialect::sqlite::Sqlite;
    use lockcore::{KeepAlive, Wait};

    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}/hand.db", dir.path().display());
    let config = crate::config::SqlConfig::parse(&url).expect("a SQLite URL");
    let client = Arc::new(Client::<Sqlite>::connect(&config).await.expect("connect"));
    let name = LockName::new("hand-over").expect("a name");
    let opts = AcquireOptions::new()
        .ttl(Duration::from_secs(30))
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No);
    let held = client
        .try_acquire_permit(&name, 1, &opts)
        .await
        .expect("try a permit")
        .expect("a free permit");
    let waiter = {
        let (client, name, opts) = (client.clone(), name.clone(), opts.clone());
        tokio::spawn(async move {
            crate::queue::acquire(&client, &name, Kind::Permits(1), &opts, None).await
        })
    };
    // Until the waiter has joined the store's queue and recorded its ticket here.
    let key = key(name.as_str(), true);
    let joined = async {
        while client.local.next(&key).is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), joined)
        .await
        .expect("the waiter joined the queue");
    let released = client.release_permit(&held).await.expect("release");
    let returned = Instant::now();
    assert_eq!(released, Released::Released);
    let lease = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter's permit in time")
        .expect("the waiter's task")
        .expect("no store error")
        .expect("a permit");
    assert!(
        lease.acquired_at() <= returned,
        "the waiter granted itself after the release instead of being handed the permit"
    );
    assert!(lease.token() > held.token());
}
