//! Read-write locks.

use std::sync::Arc;
use std::time::Duration;

use backend_redis::{RedisConfig, RedisLock};
use conformance_tests::kit::{RedisCluster, RedisReply};
use conformance_tests::within;
use lockcore::{DistributedLock, Error, LockExt, LockName, Released, Wait};

use crate::support::*;

/// The key layout of a read hold: `{dlock:<name>}:shared` holds `<owner>:<token>` per reader,
/// the tokens come from the lock's own fence counter, a queued reader's entry is marked `r`,
/// and `inspect` reports the oldest reader. The lock and the readers are one object: no write
/// lock while a reader holds, on a single server and in a Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_holds_share_the_locks_keys_and_counter() {
    use lockcore::ReadWriteExt;
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let (a, b) = (
            backend_redis::connect(&url).await.unwrap(),
            backend_redis::connect(&url).await.unwrap(),
        );
        assert!(a.capabilities().native.read_write, "{url}");
        let name = unique("rw-layout");
        let lock_name = LockName::new(&name).unwrap();
        let w = a.write_lock(&name, &opts(30 * SEC)).await.expect("writer");
        // A reader queues behind the writer.
        let reader = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { b.read_lock(&name, &opts(30 * SEC)).await })
        };
        queued(&a, &name, 1).await;
        if !url.starts_with("redis+cluster") {
            let [_, _, queue, _] = rw_keys(&name);
            let entries = members(shared().await, &queue).await;
            assert_eq!(entries.len(), 1, "{entries:?}");
            assert!(entries[0].ends_with('r'), "a reader's entry: {entries:?}");
            assert_eq!(entries[0].len(), 49, "{entries:?}");
        }
        let wt = w.fencing_token();
        w.release().await.expect("release writer");
        let r1 = within(30 * SEC, "the queued reader", reader)
            .await
            .expect("task")
            .expect("reader 1");
        let r2 = a.read_lock(&name, &opts(30 * SEC)).await.expect("reader 2");
        assert!(r1.fencing_token() > wt && r2.fencing_token() > r1.fencing_token());
        assert!(
            b.try_lock(&name, &opts(30 * SEC)).await.unwrap().is_none(),
            "{url}: the exclusive lock while readers hold"
        );
        let info = a.inspect(&lock_name).await.unwrap().expect("seen");
        assert_eq!(info.holder, Some(r1.lease().owner().to_string()), "{url}");
        assert_eq!(info.token, Some(r1.fencing_token()), "{url}");
        assert!(info.remaining.is_some_and(|r| r > 10 * SEC), "{info:?}");
        assert!(
            info.details.iter().any(|d| d.contains("2 reader")),
            "{info:?}"
        );
        assert!(
            !a.forget(&lock_name).await.unwrap(),
            "{url}: forget took a read-locked name"
        );
        if !url.starts_with("redis+cluster") {
            let redis = shared().await;
            let [lock, fence, queue, readers] = rw_keys(&name);
            let mut got = members(redis, &readers).await;
            got.sort();
            let mut expected = vec![
                format!("{}:{}", r1.lease().owner(), r1.fencing_token()),
                format!("{}:{}", r2.lease().owner(), r2.fencing_token()),
            ];
            expected.sort();
            assert_eq!(got, expected);
            assert_eq!(
                redis.command(&["GET", &fence]).await.unwrap().as_text(),
                Some(r2.fencing_token().to_string()),
                "readers draw from the lock's counter"
            );
            assert_eq!(
                redis.command(&["EXISTS", &queue]).await.unwrap(),
                RedisReply::Integer(0)
            );
            assert_eq!(
                redis
                    .command(&["GET", &lock])
                    .await
                    .unwrap()
                    .as_text()
                    .as_deref(),
                Some("-"),
                "while readers hold, the lock key is reserved"
            );
        }
        let r2t = r2.fencing_token();
        assert_eq!(r1.release().await.unwrap(), Released::Released);
        assert_eq!(r2.release().await.unwrap(), Released::Released);
        if !url.starts_with("redis+cluster") {
            let [lock, ..] = rw_keys(&name);
            assert_eq!(
                shared().await.command(&["EXISTS", &lock]).await.unwrap(),
                RedisReply::Integer(0),
                "the last reader's release with nobody queued deletes the reserved key"
            );
        }
        let w = b
            .try_write_lock(&name, &opts(30 * SEC))
            .await
            .unwrap()
            .expect("the writer once the readers left");
        assert!(w.fencing_token() > r2t);
        w.release().await.unwrap();
        assert!(a.forget(&lock_name).await.unwrap(), "{url}");
    }
}

/// A reader that crashed (its hold recorded but expired by the server's clock, and the lock key
/// it reserved gone with it) does not block a writer, neither a `try` nor a queued writer behind
/// a reader that runs out without releasing. The ghost readers are written as a reader's grant
/// writes them: the member in `shared`, and the lock key RESERVED (`-`) for as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_reader_does_not_block_a_writer() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-expired");
    let [lock, _, _, readers] = rw_keys(&name);
    let ghost = format!("{}:7", "0".repeat(32));
    let past = (server_ms(redis).await - 1000).to_string();
    ok(redis, &["ZADD", &readers, &past, &ghost]).await;
    let w = c
        .try_write_lock(&name, &opts(30 * SEC))
        .await
        .unwrap()
        .expect("an expired reader does not hold");
    w.release().await.unwrap();

    // A live ghost reader that never releases: the writer queues, and gets in once the
    // reader's time is up (expiry publishes nothing; the writer looks again when it ends).
    let soon = (server_ms(redis).await + 1500).to_string();
    ok(redis, &["ZADD", &readers, &soon, &ghost]).await;
    ok(redis, &["SET", &lock, "-", "PX", "1500"]).await;
    assert!(
        c.try_lock(&name, &opts(30 * SEC)).await.unwrap().is_none(),
        "the exclusive lock while a reader is live"
    );
    let w = within(
        30 * SEC,
        "the writer after the reader ran out",
        c.write_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC))),
    )
    .await
    .expect("the writer gets in");
    assert_eq!(members(redis, &readers).await, Vec::<String>::new());
    w.release().await.unwrap();
}

/// Readers hold; a writer queues; a reader's `try` is refused while the writer waits, and a
/// waiting reader queues behind it. Releasing one reader does not wake the writer (another
/// still reads); the last reader's release does, and the writer gets in before the reader that
/// came after it, which gets in when the writer releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_readers_release_wakes_the_queued_writer() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let config = RedisConfig::parse(&redis.url()).unwrap();
    let writer_lock = Arc::new(RedisLock::connect(&config).await.unwrap());
    let writer: Arc<dyn DistributedLock> = writer_lock.clone();
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let late = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-wake");
    let r1 = c.read_lock(&name, &opts(30 * SEC)).await.expect("r1");
    let r2 = c.read_lock(&name, &opts(30 * SEC)).await.expect("r2");
    let w_task = {
        let (writer, name) = (writer.clone(), name.clone());
        tokio::spawn(async move {
            writer
                .write_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    queued(&c, &name, 1).await;
    assert!(
        late.try_read_lock(&name, &opts(30 * SEC))
            .await
            .unwrap()
            .is_none(),
        "a reader's try jumped a queued writer"
    );
    let r_task = {
        let (late, name) = (late.clone(), name.clone());
        tokio::spawn(async move {
            late.read_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    queued(&c, &name, 2).await;

    assert_eq!(r1.release().await.unwrap(), Released::Released);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!w_task.is_finished(), "the writer got in beside a reader");
    assert_eq!(
        writer_lock.stats().wakeups,
        0,
        "a reader's release that leaves another reader woke the writer"
    );
    let r2t = r2.fencing_token();
    assert_eq!(r2.release().await.unwrap(), Released::Released);
    let w = within(30 * SEC, "the writer after the last reader", w_task)
        .await
        .expect("task")
        .expect("the writer");
    assert!(
        writer_lock.stats().wakeups >= 1,
        "the last reader's release wakes the writer"
    );
    assert!(w.fencing_token() > r2t);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !r_task.is_finished(),
        "the late reader got in beside the writer"
    );
    let wt = w.fencing_token();
    w.release().await.unwrap();
    let r3 = within(30 * SEC, "the late reader after the writer", r_task)
        .await
        .expect("task")
        .expect("the late reader");
    assert!(r3.fencing_token() > wt);
    r3.release().await.unwrap();
}

/// A run of readers queued behind a writer gets in together when the writer releases: all hold
/// at once, none has released yet; a writer queued after them waits for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_queued_readers_gets_in_together() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-run");
    let w = c.write_lock(&name, &opts(30 * SEC)).await.expect("writer");
    let mut tasks = Vec::new();
    for i in 0..3 {
        let r = backend_redis::connect(&redis.url()).await.unwrap();
        let n = name.clone();
        tasks.push(tokio::spawn(async move {
            r.read_lock(&n, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        }));
        queued(&c, &name, i + 1).await;
    }
    let w2_task = {
        let (c, name) = (c.clone(), name.clone());
        tokio::spawn(async move {
            c.write_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    queued(&c, &name, 4).await;
    w.release().await.unwrap();
    let mut readers = Vec::new();
    for t in tasks {
        readers.push(
            within(30 * SEC, "a queued reader", t)
                .await
                .expect("task")
                .expect("reader"),
        );
    }
    let info = c
        .inspect(&LockName::new(&name).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(
        info.details.iter().any(|d| d.contains("3 reader")),
        "{info:?}"
    );
    assert_eq!(info.waiters, Some(1), "the second writer still waits");
    assert!(!w2_task.is_finished());
    for r in readers {
        r.release().await.unwrap();
    }
    let w2 = within(30 * SEC, "the second writer", w2_task)
        .await
        .expect("task")
        .expect("writer 2");
    w2.release().await.unwrap();
}

/// A reader's wait dropped while queued leaves no queue entry behind, and the writer behind it
/// is not held up; a read lease is owner-checked on release and extend like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_leases_are_owner_checked_and_dropped_waits_leave_nothing() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-drop");
    let lock_name = LockName::new(&name).unwrap();
    let [_, _, queue, readers] = rw_keys(&name);
    let w = c.write_lock(&name, &opts(30 * SEC)).await.expect("writer");
    let reader = {
        let (c, name) = (c.clone(), name.clone());
        tokio::spawn(async move { c.read_lock(&name, &opts(30 * SEC)).await })
    };
    queued(&c, &name, 1).await;
    reader.abort();
    let _ = reader.await;
    until("the dropped reader left the queue", || async {
        members(redis, &queue).await.is_empty()
    })
    .await;
    w.release().await.unwrap();

    let lease = c
        .try_acquire_shared(&lock_name, &opts(30 * SEC))
        .await
        .unwrap()
        .expect("a free name");
    assert_eq!(lease.handle(), Some(backend_redis::node::READER));
    let renewed = c.extend(&lease, 20 * SEC).await.expect("extend a reader");
    assert_eq!(renewed.token(), lease.token());
    // Another owner's lease with the same token, and the reader's own lease as an exclusive
    // one (no handle), free nothing.
    let forged = lockcore::Lease::new(
        lock_name.clone(),
        lockcore::OwnerId(1),
        lease.token(),
        std::time::Instant::now(),
        30 * SEC,
        Duration::ZERO,
    )
    .with_handle(backend_redis::node::READER);
    assert_eq!(c.release(&forged).await.unwrap(), Released::NotHeld);
    assert!(matches!(
        c.extend(&forged, 20 * SEC).await,
        Err(Error::LockLost { .. })
    ));
    let as_lock = lockcore::Lease::new(
        lock_name.clone(),
        lease.owner(),
        lease.token(),
        std::time::Instant::now(),
        30 * SEC,
        Duration::ZERO,
    );
    assert_eq!(c.release(&as_lock).await.unwrap(), Released::NotHeld);
    assert_eq!(members(redis, &readers).await.len(), 1);
    assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
    assert_eq!(c.release(&lease).await.unwrap(), Released::NotHeld);
    assert!(matches!(
        c.extend(&lease, 20 * SEC).await,
        Err(Error::LockLost { .. })
    ));
    assert_eq!(
        redis.command(&["EXISTS", &readers]).await.unwrap(),
        RedisReply::Integer(0)
    );
}
