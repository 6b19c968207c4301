//! One test per row of the exit-code table in the crate README (and `dlock --help`), through the
//! binary. Rows pinned elsewhere: 1 (`migrate check` SPLIT) in `cli_dual.rs` and (a soak
//! anomaly, from broken backends through the library) in `soak.rs`, 76 (lock lost
//! while the command ran) in `cli_sqlite.rs`, 143/130 for a waiter interrupted before its
//! command ran in `cli_interrupt.rs`. Row 70 (internal error) has no outside trigger: it is
//! what a failing JSON encoder or async runtime would give.

use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use conformance_tests::kit::{MariaDb, Postgres, Redis, RedisSet, RedisTls, ZooKeeper};

mod common;

use common::{dlock, enc, rt, run, text, wait_for_file};

/// A password with every character that used to break URL parsing, unencoded.
const PASSWORD: &str = "ab/?s3cr#t@x";

/// The pieces of [`PASSWORD`] a message must never show.
const PIECES: &[&str] = &["s3cr", "cr#t", "#t@x", "ab/?"];

fn code_of(args: &[&str]) -> (Option<i32>, String) {
    let o = run(dlock().args(args));
    (o.status.code(), text(&o))
}

/// `dlock run --url URL --name a -- COMMAND...`: its exit code and output.
fn run_on(url: &str, command: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["run", "--url", url, "--name", "a", "--"];
    args.extend_from_slice(command);
    code_of(&args)
}

fn assert_no_password(out: &str) {
    for piece in PIECES {
        assert!(
            !out.contains(piece),
            "part of the password ({piece:?}) printed:\n{out}"
        );
    }
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/locks.db", dir.path().display())
}

#[test]
fn row_0_success_and_the_commands_own_exit_code() {
    let (code, out) = run_on("memory://x", &["true"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run_on("memory://x", &["sh", "-c", "exit 7"]);
    assert_eq!(
        code,
        Some(7),
        "the command's own code passes through: {out}"
    );
}

#[test]
fn row_64_usage_errors() {
    let (code, out) = code_of(&["run", "--name", "x", "--bogus", "--", "true"]);
    assert_eq!(code, Some(64), "an unknown flag before `--`: {out}");
    assert!(out.contains("--bogus"), "the message names the flag: {out}");
    assert!(
        !out.contains("cannot run"),
        "the flag was run as the command: {out}"
    );
    let (code, out) = code_of(&["run", "--url", "memory://x", "--name", "", "--", "true"]);
    assert_eq!(code, Some(64), "an empty lock name: {out}");
    let (code, out) = code_of(&[
        "run",
        "--url",
        "memory://x",
        "--name",
        "a",
        "--wait",
        "soon",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(64), "a bad --wait: {out}");
    // An operation the store does not offer: ZooKeeper cannot raise its tokens (czxid).
    let rt = rt();
    let zk = rt.block_on(ZooKeeper::start()).expect("kit ZooKeeper");
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = code_of(&[
        "migrate",
        "prepare",
        "--from",
        &sqlite_url(&dir),
        "--to",
        &format!("{}/exit", zk.url()),
    ]);
    assert_eq!(code, Some(64), "Unsupported is a usage error: {out}");
    assert!(out.contains("not supported"), "{out}");
}

#[test]
fn row_69_the_store_is_unreachable() {
    for url in [
        "postgres://u@127.0.0.1:1/db?timeout=5s",
        "redis://127.0.0.1:1?timeout=5s",
        "zk://127.0.0.1:1/app?timeout=2s&session_timeout=2s",
    ] {
        let (code, out) = run_on(url, &["true"]);
        assert_eq!(code, Some(69), "{url}: {out}");
    }
}

#[test]
fn row_73_soak_cannot_write_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = file.to_str().unwrap();
    let args = [
        "soak",
        "--spawn",
        "sqlite",
        "--duration",
        "5s",
        "--out",
        out,
    ];
    let (code, text) = code_of(&args);
    assert_eq!(code, Some(73), "{text}");
    assert!(text.contains("cannot create"), "{text}");
}

#[test]
fn row_75_not_acquired_within_wait() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let mut holder = dlock()
        .args(["run", "--url", &url, "--name", "busy", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("holder");
    let start = Instant::now();
    let (code, out) = loop {
        let (code, out) = code_of(&[
            "run", "--url", &url, "--name", "busy", "--wait", "0", "--", "true",
        ]);
        if code != Some(0) || start.elapsed() > Duration::from_secs(60) {
            break (code, out);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = Command::new("kill")
        .args(["-TERM", &holder.id().to_string()])
        .status();
    let _ = holder.wait();
    assert_eq!(code, Some(75), "{out}");
    assert!(out.contains("held by another owner"), "{out}");
}

/// Missing, wrong and refused credentials exit 77 on every scheme that has them, and no message
/// shows any part of the password; the right password, unencoded, works.
#[test]
fn row_77_credentials_refused_on_every_scheme() {
    let rt = rt();
    let auth = ["--requirepass", PASSWORD];
    let redis = rt.block_on(Redis::start_with(&auth)).expect("kit Redis");
    let port = redis.port();
    let ok = |url: &str| {
        let (code, out) = run_on(url, &["true"]);
        assert_eq!(code, Some(0), "{}: {out}", dlock::redact(url));
        assert_no_password(&out);
    };
    let denied = |url: &str, says: &str| {
        for args in [
            vec!["run", "--url", url, "--name", "a", "--", "true"],
            vec!["status", "--url", url, "a"],
        ] {
            let (code, out) = code_of(&args);
            assert_eq!(
                code,
                Some(77),
                "`dlock {}` on {}: {out}",
                args[0],
                dlock::redact(url)
            );
            assert!(
                out.contains(says),
                "{}: expected {says:?} in:\n{out}",
                dlock::redact(url)
            );
            assert_no_password(&out);
        }
    };
    let noauth =
        "the server requires a password (NOAUTH): put it in the URL as redis://:PASSWORD@host";
    denied(&format!("redis://127.0.0.1:{port}"), noauth);
    denied(&format!("tair://127.0.0.1:{port}"), noauth);
    denied(&format!("redis://:wrong@127.0.0.1:{port}"), "WRONGPASS");
    ok(&format!("redis://:{PASSWORD}@127.0.0.1:{port}"));
    ok(&format!("tair://default:{PASSWORD}@127.0.0.1:{port}/0"));

    let tls = rt
        .block_on(RedisTls::start_with(&auth))
        .expect("kit Redis TLS");
    let ca = tls.ca_cert();
    let tls_port = tls.tls_port();
    denied(
        &format!("rediss://127.0.0.1:{tls_port}?ca={}", ca.display()),
        noauth,
    );
    ok(&format!(
        "rediss://:{PASSWORD}@127.0.0.1:{tls_port}?ca={}",
        ca.display()
    ));

    let set = rt
        .block_on(RedisSet::start(3, &auth))
        .expect("kit Redis x3");
    let hosts: Vec<String> = set
        .nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    denied(&format!("redlock://{}", hosts.join(",")), noauth);
    ok(&format!("redlock://:{PASSWORD}@{}", hosts.join(",")));

    // PostgreSQL: a role with a password, and scram for it.
    let pg = rt.block_on(Postgres::start()).expect("kit PostgreSQL");
    let sql_password = PASSWORD.replace('\'', "''");
    rt.block_on(async {
        pg.query(
            "postgres",
            &format!("CREATE ROLE locker LOGIN PASSWORD '{sql_password}'"),
        )
        .await?;
        pg.query("postgres", "CREATE DATABASE lockerdb OWNER locker")
            .await?;
        pg.prepend_hba("host all locker 127.0.0.1/32 scram-sha-256")
            .await
    })
    .expect("role with a password");
    let pg_port = pg.port();
    denied(
        &format!("postgres://locker:wrong@127.0.0.1:{pg_port}/lockerdb?sslmode=disable"),
        "password authentication failed",
    );
    ok(&format!(
        "postgres://locker:{PASSWORD}@127.0.0.1:{pg_port}/lockerdb?sslmode=disable"
    ));

    // MariaDB: a user with a password.
    let maria = rt.block_on(MariaDb::shared()).expect("kit MariaDB");
    let db = rt
        .block_on(maria.fresh_database("exit77"))
        .expect("database");
    let db_name = db
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    rt.block_on(async {
        maria
            .query(
                "mysql",
                &format!("CREATE USER IF NOT EXISTS 'locker'@'%' IDENTIFIED BY '{sql_password}'"),
            )
            .await?;
        maria
            .query(
                "mysql",
                &format!("GRANT ALL ON `{db_name}`.* TO 'locker'@'%'"),
            )
            .await
    })
    .expect("user with a password");
    let my_port = maria.port();
    denied(
        &format!("mysql://locker:wrong@127.0.0.1:{my_port}/{db_name}?ssl-mode=disabled"),
        "Access denied",
    );
    ok(&format!(
        "mysql://locker:{PASSWORD}@127.0.0.1:{my_port}/{db_name}?ssl-mode=disabled"
    ));

    // ZooKeeper: lock nodes made by one digest identity are closed to another.
    let zk = rt.block_on(ZooKeeper::start()).expect("kit ZooKeeper");
    let owner = format!("zk://alice:{PASSWORD}@127.0.0.1:{}/exit", zk.port());
    ok(&owner);
    denied(
        &format!("zk://mallory:{PASSWORD}@127.0.0.1:{}/exit", zk.port()),
        "NoAuth",
    );

    // dual: a side that refuses says so.
    denied(
        &format!(
            "dual://?first={}&second={}",
            enc(&format!("redis://127.0.0.1:{port}")),
            enc(&owner)
        ),
        noauth,
    );
}

#[test]
fn row_78_bad_url_or_configuration() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "",
        "  ",
        "nosuch://h",
        "redis://h:1?bogus=1",
        "redis://h:1?ttl=banana",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout=banana",
        "zk://127.0.0.1:1/app?session_timeout=banana",
        "postgres://u@h/db?timeout=banana",
        "mysql://u@h/db?ttl=banana",
        "dual://?first=redis://h",
        &format!("{}?table=bad-name", sqlite_url(&dir)),
    ] {
        let (code, out) = run_on(url, &["true"]);
        assert_eq!(code, Some(78), "{url:?}: {out}");
    }
}

#[test]
fn rows_126_and_127_the_command_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let not_executable = dir.path().join("script");
    std::fs::write(&not_executable, "#!/bin/sh\ntrue\n").unwrap();
    let (code, out) = run_on("memory://x", &[not_executable.to_str().unwrap()]);
    assert_eq!(code, Some(126), "{out}");
    let (code, out) = run_on("memory://x", &["no-such-command-dlock"]);
    assert_eq!(code, Some(127), "{out}");
}

#[test]
fn row_128_plus_n_the_command_was_killed_by_a_signal() {
    let (code, out) = run_on("memory://x", &["sh", "-c", "kill -KILL $$"]);
    assert_eq!(code, Some(137), "{out}");
}

/// A command that exits 5 on SIGINT. It touches the file named by `$0` once the trap is set,
/// then sleeps in one-second steps: a SIGINT that arrives between the shell's trap check and
/// its fork of the next `sleep` is taken at most a second later, when that sleep ends, well
/// inside dlock's `--grace` (10 s) after which the command would get SIGKILL.
const TRAP_INT_EXIT_5: &str = "trap 'exit 5' INT; touch \"$0\"; while :; do sleep 1; done";

/// A Ctrl-C reaches the whole foreground process group at once: dlock and the command. dlock
/// then exits with the command's own status every time (130 if SIGINT ended it, 5 if it trapped
/// SIGINT and exited 5), never one or the other depending on who saw the signal first.
#[test]
fn rows_129_130_143_a_group_sigint_gives_the_commands_status_every_time() {
    let dir = tempfile::tempdir().unwrap();
    for (script, want) in [
        // The command: the foreground `sleep` dies of the SIGINT, then the trap runs.
        // Short sleeps in a loop, not one `sleep 10`: a SIGINT that lands after the shell's
        // last trap check but before it forks `sleep` misses the sleep, and the shell runs the
        // trap only when that sleep ends; one `sleep 10` would then race dlock's 10 s grace.
        (TRAP_INT_EXIT_5, 5),
        ("touch \"$0\"; exec sleep 10", 130),
    ] {
        for round in 0..6 {
            let started = dir.path().join(format!("started-{want}-{round}"));
            let child = dlock()
                .args([
                    "run",
                    "--url",
                    "memory://x",
                    "--name",
                    "a",
                    "--",
                    "sh",
                    "-c",
                    script,
                ])
                .arg(&started)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .process_group(0)
                .spawn()
                .expect("dlock starts");
            wait_for_file(&started);
            std::thread::sleep(Duration::from_millis(50));
            let sent = Command::new("kill")
                .args(["-INT", "--", &format!("-{}", child.id())])
                .status()
                .expect("kill");
            assert!(sent.success());
            let out = child.wait_with_output().expect("dlock exits");
            assert_eq!(
                out.status.code(),
                Some(want),
                "round {round} of `{script}`: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The same through a real terminal: `script` gives dlock a pseudo-terminal, and the `^C`
/// written to it is turned into SIGINT for the foreground process group by the terminal itself,
/// as when a user types Ctrl-C. dlock does not forward it (the command already has it) and
/// exits with the command's status every time.
#[test]
fn a_ctrl_c_typed_at_a_terminal_gives_the_commands_status_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_dlock");
    for round in 0..6 {
        let started = dir.path().join(format!("tty-started-{round}"));
        // `exec`: `script` starts the command through `$SHELL -c`, and dash (CI has no $SHELL,
        // so /bin/sh) does not replace itself with a lone command; it would then die of the
        // same SIGINT and `script` would report 130 whatever dlock did. With `exec`, dlock is
        // the terminal's session leader under any shell, as under an interactive shell's job.
        let inner = format!(
            "exec {bin} run --url memory://x --name a -- sh -c '{}' {}",
            TRAP_INT_EXIT_5.replace('\'', "\""),
            started.display()
        );
        // The feeder types ^C once the command has started, then keeps the terminal open a
        // moment while dlock finishes.
        let feeder = format!(
            "i=0; while [ ! -e {} ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done; printf '\\003'; sleep 1",
            started.display()
        );
        let pipeline = format!("({feeder}) | script -qec \"$0\" /dev/null > /dev/null");
        let out = Command::new("sh")
            .args(["-c", &pipeline, &inner])
            .env_remove("DLOCK_URL")
            .stdin(Stdio::null())
            .output()
            .expect("sh and script (util-linux) run");
        assert_eq!(
            out.status.code(),
            Some(5),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
