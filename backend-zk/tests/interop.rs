//! `layout=curator` and `layout=kazoo` against the real libraries: Apache Curator 5.4 (Debian's
//! `libcurator-recipes-java`) and kazoo (PyPI, in a virtualenv the kit makes), each run by the
//! test kit as a child process with a ZooKeeper session of its own ([`LockPeer`]), on the kit's
//! shared server. Every test runs once per library, with dlock in that library's layout: who
//! holds, who waits and in which order, readers and writers across libraries, mixed hammers
//! checked on recorded histories and a fenced resource, and a holder whose session expires.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_zk::ZkLock;
use backend_zk::zookeeper_client as zk;
use conformance_tests::kit::{Fault, LockPeer, PeerHold, PeerLibrary, PeerLock, Proxy, ZooKeeper};
use conformance_tests::{FencedResource, History, Hold, within};
use lockcore::{
    AcquireOptions, DistributedLock, Error, FencingToken, KeepAlive, LockExt, LockName,
    ReadWriteExt, Released, SemaphoreExt, Wait,
};
use tokio::sync::{mpsc, oneshot};

mod common;

use common::{SEC, client, rand_u32};

fn plain(wait: Wait) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(30 * SEC)
        .keep_alive(KeepAlive::Off)
        .wait(wait)
}

fn layout(library: PeerLibrary) -> &'static str {
    match library {
        PeerLibrary::Curator => "curator",
        PeerLibrary::Kazoo => "kazoo",
    }
}

/// One test's corner of the shared server: a chroot of its own, dlock clients in `library`'s
/// layout there, and an observer session.
struct Setup {
    zk: &'static ZooKeeper,
    library: PeerLibrary,
    chroot: String,
    observer: ZkLock,
}

impl Setup {
    async fn new(library: PeerLibrary, test: &str) -> Setup {
        let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
        let chroot = format!("/interop-{test}-{}-{:08x}", layout(library), rand_u32());
        let observer = client(&format!("{}{chroot}?layout={}", zk.url(), layout(library))).await;
        Setup {
            zk,
            library,
            chroot,
            observer,
        }
    }

    /// A dlock client in this test's layout, with a session of its own.
    async fn dlock(&self) -> Arc<dyn DistributedLock> {
        Arc::new(client(&self.url(self.library)).await)
    }

    fn url(&self, library: PeerLibrary) -> String {
        format!(
            "{}{}?layout={}",
            self.zk.url(),
            self.chroot,
            layout(library)
        )
    }

    /// A client of this test's library.
    async fn peer(&self) -> Arc<LockPeer> {
        Arc::new(peer_of(self.library, self.zk, 10 * SEC).await)
    }

    /// The znode path of lock `name`, as the other library names it.
    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.chroot)
    }

    /// The contender nodes under lock `name`'s path, as the observer lists them.
    async fn nodes(&self, name: &str) -> Vec<String> {
        match self
            .observer
            .zk_client()
            .list_children(&self.path(name))
            .await
        {
            Ok(c) => c,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => panic!("list {}: {e}", self.path(name)),
        }
    }

    /// Polls until lock `name` has `n` contender nodes (the limit only stops a hang).
    async fn wait_for_nodes(&self, name: &str, n: usize) {
        within(30 * SEC, &format!("{n} nodes under {name}"), async {
            while self.nodes(name).await.len() != n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}

async fn peer_of(library: PeerLibrary, zk: &ZooKeeper, session: Duration) -> LockPeer {
    let started = match library {
        PeerLibrary::Curator => LockPeer::curator(&zk.connect_string(), session).await,
        PeerLibrary::Kazoo => {
            let cache = Path::new(env!("CARGO_TARGET_TMPDIR"));
            LockPeer::kazoo(&zk.connect_string(), session, cache).await
        }
    };
    started.unwrap_or_else(|e| panic!("cannot start a {library:?} client: {e}"))
}

async fn peer_take(
    peer: &LockPeer,
    lock: PeerLock,
    path: &str,
    wait: Duration,
) -> Option<PeerHold> {
    let sent = peer.acquire(lock, path, Some(wait)).expect("send acquire");
    within(wait + 60 * SEC, "the other library's acquire", sent)
        .await
        .expect("the other library's acquire")
}

/// While the other library holds a lock, dlock's `try_lock` says held, and `inspect` names the
/// holder as that library recorded it (Curator: its client's address in the node's data;
/// kazoo without an identifier: the id in the node's name) with the node's czxid as token;
/// after the release dlock gets the lock with a higher token.
async fn other_library_holds(library: PeerLibrary) {
    let s = Setup::new(library, "holds").await;
    let peer = s.peer().await;
    let name = "orders";
    let hold = peer_take(&peer, PeerLock::Mutex, &s.path(name), Duration::ZERO)
        .await
        .expect("the other library takes a free lock");
    let dlock = s.dlock().await;
    assert!(
        dlock
            .try_lock(name, &plain(Wait::No))
            .await
            .expect("try_lock")
            .is_none(),
        "dlock took a lock {library:?} holds"
    );
    let info = dlock
        .inspect(&LockName::new(name).unwrap())
        .await
        .expect("inspect")
        .expect("inspect sees the lock");
    assert_eq!(info.token, Some(FencingToken(hold.czxid)));
    let (data, _) = s
        .observer
        .zk_client()
        .get_data(&hold.node)
        .await
        .expect("read the holder's node");
    let recorded = match library {
        PeerLibrary::Curator => {
            assert!(!data.is_empty(), "Curator records its address");
            String::from_utf8(data).expect("an address")
        }
        PeerLibrary::Kazoo => {
            let node = hold.node.rsplit('/').next().unwrap();
            node.split("__").next().unwrap().to_owned()
        }
    };
    assert_eq!(info.holder, Some(recorded), "inspect names the holder");
    peer.release(&hold).await.expect("release");
    let g = dlock
        .try_lock(name, &plain(Wait::No))
        .await
        .expect("try_lock")
        .expect("free after the other library released");
    assert!(g.fencing_token().0 > hold.czxid, "tokens must grow");
    g.release().await.expect("release");
}

/// While dlock holds, the other library's acquire with a timeout gives up; dlock's node is
/// named as that library names its own and carries the owner id; after the release the other
/// library gets the lock.
async fn dlock_holds(library: PeerLibrary) {
    let s = Setup::new(library, "dlock-holds").await;
    let peer = s.peer().await;
    let dlock = s.dlock().await;
    let name = "app/orders";
    let g = dlock
        .lock(name, &plain(Wait::No))
        .await
        .expect("dlock takes a free lock");
    let nodes = s.nodes(name).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let owner = g.lease().owner().to_string();
    let expected_head = match library {
        PeerLibrary::Curator => format!(
            "_c_{}-{}-{}-{}-{}-lock-",
            &owner[..8],
            &owner[8..12],
            &owner[12..16],
            &owner[16..20],
            &owner[20..]
        ),
        PeerLibrary::Kazoo => format!("{owner}__lock__"),
    };
    assert!(
        nodes[0].starts_with(&expected_head) && nodes[0].len() == expected_head.len() + 10,
        "dlock's node {} is not named like the library's ({expected_head}<seq>)",
        nodes[0]
    );
    let (data, stat) = s
        .observer
        .zk_client()
        .get_data(&format!("{}/{}", s.path(name), nodes[0]))
        .await
        .expect("read dlock's node");
    assert_eq!(String::from_utf8(data).unwrap(), owner);
    assert_eq!(stat.czxid as u64, g.fencing_token().0);
    assert_eq!(
        peer_take(
            &peer,
            PeerLock::Mutex,
            &s.path(name),
            Duration::from_millis(300)
        )
        .await,
        None,
        "the other library took a lock dlock holds"
    );
    let token = g.fencing_token().0;
    assert_eq!(g.release().await.expect("release"), Released::Released);
    let hold = peer_take(&peer, PeerLock::Mutex, &s.path(name), Duration::ZERO)
        .await
        .expect("free after dlock released");
    assert!(hold.czxid > token);
    peer.release(&hold).await.expect("release");
}

/// Who got the lock, in the order the grants came, with their tokens.
type Grants = mpsc::UnboundedReceiver<(String, u64, oneshot::Sender<()>)>;

/// Queues a dlock waiter: when it gets the lock it reports `label` and its token, then holds
/// until told to release.
fn dlock_waiter(
    client: Arc<dyn DistributedLock>,
    name: &str,
    label: &str,
    grants: &mpsc::UnboundedSender<(String, u64, oneshot::Sender<()>)>,
) {
    let (name, label, grants) = (name.to_owned(), label.to_owned(), grants.clone());
    tokio::spawn(async move {
        let g = client
            .lock(&name, &plain(Wait::For(120 * SEC)))
            .await
            .expect("dlock waiter acquires");
        let (done, release) = oneshot::channel();
        let _ = grants.send((label, g.fencing_token().0, done));
        let _ = release.await;
        g.release().await.expect("release");
    });
}

/// Queues a waiter of the other library (its request is on its way before this returns).
fn peer_waiter(
    peer: &Arc<LockPeer>,
    lock: PeerLock,
    path: &str,
    label: &str,
    grants: &mpsc::UnboundedSender<(String, u64, oneshot::Sender<()>)>,
) {
    let pending = peer.acquire(lock, path, None).expect("send acquire");
    let (peer, label, grants) = (peer.clone(), label.to_owned(), grants.clone());
    tokio::spawn(async move {
        let hold = pending
            .await
            .expect("waiter acquires")
            .expect("a waiter without a timeout");
        let (done, release) = oneshot::channel();
        let _ = grants.send((label, hold.czxid, done));
        let _ = release.await;
        peer.release(&hold).await.expect("release");
    });
}

/// Takes the next grant, checks it went to `expected` and that nobody else holds beside it,
/// and returns its token and the handle that releases it.
async fn next_grant(grants: &mut Grants, expected: &str) -> (u64, oneshot::Sender<()>) {
    let (label, token, release) =
        within(60 * SEC, &format!("the grant to {expected}"), grants.recv())
            .await
            .expect("a waiter task ended without its grant");
    assert_eq!(label, expected, "waiters were not served in arrival order");
    assert!(grants.try_recv().is_err(), "two waiters hold at once");
    (token, release)
}

/// A dlock waiter queued behind the other library's holder gets the lock when it releases,
/// and a queue of dlock and library waiters, mixed, is served in arrival order with growing
/// tokens.
async fn mixed_waiters_in_arrival_order(library: PeerLibrary) {
    let s = Setup::new(library, "fifo").await;
    let (p1, p2) = (s.peer().await, s.peer().await);
    let name = "queue";
    let path = s.path(name);
    let (tx, mut grants) = mpsc::unbounded_channel();
    peer_waiter(&p1, PeerLock::Mutex, &path, "peer-holder", &tx);
    let (mut last, holder) = next_grant(&mut grants, "peer-holder").await;
    let order = ["dlock-1", "peer-2", "dlock-3", "peer-4", "dlock-5"];
    for (i, label) in order.iter().enumerate() {
        if label.starts_with("dlock") {
            dlock_waiter(s.dlock().await, name, label, &tx);
        } else {
            peer_waiter(
                if i % 4 == 1 { &p2 } else { &p1 },
                PeerLock::Mutex,
                &path,
                label,
                &tx,
            );
        }
        // The next waiter arrives only once this one's node is in the queue.
        s.wait_for_nodes(name, i + 2).await;
    }
    assert!(grants.try_recv().is_err(), "a waiter got a held lock");
    let mut release = holder;
    for label in order {
        let _ = release.send(());
        let (token, next) = next_grant(&mut grants, label).await;
        assert!(token > last, "tokens must grow: {token} after {last}");
        (last, release) = (token, next);
    }
    let _ = release.send(());
    s.wait_for_nodes(name, 0).await;
}

/// The read-write matrix across libraries: readers of either share; a writer of either
/// excludes readers and writers of both (and dlock's plain lock); a writer queued behind
/// readers keeps later readers of both out, and gets the lock when the readers leave.
async fn read_write_across_libraries(library: PeerLibrary) {
    let s = Setup::new(library, "rw").await;
    let peer = s.peer().await;
    let (d1, d2) = (s.dlock().await, s.dlock().await);
    let name = "catalog";
    let path = s.path(name);
    let one = Duration::ZERO;
    let try_read = |c: &Arc<dyn DistributedLock>| {
        let c = c.clone();
        async move {
            c.try_read_lock(name, &plain(Wait::No))
                .await
                .expect("try_read_lock")
        }
    };
    let try_write = |c: &Arc<dyn DistributedLock>| {
        let c = c.clone();
        async move {
            c.try_write_lock(name, &plain(Wait::No))
                .await
                .expect("try_write_lock")
        }
    };

    // Readers of both share; writers of both stay out.
    let r1 = peer_take(&peer, PeerLock::Read, &path, one)
        .await
        .expect("a library reader on a free lock");
    let r2 = try_read(&d1)
        .await
        .expect("a dlock reader shares with a library reader");
    let r3 = peer_take(&peer, PeerLock::Read, &path, one)
        .await
        .expect("a library reader shares with a dlock reader");
    assert!(
        try_write(&d2).await.is_none(),
        "a dlock writer got in beside readers"
    );
    assert!(
        d2.try_lock(name, &plain(Wait::No))
            .await
            .expect("try_lock")
            .is_none(),
        "dlock's plain lock got in beside readers"
    );
    assert_eq!(
        peer_take(&peer, PeerLock::Write, &path, one).await,
        None,
        "a library writer got in beside readers"
    );

    // A dlock writer queues behind them; later readers of both wait behind it.
    let writer = {
        let d2 = d2.clone();
        tokio::spawn(async move {
            d2.write_lock(name, &plain(Wait::For(120 * SEC)))
                .await
                .expect("the queued writer gets the lock")
        })
    };
    s.wait_for_nodes(name, 4).await;
    assert_eq!(
        peer_take(&peer, PeerLock::Read, &path, one).await,
        None,
        "a library reader jumped a queued dlock writer"
    );
    assert!(
        try_read(&d1).await.is_none(),
        "a dlock reader jumped a queued writer"
    );
    peer.release(&r1).await.expect("release");
    r2.release().await.expect("release");
    assert!(
        !writer.is_finished(),
        "the writer got in while a reader held"
    );
    peer.release(&r3).await.expect("release");
    let w = within(60 * SEC, "the queued writer", writer)
        .await
        .expect("writer task");
    assert!(w.fencing_token().0 > r3.czxid);
    assert_eq!(peer_take(&peer, PeerLock::Read, &path, one).await, None);
    assert_eq!(peer_take(&peer, PeerLock::Write, &path, one).await, None);
    w.release().await.expect("release");

    // A library writer keeps dlock's readers, writers and plain locks out.
    let lw = peer_take(&peer, PeerLock::Write, &path, one)
        .await
        .expect("a library writer on a free lock");
    assert!(
        try_read(&d1).await.is_none(),
        "a dlock reader got in beside a writer"
    );
    assert!(
        try_write(&d1).await.is_none(),
        "a dlock writer got in beside a writer"
    );
    assert!(
        d1.try_lock(name, &plain(Wait::No))
            .await
            .expect("try_lock")
            .is_none(),
        "dlock's plain lock got in beside a library writer"
    );
    peer.release(&lw).await.expect("release");
    s.wait_for_nodes(name, 0).await;
}

/// Two processes of the other library and two dlock clients take turns on one lock, each
/// writing to one fenced resource with its token (a library holder's token is its node's
/// czxid): the recorded history has no overlap, tokens grow, nothing stale is accepted.
async fn mixed_hammer(library: PeerLibrary) {
    const ROUNDS: usize = 12;
    let s = Setup::new(library, "hammer").await;
    let name = "hot";
    let path = s.path(name);
    let history = Arc::new(History::new());
    let resource = Arc::new(FencedResource::new());
    let mut tasks = Vec::new();
    for client in 0..2 {
        let dlock = s.dlock().await;
        let (history, resource) = (history.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..ROUNDS {
                let g = dlock
                    .lock(name, &plain(Wait::For(120 * SEC)))
                    .await
                    .expect("dlock acquires");
                let id = history.acquired(client, &g.lease());
                resource
                    .write(g.fencing_token(), (client * 1000 + i) as u64)
                    .expect("a current dlock holder was refused");
                tokio::task::yield_now().await;
                history.ended(id);
                g.release().await.expect("release");
            }
        }));
    }
    for client in 2..4 {
        let peer = s.peer().await;
        let (history, resource, path) = (history.clone(), resource.clone(), path.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..ROUNDS {
                let hold = peer
                    .acquire(PeerLock::Mutex, &path, None)
                    .expect("send acquire")
                    .await
                    .expect("the library acquires")
                    .expect("no timeout was asked for");
                let acquired = Instant::now();
                resource
                    .write(FencingToken(hold.czxid), (client * 1000 + i) as u64)
                    .expect("a current library holder was refused");
                tokio::task::yield_now().await;
                history.push(Hold {
                    client,
                    name: name.to_owned(),
                    token: hold.czxid,
                    acquired,
                    // No lease: the library holds until it releases.
                    valid_until: acquired + 3600 * SEC,
                    ended: Some(Instant::now()),
                });
                peer.release(&hold).await.expect("release");
            }
        }));
    }
    for t in tasks {
        within(300 * SEC, "the hammer", t)
            .await
            .expect("hammer task");
    }
    assert_eq!(history.holds().len(), 4 * ROUNDS);
    history.assert_safe();
    resource.assert_never_accepted_stale();
    assert_eq!(resource.rejected(), 0, "nobody wrote stale");
    s.wait_for_nodes(name, 0).await;
}

/// The other library's holder is frozen (SIGSTOP) past its session timeout: the server
/// expires its session and deletes its node, and the dlock client waiting behind it gets the
/// lock with a higher token.
async fn frozen_holder_hands_over(library: PeerLibrary) {
    let s = Setup::new(library, "frozen").await;
    let holder = peer_of(library, s.zk, 2 * SEC).await;
    let dlock = s.dlock().await;
    let name = "leader";
    let hold = peer_take(&holder, PeerLock::Mutex, &s.path(name), Duration::ZERO)
        .await
        .expect("the library takes a free lock");
    let waiter = {
        let dlock = dlock.clone();
        tokio::spawn(async move {
            dlock
                .lock(name, &plain(Wait::For(120 * SEC)))
                .await
                .expect("the dlock waiter gets the lock")
        })
    };
    s.wait_for_nodes(name, 2).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    holder.pause();
    let g = within(60 * SEC, "handover after the session expired", waiter)
        .await
        .expect("waiter task");
    assert!(
        g.fencing_token().0 > hold.czxid,
        "the new holder's token must be above the expired holder's"
    );
    let gone = s
        .observer
        .zk_client()
        .check_stat(&hold.node)
        .await
        .expect("exists");
    assert!(
        gone.is_none(),
        "the frozen holder's node outlived its session"
    );
    holder.resume();
    g.release().await.expect("release");
}

/// dlock's holder loses its session behind its back (its link down, another connection
/// resumes the session and closes it, as an operator tool would): the other library's waiter
/// gets the lock with a higher token, the holder's `lost()` says `SessionExpired` once its
/// link is back, and the fenced resource refuses its late write.
async fn dlock_session_closed_hands_over(library: PeerLibrary) {
    let s = Setup::new(library, "session").await;
    let proxy = Proxy::start(s.zk.addr()).await.expect("proxy");
    let holder = client(&format!(
        "zk://{}{}?layout={}&session_timeout=40s&ttl=40s",
        proxy.addr(),
        s.chroot,
        layout(library)
    ))
    .await;
    let peer = s.peer().await;
    let name = "job";
    let fenced = FencedResource::new();
    let opts = AcquireOptions::new()
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let guard = (Arc::new(holder.clone()) as Arc<dyn DistributedLock>)
        .lock(name, &opts)
        .await
        .expect("dlock acquires");
    let old = guard.fencing_token();
    fenced.write(old, 0).expect("holder writes");
    let waiter = peer
        .acquire(PeerLock::Mutex, &s.path(name), None)
        .expect("send acquire");
    s.wait_for_nodes(name, 2).await;
    proxy.set(Fault::Down);
    let intruder = zk::Client::connector()
        .with_session(holder.zk_client().session().clone())
        .connect(&s.zk.connect_string())
        .await
        .expect("resume the holder's session");
    drop(intruder); // closes the session: its ephemeral nodes go
    let hold = within(60 * SEC, "the library waiter", waiter)
        .await
        .expect("the library acquires")
        .expect("no timeout was asked for");
    assert!(hold.czxid > old.0, "the next holder's token must be higher");
    fenced
        .write(FencingToken(hold.czxid), 1)
        .expect("the new holder writes");
    proxy.set(Fault::PassThrough);
    let reason = within(60 * SEC, "the holder's lost()", guard.lost()).await;
    assert_eq!(reason, lockcore::LostReason::SessionExpired);
    assert!(fenced.write(old, 2).is_err(), "stale write accepted");
    peer.release(&hold).await.expect("release");
    drop(guard);
}

/// A semaphore of two shared by dlock (in the library's layout) and the library's own
/// semaphore (Curator's `InterProcessSemaphoreV2`, kazoo's `Semaphore`): together they never
/// hold more than two leases. The library holds one and dlock gets the other; then neither a
/// third dlock client nor the library gets one at once; a dlock waiter gets the library's
/// lease once it is returned, with a higher token; with dlock holding both, the library's
/// one attempt is refused.
async fn semaphore_shared_with_library(library: PeerLibrary) {
    let s = Setup::new(library, "sem").await;
    let name = "jobs";
    let peer = s.peer().await;
    let (a, b, c) = (s.dlock().await, s.dlock().await, s.dlock().await);
    let sem = |c: &Arc<dyn DistributedLock>| c.semaphore(name, 2).expect("semaphore");
    let two = PeerLock::Semaphore { max_leases: 2 };
    let theirs = peer_take(&peer, two, &s.path(name), 10 * SEC)
        .await
        .expect("the library takes a lease of a free semaphore");
    let mine = sem(&a)
        .try_acquire(&plain(Wait::No))
        .await
        .expect("try_acquire")
        .expect("dlock gets the second permit");
    assert!(
        mine.fencing_token() > FencingToken(theirs.czxid),
        "dlock's later grant has a lower token than the library's lease"
    );
    assert!(
        sem(&b)
            .try_acquire(&plain(Wait::No))
            .await
            .expect("try_acquire")
            .is_none(),
        "a third holder beside the library's lease and dlock's permit"
    );
    assert!(
        peer_take(&peer, two, &s.path(name), Duration::ZERO)
            .await
            .is_none(),
        "the library took a third lease beside dlock's permit"
    );
    let waiter = {
        let sem = sem(&c);
        tokio::spawn(async move { sem.acquire(&plain(Wait::For(120 * SEC))).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "a dlock waiter got a permit while both were held"
    );
    peer.release(&theirs)
        .await
        .expect("the library returns its lease");
    let next = within(60 * SEC, "dlock's waiter", waiter)
        .await
        .expect("waiter task")
        .expect("dlock's waiter gets the returned lease");
    assert!(next.fencing_token() > mine.fencing_token());
    assert!(
        peer_take(&peer, two, &s.path(name), Duration::ZERO)
            .await
            .is_none(),
        "the library took a lease while dlock held both"
    );
    assert_eq!(next.release().await.expect("release"), Released::Released);
    let again = peer_take(&peer, two, &s.path(name), 10 * SEC)
        .await
        .expect("the library takes the lease dlock released");
    peer.release(&again).await.expect("release");
    assert_eq!(mine.release().await.expect("release"), Released::Released);
}

/// Each scenario above, once per library.
macro_rules! per_library {
    ($($scenario:ident => $curator:ident, $kazoo:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $curator() {
            $scenario(PeerLibrary::Curator).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $kazoo() {
            $scenario(PeerLibrary::Kazoo).await;
        }
    )*};
}

per_library! {
    other_library_holds => curator_holds_dlock_sees_held, kazoo_holds_dlock_sees_held;
    dlock_holds => dlock_holds_curator_times_out, dlock_holds_kazoo_times_out;
    mixed_waiters_in_arrival_order =>
        curator_and_dlock_waiters_in_arrival_order,
        kazoo_and_dlock_waiters_in_arrival_order;
    read_write_across_libraries =>
        curator_read_write_lock_with_dlock,
        kazoo_read_write_lock_with_dlock;
    mixed_hammer =>
        curator_and_dlock_hammer_without_overlap,
        kazoo_and_dlock_hammer_without_overlap;
    frozen_holder_hands_over =>
        frozen_curator_holder_hands_over_on_session_expiry,
        frozen_kazoo_holder_hands_over_on_session_expiry;
    dlock_session_closed_hands_over =>
        dlock_session_closed_hands_over_to_curator,
        dlock_session_closed_hands_over_to_kazoo;
    semaphore_shared_with_library =>
        curator_and_dlock_semaphore_never_exceed_count,
        kazoo_and_dlock_semaphore_never_exceed_count;
}

/// kazoo records its semaphore's count in the path's data and raises on another: dlock, in
/// kazoo's layout, refuses another count than the one a kazoo holder recorded, and kazoo
/// refuses another count than the one dlock recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_and_dlock_refuse_each_others_other_count() {
    let s = Setup::new(PeerLibrary::Kazoo, "sem-count").await;
    let peer = s.peer().await;
    let dlock = s.dlock().await;
    let theirs = peer_take(
        &peer,
        PeerLock::Semaphore { max_leases: 2 },
        &s.path("kazoo-first"),
        10 * SEC,
    )
    .await
    .expect("kazoo takes a lease");
    let three = dlock
        .semaphore("kazoo-first", 3)
        .expect("semaphore")
        .try_acquire(&plain(Wait::No))
        .await;
    match three {
        Err(Error::InvalidArgument { argument, reason }) => {
            assert_eq!(argument, "permits");
            assert!(reason.contains('2') && reason.contains('3'), "{reason}");
        }
        other => panic!("dlock with another count than kazoo's: {other:?}"),
    }
    peer.release(&theirs).await.expect("release");

    let mine = dlock
        .semaphore("dlock-first", 3)
        .expect("semaphore")
        .try_acquire(&plain(Wait::No))
        .await
        .expect("try_acquire")
        .expect("a permit of a free semaphore");
    let data = s
        .observer
        .zk_client()
        .get_data(&s.path("dlock-first"))
        .await
        .expect("the semaphore's node")
        .0;
    assert_eq!(data, b"3", "dlock records the count where kazoo reads it");
    let sent = peer
        .acquire(
            PeerLock::Semaphore { max_leases: 2 },
            &s.path("dlock-first"),
            Some(Duration::ZERO),
        )
        .expect("send acquire");
    let refused = within(60 * SEC, "kazoo's acquire", sent).await;
    match refused {
        Err(e) => assert!(
            e.to_string().contains("Inconsistent max leases"),
            "kazoo's error: {e}"
        ),
        Ok(hold) => panic!("kazoo with another count than dlock's: {hold:?}"),
    }
    mine.release().await.expect("release");
}

/// A dlock client in either path layout also counts the other library's nodes, which that
/// library itself does not see: dlock in Curator's layout stays out while kazoo holds, and in
/// kazoo's layout while Curator holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_counts_both_libraries_nodes() {
    let s = Setup::new(PeerLibrary::Curator, "both").await;
    for (holder, dlock_layout) in [
        (PeerLibrary::Kazoo, PeerLibrary::Curator),
        (PeerLibrary::Curator, PeerLibrary::Kazoo),
    ] {
        let peer = peer_of(holder, s.zk, 10 * SEC).await;
        let name = format!("held-by-{}", layout(holder));
        let hold = peer_take(&peer, PeerLock::Mutex, &s.path(&name), Duration::ZERO)
            .await
            .expect("a free lock");
        let dlock: Arc<dyn DistributedLock> = Arc::new(client(&s.url(dlock_layout)).await);
        assert!(
            dlock
                .try_lock(&name, &plain(Wait::No))
                .await
                .expect("try_lock")
                .is_none(),
            "dlock in {}'s layout took a lock {holder:?} holds",
            layout(dlock_layout)
        );
        peer.release(&hold).await.expect("release");
        let g = dlock
            .try_lock(&name, &plain(Wait::No))
            .await
            .expect("try_lock")
            .expect("free after the release");
        g.release().await.expect("release");
    }
}

/// In the path layouts a name is a znode path under the chroot: paths with spaces, unicode,
/// case differences and punctuation are usable and distinct, and `names()` lists them; a name
/// that is no znode path (an empty, `.` or `..` segment, a control character, a character
/// beyond U+FFFF) is `InvalidName` before any I/O, even with the link to the server silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_names_are_znode_paths() {
    let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    for library in [PeerLibrary::Curator, PeerLibrary::Kazoo] {
        let chroot = format!("interop-names-{}-{:08x}", layout(library), rand_u32());
        let url = format!(
            "zk://{}/{chroot}?layout={}&timeout=60s",
            proxy.addr(),
            layout(library)
        );
        let (a, b): (Arc<dyn DistributedLock>, Arc<dyn DistributedLock>) =
            (Arc::new(client(&url).await), Arc::new(client(&url).await));
        let long = "x".repeat(1000);
        let good = [
            "a b",
            "ünïcødé ✓",
            "Case",
            "case",
            "CASE",
            "a/b",
            "a/b/c",
            "a%2Fb",
            "a:b",
            "{x}",
            "*",
            "'; DROP TABLE x; --",
            "\\",
            "%",
            "zookeeper",
            long.as_str(),
        ];
        let mut guards = Vec::new();
        for n in good {
            guards.push(
                a.lock(n, &plain(Wait::For(30 * SEC)))
                    .await
                    .unwrap_or_else(|e| panic!("{n:?} not usable: {e}")),
            );
        }
        for n in good {
            assert!(
                b.try_lock(n, &plain(Wait::No))
                    .await
                    .expect("try_lock")
                    .is_none(),
                "{n:?} looks free while held"
            );
        }
        // `names()` lists exactly the held paths (`a` is only a parent of `a/b`).
        let mut names = a.names().await.expect("names");
        names.sort();
        let mut expected: Vec<LockName> = good.iter().map(|n| LockName::new(n).unwrap()).collect();
        expected.sort();
        assert_eq!(names, expected, "names() in layout={}", layout(library));
        for g in guards {
            assert_eq!(g.release().await.expect("release"), Released::Released);
        }
        proxy.set(Fault::BlackholeRequests);
        for bad in [
            "/orders", "orders/", "a//b", ".", "..", "a/./b", "a/../b", "a\u{1}b", "a\u{7f}", "🔒",
        ] {
            let got = within(
                10 * SEC,
                "a refused name",
                a.try_lock(bad, &plain(Wait::No)),
            )
            .await;
            assert!(
                matches!(got, Err(Error::InvalidName { .. })),
                "{bad:?}: expected InvalidName, got {got:?}"
            );
        }
        proxy.set(Fault::PassThrough);
    }
}
