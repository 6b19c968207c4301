//! The Tair emulation's primitives (`expireLock` / `expireUnlock`, proofs, versions, the
//! reentrant form) and the read-write race of the usual two-step pattern, against a kit server.
//! The shared suite and fault scenarios run on `tair://` in `tests/conformance.rs`.

use std::time::Duration;

use backend_redis::TairLock;
use backend_redis::config::RedisConfig;
use backend_redis::tair::{ExpireLock, ExpireUnlock, ReadEnter};
use conformance_tests::kit::{Redis, RedisReply};
use lockcore::{AcquireOptions, DistributedLock, FencingToken, LockName, OwnerId, Released};

const SEC: Duration = Duration::from_secs(1);

async fn tair(redis: &Redis) -> TairLock {
    let url = redis.url().replacen("redis://", "tair://", 1);
    TairLock::connect(&RedisConfig::parse(&url).expect("url"))
        .await
        .expect("connect")
}

fn name(n: &str) -> LockName {
    LockName::new(n).expect("name")
}

/// Everything the store keeps for `n` (its hash), to show that a refused call changed nothing.
async fn state(redis: &Redis, n: &str) -> RedisReply {
    let key = format!("{{dlock:{}}}:tair", name(n).escaped());
    redis.command(&["HGETALL", &key]).await.expect("HGETALL")
}

fn locked(answer: ExpireLock) -> (u64, u64, u64) {
    match answer {
        ExpireLock::Locked {
            expiry,
            version,
            count,
        } => (expiry, version, count),
        other => panic!("expected a lock, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_lock_and_unlock_judge_flag_and_timestamp_together() {
    let redis = Redis::start().await.expect("kit redis");
    let t = tair(&redis).await;
    let n = name("primitives");
    let (a, b) = (OwnerId::random(), OwnerId::random());

    let (proof, v1, _) = locked(t.expire_lock(&n, a, SEC, false).await.unwrap());
    // Held: another lock fails and reports the holder's expiry.
    match t.expire_lock(&n, b, SEC, false).await.unwrap() {
        ExpireLock::Held { expiry, holder } => {
            assert_eq!(expiry, proof);
            assert_eq!(holder, a.to_string());
        }
        other => panic!("a held key was locked again: {other:?}"),
    }
    // A wrong proof changes nothing.
    let before = state(&redis, "primitives").await;
    assert_eq!(
        t.expire_unlock(&n, proof + 1, true).await.unwrap(),
        ExpireUnlock::NotCurrent
    );
    assert_eq!(state(&redis, "primitives").await, before);

    // Once the expiry passes, the lock is taken over atomically with a later proof and a
    // higher version, and the old proof can no longer unlock anything.
    tokio::time::sleep(SEC + Duration::from_millis(100)).await;
    let (proof2, v2, _) = locked(t.expire_lock(&n, b, 5 * SEC, false).await.unwrap());
    assert!(proof2 > proof, "{proof2} after {proof}");
    assert!(v2 > v1, "version {v2} after {v1}");
    let before = state(&redis, "primitives").await;
    assert_eq!(
        t.expire_unlock(&n, proof, true).await.unwrap(),
        ExpireUnlock::NotCurrent,
        "a stale proof unlocked the new holder"
    );
    assert_eq!(state(&redis, "primitives").await, before);
    assert_eq!(
        t.expire_unlock(&n, proof2, true).await.unwrap(),
        ExpireUnlock::Unlocked
    );
    assert_eq!(
        t.expire_unlock(&n, proof2, true).await.unwrap(),
        ExpireUnlock::NotCurrent,
        "unlocking twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proofs_never_repeat_even_within_one_millisecond() {
    let redis = Redis::start().await.expect("kit redis");
    let t = tair(&redis).await;
    let n = name("same-ms");
    let mut last_proof = 0;
    let mut last_version = 0;
    for _ in 0..200 {
        let owner = OwnerId::random();
        let (proof, version, _) = locked(t.expire_lock(&n, owner, 30 * SEC, false).await.unwrap());
        assert!(proof > last_proof, "proof {proof} after {last_proof}");
        assert!(version > last_version);
        if last_proof > 0 {
            // The previous holder's proof is stale: it must not unlock this one.
            assert_eq!(
                t.expire_unlock(&n, last_proof, true).await.unwrap(),
                ExpireUnlock::NotCurrent
            );
        }
        assert_eq!(
            t.expire_unlock(&n, proof, true).await.unwrap(),
            ExpireUnlock::Unlocked
        );
        (last_proof, last_version) = (proof, version);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reentrant_form_counts_per_owner_and_balances() {
    let redis = Redis::start().await.expect("kit redis");
    let t = tair(&redis).await;
    let n = name("reentrant");
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let (proof, version, count) = locked(t.expire_lock(&n, a, 30 * SEC, true).await.unwrap());
    assert_eq!(count, 1);
    let (again, version2, count2) = locked(t.expire_lock(&n, a, 30 * SEC, true).await.unwrap());
    assert_eq!(
        (again, version2, count2),
        (proof, version, 2),
        "re-entry keeps proof and token"
    );
    assert!(matches!(
        t.expire_lock(&n, b, 30 * SEC, true).await.unwrap(),
        ExpireLock::Held { .. }
    ));
    assert_eq!(
        t.expire_unlock(&n, proof, false).await.unwrap(),
        ExpireUnlock::CountedDown
    );
    assert!(matches!(
        t.expire_lock(&n, b, 30 * SEC, true).await.unwrap(),
        ExpireLock::Held { .. }
    ));
    assert_eq!(
        t.expire_unlock(&n, proof, false).await.unwrap(),
        ExpireUnlock::Unlocked
    );
    let (_, version3, _) = locked(t.expire_lock(&n, b, 30 * SEC, true).await.unwrap());
    assert!(version3 > version);
}

/// A token minimum lifts the version in the granting step, for a writer's `expireLock` and for a
/// reader's entry alike, and the next plain hold continues above it; a minimum below the version
/// changes nothing. The caller's owner id is the one the hash records.
/// dlock's single attempt (`try_acquire`) sends the short `try_fast.lua` first. A writer holding
/// alone refuses it there, and nothing is written. The owner's own `writer waiting` mark (left
/// by a wait that gave up) and a reader's hold make it answer -1, and the attempt runs
/// `lock.lua`, which clears the mark as it grants, and refuses while the reader holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_attempt_falls_back_to_the_full_script_where_it_must() {
    let redis = Redis::shared().await.expect("kit redis");
    let t = tair(redis).await;
    let label = format!("fast/{:08x}", rand::random::<u32>());
    let n = name(&label);
    let key = format!("{{dlock:{}}}:tair", n.escaped());
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let opts = |owner| AcquireOptions::new().ttl(30 * SEC).owner(owner);

    // A writer holding alone: refused at once, nothing written.
    let (proof, _, _) = locked(t.expire_lock(&n, a, 30 * SEC, false).await.unwrap());
    let before = state(redis, &label).await;
    assert!(t.try_acquire(&n, &opts(b)).await.unwrap().is_none());
    assert_eq!(state(redis, &label).await, before);
    let unlocked = t.expire_unlock(&n, proof, true).await.unwrap();
    assert_eq!(unlocked, ExpireUnlock::Unlocked);

    // b's own mark: granted, and the mark is gone.
    let (b_hex, until) = (b.to_string(), "99999999999999");
    let mark = ["HSET", &key, "wwait", &b_hex, "wwait_until", until];
    redis.command(&mark).await.expect("HSET");
    let lease = t.try_acquire(&n, &opts(b)).await.unwrap().expect("free");
    let left = redis
        .command(&["HGET", &key, "wwait"])
        .await
        .expect("HGET")
        .as_text();
    assert_eq!(left, None, "the grant left the owner's mark behind");
    assert_eq!(t.release(&lease).await.unwrap(), Released::Released);

    // A reader holding: refused; once it left, granted.
    let reader = t.try_acquire_shared(&n, &opts(a)).await.unwrap();
    let reader = reader.expect("no writer holds");
    assert!(t.try_acquire(&n, &opts(b)).await.unwrap().is_none());
    assert_eq!(t.release(&reader).await.unwrap(), Released::Released);
    assert!(t.try_acquire(&n, &opts(b)).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_tokens_lift_the_version_for_writers_and_readers() {
    let redis = Redis::shared().await.expect("kit redis");
    let t = tair(redis).await;
    let n = name(&format!("min_token/{:08x}", rand::random::<u32>()));
    let opts = |min_token: u64| {
        AcquireOptions::new()
            .ttl(30 * SEC)
            .min_token(FencingToken(min_token))
    };
    let version = || async {
        let key = format!("{{dlock:{}}}:tair", n.escaped());
        redis
            .command(&["HGET", &key, "version"])
            .await
            .expect("HGET")
            .as_text()
    };

    let owner = OwnerId::random();
    let w = t
        .try_acquire(&n, &opts(700).owner(owner))
        .await
        .expect("write")
        .expect("free");
    assert_eq!(w.token(), FencingToken(700));
    assert_eq!(w.owner(), owner);
    assert_eq!(version().await, Some("700".to_owned()));
    assert_eq!(t.release(&w).await.expect("release"), Released::Released);

    let r = t
        .try_acquire_shared(&n, &opts(900))
        .await
        .expect("read")
        .expect("no writer");
    assert_eq!(r.token(), FencingToken(900));
    assert_eq!(version().await, Some("900".to_owned()));
    assert_eq!(t.release(&r).await.expect("release"), Released::Released);

    let plain = t
        .try_acquire(&n, &AcquireOptions::new().ttl(30 * SEC))
        .await
        .expect("write")
        .expect("free");
    assert_eq!(plain.token(), FencingToken(901));
    assert_eq!(
        t.release(&plain).await.expect("release"),
        Released::Released
    );

    let low = t
        .try_acquire(&n, &opts(5))
        .await
        .expect("write")
        .expect("free");
    assert_eq!(
        low.token(),
        FencingToken(902),
        "a low min_token moved the version"
    );
    assert_eq!(t.release(&low).await.expect("release"), Released::Released);
}

/// One step of the read-write race: a reader's or a writer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The reader checks that no writer holds the key.
    ReaderChecks,
    /// The reader counts itself in.
    ReaderEnters,
    /// The writer checks that no reader is in.
    WriterChecks,
    /// The writer locks.
    WriterLocks,
}

/// Every order of the reader's two steps and the writer's two steps that keeps each side's own
/// order: the six interleavings.
fn interleavings() -> Vec<[Step; 4]> {
    use Step::*;
    let mut all = Vec::new();
    for reader_at in [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]] {
        let mut order = [WriterChecks; 4];
        let mut writer = [WriterChecks, WriterLocks].into_iter();
        for (i, slot) in order.iter_mut().enumerate() {
            *slot = if i == reader_at[0] {
                ReaderChecks
            } else if i == reader_at[1] {
                ReaderEnters
            } else {
                writer.next().expect("two writer steps")
            };
        }
        all.push(order);
    }
    all
}

/// The usual two-step read-write lock built from the bare primitives (a test helper, not
/// shipped): readers in a counter beside the write lock. Returns whether the reader and the
/// writer both got in, running the steps in `order`.
async fn two_step(t: &TairLock, redis: &Redis, n: &LockName, order: [Step; 4]) -> (bool, bool) {
    let counter = format!("two-step-readers:{}", n.as_str());
    let (mut reader_saw_free, mut writer_saw_none) = (false, false);
    let (mut reader_in, mut writer_in) = (false, false);
    for step in order {
        match step {
            Step::ReaderChecks => {
                reader_saw_free = t.inspect(n).await.unwrap().is_none_or(|i| !i.is_held());
            }
            Step::ReaderEnters => {
                if reader_saw_free {
                    redis.command(&["INCR", &counter]).await.unwrap();
                    reader_in = true;
                }
            }
            Step::WriterChecks => {
                let readers = redis.command(&["GET", &counter]).await.unwrap();
                writer_saw_none = matches!(readers, RedisReply::Bulk(None))
                    || readers.as_text().as_deref() == Some("0");
            }
            Step::WriterLocks => {
                if writer_saw_none {
                    writer_in = matches!(
                        t.expire_lock(n, OwnerId::random(), 30 * SEC, false)
                            .await
                            .unwrap(),
                        ExpireLock::Locked { .. }
                    );
                }
            }
        }
    }
    (reader_in, writer_in)
}

/// The emulation: each side is one script, so its check and its step cannot be split; the
/// steps run in the order each side's *first* step has in `order`.
async fn atomic(t: &TairLock, n: &LockName, order: [Step; 4]) -> (bool, bool) {
    let (mut reader_in, mut writer_in) = (false, false);
    for step in order {
        match step {
            Step::ReaderChecks => {
                reader_in = matches!(
                    t.read_enter(n, OwnerId::random(), 30 * SEC).await.unwrap(),
                    ReadEnter::Entered { .. }
                );
            }
            Step::WriterChecks => {
                writer_in = matches!(
                    t.expire_lock(n, OwnerId::random(), 30 * SEC, false)
                        .await
                        .unwrap(),
                    ExpireLock::Locked { .. }
                );
            }
            Step::ReaderEnters | Step::WriterLocks => {}
        }
    }
    (reader_in, writer_in)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_and_a_writer_never_both_get_in_where_the_two_step_pattern_lets_them() {
    let redis = Redis::start().await.expect("kit redis");
    let t = tair(&redis).await;
    let mut two_step_broken = Vec::new();
    for (i, order) in interleavings().into_iter().enumerate() {
        let n = name(&format!("rw-two-step/{i}"));
        let (reader, writer) = two_step(&t, &redis, &n, order).await;
        assert!(reader || writer, "{order:?}: nobody got in");
        if reader && writer {
            two_step_broken.push(order);
        }
        let n = name(&format!("rw-atomic/{i}"));
        let (reader, writer) = atomic(&t, &n, order).await;
        assert!(
            reader != writer,
            "{order:?}: the emulation let reader {reader} and writer {writer} in"
        );
    }
    // Both checks before both steps: the four interleavings where each side checks before the
    // other acts.
    use Step::*;
    let broken_expected: Vec<[Step; 4]> = interleavings()
        .into_iter()
        .filter(|o| {
            let at = |s| o.iter().position(|x| *x == s).unwrap();
            at(ReaderChecks) < at(WriterLocks) && at(WriterChecks) < at(ReaderEnters)
        })
        .collect();
    assert_eq!(broken_expected.len(), 4);
    assert_eq!(
        two_step_broken, broken_expected,
        "the two-step pattern must break exactly where both check before either acts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_and_writers_never_overlap() {
    let redis = Redis::start().await.expect("kit redis");
    let t = tair(&redis).await;
    for round in 0..100 {
        let n = name(&format!("rw-race/{round}"));
        let (r, w) = tokio::join!(
            t.read_enter(&n, OwnerId::random(), 30 * SEC),
            t.expire_lock(&n, OwnerId::random(), 30 * SEC, false)
        );
        let reader = matches!(r.unwrap(), ReadEnter::Entered { .. });
        let writer = matches!(w.unwrap(), ExpireLock::Locked { .. });
        assert!(
            reader != writer,
            "round {round}: reader {reader}, writer {writer}"
        );
    }
    // Many readers share; a reader's exit lets the writer in.
    let n = name("rw-shared");
    let readers: Vec<OwnerId> = (0..5).map(|_| OwnerId::random()).collect();
    for r in &readers {
        assert!(matches!(
            t.read_enter(&n, *r, 30 * SEC).await.unwrap(),
            ReadEnter::Entered { .. }
        ));
    }
    assert_eq!(
        t.expire_lock(&n, OwnerId::random(), 30 * SEC, false)
            .await
            .unwrap(),
        ExpireLock::Readers
    );
    for r in &readers {
        assert!(t.read_exit(&n, *r).await.unwrap());
    }
    let (_, _, _) = locked(
        t.expire_lock(&n, OwnerId::random(), 30 * SEC, false)
            .await
            .unwrap(),
    );
    assert!(matches!(
        t.read_enter(&n, OwnerId::random(), 30 * SEC).await.unwrap(),
        ReadEnter::Writer { .. }
    ));
}

/// dlock's waiters queue (FIFO, woken by the release) beside the emulation's hash, while Tair's
/// own `expireLock` keeps exclusion and only bypasses the queue: it is refused while anyone
/// holds, and a free name nobody holds goes to it even with nobody queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_waiters_queue_while_tairs_own_commands_keep_exclusion() {
    use lockcore::{LockExt, Wait};

    let redis = Redis::start().await.expect("kit redis");
    let t = tair(&redis).await;
    let caps = t.capabilities();
    assert_eq!(caps.fairness, lockcore::Fairness::Fifo);
    assert_eq!(caps.waiting, lockcore::WaitMechanism::PubSub);
    let n = "queued-beside-tair";
    let opts = |wait| AcquireOptions::new().ttl(30 * SEC).wait(wait);
    let client = |t: TairLock| -> std::sync::Arc<dyn DistributedLock> { std::sync::Arc::new(t) };
    let holder = client(t.clone())
        .lock(n, &opts(Wait::No))
        .await
        .expect("a holds");

    // Two dlock waiters, queued in this order.
    let mut waiters = Vec::new();
    for i in 0..2 {
        let t2 = client(tair(&redis).await);
        waiters.push(tokio::spawn(async move {
            t2.lock(n, &opts(Wait::For(60 * SEC))).await
        }));
        let queued = async {
            loop {
                let info = t.inspect(&name(n)).await.unwrap().expect("held");
                if info.waiters == Some(i + 1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(30 * SEC, queued)
            .await
            .expect("the waiter queued");
    }
    // Tair's own expireLock is refused while the lock is held, queue or not.
    let outsider = OwnerId::random();
    assert!(matches!(
        t.expire_lock(&name(n), outsider, SEC, false).await.unwrap(),
        ExpireLock::Held { .. }
    ));
    // A dlock `try` does not jump the queue.
    let tried = client(t.clone()).try_lock(n, &opts(Wait::No)).await;
    assert!(tried.unwrap().is_none());

    // The release wakes the head: the first waiter gets it, then the second, in order.
    let first_token = holder.fencing_token();
    holder.release().await.unwrap();
    let first = tokio::time::timeout(30 * SEC, waiters.remove(0))
        .await
        .expect("the head was woken")
        .unwrap()
        .expect("the head acquires");
    assert!(first.fencing_token() > first_token);
    assert!(
        !waiters[0].is_finished(),
        "the second waiter jumped the first"
    );
    first.release().await.unwrap();
    let second = tokio::time::timeout(30 * SEC, waiters.remove(0))
        .await
        .expect("the next head was woken")
        .unwrap()
        .expect("the next head acquires");
    second.release().await.unwrap();

    // Nobody holds or queues: Tair's own command takes it.
    locked(t.expire_lock(&name(n), outsider, SEC, false).await.unwrap());
    let info = t.inspect(&name(n)).await.unwrap().expect("held");
    assert_eq!(info.waiters, Some(0));
}

/// The hash's `busy` field, as the store has it.
async fn busy(redis: &Redis, n: &LockName) -> Option<String> {
    let key = format!("{{dlock:{}}}:tair", n.escaped());
    let reply = redis.command(&["HGET", &key, "busy"]).await;
    reply.expect("HGET").as_text()
}

/// The uncontended single attempt and unlock learn from the hash's `busy` field that nobody
/// reads or queues, instead of asking the readers' and the queue's keys: so the field must
/// stand whenever a reader (Tair's own or dlock's) or a queued waiter may be in, and it goes
/// once they are all gone, by exit, by grant, or by expiry. Uncontended pairs then send no
/// `EXISTS` at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_busy_mark_stands_while_anyone_reads_or_queues() {
    use lockcore::{LockExt, Wait};

    let redis = Redis::start().await.expect("kit redis");
    let t = tair(&redis).await;
    let n = name("busy");
    let opts = |wait| AcquireOptions::new().ttl(30 * SEC).wait(wait);
    let one =
        |t: &TairLock| -> std::sync::Arc<dyn DistributedLock> { std::sync::Arc::new(t.clone()) };

    // Uncontended pairs: no mark, and not one EXISTS.
    redis.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
    for _ in 0..20 {
        let guard = one(&t).lock("busy", &opts(Wait::No)).await.unwrap();
        guard.release().await.unwrap();
    }
    assert_eq!(redis.calls("exists").await.unwrap(), 0);
    assert!(redis.calls("hmget").await.unwrap() >= 40);
    assert_eq!(busy(&redis, &n).await, None);

    // Tair's own reader marks it: a dlock try is refused; its exit clears the mark.
    let reader = OwnerId::random();
    assert!(matches!(
        t.read_enter(&n, reader, 30 * SEC).await.unwrap(),
        ReadEnter::Entered { .. }
    ));
    assert_eq!(busy(&redis, &n).await.as_deref(), Some("1"));
    assert!(
        one(&t)
            .try_lock("busy", &opts(Wait::No))
            .await
            .unwrap()
            .is_none()
    );
    assert!(t.read_exit(&n, reader).await.unwrap());
    assert_eq!(busy(&redis, &n).await, None);

    // A queued writer marks it while it waits; its grant (the queue emptied) clears it.
    let holder = one(&t).lock("busy", &opts(Wait::No)).await.unwrap();
    let t2 = tair(&redis).await;
    let waiter =
        tokio::spawn(async move { one(&t2).lock("busy", &opts(Wait::For(60 * SEC))).await });
    let queued = async {
        while t.inspect(&n).await.unwrap().expect("held").waiters != Some(1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(30 * SEC, queued)
        .await
        .expect("queued");
    assert_eq!(busy(&redis, &n).await.as_deref(), Some("1"));
    holder.release().await.unwrap();
    let next = tokio::time::timeout(30 * SEC, waiter)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .expect("the waiter acquires");
    assert_eq!(busy(&redis, &n).await, None);
    next.release().await.unwrap();

    // A reader that never exits: the mark outlives it, and the next try, sent to the full
    // script by the mark, drops the expired reader and clears the mark as it grants.
    let short = Duration::from_millis(200);
    assert!(matches!(
        t.read_enter(&n, OwnerId::random(), short).await.unwrap(),
        ReadEnter::Entered { .. }
    ));
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert_eq!(busy(&redis, &n).await.as_deref(), Some("1"));
    let lease = one(&t).try_lock("busy", &opts(Wait::No)).await.unwrap();
    assert!(lease.is_some(), "an expired reader kept the lock");
    assert_eq!(busy(&redis, &n).await, None);
    let readers = format!("{{dlock:{}}}:readers", n.escaped());
    let left = redis.command(&["EXISTS", &readers]).await.unwrap();
    assert_eq!(left, RedisReply::Integer(0), "the expired reader stayed");
}
