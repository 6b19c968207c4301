//! The write turn between processes: two turns over one sidecar, each with its own open file
//! (as two processes have), take it one after the other.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use super::*;

/// Polls `turn` once: whether it is still waiting. (No timer: whether a take waits is decided
/// by the locks, at its first poll.)
async fn waits<F: Future>(mut turn: Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(turn.as_mut().poll(cx).is_pending())).await
}

/// Fails instead of hanging.
const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_openers_of_one_sidecar_take_turns() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sidecar = dir.path().join("locks.db-turn");
    let (one, other) = (WriteTurn::beside(&sidecar), WriteTurn::beside(&sidecar));
    assert!(one.between.is_some() && other.between.is_some());

    let held = one.take().await;
    assert!(held.locked.is_some(), "nobody else held it: locked at once");
    let mut waiting = pin!(other.take());
    // The other opener waits while the first holds its turn...
    assert!(
        waits(waiting.as_mut()).await,
        "took the turn while another opener held it"
    );
    // ...and has it once that turn ends.
    drop(held);
    let next = tokio::time::timeout(LIMIT, waiting)
        .await
        .expect("the turn");
    assert!(next.locked.is_some());

    // A writer dropped while it waits gives the turn on when its thread gets it.
    let mut abandoned = Box::pin(one.take());
    assert!(waits(abandoned.as_mut()).await);
    drop(abandoned);
    drop(next);
    let again = tokio::time::timeout(LIMIT, other.take())
        .await
        .expect("the turn");
    assert!(again.locked.is_some());
}

#[tokio::test]
async fn without_a_sidecar_the_turn_is_this_process_only() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let turn = WriteTurn::beside(&dir.path().join("missing").join("locks.db-turn"));
    assert!(turn.between.is_none());
    let held = turn.take().await;
    assert!(held.locked.is_none());
    assert!(
        waits(pin!(turn.take())).await,
        "the turn in this process still orders its writers"
    );
}
