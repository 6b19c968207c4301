//! Semaphores: a silent holder's permit, and which nodes a permit waiter watches.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use conformance_tests::FencedResource;
use conformance_tests::kit::{Fault, Proxy, ZooKeeper};
use lockcore::{DistributedLock, LockName, Released, SemaphoreExt, Wait};

use crate::common::{SEC, client, dyn_lock, ms, plain, unique, within};

/// A permit's holder goes silent (its link drops every request, as if its process had died:
/// not even its client's own clean-up reaches the server). In each layout the semaphore stays
/// full until the server ends the holder's session and with it the ephemeral permit node;
/// then a waiter gets the permit, with a token above the silent holder's, whose late write to
/// its slot is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_permit_holder_returns_its_permit_with_its_session() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    for layout in ["dlock", "curator", "kazoo"] {
        let proxy = Proxy::start(zk.addr()).await.expect("proxy");
        let query = format!("session_timeout=2s&timeout=1s&layout={layout}");
        let holder = client(&format!("zk://{}/sem-{layout}?{query}", proxy.addr())).await;
        let other = dyn_lock(&client(&format!("{}/sem-{layout}?{query}", zk.url())).await);
        let name = unique("silent");
        let slot = FencedResource::new();
        let held = dyn_lock(&holder)
            .semaphore(&name, 1)
            .expect("semaphore")
            .acquire(&plain(30 * SEC, Wait::No))
            .await
            .expect("the holder takes the permit");
        let old = held.fencing_token();
        slot.write(old, 0).expect("the holder writes");
        let sem = other.semaphore(&name, 1).expect("semaphore");
        assert!(
            sem.try_acquire(&plain(30 * SEC, Wait::No))
                .await
                .expect("try_acquire")
                .is_none(),
            "{layout}: a second permit of one"
        );

        proxy.set(Fault::BlackholeRequests);
        let next = within(
            60 * SEC,
            "the permit after the session's end",
            sem.acquire(&plain(30 * SEC, Wait::For(45 * SEC))),
        )
        .await
        .unwrap_or_else(|e| panic!("{layout}: the permit did not come back: {e}"));
        assert!(
            next.fencing_token() > old,
            "{layout}: the new holder's token is not above the silent one's"
        );
        slot.write(next.fencing_token(), 1)
            .expect("the new holder writes");
        assert!(
            slot.write(old, 2).is_err(),
            "{layout}: the silent holder's late write was accepted"
        );
        slot.assert_never_accepted_stale();
        next.release().await.expect("release");
        std::mem::forget(held);
    }
}

/// In dlock's layout a permit waiter watches only the `permits` nodes right ahead of its own.
/// With two permits held by A then B and waiters C then D: B leaving first (not the oldest
/// holder) must admit C, whose watched pair is {A, B}; D, watching {B, C}, wakes too but must
/// stay queued (A and C hold), and A leaving must then admit it. A waiter that watched only the
/// node `permits` places ahead (A, for C) would never learn of B's release, and the guard below
/// would fail the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_is_admitted_whichever_holder_ahead_leaves() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let locks = dyn_lock(&client(&format!("{}/ahead", zk.url())).await);
    let name = unique("ahead");
    let sem = locks.semaphore(&name, 2).expect("semaphore");
    let hold = || plain(30 * SEC, Wait::No);
    let a = sem.acquire(&hold()).await.expect("A holds");
    let b = sem.acquire(&hold()).await.expect("B holds");
    let waiter = |expect: &'static str| {
        let sem = sem.clone();
        tokio::spawn(async move {
            sem.acquire(&plain(30 * SEC, Wait::For(60 * SEC)))
                .await
                .expect(expect)
        })
    };
    let key = LockName::new(&name).unwrap();
    let queued = |n: usize, what: &'static str| {
        let (locks, key) = (locks.clone(), key.clone());
        within(30 * SEC, what, async move {
            loop {
                let info = locks.inspect_semaphore(&key).await.expect("inspect");
                if info.and_then(|i| i.waiters) == Some(n) {
                    break;
                }
                tokio::time::sleep(ms(20)).await;
            }
        })
    };
    let c = waiter("C is admitted");
    queued(1, "C queued").await;
    let d = waiter("D is admitted");
    queued(2, "D queued").await;

    assert_eq!(b.release().await.expect("B releases"), Released::Released);
    let c = within(45 * SEC, "C admitted after B left", c)
        .await
        .expect("C's task");
    let info = locks
        .inspect_semaphore(&key)
        .await
        .expect("inspect")
        .expect("in use");
    assert_eq!(info.holders.len(), 2, "A and C hold, D waits: {info:?}");
    assert!(!d.is_finished(), "D was admitted with A and C holding");

    assert_eq!(a.release().await.expect("A releases"), Released::Released);
    let d = within(45 * SEC, "D admitted after A left", d)
        .await
        .expect("D's task");
    assert!(d.fencing_token() > c.fencing_token());
    drop((c, d));
}

/// The total of watches the server at `addr` holds, from `wchs`.
async fn watches(addr: std::net::SocketAddr) -> usize {
    let text = conformance_tests::kit::zk_four_letter(addr, "wchs", 5 * SEC)
        .await
        .expect("wchs");
    text.split("Total watches:")
        .nth(1)
        .and_then(|t| t.trim().parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no watch total in {text:?}"))
}

/// In dlock's layout the first waiter of a semaphore watches exactly the nodes ahead of it, so
/// when one of them goes it holds on that event alone, without reading the children again: here
/// the waiter's link drops every request from the moment its watches are set, and it still
/// gets the permit when the holder releases (the event comes from the server). Its token is
/// above the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_permit_waiter_holds_on_the_event_alone() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let url = |addr: String| format!("zk://{addr}/sem-event?timeout=20s");
    let holder = dyn_lock(&client(&url(zk.addr().to_string())).await);
    let waiter = dyn_lock(&client(&url(proxy.addr().to_string())).await);
    let name = unique("first-waiter");
    let held = holder
        .semaphore(&name, 1)
        .expect("semaphore")
        .acquire(&plain(60 * SEC, Wait::No))
        .await
        .expect("the holder takes the permit");
    let before = watches(zk.addr()).await;
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            waiter
                .semaphore(&name, 1)
                .expect("semaphore")
                .acquire(&plain(60 * SEC, Wait::For(60 * SEC)))
                .await
        })
    };
    // Its watch on the holder's node and on its own.
    await_watches(zk.addr(), before + 2, "the waiter").await;
    proxy.set(Fault::BlackholeRequests);
    let old = held.fencing_token();
    assert_eq!(held.release().await.expect("release"), Released::Released);
    let got = within(30 * SEC, "the waiter's permit", waiting)
        .await
        .expect("task")
        .expect("the waiter holds on the deletion event, with no request answered");
    assert!(got.fencing_token() > old, "its token is above the holder's");
    proxy.set(Fault::PassThrough);
    assert_eq!(got.release().await.expect("release"), Released::Released);
}

/// A pass-through link to `upstream` that records the opcode of every request its one client
/// sends (ZooKeeper frames: a 4-byte length, then, after the connect request, the xid and the
/// opcode). Returns the address to connect to and the recorded opcodes.
async fn opcode_recorder(upstream: std::net::SocketAddr) -> (String, Arc<Mutex<Vec<i32>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let ops = Arc::new(Mutex::new(Vec::new()));
    let recorded = ops.clone();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.expect("accept");
        let server = tokio::net::TcpStream::connect(upstream)
            .await
            .expect("upstream");
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        });
        let mut connected = false;
        loop {
            let mut len = [0u8; 4];
            if from_client.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
            if from_client.read_exact(&mut frame).await.is_err() {
                return;
            }
            if connected && frame.len() >= 8 {
                let op = i32::from_be_bytes(frame[4..8].try_into().expect("4 bytes"));
                ops.lock().unwrap().push(op);
            }
            connected = true;
            if to_server.write_all(&len).await.is_err()
                || to_server.write_all(&frame).await.is_err()
            {
                return;
            }
        }
    });
    (addr, recorded)
}

/// ZooKeeper's opcodes for `getChildren` and `getChildren2`.
const GET_CHILDREN: [i32; 2] = [8, 12];

/// Waits until the server at `addr` holds exactly `n` watches.
async fn await_watches(addr: std::net::SocketAddr, n: usize, what: &str) {
    let deadline = Instant::now() + 30 * SEC;
    loop {
        let now = watches(addr).await;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never set its watches: {now}, not {n}"
        );
        tokio::time::sleep(ms(20)).await;
    }
}

/// In dlock's layout a permit waiter keeps its watches while it waits: after a release that
/// moves it up without letting it hold, it reads the children once and sends one `exists`, for
/// the node that moved into its window of `permits` nodes ahead, not one for each of them and
/// its own. Here, on two permits, H2's release lets W1 hold and moves W2 up (H1 and W1 are then
/// its window, and W1 was watched already); H1's release then lets W2 hold on the event alone,
/// with no request at all. The tokens increase along the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_waiters_keep_their_watches_as_they_move_up() {
    /// ZooKeeper's opcodes for `exists`, `ping` and `removeWatches` (the client sends the last
    /// when the watchers of a path are dropped, as a waiter's are once it holds).
    const EXISTS: i32 = 3;
    const PING: i32 = 11;
    const REMOVE_WATCHES: i32 = 18;
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let url = |addr: String| format!("zk://{addr}/sem-move-up?timeout=20s");
    let direct = || url(zk.addr().to_string());
    let (recorder, ops) = opcode_recorder(zk.addr()).await;
    let (h1, h2, w1, w2, w3) = (
        dyn_lock(&client(&direct()).await),
        dyn_lock(&client(&direct()).await),
        dyn_lock(&client(&direct()).await),
        dyn_lock(&client(&url(recorder)).await),
        dyn_lock(&client(&direct()).await),
    );
    let name = unique("move-up");
    let take = |lock: &Arc<dyn DistributedLock>| {
        let (lock, name) = (lock.clone(), name.clone());
        async move {
            lock.semaphore(&name, 2)
                .expect("semaphore")
                .acquire(&plain(60 * SEC, Wait::No))
                .await
                .expect("a free permit")
        }
    };
    let g1 = take(&h1).await;
    let g2 = take(&h2).await;
    let waiter = |lock: Arc<dyn DistributedLock>| {
        let name = name.clone();
        tokio::spawn(async move {
            lock.semaphore(&name, 2)
                .expect("semaphore")
                .acquire(&plain(60 * SEC, Wait::For(60 * SEC)))
                .await
        })
    };
    // Each waiter watches the two nodes ahead of it and its own.
    let base = watches(zk.addr()).await;
    let first = waiter(w1);
    await_watches(zk.addr(), base + 3, "W1").await;
    let second = waiter(w2);
    await_watches(zk.addr(), base + 6, "W2").await;
    let third = waiter(w3);
    await_watches(zk.addr(), base + 9, "W3").await;
    let mark = ops.lock().unwrap().len();

    let tokens = [g1.fencing_token(), g2.fencing_token()];
    assert_eq!(g2.release().await.expect("release"), Released::Released);
    let got1 = within(30 * SEC, "W1's permit", first)
        .await
        .expect("task")
        .expect("W1 holds");
    // W2 moves up: it reads the children and watches H1, which moved into its window (W1 it
    // watches already); H1 is held until W2's requests are in.
    let sent = |from: usize| -> Vec<i32> {
        ops.lock().unwrap()[from..]
            .iter()
            .copied()
            .filter(|op| ![PING, REMOVE_WATCHES].contains(op))
            .collect()
    };
    let deadline = Instant::now() + 30 * SEC;
    while sent(mark).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "W2 never moved up: {:?}",
            sent(mark)
        );
        tokio::time::sleep(ms(20)).await;
    }
    let moved = sent(mark);
    assert_eq!(
        moved.len(),
        2,
        "W2 sent one listing and one exists: {moved:?}"
    );
    assert!(GET_CHILDREN.contains(&moved[0]), "{moved:?}");
    assert_eq!(moved[1], EXISTS, "{moved:?}");
    assert!(!second.is_finished() && !third.is_finished(), "two permits");
    let moved_at = mark;
    let mark = ops.lock().unwrap().len();
    assert_eq!(g1.release().await.expect("release"), Released::Released);
    let got2 = within(30 * SEC, "W2's permit", second)
        .await
        .expect("task")
        .expect("W2 holds");
    assert_eq!(sent(mark), Vec::<i32>::new(), "W2 held on H1's event alone");
    assert_eq!(
        sent(moved_at),
        moved,
        "and sent nothing else after the release that moved it up"
    );
    assert!(
        tokens.iter().all(|t| *t < got1.fencing_token())
            && got1.fencing_token() < got2.fencing_token(),
        "tokens increase"
    );
    got1.release().await.expect("release");
    let got3 = within(30 * SEC, "W3's permit", third)
        .await
        .expect("task")
        .expect("W3 holds");
    got2.release().await.expect("release");
    got3.release().await.expect("release");
}
