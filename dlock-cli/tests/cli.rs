//! The `dlock` binary, run as a child process.

mod common;

use std::process::{Command, Stdio};

use common::{dlock, run, stderr, wait_for_file};

#[test]
fn run_passes_token_and_name_and_returns_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("env");
    let o = run(dlock()
        .args([
            "run",
            "--url",
            "memory://cli",
            "--name",
            "jobs/nightly",
            "--",
        ])
        .args([
            "sh",
            "-c",
            r#"printf '%s|%s' "$DLOCK_FENCING_TOKEN" "$DLOCK_LOCK_NAME" > "$0"; exit 7"#,
            out_file.to_str().unwrap(),
        ]));
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    let seen = std::fs::read_to_string(&out_file).unwrap();
    let (token, name) = seen.split_once('|').unwrap();
    assert!(token.parse::<u64>().unwrap() >= 1, "{seen}");
    assert_eq!(name, "jobs/nightly");
}

#[test]
fn run_without_dashdash_and_zero_exit() {
    let o = run(dlock().args(["run", "--url", "memory://cli", "--name", "a", "true"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn run_reports_death_by_signal_as_128_plus_n() {
    let o = run(dlock().args([
        "run",
        "--url",
        "memory://cli",
        "--name",
        "a",
        "--",
        "sh",
        "-c",
        "kill -KILL $$",
    ]));
    assert_eq!(o.status.code(), Some(128 + 9), "{}", stderr(&o));
}

#[test]
fn run_command_not_found_is_127() {
    let o = run(dlock().args([
        "run",
        "--url",
        "memory://cli",
        "--name",
        "a",
        "--",
        "/definitely/not/here",
    ]));
    assert_eq!(o.status.code(), Some(127));
    assert!(stderr(&o).contains("/definitely/not/here"));
}

#[test]
fn usage_errors_are_64() {
    // Missing --name.
    let o = run(dlock().args(["run", "--url", "memory://cli", "--", "true"]));
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    // Missing command.
    let o = run(dlock().args(["run", "--url", "memory://cli", "--name", "a"]));
    assert_eq!(o.status.code(), Some(64));
    // Bad --wait.
    let o = run(dlock().args([
        "run",
        "--url",
        "memory://cli",
        "--name",
        "a",
        "--wait",
        "soon",
        "true",
    ]));
    assert_eq!(o.status.code(), Some(64));
    // ttl out of range.
    let o = run(dlock().args([
        "run",
        "--url",
        "memory://cli",
        "--name",
        "a",
        "--ttl",
        "1ms",
        "true",
    ]));
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    // No subcommand.
    let o = run(&mut dlock());
    assert_eq!(o.status.code(), Some(64));
}

#[test]
fn bad_urls_are_78_and_never_show_the_password() {
    let o = run(dlock().args(["status", "--url", "nope://u:hunter2@h", "x"]));
    assert_eq!(o.status.code(), Some(78));
    let err = stderr(&o);
    assert!(err.contains("nope") && err.contains("memory"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    let o = run(dlock()
        .args(["run", "--name", "x", "true"])
        .env("DLOCK_URL", "nope://u:hunter2@h"));
    assert_eq!(o.status.code(), Some(78));
    assert!(!stderr(&o).contains("hunter2"));
}

#[test]
fn help_documents_exit_codes_and_hides_the_env_url() {
    let o = run(dlock().arg("--help"));
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    for code in ["64", "69", "75", "76", "78", "127", "128+N"] {
        assert!(text.contains(code), "--help lacks exit code {code}");
    }
    let o = run(dlock()
        .args(["run", "--help"])
        .env("DLOCK_URL", "redis://u:hunter2@h"));
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("locks.db"), "default store not shown: {text}");
    assert!(text.contains("75"));
}

#[test]
fn status_reports_never_used() {
    let o = run(dlock().args(["status", "--url", "memory://cli", "nobody/used/this"]));
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("never used"));
    let o = run(dlock().args(["status", "--url", "memory://cli", "--json", "n"]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["state"], "never_used");
    assert_eq!(v["backend"], "memory");
    assert!(v["holder"].is_null());
}

#[test]
fn bench_json_parses() {
    let o = run(dlock().args([
        "bench",
        "--url",
        "memory://cli-bench",
        "--duration",
        "200ms",
        "--warmup",
        "20ms",
        "--clients",
        "3",
        "--json",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["url"], "memory://cli-bench");
    assert_eq!(v["contended"]["violations"], 0);
    assert_eq!(v["contended"]["clients"], 3);
    assert!(v["uncontended"]["pairs"].as_u64().unwrap() > 0);
    assert!(v["uncontended"]["floor"]["ratio"].as_f64().unwrap() > 0.0);
    // No progress bar when stderr is not a terminal.
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
}

#[test]
fn bench_table_for_people() {
    let o = run(dlock().args([
        "bench",
        "--url",
        "memory://cli-bench2",
        "--mode",
        "uncontended",
        "--duration",
        "100ms",
        "--warmup",
        "0s",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("pairs/s")
            && text.contains("raw floor")
            && text.contains("ratio dlock/floor"),
        "{text}"
    );
    assert!(!text.contains("\ncontended:"), "{text}");
}

#[test]
fn sigterm_is_forwarded_and_dlock_exits_with_the_commands_status() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let got = dir.path().join("got-term");
    let script = format!(
        "trap 'echo term > {got}; exit 3' TERM; touch {started}; while :; do sleep 0.05; done",
        got = got.display(),
        started = started.display()
    );
    let child = dlock()
        .args([
            "run",
            "--url",
            "memory://cli",
            "--name",
            "sig",
            "--grace",
            "5s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&started);
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "the command handled SIGTERM and exited 3: {}",
        stderr(&out)
    );
    assert!(got.exists(), "the command did not get SIGTERM");
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_grace() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let script = format!(
        "trap '' TERM; touch {}; while :; do sleep 0.05; done",
        started.display()
    );
    let child = dlock()
        .args([
            "run",
            "--url",
            "memory://cli",
            "--name",
            "sig2",
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&started);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(137),
        "the command ended by SIGKILL: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("SIGKILL"), "{}", stderr(&out));
}
