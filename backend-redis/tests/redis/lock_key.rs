//! The lock key says whether anyone waits: a plain `SET NX` never jumps the queue, and a
//! release takes the short script until a waiter marks the key.

use std::time::Duration;

use backend_redis::node::AcquireReply;
use conformance_tests::kit::{Redis, RedisReply};
use conformance_tests::within;
use lockcore::{AcquireOptions, KeepAlive, LockExt, LockName, Released, Wait};

use crate::support::*;

/// The lock key's value as text (`None` when absent).
async fn lock_value(redis: &Redis, key: &str) -> Option<String> {
    redis.command(&["GET", key]).await.unwrap().as_text()
}

/// The lock key tells a `SET NX` whether it may take the lock: a holder nobody queued behind is
/// plain (its owner id) and its release deletes the key; a queued waiter marks the holder; the
/// release of a marked holder leaves the key reserved for the queue, so a newcomer's `try` is
/// refused until the head takes it, and the head's grant is plain again once nobody else waits.
/// A marked holder whose lease runs out unreleased leaves the key in place while its waiter is
/// live, so a newcomer's `try` still cannot jump the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_key_keeps_the_queue_from_a_set_nx() {
    use backend_redis::node::{Mode, lease};
    use std::time::Instant;
    let redis = shared().await;
    let node = node_of(redis);
    let refused = |reply: &AcquireReply| matches!(reply, AcquireReply::Waiting { .. });

    let name = LockName::new(unique("marked")).unwrap();
    let [lock, ..] = rw_keys(name.as_str());
    let [a, b, c] = [(); 3].map(|_| lockcore::OwnerId::random());
    let o = opts(30 * SEC);
    let started = Instant::now();
    let AcquireReply::Granted(ta) = node.try_once(&name, a, &o, 0).await.unwrap() else {
        panic!("a takes the free lock");
    };
    assert_eq!(lock_value(redis, &lock).await, Some(a.to_string()), "plain");
    let queued = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap();
    assert!(
        matches!(queued, AcquireReply::Waiting { rank: 0, .. }),
        "{queued:?}"
    );
    let value = lock_value(redis, &lock).await.unwrap();
    assert!(value.starts_with(&format!("{a}+")), "marked: {value}");
    assert!(
        node.release(&lease(&name, a, ta, started, &o))
            .await
            .unwrap()
    );
    assert_eq!(
        lock_value(redis, &lock).await.as_deref(),
        Some("-"),
        "reserved"
    );
    assert!(
        refused(&node.try_once(&name, c, &o, 0).await.unwrap()),
        "c jumped b"
    );
    let AcquireReply::Granted(tb) = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap() else {
        panic!("the head takes the reserved lock");
    };
    assert!(tb > ta);
    assert_eq!(
        lock_value(redis, &lock).await,
        Some(b.to_string()),
        "plain again"
    );
    assert!(
        node.release(&lease(&name, b, tb, started, &o))
            .await
            .unwrap()
    );
    assert_eq!(
        lock_value(redis, &lock).await,
        None,
        "a plain release deletes"
    );

    // A marked lease that runs out unreleased: the key stays while its waiter is live.
    let short = opts(Duration::from_millis(200));
    for _ in 0..5 {
        let name = LockName::new(unique("marked-expiry")).unwrap();
        let [lock, _, queue, _] = rw_keys(name.as_str());
        let alive = queue.replace(":queue", ":alive");
        let [a, b, c] = [(); 3].map(|_| lockcore::OwnerId::random());
        let granted = node.try_once(&name, a, &short, 0).await.unwrap();
        assert!(matches!(granted, AcquireReply::Granted(_)), "{granted:?}");
        let queued = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap();
        assert!(refused(&queued), "{queued:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // The waiter's liveness must outlast the next requests by a wide margin, or this round
        // proves nothing (a stalled machine): then try again with new names.
        let entries = members(redis, &alive).await;
        assert_eq!(entries.len(), 1, "{entries:?}");
        let until = redis
            .command(&["ZSCORE", &alive, &entries[0]])
            .await
            .unwrap();
        let until: u64 = until.as_text().unwrap().parse().unwrap();
        if until < server_ms(redis).await + 1000 {
            continue;
        }
        assert!(
            lock_value(redis, &lock).await.is_some(),
            "the key outlives the lease"
        );
        let info = node.inspect(&name).await.unwrap();
        assert!(info.holder.is_none(), "the lease ran out: {info:?}");
        assert!(
            refused(&node.try_once(&name, c, &o, 0).await.unwrap()),
            "a newcomer jumped a live waiter after the holder's lease ran out"
        );
        let granted = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap();
        assert!(matches!(granted, AcquireReply::Granted(_)), "{granted:?}");
        return;
    }
    panic!("five rounds in a row stalled past the waiter's liveness");
}

/// A reader renewed past its first ttl keeps the lock key reserved as long, so a writer's `try`
/// (a `SET NX` first) stays out for as long as the reader holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_reader_keeps_writers_out_past_its_first_ttl() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let (a, b) = (
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
    );
    let name = unique("renewed-reader");
    let ttl = Duration::from_millis(600);
    let renewed = AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::For(30 * SEC));
    let r = a.read_lock(&name, &renewed).await.expect("reader");
    for _ in 0..4 {
        tokio::time::sleep(ttl / 2).await;
        assert!(r.lost_reason().is_none(), "the reader's renewals failed");
        assert!(
            b.try_lock(&name, &opts(30 * SEC)).await.unwrap().is_none(),
            "a writer got in while a renewed reader held"
        );
    }
    assert_eq!(r.release().await.unwrap(), Released::Released);
    let w = b.try_lock(&name, &opts(30 * SEC)).await.unwrap();
    assert!(w.is_some(), "the writer once the reader left");
    w.unwrap().release().await.unwrap();
}

/// The number of keys of each `EVALSHA` that carried `owner` among its arguments since the
/// slow log was reset, oldest first (the server must log every command: `slowlog-log-slower-than
/// 0`).
async fn scripts_of(redis: &Redis, owner: lockcore::OwnerId) -> Vec<String> {
    let RedisReply::Array(Some(entries)) =
        redis.command(&["SLOWLOG", "GET", "1000"]).await.unwrap()
    else {
        panic!("SLOWLOG GET: not an array");
    };
    let owner = owner.to_string();
    let mut calls: Vec<String> = entries
        .iter()
        .filter_map(|entry| {
            let RedisReply::Array(Some(fields)) = entry else {
                return None;
            };
            let Some(RedisReply::Array(Some(args))) = fields.get(3) else {
                return None;
            };
            let args: Vec<String> = args.iter().filter_map(RedisReply::as_text).collect();
            let script = args.first()?.eq_ignore_ascii_case("evalsha");
            (script && args.contains(&owner)).then(|| args.get(2).cloned().unwrap_or_default())
        })
        .collect();
    calls.reverse();
    calls
}

/// A lock the `try` fast path granted is released by the short `release_plain.lua` (two keys)
/// while nobody queued behind it. Once a waiter has marked its key, the short script declines
/// and the full release (four keys) frees it and wakes the waiter. A stale lease is refused by
/// the short script alone, and the new holder keeps the lock. (The first round loads the scripts:
/// a call that meets `NOSCRIPT` is sent again, and the slow log shows it twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lease_is_released_by_the_short_script_until_a_waiter_marks_it() {
    let redis = Redis::start().await.expect("kit redis");
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    ok(&redis, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]).await;
    ok(&redis, &["CONFIG", "SET", "slowlog-max-len", "1000"]).await;
    for round in 0..2 {
        let label = unique("plain");
        let name = LockName::new(&label).unwrap();
        let o = opts(30 * SEC);
        let seen = |owner, expected: &'static [&'static str]| {
            let redis = &redis;
            async move {
                let calls = scripts_of(redis, owner).await;
                if round == 1 {
                    assert_eq!(calls, expected);
                }
            }
        };

        let lease = c.try_acquire(&name, &o).await.unwrap().expect("free");
        assert_eq!(lease.handle(), Some(backend_redis::node::PLAIN));
        ok(&redis, &["SLOWLOG", "RESET"]).await;
        assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
        seen(lease.owner(), &["2"]).await;

        // A waiter marks the key: the short script declines, the full one releases and wakes.
        let lease = c.try_acquire(&name, &o).await.unwrap().expect("free");
        let c2 = backend_redis::connect(&redis.url()).await.unwrap();
        let waiter = tokio::spawn({
            let label = label.clone();
            async move { c2.lock(&label, &opts(30 * SEC)).await }
        });
        within(10 * SEC, "the waiter queued", queued(&c, &label, 1)).await;
        ok(&redis, &["SLOWLOG", "RESET"]).await;
        assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
        seen(lease.owner(), &["2", "4"]).await;
        let next = within(10 * SEC, "the waiter was woken", waiter)
            .await
            .unwrap()
            .expect("the waiter acquires");
        assert_eq!(next.release().await.unwrap(), Released::Released);

        // A stale lease: its fence moved on with the next grant.
        let short = opts(Duration::from_millis(200));
        let old = c.try_acquire(&name, &short).await.unwrap().expect("free");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let new = c.try_acquire(&name, &o).await.unwrap().expect("expired");
        ok(&redis, &["SLOWLOG", "RESET"]).await;
        assert_eq!(c.release(&old).await.unwrap(), Released::NotHeld);
        seen(old.owner(), &["2"]).await;
        let info = c.inspect(&name).await.unwrap().expect("held");
        assert_eq!(info.holder, Some(new.owner().to_string()));
        assert_eq!(c.release(&new).await.unwrap(), Released::Released);
    }
}
