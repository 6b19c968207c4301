//! The write turn between processes: two turns over one sidecar, each with its own open file
//! (as two processes have), take it one after the other.

use std::time::Duration;

use super::*;

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
    let waiting = other.take();
    tokio::pin!(waiting);
    // The other opener waits while the first holds its turn...
    let early = tokio::time::timeout(Duration::from_millis(200), waiting.as_mut()).await;
    assert!(early.is_err(), "took the turn while another opener held it");
    // ...and has it once that turn ends.
    drop(held);
    let next = tokio::time::timeout(LIMIT, waiting)
        .await
        .expect("the turn");
    assert!(next.locked.is_some());

    // A writer dropped while it waits gives the turn on when its thread gets it.
    let abandoned = tokio::time::timeout(Duration::from_millis(50), one.take()).await;
    assert!(abandoned.is_err());
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
        tokio::time::timeout(Duration::from_millis(50), turn.take())
            .await
            .is_err(),
        "the turn in this process still orders its writers"
    );
}
