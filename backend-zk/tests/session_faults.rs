//! The session-expiry versions of the shared fault scenarios that assume a server-side ttl
//! (`client_paused_past_ttl`, `holder_process_killed`, `server_paused_past_ttl`, ...): a
//! ZooKeeper lock ends with its holder's session, so each fault here is measured against the
//! session timeout (which also caps every lease). Each test starts kit servers of its own,
//! records a history and checks it, and writes to a fenced resource wherever a late write can
//! happen.
//!
//! A holder that must be paused or killed as a whole runs in a process of its own: this test
//! binary started again for the one test, which then plays the holder (see [`HolderProcess`]).

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{SEC, client, contend, dyn_lock, ms, plain, unique, within};
use conformance_tests::kit::{Fault, Proxy, ServerControl, ZkEnsemble, ZooKeeper};
use conformance_tests::{FencedResource, History, Hold};
use lockcore::{
    AcquireOptions, DistributedLock, FencingToken, KeepAlive, Lease, LockExt, LostReason, Released,
    Wait,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// The URL of the store the holder process is to lock in (set only in that process).
const HOLDER_URL: &str = "DLOCK_ZK_SESSION_HOLDER_URL";
/// The lock name the holder process is to take.
const HOLDER_NAME: &str = "DLOCK_ZK_SESSION_HOLDER_NAME";

/// A session timeout short enough for quick tests, above the kit server's 1 s minimum.
const SESSION: Duration = Duration::from_secs(2);

/// Keep-alive on, no waiting: a holder's options (its ttl is the URL's, capped by the session).
fn renewed() -> AcquireOptions {
    AcquireOptions::new()
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No)
}

/// Wall-clock microseconds: the one clock the holder process and the test share.
fn epoch_us(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).expect("clock").as_micros() as u64
}

/// `instant` on the wall clock, for the other process.
fn to_epoch_us(instant: Instant) -> u64 {
    let now = (Instant::now(), SystemTime::now());
    match instant.checked_duration_since(now.0) {
        Some(ahead) => epoch_us(now.1 + ahead),
        None => epoch_us(now.1 - now.0.duration_since(instant)),
    }
}

/// The other process's wall-clock microseconds as an instant of this one.
fn from_epoch_us(micros: u64) -> Instant {
    let now = (Instant::now(), epoch_us(SystemTime::now()));
    if micros >= now.1 {
        now.0 + Duration::from_micros(micros - now.1)
    } else {
        now.0 - Duration::from_micros(now.1 - micros)
    }
}

/// The URL of `base` (a `zk://` URL without a path) in the chroot `/sessions`, with sessions
/// of `session` (and so leases no longer) and a 1 s limit per request.
fn session_url(base: &str, session: Duration) -> String {
    format!(
        "{base}/sessions?session_timeout={}ms&timeout=1s",
        session.as_millis()
    )
}

/// In the holder process: takes the lock with keep-alive, then reports on stdout its token
/// (`DLOCK_HELD`), the end of its lease each time it moves (`DLOCK_LEASE`), and, once `lost()`
/// resolves, the reason and whether the guard still claims the lock (`DLOCK_LOST`), then
/// its release's answer (`DLOCK_RELEASED`). Then it waits to be killed.
async fn holder_process_main(url: &str, name: &str) {
    use std::io::Write as _;
    let locks = dyn_lock(&client(url).await);
    let guard = locks
        .lock(name, &renewed())
        .await
        .expect("the holder process acquires");
    println!("DLOCK_HELD {}", guard.fencing_token().0);
    let watch = guard.watch();
    let mut reported = None;
    let reason = loop {
        let until = watch.lease().valid_until();
        if reported != Some(until) {
            println!("DLOCK_LEASE {}", to_epoch_us(until));
            std::io::stdout().flush().expect("flush");
            reported = Some(until);
        }
        tokio::select! {
            reason = guard.lost() => break reason,
            () = tokio::time::sleep(ms(20)) => {}
        }
    };
    println!("DLOCK_LOST {reason:?} {}", guard.is_held());
    let released = release_through_errors(&locks, &guard.lease()).await;
    drop(guard);
    println!("DLOCK_RELEASED {released:?}");
    std::io::stdout().flush().expect("flush");
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

/// Releases `lease`, retrying while the client reconnects (its session may just have ended).
async fn release_through_errors(locks: &Arc<dyn DistributedLock>, lease: &Lease) -> Released {
    within(30 * SEC, "the old holder's release", async {
        loop {
            match locks.release(lease).await {
                Ok(r) => break r,
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(100)).await,
                Err(e) => panic!("the old holder's release: {e}"),
            }
        }
    })
    .await
}

/// What the holder process has said.
#[derive(Default)]
struct Heard {
    /// How many lease reports so far (one per renewal, after the first).
    leases: u64,
    /// Its token, once it holds.
    token: Option<u64>,
    /// The end of its lease as it last reported it.
    valid_until: Option<Instant>,
}

/// A holder in a process of its own (this test binary started again for `test`), which the
/// test can pause (SIGSTOP) as a whole, its client's pings and keep-alive included, or kill -9.
struct HolderProcess {
    child: tokio::process::Child,
    heard: Arc<Mutex<Heard>>,
    /// Told at each lease report.
    leased: Arc<tokio::sync::Notify>,
    /// The lines after `DLOCK_LEASE`s: `DLOCK_LOST ...`, `DLOCK_RELEASED ...`.
    later: mpsc::UnboundedReceiver<String>,
    /// When the holder reported its lock (it acquired before).
    acquired: Instant,
}

impl HolderProcess {
    /// Starts the holder process for `test` and waits until it holds `name` at `url`.
    async fn start(test: &str, url: &str, name: &str) -> HolderProcess {
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(HOLDER_URL, url)
            .env(HOLDER_NAME, name)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the holder process");
        let heard = Arc::new(Mutex::new(Heard::default()));
        let (tx, later) = mpsc::unbounded_channel();
        let (held_tx, held) = tokio::sync::oneshot::channel();
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let (mine, leased) = (heard.clone(), Arc::new(tokio::sync::Notify::new()));
        let tell = leased.clone();
        tokio::spawn(async move {
            let mut held_tx = Some(held_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                // The harness's `test ... ` may begin the line.
                let Some(at) = line.find("DLOCK_") else {
                    continue;
                };
                let line = line[at..].to_owned();
                let mut heard = mine.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(t) = line.strip_prefix("DLOCK_HELD ") {
                    heard.token = Some(t.trim().parse().expect("token"));
                } else if let Some(at) = line.strip_prefix("DLOCK_LEASE ") {
                    heard.valid_until = Some(from_epoch_us(at.trim().parse().expect("lease")));
                    heard.leases += 1;
                    tell.notify_waiters();
                    if let Some(tx) = held_tx.take() {
                        let _ = tx.send(());
                    }
                } else {
                    let _ = tx.send(line);
                }
            }
        });
        within(60 * SEC, "the holder process acquires", held)
            .await
            .expect("the holder process ended before holding the lock");
        HolderProcess {
            child,
            heard,
            leased,
            later,
            acquired: Instant::now(),
        }
    }

    fn token(&self) -> FencingToken {
        FencingToken(self.heard().token.expect("token"))
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        self.heard.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its hold as far as it reported it (`valid_until`: the end of its last lease).
    fn hold(&self, client: usize, name: &str) -> Hold {
        let heard = self.heard();
        Hold {
            client,
            name: name.to_owned(),
            token: heard.token.expect("token"),
            acquired: self.acquired,
            valid_until: heard.valid_until.expect("lease"),
            ended: None,
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self
            .child
            .id()
            .expect("the holder process runs")
            .to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// SIGSTOP right after the holder reports a renewal (so that none is in flight): nothing
    /// of the holder runs, its session hears nothing.
    async fn pause_after_a_renewal(&self) {
        let seen = self.heard().leases;
        within(30 * SEC, "a renewal", async {
            loop {
                let told = self.leased.notified();
                if self.heard().leases > seen {
                    break;
                }
                told.await;
            }
        })
        .await;
        self.signal("-STOP");
    }

    /// SIGCONT.
    fn resume(&self) {
        self.signal("-CONT");
    }

    /// kill -9, and waits until its stdout has been read to the end (its last lease report
    /// included).
    async fn kill9(&mut self) {
        self.child.kill().await.expect("kill -9 the holder process");
        while self.later.recv().await.is_some() {}
    }

    /// The next `DLOCK_LOST`/`DLOCK_RELEASED` line's words after the tag.
    async fn next(&mut self, tag: &str) -> Vec<String> {
        let line = within(30 * SEC, tag, self.later.recv())
            .await
            .unwrap_or_else(|| panic!("the holder process ended before saying {tag}"));
        let rest = line
            .strip_prefix(tag)
            .unwrap_or_else(|| panic!("expected {tag}, the holder process said {line:?}"));
        rest.split_whitespace().map(str::to_owned).collect()
    }
}

/// The holder's process is paused (SIGSTOP: its client's pings stop with it) past its session
/// timeout. The server ends the session and with it the lock node, so the next client gets the
/// lock, with a higher token, and writes. Resumed, the paused holder's guard stops claiming the
/// lock and `lost()` says why; the write it had in flight is refused by the fence, and its
/// release frees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_paused_past_session_timeout() {
    if let (Ok(url), Ok(name)) = (std::env::var(HOLDER_URL), std::env::var(HOLDER_NAME)) {
        return holder_process_main(&url, &name).await;
    }
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let url = session_url(&zk.url(), SESSION);
    let name = unique("paused-client");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut holder = HolderProcess::start("client_paused_past_session_timeout", &url, &name).await;
    let old = holder.token();
    fenced.write(old, 0).expect("the holder writes");

    holder.pause_after_a_renewal().await;
    let other = dyn_lock(&client(&url).await);
    let next = within(
        60 * SEC,
        "the takeover",
        other.lock(&name, &plain(30 * SEC, Wait::For(45 * SEC))),
    )
    .await
    .expect("the other client gets the lock once the paused holder's session is over");
    let id = history.acquired(1, &next.lease());
    assert!(
        next.fencing_token() > old,
        "the takeover token is not higher"
    );
    fenced
        .write(next.fencing_token(), 1)
        .expect("the new holder writes");

    holder.resume();
    // Resumed, the guard finds its lease over by its own clock before its client hears from
    // the server: `Expired` (the lease, capped by the session timeout, ended no later than the
    // session; no renewal was in flight when the pause began).
    let lost = holder.next("DLOCK_LOST ").await;
    assert_eq!(
        lost,
        ["Expired", "false"],
        "the resumed holder's lost() and is_held()"
    );
    assert!(
        fenced.write(old, 2).is_err(),
        "the paused holder's late write was accepted"
    );
    assert_eq!(holder.next("DLOCK_RELEASED ").await, ["NotHeld"]);
    history.push(holder.hold(0, &name));
    history.ended(id);
    next.release().await.expect("release");
    history.assert_safe();
    fenced.assert_never_accepted_stale();
}

/// The holder's process is killed -9 (its connection closes, its session does not). The lock
/// stays held until the server expires that session: a try right after the kill finds it
/// held; the next client gets it later, after the holder's last lease, with a higher token;
/// the dead holder's late write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_killed_past_session_timeout() {
    if let (Ok(url), Ok(name)) = (std::env::var(HOLDER_URL), std::env::var(HOLDER_NAME)) {
        return holder_process_main(&url, &name).await;
    }
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let url = session_url(&zk.url(), SESSION);
    let name = unique("killed-holder");
    let history = History::new();
    let fenced = FencedResource::new();
    let mut holder =
        HolderProcess::start("holder_process_killed_past_session_timeout", &url, &name).await;
    let old = holder.token();
    fenced.write(old, 0).expect("the holder writes");
    let other = dyn_lock(&client(&url).await);

    holder.kill9().await;
    let killed_at = Instant::now();
    assert!(
        other
            .try_lock(&name, &plain(30 * SEC, Wait::No))
            .await
            .expect("try_lock")
            .is_none(),
        "the lock was free as soon as the holder's connection closed"
    );
    let next = within(
        60 * SEC,
        "the takeover",
        other.lock(&name, &plain(30 * SEC, Wait::For(45 * SEC))),
    )
    .await
    .expect("the other client gets the lock once the dead holder's session is over");
    let id = history.acquired(1, &next.lease());
    history.push(holder.hold(0, &name));
    assert!(
        killed_at.elapsed() > SESSION / 2,
        "the lock freed {:?} after the kill, well within the session timeout",
        killed_at.elapsed()
    );
    assert!(
        next.fencing_token() > old,
        "the takeover token is not higher"
    );
    fenced
        .write(next.fencing_token(), 1)
        .expect("the new holder writes");
    assert!(
        fenced.write(old, 2).is_err(),
        "the dead holder's late write was accepted"
    );
    history.ended(id);
    next.release().await.expect("release");
    history.assert_safe();
    fenced.assert_never_accepted_stale();
}

/// A holder (keep-alive on) with a waiter queued behind it, on a server of their own.
struct HolderAndWaiter {
    zk: ZooKeeper,
    holder: Arc<dyn DistributedLock>,
    guard: lockcore::LockGuard,
    acquired: Instant,
    waiter: tokio::task::JoinHandle<(lockcore::LockGuard, Instant)>,
    name: String,
    fenced: FencedResource,
}

/// Starts a server, a holder and a waiter on sessions of `session` (and leases as long), the
/// holder's first write done, and checks that the waiter is queued.
async fn holder_and_waiter(session: Duration) -> HolderAndWaiter {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let url = session_url(&zk.url(), session);
    let name = unique("paused-server");
    let fenced = FencedResource::new();
    let holder = dyn_lock(&client(&url).await);
    let guard = holder
        .lock(&name, &renewed())
        .await
        .expect("holder acquires");
    let acquired = Instant::now();
    fenced
        .write(guard.fencing_token(), 0)
        .expect("holder writes");
    let waiter = {
        let (other, name) = (dyn_lock(&client(&url).await), name.clone());
        tokio::spawn(async move {
            let g = other
                .lock(&name, &plain(30 * SEC, Wait::For(90 * SEC)))
                .await
                .expect("the waiter acquires");
            (g, Instant::now())
        })
    };
    tokio::time::sleep(ms(500)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    HolderAndWaiter {
        zk,
        holder,
        guard,
        acquired,
        waiter,
        name,
        fenced,
    }
}

/// The server is stopped for less than the session timeout, with a holder (keep-alive on) and
/// a waiter: once it runs again the session lives on, so the holder keeps its lock throughout
/// (no `lost()`, its writes accepted) and the waiter gets it only when the holder releases,
/// with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_within_session_timeout_keeps_the_holder() {
    let session = 4 * SEC;
    let s = holder_and_waiter(session).await;
    s.zk.pause();
    tokio::time::sleep(ms(1500)).await;
    s.zk.resume();
    // Past the session timeout since the pause began, renewing all along.
    tokio::time::sleep(session).await;
    assert_eq!(s.guard.lost_reason(), None, "the holder was told it lost");
    assert!(s.guard.is_held(), "the holder's lease ran out");
    assert!(!s.waiter.is_finished(), "the waiter got a held lock");
    let token = s.guard.fencing_token();
    s.fenced.write(token, 1).expect("the holder writes again");
    let history = History::new();
    history.push(Hold {
        client: 0,
        name: s.name.clone(),
        token: token.0,
        acquired: s.acquired,
        valid_until: s.guard.lease().valid_until(),
        ended: Some(Instant::now()),
    });
    assert_eq!(
        s.guard.release().await.expect("release"),
        Released::Released
    );
    let (next, at) = within(30 * SEC, "the waiter", s.waiter)
        .await
        .expect("waiter task");
    assert!(
        next.fencing_token() > token,
        "the waiter's token is not higher"
    );
    s.fenced
        .write(next.fencing_token(), 2)
        .expect("the waiter writes");
    history.push(hold_from(1, &s.name, &next, at));
    next.release().await.expect("release");
    history.assert_safe();
    s.fenced.assert_never_accepted_stale();
}

/// `guard`'s hold, acquired at `at` and ended now.
fn hold_from(client: usize, name: &str, guard: &lockcore::LockGuard, at: Instant) -> Hold {
    Hold {
        client,
        name: name.to_owned(),
        token: guard.fencing_token().0,
        acquired: at,
        valid_until: guard.lease().valid_until(),
        ended: Some(Instant::now()),
    }
}

/// The server is stopped for longer than the session timeout, with a holder (keep-alive on)
/// and a waiter queued. The holder's renewals go unanswered, so its `lost()` fires by the end
/// of its lease, while the server is still stopped; once it runs again it ends the silent
/// session (or the holder's client deletes its lapsed node), and the waiter gets the lock with
/// a higher token, after the holder learned of the loss. The holder's late write is refused,
/// its release frees nothing, and its client works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_past_session_timeout() {
    let s = holder_and_waiter(SESSION).await;
    let learned = {
        let watch = s.guard.watch();
        tokio::spawn(async move { (watch.lost().await, Instant::now()) })
    };
    s.zk.pause();
    tokio::time::sleep(3 * SESSION).await;
    let resumed_at = Instant::now();
    s.zk.resume();
    let (reason, lost_at) = within(30 * SEC, "the holder's lost()", learned)
        .await
        .expect("lost() task");
    assert!(
        lost_at < resumed_at,
        "lost() fired {:?} after the server ran again",
        lost_at - resumed_at
    );
    assert!(
        matches!(reason, LostReason::ConnectionLost | LostReason::Expired),
        "lost() said {reason:?} while the server was stopped"
    );
    assert!(!s.guard.is_held(), "a lost guard still claims the lock");
    let (next, at) = within(60 * SEC, "the waiter", s.waiter)
        .await
        .expect("waiter task");
    assert!(
        lost_at < at,
        "the waiter got the lock before the holder knew"
    );
    let old = s.guard.fencing_token();
    assert!(
        next.fencing_token() > old,
        "the waiter's token is not higher"
    );
    s.fenced
        .write(next.fencing_token(), 1)
        .expect("the waiter writes");
    assert!(
        s.fenced.write(old, 2).is_err(),
        "the old holder's late write was accepted"
    );
    let history = History::new();
    history.push(Hold {
        client: 0,
        name: s.name.clone(),
        token: old.0,
        acquired: s.acquired,
        valid_until: s.guard.lease().valid_until(),
        ended: None,
    });
    history.push(hold_from(1, &s.name, &next, at));
    let released = release_through_errors(&s.holder, &s.guard.lease()).await;
    assert_eq!(released, Released::NotHeld);
    next.release().await.expect("release");
    let again = within(
        30 * SEC,
        "the old holder's client again",
        s.holder
            .lock(&unique("after"), &plain(5 * SEC, Wait::For(20 * SEC))),
    )
    .await
    .expect("the old holder's client works again");
    again.release().await.expect("release");
    history.assert_safe();
    s.fenced.assert_never_accepted_stale();
}

/// The holder's link is reset four times (every connection cut, new ones refused for a
/// moment), each outage far shorter than the session timeout, with a waiter queued: ZooKeeper
/// cannot end a client's connection itself, so this is its version of the server killing its
/// clients' connections. The client reconnects to the same session, so the holder keeps its
/// lock throughout (no `lost()`, its writes accepted), and the waiter gets it only when the
/// holder releases, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_link_reset_within_session_timeout_keeps_the_holder() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let query = "session_timeout=4s&timeout=1s";
    let holder = client(&format!("zk://{}/sessions?{query}", proxy.addr())).await;
    let session = holder.session_id();
    let name = unique("link-reset");
    let fenced = FencedResource::new();
    let guard = dyn_lock(&holder)
        .lock(&name, &renewed())
        .await
        .expect("holder acquires");
    let acquired = Instant::now();
    let token = guard.fencing_token();
    fenced.write(token, 0).expect("the holder writes");
    let waiter = {
        let other = dyn_lock(&client(&format!("{}/sessions?{query}", zk.url())).await);
        let name = name.clone();
        tokio::spawn(async move {
            let g = other
                .lock(&name, &plain(30 * SEC, Wait::For(60 * SEC)))
                .await
                .expect("the waiter acquires");
            (g, Instant::now())
        })
    };
    for round in 1..=4 {
        tokio::time::sleep(ms(700)).await;
        tokio::task::block_in_place(|| proxy.set(Fault::Reset));
        tokio::time::sleep(ms(300)).await;
        tokio::task::block_in_place(|| proxy.set(Fault::PassThrough));
        assert!(
            !waiter.is_finished(),
            "round {round}: the waiter got a held lock"
        );
    }
    // Past the session timeout since the first reset, renewing all along.
    tokio::time::sleep(2 * SEC).await;
    assert_eq!(guard.lost_reason(), None, "the holder was told it lost");
    assert!(guard.is_held(), "the holder's lease ran out");
    assert_eq!(holder.session_id(), session, "the session was replaced");
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    fenced.write(token, 1).expect("the holder writes again");
    let history = History::new();
    history.push(Hold {
        client: 0,
        name: name.clone(),
        token: token.0,
        acquired,
        valid_until: guard.lease().valid_until(),
        ended: Some(Instant::now()),
    });
    assert_eq!(guard.release().await.expect("release"), Released::Released);
    let (next, at) = within(30 * SEC, "the waiter", waiter)
        .await
        .expect("waiter task");
    assert!(
        next.fencing_token() > token,
        "the waiter's token is not higher"
    );
    fenced
        .write(next.fencing_token(), 2)
        .expect("the waiter writes");
    history.push(hold_from(1, &name, &next, at));
    next.release().await.expect("release");
    history.assert_safe();
    fenced.assert_never_accepted_stale();
}

/// The holder's replies are blackholed (its requests and pings still arrive, nothing comes
/// back) past the session timeout, with a waiter queued on a direct link. The holder's
/// `lost()` fires by the end of its lease; the waiter gets the lock only after that, with a
/// higher token; the holder's late write is refused; once the link heals, its release frees
/// nothing and its client works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_replies_blackholed_past_session_timeout() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let query = "session_timeout=2s&timeout=1s";
    let holder = dyn_lock(&client(&format!("zk://{}/sessions?{query}", proxy.addr())).await);
    let other = dyn_lock(&client(&format!("{}/sessions?{query}", zk.url())).await);
    let name = unique("replies-blackholed");
    let fenced = FencedResource::new();
    let history = History::new();
    let guard = holder
        .lock(&name, &renewed())
        .await
        .expect("holder acquires");
    let acquired = Instant::now();
    let old = guard.fencing_token();
    fenced.write(old, 0).expect("the holder writes");
    let waiter = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let g = other
                .lock(&name, &plain(30 * SEC, Wait::For(60 * SEC)))
                .await
                .expect("the waiter acquires");
            (g, Instant::now())
        })
    };
    tokio::time::sleep(ms(500)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");

    tokio::task::block_in_place(|| proxy.set(Fault::BlackholeReplies));
    let learned = {
        let watch = guard.watch();
        tokio::spawn(async move { (watch.lost().await, Instant::now()) })
    };
    let (next, at) = within(60 * SEC, "the takeover", waiter)
        .await
        .expect("waiter task");
    let (reason, lost_at) = within(30 * SEC, "the holder's lost()", learned)
        .await
        .expect("lost() task");
    assert_eq!(reason, LostReason::ConnectionLost, "the holder's lost()");
    assert!(
        lost_at < at,
        "the waiter got the lock before the holder knew"
    );
    assert!(
        next.fencing_token() > old,
        "the waiter's token is not higher"
    );
    fenced
        .write(next.fencing_token(), 1)
        .expect("the waiter writes");
    assert!(
        fenced.write(old, 2).is_err(),
        "the old holder's late write was accepted"
    );
    history.push(Hold {
        client: 0,
        name: name.clone(),
        token: old.0,
        acquired,
        valid_until: guard.lease().valid_until(),
        ended: None,
    });

    tokio::task::block_in_place(|| proxy.set(Fault::PassThrough));
    let released = release_through_errors(&holder, &guard.lease()).await;
    assert_eq!(released, Released::NotHeld);
    assert!(
        next.is_held(),
        "the stale release freed the new holder's lock"
    );
    history.push(hold_from(1, &name, &next, at));
    next.release().await.expect("release");
    let again = within(
        30 * SEC,
        "the old holder's client again",
        holder.lock(&unique("after"), &plain(5 * SEC, Wait::For(20 * SEC))),
    )
    .await
    .expect("the old holder's client works again");
    again.release().await.expect("release");
    history.assert_safe();
    fenced.assert_never_accepted_stale();
}

/// A 3-member ensemble under a lock that three clients keep taking: each member in turn is
/// killed -9 and restarted; then, with one client holding (keep-alive on) and another
/// waiting, every member is killed at once and restarted. Through all of it no two holders
/// overlap and tokens grow; the holder's `lost()` fires while the ensemble is down, the
/// waiter gets the lock after the restart with a higher token, the old holder's late write is
/// refused, and the lock works as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ensemble_member_killed_and_restarted() {
    let ensemble = ZkEnsemble::start(3).await.expect("kit ensemble");
    let url = session_url(&ensemble.url(), 4 * SEC);
    let name = unique("ensemble-restart");
    let history = Arc::new(History::new());
    let fenced = Arc::new(FencedResource::new());

    // One member at a time: a quorum stays (but for the elections).
    let contenders = Contenders::start(&url, &name, 3, &history, &fenced).await;
    for i in 0..ensemble.len() {
        let before = history.holds().len();
        ensemble.node(i).kill9();
        ensemble.node(i).restart().await.expect("restart a member");
        within(60 * SEC, "every member serves", ensemble.wait_for_all())
            .await
            .expect("ensemble");
        within(60 * SEC, "acquisitions after the restart", async {
            while history.holds().len() < before + 3 {
                tokio::time::sleep(ms(100)).await;
            }
        })
        .await;
    }
    contenders.stop().await;

    // Every member at once.
    let holder = dyn_lock(&client(&url).await);
    let guard = holder
        .lock(&name, &renewed())
        .await
        .expect("holder acquires");
    let hold = history.acquired(10, &guard.lease());
    let old = guard.fencing_token();
    fenced.write(old, 10).expect("the holder writes");
    let waiter = {
        let (other, name) = (dyn_lock(&client(&url).await), name.clone());
        tokio::spawn(async move {
            let g = other
                .lock(&name, &plain(30 * SEC, Wait::For(120 * SEC)))
                .await
                .expect("the waiter acquires");
            (g, Instant::now())
        })
    };
    tokio::time::sleep(ms(500)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let writes = fenced.accepted().len();
    ServerControl::kill9(&ensemble);
    let reason = within(30 * SEC, "the holder's lost()", guard.lost()).await;
    assert!(
        matches!(reason, LostReason::ConnectionLost | LostReason::Expired),
        "lost() said {reason:?} with every member down"
    );
    history.extended(hold, &guard.lease());
    assert_eq!(
        fenced.accepted().len(),
        writes,
        "someone wrote with every member down"
    );
    within(120 * SEC, "the restart", ServerControl::restart(&ensemble))
        .await
        .expect("restart every member");
    let (next, at) = within(120 * SEC, "the waiter after the restart", waiter)
        .await
        .expect("waiter task");
    assert!(
        next.fencing_token() > old,
        "the waiter's token is not higher"
    );
    fenced
        .write(next.fencing_token(), 11)
        .expect("the waiter writes");
    assert!(
        fenced.write(old, 12).is_err(),
        "the old holder's late write was accepted"
    );
    history.push(hold_from(11, &name, &next, at));
    next.release().await.expect("release");
    let released = release_through_errors(&holder, &guard.lease()).await;
    assert_eq!(released, Released::NotHeld);

    // The lock works as before.
    let contenders = Contenders::start(&url, &name, 3, &history, &fenced).await;
    let before = history.holds().len();
    within(60 * SEC, "acquisitions after the restart", async {
        while history.holds().len() < before + 6 {
            tokio::time::sleep(ms(100)).await;
        }
    })
    .await;
    contenders.stop().await;
    history.assert_safe();
    fenced.assert_never_accepted_stale();
}

/// Clients that keep taking one lock (20 ms each), recording every hold and writing under its
/// token, until stopped.
struct Contenders {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<usize>>,
}

impl Contenders {
    async fn start(
        url: &str,
        name: &str,
        n: usize,
        history: &Arc<History>,
        fenced: &Arc<FencedResource>,
    ) -> Contenders {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = Vec::new();
        for id in 0..n {
            let locks = dyn_lock(&client(url).await);
            tasks.push(contend(locks, name, id, history, fenced, &stop));
        }
        Contenders { stop, tasks }
    }

    async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.tasks {
            within(60 * SEC, "a contending client", t)
                .await
                .expect("contending client");
        }
    }
}
