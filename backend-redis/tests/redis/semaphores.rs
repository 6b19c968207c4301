//! Counting semaphores.

use std::time::Duration;

use backend_redis::node::{AcquireReply, AttemptReply};
use conformance_tests::kit::{Redis, RedisCluster, RedisReply};
use conformance_tests::within;
use lockcore::{Error, FencingToken, LockExt, LockName, Released, SemaphoreExt, Wait};

use crate::support::*;

/// A Redis ACL user allowed only pub/sub (no key, no script) sees the wake-up channels and
/// publishes forged permit hand-overs on each while a holder holds the only permit and three
/// waiters queue (each in a client of its own, as processes are): for every waiter, every token
/// the semaphore could have given, in the form a hand-over had before it was tagged and with
/// tags of its own. No waiter takes one for a permit: after the holder's release the permits go
/// to the waiters in queue order with increasing tokens. The server is the test's own: the user
/// publishes on every channel it sees, which on the shared server would reach other tests'
/// clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_permit_hand_overs_grant_nothing() {
    let own = Redis::start().await.expect("a server of the test's own");
    let redis = &own;
    let user = format!("mallory{:08x}", rand::random::<u32>());
    let acl = ["ACL", "SETUSER", &user, "on", &format!(">{PASSWORD}")];
    ok(
        redis,
        &[&acl[..], &["resetchannels", "&*", "-@all", "+@pubsub"]].concat(),
    )
    .await;
    let name = unique("forged-permits");
    let lock_name = LockName::new(&name).expect("name");
    let holder = backend_redis::connect(&redis.url()).await.expect("holder");
    let sem = holder.semaphore(&name, 1).expect("semaphore");
    let held = sem.acquire(&permit_opts(60 * SEC)).await.expect("free");
    let owners = [(); 3].map(|_| lockcore::OwnerId::random());
    let mut tasks = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let c = backend_redis::connect(&redis.url()).await.expect("waiter");
        let sem = c.semaphore(&name, 1).expect("semaphore");
        let opts = permit_opts(60 * SEC)
            .wait(Wait::For(60 * SEC))
            .owner(*owner);
        tasks.push(tokio::spawn(async move { sem.acquire(&opts).await }));
        until("the waiter queued", || async {
            let info = holder.inspect_semaphore(&lock_name).await.unwrap();
            info.and_then(|i| i.waiters) == Some(i + 1)
        })
        .await;
    }

    let attacker = redis::Client::open(format!(
        "redis://{user}:{PASSWORD}@127.0.0.1:{}",
        redis.port()
    ))
    .expect("url")
    .get_multiplexed_async_connection()
    .await
    .expect("the user connects");
    let mut con = attacker.clone();
    let read: redis::RedisResult<Option<String>> =
        redis::cmd("GET").arg("dlock").query_async(&mut con).await;
    let refused = read.expect_err("the user can read keys").to_string();
    assert!(refused.to_lowercase().contains("permission"), "{refused}");
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*")
        .query_async(&mut con)
        .await
        .expect("PUBSUB CHANNELS");
    assert!(channels.len() >= 3, "the waiters' channels: {channels:?}");
    let mut forged = redis::pipe();
    for channel in &channels {
        for owner in owners {
            for token in 1..=50 {
                let tag = format!("{:040x}", rand::random::<u128>());
                for message in [
                    format!("{owner}:{token}"),
                    format!("{owner}:{token}:{}", "0".repeat(40)),
                    format!("{owner}:{token}:{tag}"),
                ] {
                    forged.cmd("PUBLISH").arg(channel).arg(message).ignore();
                }
            }
        }
    }
    let () = forged
        .query_async(&mut con)
        .await
        .expect("the user publishes");
    // The server sent every message out before it answers a command sent after them.
    let _: i64 = redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query_async(&mut con)
        .await
        .expect("PUBSUB NUMPAT");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (owner, task) in owners.iter().zip(&tasks) {
        assert!(!task.is_finished(), "waiter {owner} took a forged permit");
    }

    held.release().await.expect("release");
    let mut last = FencingToken(0);
    for (owner, task) in owners.iter().zip(tasks) {
        let permit = within(30 * SEC, "a waiter's permit", task)
            .await
            .expect("task")
            .expect("acquire");
        assert_eq!(permit.lease().owner(), *owner, "granted out of queue order");
        assert!(
            permit.fencing_token() > last,
            "tokens went {last} then {}",
            permit.fencing_token()
        );
        last = permit.fencing_token();
        permit.release().await.expect("release");
    }
}

/// A semaphore and the lock of the same name are two objects, on a single server and in a
/// Cluster: all permits held, the lock is free (and the other way round); the lock's queue does
/// not see the semaphore's waiters; the semaphore's tokens are its own sequence. On a single
/// server the keys are checked too: `{dlock:<name>}:sem:*`, the permits as `<owner>:<token>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_and_the_lock_of_its_name_are_apart() {
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let c = backend_redis::connect(&url).await.expect("client");
        assert!(c.capabilities().native.semaphore, "{url}");
        let name = unique("sem-apart");
        let lock_name = LockName::new(&name).unwrap();
        let sem = c.semaphore(&name, 2).expect("semaphore");
        let p1 = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit 1");
        let p2 = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit 2");
        assert!(p2.fencing_token() > p1.fencing_token(), "{url}");
        assert!(
            sem.try_acquire(&permit_opts(30 * SEC))
                .await
                .unwrap()
                .is_none(),
            "{url}: a third permit of two"
        );
        // Every permit is held, and the lock of the name is free.
        let lock = c
            .try_lock(&name, &opts(30 * SEC))
            .await
            .expect("try lock")
            .expect("the lock is not excluded by the semaphore");
        assert_eq!(
            lock.fencing_token(),
            FencingToken(1),
            "{url}: the lock's own counter"
        );

        // A permit waiter queues with the semaphore only.
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire(&permit_opts(30 * SEC)).await })
        };
        until("the permit waiter queued", || async {
            let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
            info.waiters == Some(1)
        })
        .await;
        let lock_info = c.inspect(&lock_name).await.unwrap().expect("lock seen");
        assert_eq!(
            lock_info.waiters,
            Some(0),
            "{url}: the lock's queue saw a permit waiter"
        );
        assert_eq!(lock_info.holder, Some(lock.lease().owner().to_string()));

        // Releasing the lock wakes no permit waiter; releasing a permit does.
        lock.release().await.expect("release lock");
        p1.release().await.expect("release permit 1");
        let p3 = within(30 * SEC, "the waiter gets the freed permit", waiter)
            .await
            .expect("task")
            .expect("permit 3");
        assert!(p3.fencing_token() > p2.fencing_token(), "{url}");
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert_eq!(info.permits, Some(2));
        assert_eq!(info.waiters, Some(0));
        let holders: Vec<_> = info.holders.iter().map(|h| h.token).collect();
        assert_eq!(holders, [p2.fencing_token(), p3.fencing_token()], "{url}");

        if !url.starts_with("redis+cluster") {
            let redis = shared().await;
            let [holders, queue, _, fence, count] = sem_keys(&name);
            let mut expected = vec![
                format!("{}:{}", p2.lease().owner(), p2.fencing_token()),
                format!("{}:{}", p3.lease().owner(), p3.fencing_token()),
            ];
            expected.sort();
            let mut got = members(redis, &holders).await;
            got.sort();
            assert_eq!(got, expected);
            assert_eq!(
                redis.command(&["GET", &fence]).await.unwrap().as_text(),
                Some(p3.fencing_token().to_string()),
                "the semaphore's own counter"
            );
            assert_eq!(
                redis.command(&["GET", &count]).await.unwrap().as_text(),
                Some("2".to_owned())
            );
            assert_eq!(
                redis.command(&["EXISTS", &queue]).await.unwrap(),
                RedisReply::Integer(0)
            );
        }
        p2.release().await.expect("release 2");
        p3.release().await.expect("release 3");
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert!(info.holders.is_empty());
        assert_eq!(info.permits, None, "an idle semaphore binds no count");
        assert!(c.forget(&lock_name).await.unwrap());
        assert_eq!(c.inspect_semaphore(&lock_name).await.unwrap(), None);
    }
}

/// While a semaphore is in use (a live permit or a queued waiter) another count is refused with
/// `InvalidArgument`, by a try and by a wait, and changes nothing; once idle, the next caller's
/// count is the semaphore's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_count_is_refused_while_in_use_and_taken_once_idle() {
    let c = backend_redis::connect(&shared().await.url()).await.unwrap();
    let name = unique("sem-count");
    let lock_name = LockName::new(&name).unwrap();
    let one = c.semaphore(&name, 1).unwrap();
    let three = c.semaphore(&name, 3).unwrap();
    let held = one.acquire(&permit_opts(30 * SEC)).await.expect("permit");
    let refused = |r: lockcore::Result<Option<lockcore::PermitGuard>>| match r {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    refused(three.try_acquire(&permit_opts(30 * SEC)).await);
    refused(three.acquire(&permit_opts(30 * SEC)).await.map(Some));
    // A waiter with the recorded count keeps the semaphore in use after the holder leaves.
    let waiter = {
        let one = one.clone();
        tokio::spawn(async move { one.acquire(&permit_opts(30 * SEC)).await })
    };
    until("the waiter queued", || async {
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .waiters
            == Some(1)
    })
    .await;
    let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.permits, Some(1));
    held.release().await.unwrap();
    let second = within(30 * SEC, "the waiter's permit", waiter)
        .await
        .unwrap()
        .expect("waiter");
    refused(three.try_acquire(&permit_opts(30 * SEC)).await);
    second.release().await.unwrap();
    // Idle: the next caller's count is the semaphore's.
    let a = three
        .acquire(&permit_opts(30 * SEC))
        .await
        .expect("count 3 once idle");
    let b = three
        .acquire(&permit_opts(30 * SEC))
        .await
        .expect("second of three");
    refused(one.try_acquire(&permit_opts(30 * SEC)).await);
    let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.permits, Some(3));
    assert_eq!(info.holders.len(), 2);
    a.release().await.unwrap();
    b.release().await.unwrap();
}

/// Each grant's token is above every earlier one of the semaphore, across release and across
/// a permit that ran out (freed by the server's clock, with no release); an expired permit's
/// lease can neither be extended nor released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_tokens_increase_across_release_and_expiry() {
    let c = backend_redis::connect(&shared().await.url()).await.unwrap();
    let name = unique("sem-tokens");
    let lock_name = LockName::new(&name).unwrap();
    let sem = c.semaphore(&name, 1).unwrap();
    let mut last = FencingToken(0);
    for round in 0..3 {
        let p = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit");
        assert!(p.fencing_token() > last, "round {round}");
        last = p.fencing_token();
        p.release().await.expect("release");

        // A short permit that is never released: the next one comes once it ran out.
        let short = sem
            .acquire(&permit_opts(Duration::from_millis(200)))
            .await
            .expect("short permit");
        assert!(short.fencing_token() > last);
        last = short.fencing_token();
        let lease = short.lease();
        std::mem::forget(short);
        let next = sem
            .acquire(&permit_opts(30 * SEC))
            .await
            .expect("the permit after the expired one");
        assert!(next.fencing_token() > last, "round {round}");
        last = next.fencing_token();
        assert!(matches!(
            c.extend(&lease, 10 * SEC).await,
            Err(Error::LockLost { .. })
        ));
        assert_eq!(c.release(&lease).await.unwrap(), Released::NotHeld);
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert_eq!(info.holders.len(), 1, "the expired permit is not reported");
        assert_eq!(info.holders[0].token, next.fencing_token());
        next.release().await.unwrap();
    }
}

/// Release and extend of a permit are owner- and token-checked: another owner's lease, a lease
/// with the right owner but another token, a released (stale) lease, and a lock's lease with the
/// permit's owner and token all free nothing and extend nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_release_and_extend_are_owner_checked() {
    let c = backend_redis::connect(&shared().await.url()).await.unwrap();
    let name = unique("sem-owner");
    let lock_name = LockName::new(&name).unwrap();
    let sem = c.semaphore(&name, 2).unwrap();
    let p = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit");
    let real = p.lease();
    assert_eq!(real.handle(), Some(backend_redis::node::PERMIT));
    let forged = |owner: lockcore::OwnerId, token: FencingToken| {
        lockcore::Lease::new(
            lock_name.clone(),
            owner,
            token,
            std::time::Instant::now(),
            30 * SEC,
            Duration::from_millis(2),
        )
    };
    let permit = |l: lockcore::Lease| l.with_handle(backend_redis::node::PERMIT);
    let other_owner = permit(forged(lockcore::OwnerId::random(), real.token()));
    let other_token = permit(forged(real.owner(), FencingToken(real.token().0 + 1)));
    let as_lock = forged(real.owner(), real.token());
    for lease in [&other_owner, &other_token, &as_lock] {
        assert_eq!(
            c.release(lease).await.unwrap(),
            Released::NotHeld,
            "{lease:?}"
        );
        assert!(
            matches!(c.extend(lease, 60 * SEC).await, Err(Error::LockLost { .. })),
            "{lease:?}"
        );
    }
    let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.holders.len(), 1, "the permit is still held");
    assert_eq!(info.holders[0].owner, real.owner().to_string());
    assert!(info.holders[0].remaining.unwrap() <= 30 * SEC);
    // The real lease extends and releases; then it is stale.
    let extended = c.extend(&real, 60 * SEC).await.expect("extend");
    assert_eq!(extended.token(), real.token());
    assert!(
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .holders[0]
            .remaining
            .unwrap()
            > 30 * SEC
    );
    assert_eq!(c.release(&real).await.unwrap(), Released::Released);
    let again = sem.acquire(&permit_opts(30 * SEC)).await.expect("again");
    assert_eq!(c.release(&real).await.unwrap(), Released::NotHeld, "stale");
    assert!(matches!(
        c.extend(&real, 60 * SEC).await,
        Err(Error::LockLost { .. })
    ));
    assert_eq!(
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .holders
            .len(),
        1
    );
    drop(p);
    again.release().await.unwrap();
}

/// A waiting permit acquire that is dropped (its task aborted) leaves no queue entry and no
/// permit: whether it was still queued, or the freed permit was granted to it just as it was
/// dropped, the clean-up it armed removes what it had. Checked on the keys themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_wait_leaves_no_entry_and_no_permit() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    for round in 0..6 {
        let name = unique("sem-dropped");
        let lock_name = LockName::new(&name).unwrap();
        let [holders, queue, alive, _, _] = sem_keys(&name);
        let sem = c.semaphore(&name, 1).unwrap();
        let held = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit");
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire(&permit_opts(30 * SEC)).await })
        };
        until("the waiter queued", || async {
            members(redis, &queue).await.len() == 1
        })
        .await;
        if round % 2 == 1 {
            // Free the permit first: the waiter may be granted just as it is dropped.
            held.release().await.unwrap();
            tokio::task::yield_now().await;
            waiter.abort();
        } else {
            waiter.abort();
            held.release().await.unwrap();
        }
        let _ = waiter.await;
        until("the clean-up ran", || async {
            members(redis, &queue).await.is_empty()
                && members(redis, &alive).await.is_empty()
                && members(redis, &holders).await.is_empty()
        })
        .await;
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert!(info.holders.is_empty(), "round {round}: {info:?}");
        assert_eq!(info.waiters, Some(0), "round {round}");
    }
}

/// The node's clean-up of a permit acquire frees a permit granted to that owner (the case of a
/// reply lost with its request) and wakes the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_permit_grant_is_freed() {
    let node = node_of(shared().await);
    let name = LockName::new(unique("sem-cancel")).unwrap();
    let owner = lockcore::OwnerId::random();
    let o = opts(30 * SEC);
    let (node_ref, name_ref, o_ref) = (&node, &name, &o);
    let try_permit = |who| async move {
        let try_mode = backend_redis::node::Mode::Try;
        node_ref
            .acquire_permit(name_ref, who, o_ref, try_mode, 0, 1, false)
            .await
            .unwrap()
    };
    let granted = try_permit(owner).await;
    assert!(matches!(
        granted,
        AttemptReply::Now(AcquireReply::Granted(_))
    ));
    let other = lockcore::OwnerId::random();
    let refused = try_permit(other).await;
    assert!(matches!(
        refused,
        AttemptReply::Now(AcquireReply::Waiting { .. })
    ));
    assert!(
        !node.cancel_permit(&name, other).await.unwrap(),
        "held nothing"
    );
    assert!(node.cancel_permit(&name, owner).await.unwrap(), "freed");
    let reply = node.inspect_semaphore(&name).await.unwrap();
    assert!(reply.holders.is_empty());
    let again = try_permit(other).await;
    assert!(matches!(again, AttemptReply::Now(AcquireReply::Granted(2))));
}

/// A permit's release hands the free permit to the head waiter in the same script: the waiter
/// is told its token through the hub and holds without another request; an attempt it sends
/// meanwhile (a message it missed) is answered with the same handed permit; a waiter that
/// never said it queued is not answered so; the handed permit's lease runs out no later than
/// the waiter's last queued attempt plus the ttl, and its token respects the waiter's minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_hands_the_permit_to_the_head_waiter() {
    use backend_redis::node::Mode;
    let node = node_of(shared().await);
    let name = LockName::new(unique("sem-hand")).unwrap();
    let o = opts(30 * SEC);
    let (holder, waiter) = (lockcore::OwnerId::random(), lockcore::OwnerId::random());
    let Ok(AttemptReply::Now(AcquireReply::Granted(first))) = node
        .acquire_permit(&name, holder, &o, Mode::Try, 0, 1, false)
        .await
    else {
        panic!("the free permit is granted");
    };
    let (registration, _) = node.register(&waiter.to_string(), &name);
    node.ensure_subscribed(&name).await.unwrap();
    let queued_at = std::time::Instant::now();
    // The waiter's token minimum (a `dual://` migration's) binds the permit handed to it too.
    let min_token = first + 500;
    let queued = node
        .acquire_permit(&name, waiter, &o, Mode::Wait, min_token, 1, false)
        .await
        .unwrap();
    assert!(
        matches!(
            queued,
            AttemptReply::Now(AcquireReply::Waiting { rank: 0, .. })
        ),
        "{queued:?}"
    );
    assert_eq!(registration.handed(), None, "nothing handed yet");
    let lease = backend_redis::node::lease(&name, holder, first, queued_at, &o)
        .with_handle(backend_redis::node::PERMIT);
    assert!(node.release(&lease).await.unwrap(), "released");
    tokio::time::timeout(30 * SEC, registration.notified())
        .await
        .expect("the waiter is told");
    assert_eq!(
        registration.handed(),
        Some(min_token),
        "the message carries the handed token"
    );
    let state = node.inspect_semaphore(&name).await.unwrap();
    assert_eq!(state.queued, 0, "the waiter left the queue: {state:?}");
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.holders[0].owner, waiter.to_string());
    assert_eq!(state.holders[0].token, min_token);
    assert!(
        state.holders[0].remaining_ms <= 30_000,
        "no longer than the ttl from the waiter's queued attempt: {state:?}"
    );
    // A queued owner's next attempt finds the permit handed to it; the same attempt without
    // `queued` would queue again instead.
    let again = node
        .acquire_permit(&name, waiter, &o, Mode::Wait, min_token, 1, true)
        .await
        .unwrap();
    assert_eq!(again, AttemptReply::Handed(min_token));
    let third = lockcore::OwnerId::random();
    let other = node
        .acquire_permit(&name, third, &o, Mode::Wait, 0, 1, true)
        .await
        .unwrap();
    assert!(
        matches!(other, AttemptReply::Now(AcquireReply::Waiting { .. })),
        "a permit handed to another owner is not this one's: {other:?}"
    );
    assert!(
        !node.cancel_permit(&name, third).await.unwrap(),
        "the third owner held nothing"
    );
    assert!(
        node.cancel_permit(&name, waiter).await.unwrap(),
        "the undo of the waiter's acquire frees the handed permit"
    );
    assert!(node.forget(&name).await.unwrap(), "nothing is left in use");
}

/// `forget` forgets an idle semaphore (its counter and count too), not one in use; the lock
/// and the semaphore of a name are forgotten each on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_takes_an_idle_semaphore_only() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("sem-forget");
    let lock_name = LockName::new(&name).unwrap();
    let [holders, _, _, fence, count] = sem_keys(&name);
    let sem = c.semaphore(&name, 2).unwrap();
    let p = sem.acquire(&permit_opts(30 * SEC)).await.unwrap();
    assert!(!c.forget(&lock_name).await.unwrap(), "a permit is held");
    assert_eq!(members(redis, &holders).await.len(), 1);
    // The lock held, the semaphore idle: the semaphore goes, the lock stays.
    p.release().await.unwrap();
    let lock = c.lock(&name, &opts(30 * SEC)).await.unwrap();
    assert!(!c.forget(&lock_name).await.unwrap(), "the lock is held");
    for key in [&fence, &count] {
        assert_eq!(
            redis.command(&["EXISTS", key]).await.unwrap(),
            RedisReply::Integer(0),
            "{key}"
        );
    }
    assert_eq!(c.inspect_semaphore(&lock_name).await.unwrap(), None);
    assert!(c.inspect(&lock_name).await.unwrap().unwrap().is_held());
    lock.release().await.unwrap();
    assert!(c.forget(&lock_name).await.unwrap());
    assert_eq!(c.inspect(&lock_name).await.unwrap(), None);
}

/// Keep-alive batches hold locks and permits together: one `extend_many` renews both kinds (in
/// one pipeline on a single server, per master in a Cluster), each with its own script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_permits_renew_in_one_batch() {
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let c = backend_redis::connect(&url).await.unwrap();
        let base = unique("sem-batch");
        let mut leases = Vec::new();
        let mut guards = Vec::new();
        for i in 0..20 {
            let name = format!("{base}/{i}");
            let g = c.lock(&name, &opts(30 * SEC)).await.unwrap();
            leases.push((g.lease(), 60 * SEC));
            guards.push(g);
            let p = c
                .semaphore(&name, 3)
                .unwrap()
                .acquire(&opts(30 * SEC))
                .await
                .unwrap();
            leases.push((p.lease(), 60 * SEC));
            guards.push(p.into_inner());
        }
        let renewed = c.extend_many(&leases).await;
        for ((lease, _), r) in leases.iter().zip(&renewed) {
            let r = r
                .as_ref()
                .unwrap_or_else(|e| panic!("{url}: {lease:?}: {e}"));
            assert_eq!(r.token(), lease.token());
            assert_eq!(r.handle(), lease.handle());
        }
        let name = LockName::new(format!("{base}/0")).unwrap();
        let info = c.inspect_semaphore(&name).await.unwrap().unwrap();
        assert!(info.holders[0].remaining.unwrap() > 30 * SEC, "{url}");
        let info = c.inspect(&name).await.unwrap().unwrap();
        assert!(info.remaining.unwrap() > 30 * SEC, "{url}");
        for g in guards {
            assert_eq!(g.release().await.unwrap(), Released::Released, "{url}");
        }
    }
}

/// A token minimum lifts a permit's token (on a try and on a queued waiter's grant) and the
/// semaphore's counter with it, so later permits are above the minimum; the lock's counter is
/// not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_token_lifts_permits() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("sem-min_token");
    let lock_name = LockName::new(&name).unwrap();
    let [_, _, _, fence, _] = sem_keys(&name);
    let sem = c.semaphore(&name, 1).unwrap();
    let raised = |f: u64| permit_opts(30 * SEC).min_token(FencingToken(f));
    let p = sem.try_acquire(&raised(700)).await.unwrap().expect("free");
    assert_eq!(p.fencing_token(), FencingToken(700));
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire(&raised(900)).await })
    };
    until("the waiter queued", || async {
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .waiters
            == Some(1)
    })
    .await;
    p.release().await.unwrap();
    let q = within(30 * SEC, "the raised waiter", waiter)
        .await
        .unwrap()
        .expect("granted");
    assert_eq!(q.fencing_token(), FencingToken(900));
    q.release().await.unwrap();
    let r = sem.acquire(&permit_opts(30 * SEC)).await.unwrap();
    assert_eq!(r.fencing_token(), FencingToken(901));
    assert_eq!(
        redis.command(&["GET", &fence]).await.unwrap().as_text(),
        Some("901".to_owned())
    );
    assert_eq!(
        c.inspect(&lock_name).await.unwrap(),
        None,
        "the lock never seen"
    );
    r.release().await.unwrap();
}
