//! The write turn in this process (the keep line first, a cancelled writer hands its turn on)
//! and between processes: two turns over one sidecar, each with its own open file (as two
//! processes have), take it one after the other.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use super::*;

/// Polls `take` once: whether it is still waiting. (No timer: whether a take waits is decided
/// by the locks, at its first poll.)
async fn waits<F: Future>(mut take: Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(take.as_mut().poll(cx).is_pending())).await
}

/// Fails instead of hanging.
const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_openers_of_one_sidecar_take_turns() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sidecar = dir.path().join("locks.db-queue");
    let db = dir.path().join("locks.db");
    let (one, other) = (
        SqliteWriteQueue::beside(&db, &sidecar),
        SqliteWriteQueue::beside(&db, &sidecar),
    );
    assert!(one.between.is_some() && other.between.is_some());

    let held = one.take(WritePriority::Normal).await;
    assert!(held.locked.is_some(), "nobody else held it: locked at once");
    let mut waiting = pin!(other.take(WritePriority::Normal));
    // The other opener waits while the first holds its turn...
    assert!(
        waits(waiting.as_mut()).await,
        "took the queue while another opener held it"
    );
    // ...and has it once that turn ends.
    drop(held);
    let next = tokio::time::timeout(LIMIT, waiting)
        .await
        .expect("the queue");
    assert!(next.locked.is_some());

    // A writer dropped while it waits gives the turn on when its thread gets it.
    let mut abandoned = Box::pin(one.take(WritePriority::Normal));
    assert!(waits(abandoned.as_mut()).await);
    drop(abandoned);
    drop(next);
    let again = tokio::time::timeout(LIMIT, other.take(WritePriority::Normal))
        .await
        .expect("the queue");
    assert!(again.locked.is_some());
}

#[tokio::test]
async fn without_a_sidecar_the_turn_is_this_process_only() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let missing = dir.path().join("missing");
    let queue =
        SqliteWriteQueue::beside(&missing.join("locks.db"), &missing.join("locks.db-queue"));
    assert!(queue.between.is_none());
    let held = queue.take(WritePriority::Normal).await;
    assert!(held.locked.is_none());
    assert!(
        waits(pin!(queue.take(WritePriority::Normal))).await,
        "the queue in this process still orders its writers"
    );
}

/// A turn in this process only (its sidecar's directory does not exist).
fn local_only(dir: &tempfile::TempDir) -> SqliteWriteQueue {
    let missing = dir.path().join("missing");
    SqliteWriteQueue::beside(&missing.join("locks.db"), &missing.join("locks.db-queue"))
}

#[tokio::test]
async fn a_keeping_write_goes_before_the_writers_that_wait() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let queue = local_only(&dir);
    let held = queue.take(WritePriority::Normal).await;
    let mut first = pin!(queue.take(WritePriority::Normal));
    let mut second = pin!(queue.take(WritePriority::Normal));
    let mut keep = pin!(queue.take(WritePriority::KeepAlive));
    // Each waits (and so stands in its line) in this order.
    assert!(
        waits(first.as_mut()).await,
        "took the queue while it was held"
    );
    assert!(
        waits(second.as_mut()).await,
        "took the queue while it was held"
    );
    assert!(
        waits(keep.as_mut()).await,
        "took the queue while it was held"
    );
    drop(held);
    let served = tokio::time::timeout(LIMIT, keep)
        .await
        .expect("the keep line's queue");
    assert!(
        waits(first.as_mut()).await && waits(second.as_mut()).await,
        "another writer got in beside the keeping write"
    );
    drop(served);
    let one = tokio::time::timeout(LIMIT, first.as_mut())
        .await
        .expect("the first writer");
    assert!(
        waits(second.as_mut()).await,
        "the other line is served out of arrival order"
    );
    drop(one);
    tokio::time::timeout(LIMIT, second)
        .await
        .expect("the second writer");
}

#[tokio::test]
async fn a_writer_dropped_after_it_was_handed_the_turn_hands_it_on() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let queue = local_only(&dir);
    let held = queue.take(WritePriority::Normal).await;
    let mut given = Box::pin(queue.take(WritePriority::Normal));
    let mut next = pin!(queue.take(WritePriority::Normal));
    assert!(waits(given.as_mut()).await && waits(next.as_mut()).await);
    // The turn goes to `given`, which is dropped before it is polled again.
    drop(held);
    drop(given);
    let got = tokio::time::timeout(LIMIT, next)
        .await
        .expect("the queue, given on");
    drop(got);
    // And nobody keeps it afterwards.
    tokio::time::timeout(LIMIT, queue.take(WritePriority::KeepAlive))
        .await
        .expect("a free queue");
}

/// A new sidecar is open only to the classes of users that may write the database: whoever
/// can lock it can hold up every writer.
#[test]
fn a_new_sidecar_is_open_only_to_the_databases_writers() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    std::fs::write(&db, b"").unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let sidecar = dir.path().join("locks.db-queue");
    let _turn = SqliteWriteQueue::beside(&db, &sidecar);
    let mode = std::fs::metadata(&sidecar).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a database only its owner writes: {mode:o}");
}
