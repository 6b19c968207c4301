//! `dlock run` stops its command before the lease ends when the lease can no longer be renewed.
//!
//! The command ignores SIGTERM, and so does a process it starts. Once the holder's renewals stop
//! reaching the store (its link to the server drops every request, through the kit's proxy; on
//! SQLite, an exclusive transaction of another connection keeps every write out), both must
//! have exited before a second client, connected straight to the store, gets the lock: judged
//! on the instants this test records (the processes seen gone, the second grant returned).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{HANG, dlock};
use conformance_tests::kit::{Fault, Postgres, Proxy, Redis, ZooKeeper};
use dlock::{AcquireOptions, DistributedLock, KeepAlive, LockExt, Wait};

/// The holder's lease: renewed every second, so the last renewal before a fault is at most a
/// second old, and the store frees the lock at most this long after the fault.
const TTL: Duration = Duration::from_secs(3);

/// The command `dlock run` starts: ignores SIGTERM, starts a process of its own that ignores it
/// too (the disposition is inherited), writes both pids, and runs until it is killed.
fn script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "trap '' TERM; echo $$ > {d}/pid; \
         sh -c 'while :; do sleep 0.05; done' & echo $! > {d}/grandchild; \
         touch {d}/started; while :; do sleep 0.05; done"
    )
}

/// `dlock run` holding `name` at `url` with the command above (`--grace` far longer than the
/// lease: dlock must cut it), once the command has started; with the pids it wrote.
fn hold(url: &str, name: &str, dir: &Path) -> (Child, [u32; 2]) {
    let ttl = format!("{}s", TTL.as_secs());
    let child = dlock()
        .env(MARK, mark(dir))
        .args(["run", "--url", url, "--name", name, "--ttl", &ttl])
        .args(["--grace", "10s", "--", "sh", "-c", &script(dir)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock runs");
    let mut child = child;
    let started = dir.join("started");
    common::eventually("the command to start", || {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            use std::io::Read as _;
            let _ = child
                .stderr
                .take()
                .map(|mut e| e.read_to_string(&mut stderr));
            panic!("dlock run exited {status} before the command started: {stderr}");
        }
        started
            .exists()
            .then_some(())
            .ok_or_else(|| "not started".to_owned())
    });
    let pid = |file: &str| -> u32 {
        let text = std::fs::read_to_string(dir.join(file)).expect("a pid file");
        text.trim().parse().expect("a pid")
    };
    (child, [pid("pid"), pid("grandchild")])
}

/// The variable that marks every process of a holder's command tree (each inherits it).
const MARK: &str = "DLOCK_TEST_TREE";

/// The mark of the tree started in `dir`.
fn mark(dir: &Path) -> String {
    dir.display().to_string()
}

/// The processes still running with `mark` in their environment; they are killed, so that a
/// failing test leaves none behind.
fn survivors(mark: &str) -> Vec<u32> {
    let wanted = format!("{MARK}={mark}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) && !exited(pid) {
            found.push(pid);
        }
    }
    for pid in &found {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    found
}

/// Whether `pid` has exited: gone, or a zombie waiting for its parent to reap it.
fn exited(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    after.trim_start().starts_with(['Z', 'X'])
}

/// Resolves with the first instant at which every one of `pids` was seen exited (looked at
/// every millisecond, so it is no earlier than the last of them exited); `None` if one still
/// runs after [`HANG`].
async fn all_exited(pids: [u32; 2]) -> Option<Instant> {
    let give_up = Instant::now() + HANG;
    tokio::task::spawn_blocking(move || {
        while Instant::now() < give_up {
            if pids.iter().all(|p| exited(*p)) {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    })
    .await
    .expect("the watcher")
}

/// Kills what is left of the command tree marked in `dir` when dropped, so that a failing
/// test leaves no process behind (nor one holding dlock's stderr open).
struct Tree(String);

impl Drop for Tree {
    fn drop(&mut self) {
        survivors(&self.0);
    }
}

/// A second client's waiting acquire of `name`, on a task; resolves with the instant it was
/// granted.
fn second_client(
    c: Arc<dyn DistributedLock>,
    name: &str,
) -> tokio::task::JoinHandle<(Instant, dlock::LockGuard)> {
    let name = name.to_owned();
    tokio::spawn(async move {
        let opts = AcquireOptions::new()
            .ttl(Duration::from_secs(30))
            .keep_alive(KeepAlive::Off)
            .wait(Wait::For(HANG));
        let guard = c.lock(&name, &opts).await.expect("the second client");
        (Instant::now(), guard)
    })
}

/// The verdict: the command and its own process had exited before the second client's grant,
/// and no process of the command's tree is left. `dlock run` itself exits 76 (lost) having
/// said why, SIGTERM first and SIGKILL before the end.
async fn judge(
    mut holder: Child,
    dir: &Path,
    pids: [u32; 2],
    fault: Instant,
    second: tokio::task::JoinHandle<(Instant, dlock::LockGuard)>,
) {
    let _tree = Tree(mark(dir));
    let exit = all_exited(pids)
        .await
        .expect("the command and its child to exit");
    let (granted, guard) = tokio::time::timeout(HANG, second)
        .await
        .expect("the second client's grant")
        .expect("task");
    let since = |t: Instant| t.saturating_duration_since(fault);
    assert!(
        exit < granted,
        "the command ran on beside the next holder: it exited {:?} after the fault, the second \
         client held from {:?}",
        since(exit),
        since(granted)
    );
    let status = holder.wait().expect("dlock exits");
    let left = survivors(&mark(dir));
    assert!(
        left.is_empty(),
        "processes of the command's tree outlived it: {left:?}"
    );
    let mut stderr = String::new();
    use std::io::Read as _;
    holder
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(
        stderr.contains("SIGTERM") && stderr.contains("SIGKILL"),
        "{stderr}"
    );
    guard.release().await.expect("release");
}

/// A holder behind `proxy` (its URL `via`), the second client straight at `direct`.
async fn through_a_proxy(via: &str, direct: &str, proxy: &Proxy) {
    let dir = tempfile::tempdir().expect("temp dir");
    let name = "cut-off-holder";
    let (holder, pids) = hold(via, name, dir.path());
    let second = second_client(dlock::connect(direct).await.expect("connect"), name);
    let fault = Instant::now();
    proxy.set(Fault::BlackholeRequests);
    judge(holder, dir.path(), pids, fault, second).await;
}

/// `url` with its port `from` replaced by `to`.
fn via(url: &str, from: u16, to: u16) -> String {
    let (from, to) = (format!(":{from}"), format!(":{to}"));
    assert!(url.contains(&from), "{url}");
    url.replacen(&from, &to, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holder_cut_off_stops_its_command_in_time() {
    let redis = Redis::start().await.expect("kit redis");
    let proxy = Proxy::start(redis.addr()).await.expect("proxy");
    let direct = redis.url();
    let behind = via(&direct, redis.port(), proxy.addr().port());
    through_a_proxy(&behind, &direct, &proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holder_cut_off_stops_its_command_in_time() {
    let pg = Postgres::shared().await.expect("kit PostgreSQL");
    let direct = pg.fresh_database("lease_end").await.expect("database");
    let proxy = Proxy::start(pg.addr()).await.expect("proxy");
    let behind = via(&direct, pg.port(), proxy.addr().port());
    through_a_proxy(&behind, &direct, &proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_holder_cut_off_stops_its_command_in_time() {
    let zk = ZooKeeper::start().await.expect("kit ZooKeeper");
    let proxy = Proxy::start(zk.addr()).await.expect("proxy");
    let direct = zk.url();
    let behind = via(&direct, zk.port(), proxy.addr().port());
    through_a_proxy(&behind, &direct, &proxy).await;
}

/// SQLite: no link to cut, so the fault is the client's own store refusing its writes: another
/// connection holds an exclusive transaction from the fault on, until the command has exited
/// or the lease has surely run out by the database's clock (its last renewal was before the
/// fault), whichever comes first; the second client's acquire then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_holder_whose_writes_are_refused_stops_its_command_in_time() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().expect("temp dir");
    let db: PathBuf = dir.path().join("locks.db");
    let url = format!("sqlite://{}", db.display());
    let name = "refused-holder";
    let (holder, pids) = hold(&url, name, dir.path());
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("a second connection");
    let second = dlock::connect(&url).await.expect("connect");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut blocker)
        .await
        .expect("an exclusive transaction");
    let fault = Instant::now();
    tokio::select! {
        _ = all_exited(pids) => {}
        _ = tokio::time::sleep_until((fault + TTL).into()) => {}
    }
    sqlx::query("COMMIT")
        .execute(&mut blocker)
        .await
        .expect("commit");
    judge(holder, dir.path(), pids, fault, second_client(second, name)).await;
}
