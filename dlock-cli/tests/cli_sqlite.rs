//! Cross-process `dlock run` / `status` through the SQL backend's SQLite files (memory:// locks
//! are per process).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::{dlock, stderr, stdout, wait_for_file};

fn url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// `dlock run` holding `name` with a command that signals `started` and then sleeps until
/// `finish` exists.
fn holder(url: &str, name: &str, dir: &Path) -> (Child, PathBuf) {
    let started = dir.join(format!("{name}.started"));
    let finish = dir.join(format!("{name}.finish"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        started.display(),
        finish.display()
    );
    let child = dlock()
        .args([
            "run", "--url", url, "--name", name, "--", "sh", "-c", &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&started);
    (child, finish)
}

#[test]
fn a_second_run_with_wait_0_exits_75_and_status_follows_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path());
    let (first, finish) = holder(&url, "nightly", dir.path());

    let o = dlock()
        .args([
            "run", "--url", &url, "--name", "nightly", "--wait", "0", "--", "sh", "-c", "echo ran",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(
        !stdout(&o).contains("ran"),
        "the command ran without the lock"
    );
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line expected: {err}");
    assert!(
        err.contains("\"nightly\"") && err.contains("held by another owner"),
        "{err}"
    );

    // A bounded wait also gives up with 75.
    let o = dlock()
        .args([
            "run", "--url", &url, "--name", "nightly", "--wait", "200ms", "--", "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));

    let o = dlock()
        .args(["status", "--url", &url, "nightly"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("held by"), "{}", stdout(&o));
    let o = dlock()
        .args(["status", "--url", &url, "--json", "nightly"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["state"], "held");
    assert!(v["holder"].is_string());
    let held_token = v["token"].as_u64().unwrap();
    assert!(v["remaining_ms"].as_u64().unwrap() > 0);

    std::fs::write(&finish, b"").unwrap();
    let out = first.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let o = dlock()
        .args(["status", "--url", &url, "nightly"])
        .output()
        .unwrap();
    assert!(stdout(&o).contains("free"), "{}", stdout(&o));
    let o = dlock()
        .args(["status", "--url", &url, "--json", "nightly"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["state"], "free");
    assert!(v["holder"].is_null());

    // Now it can be had, with a larger fencing token.
    let token_file = dir.path().join("token");
    let o = dlock()
        .args([
            "run", "--url", &url, "--name", "nightly", "--wait", "0", "--", "sh", "-c",
        ])
        .arg(format!(
            "echo $DLOCK_FENCING_TOKEN > {}",
            token_file.display()
        ))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let token: u64 = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token > held_token, "{token} <= {held_token}");
}

#[test]
fn a_waiting_run_gets_the_lock_when_the_holder_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path());
    let (first, finish) = holder(&url, "queue", dir.path());
    let second = dlock()
        .args([
            "run", "--url", &url, "--name", "queue", "--wait", "forever", "--", "sh", "-c",
            "exit 3",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(&finish, b"").unwrap();
    assert_eq!(first.wait_with_output().unwrap().status.code(), Some(0));
    let out = second.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn losing_the_lock_stops_the_command_and_exits_76() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path());
    let started = dir.path().join("started");
    let got = dir.path().join("got-term");
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; touch {}; while :; do sleep 0.05; done",
        got.display(),
        started.display()
    );
    let child = dlock()
        .args([
            "run", "--url", &url, "--name", "fragile", "--ttl", "300ms", "--grace", "5s", "--",
        ])
        .args(["sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&started);
    let pid = child.id().to_string();
    // Freeze dlock (not its command) well past the ttl, so its keep-alive cannot renew, and let
    // another owner take the expired lock meanwhile.
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    std::thread::sleep(Duration::from_millis(900));
    let taker = dlock()
        .args([
            "run", "--url", &url, "--name", "fragile", "--wait", "0", "--", "true",
        ])
        .output()
        .unwrap();
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(taker.status.code(), Some(0), "{}", stderr(&taker));

    // Its lease ended while it was frozen: the command is killed at once, with no SIGTERM
    // and no grace (another owner may hold the lock already).
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lost lock \"fragile\"") && stderr(&out).contains("SIGKILL"),
        "{}",
        stderr(&out)
    );
    assert!(
        !got.exists(),
        "the command was given a grace it had no lease for"
    );
}

#[test]
fn the_default_store_is_a_per_user_sqlite_file() {
    let home = tempfile::tempdir().unwrap();
    let o = dlock()
        .args(["run", "--name", "default-store", "--", "true"])
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(home.path().join(".local/state/dlock/locks.db").exists());

    let state = tempfile::tempdir().unwrap();
    let o = dlock()
        .args(["status", "default-store"])
        .env("HOME", home.path())
        .env("XDG_STATE_HOME", state.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("never used"), "{}", stdout(&o));
    assert!(state.path().join("dlock/locks.db").exists());

    // Through the home file again: the run above left the lock free with a token.
    let o = dlock()
        .args(["status", "default-store"])
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(stdout(&o).contains("free"), "{}", stdout(&o));
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// A HOME (or XDG_STATE_HOME) with `%`, `?`, `#` and spaces in it names the default database
/// file as written: the file is at `<state>/dlock/locks.db` and nowhere else, in a folder only
/// its user can enter, and no one else can read it.
#[test]
fn the_default_store_path_is_taken_as_written() {
    use std::os::unix::fs::PermissionsExt;
    for var in ["HOME", "XDG_STATE_HOME"] {
        let root = tempfile::tempdir().unwrap();
        let odd = root.path().join("a %41 b?table=x#c d");
        std::fs::create_dir(&odd).unwrap();
        let mut cmd = dlock();
        cmd.args(["run", "--name", "odd-home", "--", "true"]);
        let dir = match var {
            "HOME" => {
                cmd.env("HOME", &odd);
                odd.join(".local/state/dlock")
            }
            _ => {
                cmd.env("HOME", root.path().join("unused"))
                    .env("XDG_STATE_HOME", &odd);
                odd.join("dlock")
            }
        };
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{var}: {}", stderr(&o));
        let db = dir.join("locks.db");
        assert!(db.is_file(), "{var}: no {}", db.display());
        let elsewhere: Vec<_> = files_under(root.path())
            .into_iter()
            .filter(|f| f.parent() != Some(dir.as_path()))
            .collect();
        assert!(
            elsewhere.is_empty(),
            "{var}: files elsewhere: {elsewhere:?}"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "{var}: the folder's mode");
        assert_eq!(
            mode(&db) & 0o077,
            0,
            "{var}: the file's mode {:o}",
            mode(&db)
        );
    }
}

/// A variable the test kit and `dlock bench --processes` set for the children they start does
/// not, inherited by a user's `dlock run`, make it one of those children: the command runs
/// under the lock.
#[test]
fn child_role_variables_in_the_environment_do_not_change_what_run_does() {
    for var in ["DLOCK_CT_CHILD_TARGET", "DLOCK_BENCH_CLIENT"] {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let script = format!(
            "echo \"$DLOCK_LOCK_NAME $DLOCK_FENCING_TOKEN\" > {}",
            ran.display()
        );
        let o = dlock()
            .args(["run", "--url", &url(dir.path()), "--name", "n", "--"])
            .args(["sh", "-c", &script])
            .env(var, "x")
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{var}: {}{}",
            stdout(&o),
            stderr(&o)
        );
        let got = std::fs::read_to_string(&ran).unwrap_or_default();
        let mut words = got.split_whitespace();
        assert_eq!(
            words.next(),
            Some("n"),
            "{var}: the command did not run under the lock"
        );
        assert!(
            words.next().is_some_and(|t| t.parse::<u64>().is_ok()),
            "{var}: no fencing token: {got:?}"
        );
    }
}

#[test]
fn bench_json_on_sqlite_parses() {
    let dir = tempfile::tempdir().unwrap();
    let o = dlock()
        .args([
            "bench",
            "--url",
            &url(dir.path()),
            "--duration",
            "200ms",
            "--warmup",
            "0s",
            "--clients",
            "3",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["backend"], "sqlite");
    assert_eq!(v["contended"]["violations"], 0);
    assert!(v["uncontended"]["pairs"].as_u64().unwrap() > 0);
    assert!(v["contended"]["acquisitions"].as_u64().unwrap() > 0);
}

/// `--processes`: every contended client is a `dlock` process of its own on one SQLite file.
/// The parent merges their holds: none overlap, every client acquired, and hand-overs between
/// different processes are measured. memory:// lives inside one process and is refused.
#[test]
fn bench_clients_as_processes_take_turns_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let o = dlock()
        .args([
            "bench",
            "--url",
            &url(dir.path()),
            "--mode",
            "contended",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--clients",
            "3",
            "--hold",
            "2ms",
            "--processes",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &v["contended"];
    assert_eq!(c["processes"], true, "{c}");
    assert_eq!(c["clients"], 3, "{c}");
    assert_eq!(c["violations"], 0, "{c}");
    assert_eq!(c["errors"], 0, "{c}");
    let per_client: Vec<u64> = c["per_client"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert!(per_client.iter().all(|&n| n > 0), "{per_client:?}");
    assert_eq!(
        c["acquisitions"].as_u64().unwrap(),
        per_client.iter().sum::<u64>()
    );
    assert_eq!(c["wait"]["count"], c["acquisitions"], "{c}");
    assert!(c["handoff"]["count"].as_u64().unwrap() > 0, "{c}");
    let holders = c["mean_holders"].as_f64().unwrap();
    assert!(holders > 0.0 && holders <= 1.0, "{holders}");
    // The acquires given up at the window's end leave nothing behind: a grant one of them
    // was handed is freed, and no waiter row stays, before the client processes exit.
    let name = c["name"].as_str().unwrap();
    let o = dlock()
        .args(["status", "--url", &url(dir.path()), "--json", name])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(status["state"], "free", "{status}");
    assert_eq!(status["waiters"], 0, "{status}");

    let o = dlock()
        .args(["bench", "--url", "memory://", "--processes"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(stderr(&o).contains("processes"), "{}", stderr(&o));
}

/// A `dlock run` killed with SIGKILL takes its command with it: the command would otherwise
/// run on without the lock once the lease ran out, beside the next holder.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_dlock_takes_its_command_with_it() {
    use conformance_tests::kit::is_alive;
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path());
    let pid_file = dir.path().join("command.pid");
    // `exec` keeps the pid the shell wrote.
    let script = format!(
        "echo $$ > {0}.new && mv {0}.new {0} && exec sleep 600",
        pid_file.display()
    );
    let mut run = dlock()
        .args([
            "run", "--url", &url, "--name", "orphan", "--", "sh", "-c", &script,
        ])
        .spawn()
        .unwrap();
    wait_for_file(&pid_file);
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .expect("the command's pid");
    assert!(is_alive(pid), "the command is not running");
    run.kill().expect("kill -9 dlock");
    run.wait().unwrap();
    common::eventually("the command to end with dlock", || {
        if is_alive(pid) {
            Err(format!("process {pid} still runs"))
        } else {
            Ok(())
        }
    });
}
