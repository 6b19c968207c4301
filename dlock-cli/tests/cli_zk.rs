//! The `dlock` binary against a kit ZooKeeper server: `run`, `status` and `check` reach
//! `zk://` through the `zk` feature.

use std::os::unix::process::CommandExt as _;

use conformance_tests::kit::ZooKeeper;

mod common;

use common::{dlock, run, text};

#[test]
fn run_status_and_check_on_zookeeper() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let zk = rt.block_on(ZooKeeper::start()).expect("kit ZooKeeper");
    let url = format!("{}/dlock-cli?ttl=10s", zk.url());

    let o = run(dlock().args([
        "run",
        "--url",
        &url,
        "--name",
        "cli/zk",
        "--",
        "sh",
        "-c",
        "echo \"token=$DLOCK_FENCING_TOKEN\"",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let token: u64 = out
        .trim()
        .strip_prefix("token=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {out:?}"));
    assert!(token > 0);

    let o = run(dlock().args(["status", "--url", &url, "--json", "cli/zk"]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["backend"], "zookeeper");
    assert!(v["holder"].is_null(), "released after run: {v}");

    let o = run(dlock().args([
        "check",
        "--url",
        &url,
        "--cases",
        "basic_exclusivity|fencing_tokens_increase$|idempotent_release",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A short bench: the lock and its raw floor (ephemeral create + delete) both run.
    let o = run(dlock().args([
        "bench",
        "--url",
        &url,
        "--duration",
        "500ms",
        "--warmup",
        "50ms",
        "--clients",
        "3",
        "--json",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["contended"]["violations"], 0);
    assert!(v["uncontended"]["pairs"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(
        v["uncontended"]["floor"]["ratio"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{v}"
    );
}

/// `dlock run --ttl` on zk:// sets the session timeout too (one process, one lock): a holder
/// killed with SIGKILL frees the lock after about its --ttl, not after the default 30 s
/// session; a ttl below the server's minimum session timeout is clamped, and run says so.
#[test]
fn run_ttl_sets_the_session_timeout() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let zk = rt.block_on(ZooKeeper::start()).expect("kit ZooKeeper");
    let url = format!("{}/dlock-ttl", zk.url());
    let mut holder = dlock()
        .args([
            "run", "--url", &url, "--name", "j", "--ttl", "3s", "--", "sleep", "600",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own process group, so that the SIGKILL below takes the command with it.
        .process_group(0)
        .spawn()
        .expect("holder starts");
    let start = std::time::Instant::now();
    loop {
        let o = run(dlock().args(["status", "--url", &url, "--json", "j"]));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        if v["state"] == "held" {
            assert_eq!(v["expiry"], "session", "{v}");
            assert!(v["session_timeout_ms"].as_u64().is_some(), "{v}");
            break;
        }
        assert!(
            start.elapsed().as_secs() < 60,
            "the holder never got the lock: {v}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let killed = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", holder.id())])
        .status()
        .expect("kill runs");
    assert!(killed.success(), "SIGKILL to the holder's process group");
    holder.wait().expect("reaped");
    // With the default 30 s session the lock would still be held when this gives up.
    let o = run(dlock().args([
        "run", "--url", &url, "--name", "j", "--ttl", "3s", "--wait", "20s", "--", "true",
    ]));
    assert_eq!(
        o.status.code(),
        Some(0),
        "the dead holder's lock outlived its --ttl session: {}",
        text(&o)
    );
    // Below the kit server's minSessionTimeout (1 s): clamped, and said.
    let o = run(dlock().args([
        "run", "--url", &url, "--name", "j2", "--ttl", "500ms", "--", "true",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("session timeout of 1s") && err.contains("--ttl 500ms"),
        "no note about the clamped session timeout: {err}"
    );
}
