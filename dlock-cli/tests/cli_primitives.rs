//! `dlock run --permits N` (a semaphore permit) and `--shared` (the read side of a read-write
//! lock), across processes: refused before any I/O where the store has neither, and holders,
//! waiters and refusals as the primitive says where it has them.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};

use conformance_tests::kit::ZooKeeper;

mod common;

use common::{dlock, eventually, run, text, wait_for_file};

/// Stores that cannot be reached: a command that tried to connect would fail with 69, not 64.
const UNREACHABLE_REDLOCK: &str = "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3";

fn run_with(url: &str, extra: &[&str]) -> Output {
    let mut args = vec!["run", "--url", url, "--name", "jobs", "--wait", "0"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "true"]);
    run(dlock().args(&args))
}

#[test]
fn a_primitive_the_store_lacks_is_refused_before_any_io() {
    for (url, flag, what) in [
        (UNREACHABLE_REDLOCK, &["--permits", "2"][..], "semaphores"),
        (UNREACHABLE_REDLOCK, &["--shared"][..], "read-write locks"),
    ] {
        let o = run_with(url, flag);
        assert_eq!(o.status.code(), Some(64), "{url} {flag:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(flag[0]) && err.contains(what), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        // A store that cannot be reached: had dlock tried to connect, it would have said
        // so and exited 69, not 64.
        assert!(
            !err.contains("cannot connect"),
            "{url}: it tried to connect: {err}"
        );
    }
}

#[test]
fn bad_counts_and_both_flags_are_usage_errors() {
    for extra in [
        &["--permits", "0"][..],
        &["--permits", "10001"][..],
        &["--permits", "four"][..],
        &["--permits", "2", "--shared"][..],
    ] {
        let o = run_with("memory://cli", extra);
        assert_eq!(o.status.code(), Some(64), "{extra:?}: {}", text(&o));
    }
    // In-process stores have both: a lone holder runs its command.
    for extra in [&["--permits", "2"][..], &["--shared"][..]] {
        let o = run_with("memory://cli", extra);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", text(&o));
    }
}

/// A `dlock run` with `flags` on `name` whose command touches `<tag>.started` and then waits
/// for `<tag>.finish`. Returns the child and the two paths; does not wait for the start.
fn holder(url: &str, flags: &[&str], tag: &str, dir: &Path) -> (Child, PathBuf, PathBuf) {
    let started = dir.join(format!("{tag}.started"));
    let finish = dir.join(format!("{tag}.finish"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        started.display(),
        finish.display()
    );
    let mut args = vec!["run", "--url", url, "--name", "catalog"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let child = dlock()
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock runs");
    (child, started, finish)
}

fn finish(child: Child, finish: &Path) {
    std::fs::write(finish, b"").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// Readers overlap; a writer (a plain `dlock run`) waits for them; a reader that arrives after
/// the queued writer waits for the writer: on ZooKeeper.
#[test]
fn shared_holders_overlap_and_a_queued_writer_holds_back_later_readers() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let zk = rt.block_on(ZooKeeper::start()).expect("kit ZooKeeper");
    let dir = tempfile::tempdir().unwrap();
    shared_holders_and_a_queued_writer(&format!("{}/dlock-cli-rw", zk.url()), dir.path());
}

/// The same on the embedded default, SQLite (one database file shared by the processes).
#[test]
fn shared_holders_and_a_queued_writer_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    shared_holders_and_a_queued_writer(&url, dir.path());
}

fn shared_holders_and_a_queued_writer(url: &str, d: &Path) {
    let url = url.to_owned();
    let wait = ["--shared", "--wait", "60s"];

    let (r1, r1_started, r1_finish) = holder(&url, &wait, "r1", d);
    wait_for_file(&r1_started);
    let (r2, r2_started, r2_finish) = holder(&url, &wait, "r2", d);
    wait_for_file(&r2_started);
    // Both readers run at once.
    assert!(!r1_finish.exists() && !r2_finish.exists());

    let waiters = || {
        let o = run(dlock().args(["status", "--url", &url, "--json", "catalog"]));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        (v["waiters"].as_u64().unwrap_or(0), v)
    };
    let before = waiters().0;
    let (w, w_started, w_finish) = holder(&url, &["--wait", "60s"], "w", d);
    // Waits until status shows `more` waiting than before (it counts waiters, not holders).
    let queued = |more: u64, what: &str| {
        eventually(what, || match waiters() {
            (now, _) if now >= before + more => Ok(()),
            (_, v) => Err(v.to_string()),
        })
    };
    queued(1, "the writer to queue");
    let (r3, r3_started, r3_finish) = holder(&url, &wait, "r3", d);
    // The late reader queues behind the writer.
    queued(2, "the late reader to queue");
    assert!(!w_started.exists(), "the writer ran beside readers");
    assert!(
        !r3_started.exists(),
        "a reader arriving after a queued writer got in before it"
    );

    finish(r1, &r1_finish);
    finish(r2, &r2_finish);
    wait_for_file(&w_started);
    let (queued, v) = waiters();
    assert!(
        queued >= 1,
        "the late reader is not waiting for the writer: {v}"
    );
    assert!(!r3_started.exists(), "a reader ran beside the writer");
    finish(w, &w_finish);
    wait_for_file(&r3_started);
    finish(r3, &r3_finish);

    // The readers' and the writer's exits were checked; a read-only status of a free name.
    let o = run(dlock().args(["status", "--url", &url, "catalog"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("free"), "{}", text(&o));
}

/// Two `dlock run --permits 2` holders run their commands at once; a third that does not wait
/// is refused with 75 while both hold, and runs once one of them has finished. On SQLite, the
/// embedded default, shared by the processes through one database file.
#[test]
fn two_permit_holders_run_at_once_and_a_third_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = format!("sqlite://{}/locks.db", d.display());
    let flags = ["--permits", "2", "--wait", "60s"];
    let (p1, p1_started, p1_finish) = holder(&url, &flags, "p1", d);
    wait_for_file(&p1_started);
    let (p2, p2_started, p2_finish) = holder(&url, &flags, "p2", d);
    wait_for_file(&p2_started);
    let third = || {
        run(dlock().args([
            "run",
            "--url",
            &url,
            "--name",
            "catalog",
            "--permits",
            "2",
            "--wait",
            "0",
            "--",
            "true",
        ]))
    };
    let o = third();
    assert_eq!(o.status.code(), Some(75), "{}", text(&o));
    finish(p1, &p1_finish);
    let o = third();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    finish(p2, &p2_finish);
}
