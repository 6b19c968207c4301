//! What a new user met in the first hour: passwords printed, bad input found only after
//! connecting, an empty URL taken as the default store, a closed port reported as a pool
//! timeout, colour escapes in redirected logs. Each is pinned down here through the binary
//! and the library, against closed local ports (no server needed).

use std::time::Duration;

mod common;

use common::{dlock, run, text};

const SCHEMES: &[&str] = &[
    "sqlite",
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "redis",
    "rediss",
    "redis+cluster",
    "redlock",
    "zk",
    "tair",
    "memory",
    "nosuch",
];

const PASSWORDS: &[&str] = &[
    "pa/ss", "p@ss", "pa:ss", "pa#ss", "pa?ss", "pa%ss", "pa%2Fss",
];

/// The forms a password takes in a URL: after the user, and as a query parameter; with a host
/// and port, with a bad port, and without a host.
fn urls(scheme: &str, password: &str) -> Vec<String> {
    vec![
        format!("{scheme}://u:{password}@127.0.0.1:1/db"),
        format!("{scheme}://u:{password}@127.0.0.1:1,127.0.0.1:2/db?ttl=5s"),
        format!("{scheme}://u:{password}@127.0.0.1:notaport/db"),
        format!("{scheme}://u:{password}@/db"),
        format!("{scheme}://127.0.0.1:1/db?user=u&password={password}"),
    ]
}

/// The password as written and as it decodes, the forms a message might quote.
fn forms(password: &str) -> Vec<String> {
    let mut forms = vec![password.to_owned()];
    if password.contains("%2F") {
        forms.push(password.replace("%2F", "/"));
    }
    forms
}

#[test]
fn no_password_reaches_any_output_of_any_command_for_any_scheme() {
    // `sqlite://u:pa/ss@...` is a relative path: keep what it creates out of the source tree.
    let cwd = tempfile::tempdir().unwrap();
    for scheme in SCHEMES {
        for password in PASSWORDS {
            for url in urls(scheme, password) {
                let commands: [&[&str]; 5] = [
                    &["-vvv", "status", "--url", &url, "x"],
                    &["-vvv", "status", "--json", "--url", &url, "x"],
                    &[
                        "-vvv", "run", "--url", &url, "--name", "x", "--wait", "0", "--", "true",
                    ],
                    &[
                        "-vvv",
                        "bench",
                        "--url",
                        &url,
                        "--duration",
                        "100ms",
                        "--warmup",
                        "0s",
                    ],
                    &[
                        "-vvv",
                        "check",
                        "--url",
                        &url,
                        "--cases",
                        "^basic_exclusivity$",
                    ],
                ];
                for args in commands {
                    let o = run(dlock().args(args).current_dir(cwd.path()));
                    let text = text(&o);
                    for form in forms(password) {
                        assert!(
                            !text.contains(&form),
                            "`dlock {}` printed the password {form:?}:\n{text}",
                            args.join(" ")
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn no_password_reaches_library_errors_or_debug_output() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for scheme in SCHEMES {
        for password in PASSWORDS {
            for url in urls(scheme, password) {
                // Connecting to a relative SQLite path would create it here: parse only.
                let shown = if *scheme == "sqlite" {
                    format!("{:?}", "no connect")
                } else {
                    rt.block_on(async {
                        match tokio::time::timeout(Duration::from_secs(30), dlock::connect(&url))
                            .await
                        {
                            Ok(Ok(client)) => format!("{client:?}"),
                            Ok(Err(e)) => format!("{e} {e:?}"),
                            Err(_) => panic!("connect to {} hung", dlock::redact(&url)),
                        }
                    })
                };
                let config: Result<dlock::LockConfig, _> =
                    serde_json::from_value(serde_json::json!({ "url": url }));
                let config = format!("{config:?}");
                for form in forms(password) {
                    assert!(!shown.contains(&form), "{shown}");
                    assert!(!config.contains(&form), "{config}");
                    assert!(!dlock::redact(&url).contains(&form), "{url}");
                }
            }
        }
    }
}

#[test]
fn ttl_out_of_bounds_is_a_usage_error_before_connecting() {
    // A closed PostgreSQL port: connecting would fail with "refused" and exit 69.
    for ttl in ["0", "5ms", "8d"] {
        let o = run(dlock().args([
            "run",
            "--url",
            "postgres://u@127.0.0.1:1/db",
            "--name",
            "x",
            "--ttl",
            ttl,
            "--",
            "true",
        ]));
        let text = text(&o);
        assert_eq!(o.status.code(), Some(64), "--ttl {ttl}: {text}");
        assert!(text.contains("outside the allowed range"), "{text}");
        assert!(
            !text.contains("refused"),
            "connected before refusing: {text}"
        );
    }
}

#[test]
fn an_empty_url_is_a_configuration_error_not_the_default_store() {
    let home = tempfile::tempdir().unwrap();
    for (flag, env) in [(Some(""), None), (None, Some("")), (Some("  "), None)] {
        let mut cmd = dlock();
        cmd.env("HOME", home.path()).env_remove("XDG_STATE_HOME");
        cmd.arg("run");
        if let Some(url) = flag {
            cmd.args(["--url", url]);
        }
        if let Some(url) = env {
            cmd.env("DLOCK_URL", url);
        }
        cmd.args(["--name", "x", "--", "true"]);
        let o = run(&mut cmd);
        assert_eq!(o.status.code(), Some(78), "{}", text(&o));
        assert!(text(&o).contains("URL is empty"), "{}", text(&o));
    }
    assert!(
        !home.path().join(".local/state/dlock/locks.db").exists(),
        "the default store was created for an empty URL"
    );
}

#[test]
fn a_closed_sql_port_says_connection_refused_at_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for url in [
        "postgres://u@127.0.0.1:1/db?timeout=30s",
        "mysql://u@127.0.0.1:1/db?timeout=30s",
    ] {
        let e = rt
            .block_on(async {
                // A hang guard only: the pool's timeout is 30 s, so a message that says
                // "refused" came from the first attempt, not from waiting it out.
                tokio::time::timeout(Duration::from_secs(60), dlock::connect(url)).await
            })
            .expect("connect returned")
            .expect_err("nothing listens on port 1");
        let text = e.to_string().to_lowercase();
        assert!(text.contains("refused"), "{url}: {e}");
        assert!(!text.contains("pool timed out"), "{url}: {e}");
        assert!(e.is_retryable(), "a refused connection may work later: {e}");
    }
}

#[test]
fn logs_written_to_a_pipe_have_no_colour_escapes() {
    let o = run(dlock().args([
        "-vv",
        "run",
        "--url",
        "memory://colour",
        "--name",
        "x",
        "--",
        "true",
    ]));
    assert_eq!(o.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("lock acquired"),
        "-vv logs nothing: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes in a pipe: {stderr:?}"
    );
}
