//! A waiting `dlock run` stopped by SIGTERM or SIGINT removes what it queued before it exits,
//! on every backend: right after it exits nobody waits any more, and once the holder lets go the
//! lock is free (a waiter's node left behind on ZooKeeper would otherwise be the next holder
//! until its session ran out).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use conformance_tests::kit::{MariaDb, Postgres, Redis, RedisSet, ZooKeeper};

mod common;

use common::{HANG, dlock, eventually, rt, run, text};

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock starts")
}

fn status(url: &str, name: &str) -> serde_json::Value {
    let o = run(dlock().args(["status", "--url", url, "--json", name]));
    assert_eq!(o.status.code(), Some(0), "status: {}", text(&o));
    serde_json::from_slice(&o.stdout).expect("status --json")
}

fn signal(child: &Child, sig: i32) {
    let rc = std::process::Command::new("kill")
        .args([format!("-{sig}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(rc.success(), "kill -{sig} failed");
}

/// A `dlock` process logging at debug level to a file, which a failure shows.
struct Logged {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Logged {
    fn spawn(cmd: &mut Command) -> Logged {
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let child = cmd
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("the log file"))
            .spawn()
            .expect("dlock starts");
        Logged { child, log }
    }

    /// Kills the process and fails with `why` and the end of its log.
    fn fail(mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let logged = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let lines: Vec<&str> = logged.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        panic!("the holder: {why}; its log ends:\n{tail}");
    }
}

/// What `child` wrote to stderr, once it has exited.
fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut err);
    }
    err
}

fn wait_exit(child: &mut Child, what: &str) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let err = stderr_of(child);
            return status
                .code()
                .unwrap_or_else(|| panic!("{what} died by a signal: {err}"));
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("{what} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A holder, a waiter interrupted by `sig`, then: nobody waits, and the holder's release leaves
/// the lock free.
fn interrupted_waiter_leaves_nothing(url: &str, sig: i32) {
    let name = format!("interrupt/{sig}");
    let mut holder =
        Logged::spawn(dlock().args(["run", "--url", url, "--name", &name, "--", "sleep", "600"]));
    let held = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eventually("the holder", || {
            if let Some(exit) = holder.child.try_wait().expect("try_wait") {
                return Ok(Err(format!("it exited ({exit})")));
            }
            let v = status(url, &name);
            if v["holder"].is_null() {
                Err(v.to_string())
            } else {
                Ok(Ok(()))
            }
        })
    }));
    match held {
        Ok(Ok(())) => {}
        Ok(Err(exited)) => holder.fail(&exited),
        Err(timed_out) => {
            let why = timed_out.downcast_ref::<String>().cloned();
            holder.fail(&why.unwrap_or_else(|| "it never held the lock".to_owned()));
        }
    }
    let mut holder = holder.child;
    let mut waiter = spawn(dlock().args([
        "run", "--url", url, "--name", &name, "--wait", "60s", "--", "true",
    ]));
    // Queued (on stores that report waiters), or at least well into its wait.
    let queued = Instant::now();
    eventually("the waiter to queue", || {
        let v = status(url, &name);
        let waiting = v["waiters"].as_u64().is_some_and(|w| w >= 1);
        let unreported = v["waiters"].is_null() && queued.elapsed() > Duration::from_millis(1500);
        if waiting || unreported {
            Ok(())
        } else {
            Err(v.to_string())
        }
    });
    signal(&waiter, sig);
    let code = wait_exit(&mut waiter, "the interrupted waiter");
    assert_eq!(code, 128 + sig, "an interrupted waiter exits 128+signal");
    let v = status(url, &name);
    assert!(
        v["waiters"].as_u64().is_none_or(|w| w == 0),
        "the interrupted waiter is still queued after it exited: {v}"
    );
    signal(&holder, SIGTERM);
    assert_eq!(wait_exit(&mut holder, "the holder"), 128 + SIGTERM);
    let o = run(dlock().args([
        "run", "--url", url, "--name", &name, "--wait", "0", "--", "true",
    ]));
    assert_eq!(
        o.status.code(),
        Some(0),
        "after the holder released, the lock was not free (the interrupted waiter left \
         something behind): {}",
        text(&o)
    );
}

const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;

#[test]
fn sqlite_waiter_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    interrupted_waiter_leaves_nothing(&url, SIGTERM);
    interrupted_waiter_leaves_nothing(&url, SIGINT);
}

#[test]
fn postgres_waiter_interrupted() {
    let rt = rt();
    let url = rt
        .block_on(async { Postgres::shared().await?.fresh_database("interrupt").await })
        .expect("kit PostgreSQL");
    interrupted_waiter_leaves_nothing(&url, SIGTERM);
}

#[test]
fn mariadb_waiter_interrupted() {
    let rt = rt();
    let url = rt
        .block_on(async { MariaDb::shared().await?.fresh_database("interrupt").await })
        .expect("kit MariaDB");
    interrupted_waiter_leaves_nothing(&url, SIGTERM);
}

#[test]
fn redis_and_tair_waiters_interrupted() {
    let rt = rt();
    let redis = rt.block_on(Redis::start()).expect("kit Redis");
    interrupted_waiter_leaves_nothing(&redis.url(), SIGTERM);
    let tair = redis.url().replacen("redis://", "tair://", 1);
    interrupted_waiter_leaves_nothing(&tair, SIGTERM);
}

#[test]
fn redlock_waiter_interrupted() {
    let rt = rt();
    let set = rt.block_on(RedisSet::start(3, &[])).expect("kit Redis x3");
    interrupted_waiter_leaves_nothing(&set.redlock_url(), SIGTERM);
}

#[test]
fn zookeeper_and_dual_waiters_interrupted() {
    let rt = rt();
    let (zk, redis) = rt.block_on(async { tokio::join!(ZooKeeper::start(), Redis::start()) });
    let (zk, redis) = (zk.expect("kit ZooKeeper"), redis.expect("kit Redis"));
    // The default session timeout (30 s): a waiter's node left behind would outlive the test's
    // patience for a free lock.
    let zk_url = format!("{}/interrupt", zk.url());
    interrupted_waiter_leaves_nothing(&zk_url, SIGTERM);
    interrupted_waiter_leaves_nothing(&zk_url, SIGINT);
    let dual = format!(
        "dual://?first={}&second={}",
        common::enc(&zk_url),
        common::enc(&redis.url())
    );
    interrupted_waiter_leaves_nothing(&dual, SIGTERM);
}
