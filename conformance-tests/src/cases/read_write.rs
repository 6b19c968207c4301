//! Read-write locks: readers share, a writer excludes, writers do not starve, and stores without them say so.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lockcore::{DistributedLock, Error, FencingToken, LockExt, Released, Wait};

use super::{SEC, lease_opts, ms, within};
use crate::Ctx;

/// Several readers from different clients hold a name together, and `inspect` counts them
/// (`"3 reader(s) holding"`, see `LockInfo::with_readers`; a pass-through store indents its
/// stores' lines); a writer (and `lock`, the same exclusive hold) waits until the last reader
/// releases.
pub async fn rw_readers_share_writer_waits(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let clients = [ctx.client().await, ctx.client().await, ctx.client().await];
    let writer = ctx.client().await;
    let n = ctx.name("x");
    let mut readers = Vec::new();
    for c in &clients {
        readers.push(
            c.try_read_lock(&n, &lease_opts(30 * SEC))
                .await
                .expect("try_read_lock")
                .expect("a reader must share with other readers"),
        );
    }
    let key = lockcore::LockName::new(&n).expect("name");
    let info = writer
        .inspect(&key)
        .await
        .expect("inspect")
        .expect("in use");
    assert!(
        info.details
            .iter()
            .any(|d| d.trim() == "3 reader(s) holding"),
        "inspect does not count the readers: {info:?}"
    );
    assert!(
        writer
            .try_write_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_write_lock")
            .is_none(),
        "a writer got in while readers held"
    );
    assert!(
        writer
            .try_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_lock")
            .is_none(),
        "the exclusive lock got in while readers held"
    );
    let waiting = {
        let (writer, n) = (writer.clone(), n.clone());
        tokio::spawn(async move {
            writer
                .write_lock(&n, &lease_opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    let last = readers.pop().expect("three readers");
    for r in readers {
        assert_eq!(r.release().await.expect("release"), Released::Released);
    }
    tokio::time::sleep(ms(100)).await;
    assert!(
        !waiting.is_finished(),
        "the writer got in while a reader still held"
    );
    assert_eq!(last.release().await.expect("release"), Released::Released);
    let w = within(30 * SEC, "the writer after the readers", waiting)
        .await
        .expect("task")
        .expect("the writer gets the lock once the readers are gone");
    w.release().await.expect("release");
}

/// A writer excludes readers and other writers until it releases; then a reader gets in.
pub async fn rw_writer_excludes_readers_and_writers(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let (a, b) = (ctx.client().await, ctx.client().await);
    let n = ctx.name("x");
    let w = a
        .write_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("write_lock on a free name");
    assert!(
        b.try_read_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_read_lock")
            .is_none(),
        "a reader got in while a writer held"
    );
    assert!(
        b.try_write_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("try_write_lock")
            .is_none(),
        "a second writer got in"
    );
    match b
        .read_lock(&n, &lease_opts(30 * SEC).wait(Wait::For(ms(200))))
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a bounded read_lock on a written name should time out, got {other:?}"),
    }
    assert_eq!(w.release().await.expect("release"), Released::Released);
    let r = b
        .try_read_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("try_read_lock")
        .expect("a reader gets in after the writer released");
    r.release().await.expect("release");
}

/// Readers keep coming, each taking the name before the one before it lets go, so that without
/// a queued writer there is never a moment with no reader: a store whose readers jump a queued
/// writer would starve it forever. Once the writer is queued, the next reader's short wait must
/// time out (it queues behind the writer); the chain then lets go, the writer gets the lock, and
/// no reader holds while it does.
pub async fn rw_no_writer_starvation(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let n = ctx.name("x");
    let writer = ctx.client().await;
    let readers = [ctx.client().await, ctx.client().await];
    let inside_readers = Arc::new(AtomicUsize::new(0));
    let writer_inside = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let violations = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first = readers[0]
        .read_lock(&n, &lease_opts(30 * SEC))
        .await
        .expect("the first reader");
    inside_readers.fetch_add(1, Ordering::SeqCst);
    let chain = {
        let (n, inside, writer_inside, violations, stop) = (
            n.clone(),
            inside_readers.clone(),
            writer_inside.clone(),
            violations.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let entered = |inside: &AtomicUsize| {
                inside.fetch_add(1, Ordering::SeqCst);
                if writer_inside.load(Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
            };
            let mut current = first;
            let mut turn = 0;
            while !stop.load(Ordering::SeqCst) {
                turn += 1;
                let c = &readers[turn % 2];
                let quick = lease_opts(30 * SEC).wait(Wait::For(ms(200)));
                let next = match c.read_lock(&n, &quick).await {
                    Ok(next) => next,
                    // Queued behind the writer: let go, so that it gets in, then wait.
                    Err(Error::Timeout { .. }) => {
                        inside.fetch_sub(1, Ordering::SeqCst);
                        current.release().await.expect("release");
                        let opts = lease_opts(30 * SEC).wait(Wait::For(60 * SEC));
                        let next = c.read_lock(&n, &opts).await.expect("a reader");
                        entered(&inside);
                        current = next;
                        continue;
                    }
                    Err(e) => panic!("a reader: {e}"),
                };
                entered(&inside);
                tokio::time::sleep(ms(30)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                current.release().await.expect("release");
                current = next;
            }
            inside.fetch_sub(1, Ordering::SeqCst);
            current.release().await.expect("release");
        })
    };
    tokio::time::sleep(ms(100)).await;
    let waiting = {
        let (writer, n, inside, writer_inside, violations) = (
            writer.clone(),
            n.clone(),
            inside_readers.clone(),
            writer_inside.clone(),
            violations.clone(),
        );
        tokio::spawn(async move {
            let w = writer
                .write_lock(&n, &lease_opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
                .expect("the writer must not starve");
            writer_inside.store(true, Ordering::SeqCst);
            if inside.load(Ordering::SeqCst) > 0 {
                violations.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(ms(50)).await;
            writer_inside.store(false, Ordering::SeqCst);
            w.release().await.expect("release");
        })
    };
    within(90 * SEC, "the writer under a chain of readers", waiting)
        .await
        .expect("writer task");
    stop.store(true, Ordering::SeqCst);
    within(90 * SEC, "the readers", chain)
        .await
        .expect("reader task");
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "a reader and the writer held at once"
    );
}

/// Writers' tokens grow across writers, and a reader's token is above the writer's before it.
pub async fn rw_tokens_increase_across_writers(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let clients = [ctx.client().await, ctx.client().await];
    let n = ctx.name("x");
    let mut last = FencingToken(0);
    for round in 0..6 {
        let c = &clients[round % 2];
        let w = c
            .write_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("write_lock");
        assert!(
            w.fencing_token() > last,
            "round {round}: writer token {} not above {}",
            w.fencing_token(),
            last
        );
        last = w.fencing_token();
        w.release().await.expect("release");
        let r = clients[(round + 1) % 2]
            .read_lock(&n, &lease_opts(30 * SEC))
            .await
            .expect("read_lock");
        assert!(
            r.fencing_token() > last,
            "round {round}: reader token {} not above the writer's {}",
            r.fencing_token(),
            last
        );
        last = r.fencing_token();
        r.release().await.expect("release");
    }
}

/// A store without read-write locks says so: `read_lock` and `write_lock` fail with
/// `Unsupported` before any I/O. (Not applicable to a store with them: the other `rw_` cases
/// test those.)
pub async fn rw_unsupported_says_so(ctx: Ctx) {
    use lockcore::ReadWriteExt;
    let counting = crate::CountingLock::new(ctx.client().await);
    let c: Arc<dyn DistributedLock> = counting.clone();
    let n = ctx.name("x");
    assert!(
        matches!(
            c.read_lock(&n, &lease_opts(30 * SEC)).await,
            Err(Error::Unsupported { .. })
        ),
        "read_lock on a store without read-write locks"
    );
    assert!(
        matches!(
            c.try_write_lock(&n, &lease_opts(30 * SEC)).await,
            Err(Error::Unsupported { .. })
        ),
        "try_write_lock on a store without read-write locks"
    );
    assert_eq!(
        counting.calls(),
        0,
        "an unsupported call reached the backend"
    );
}
