//! The `dlock` binary against a kit ZooKeeper server: `run`, `status` and `check` reach
//! `zk://` through the `zk` feature.

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
