//! Running the `dlock` binary, for the CLI tests against kit servers, and waiting for what it
//! does without hanging.
// Each test binary uses part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a CLI test waits for something before it fails instead of hanging: a guard, not a
/// timing goal (those are `dlock bench`'s).
pub const HANG: Duration = Duration::from_secs(60);

/// Calls `check` until it answers `Ok`, and returns that. A test that would otherwise hang
/// fails after [`HANG`] with `what` and the last `Err` (what was seen instead).
pub fn eventually<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let give_up = Instant::now() + HANG;
    loop {
        match check() {
            Ok(done) => return done,
            Err(seen) if Instant::now() >= give_up => panic!("{what}: still {seen}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Waits until `path` exists (a command's "started" file); see [`eventually`].
pub fn wait_for_file(path: &Path) {
    eventually(&format!("{} to appear", path.display()), || {
        path.exists()
            .then_some(())
            .ok_or_else(|| "missing".to_owned())
    });
}

/// `dlock` with no store (`DLOCK_URL`, or the default file's place `XDG_STATE_HOME`), log level,
/// colour setting or stdin inherited from the environment.
pub fn dlock() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env_remove("DLOCK_URL")
        .env_remove("XDG_STATE_HOME")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    c
}

/// Runs `cmd` with no stdin and collects its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("dlock runs")
}

/// Stdout then stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A runtime to start kit servers and call the library on.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// `url` percent-encoded as a query value (for `dual://?first=...&second=...`).
pub fn enc(url: &str) -> String {
    dlock::percent_encode(url)
}

/// Fails when `text` holds a URL password of the kind the test kit generates (`:` 32 hex
/// digits `@`): what `--spawn` started must never show its credentials.
pub fn assert_no_kit_password(text: &str) {
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices(':') {
        let secret = bytes.get(i + 1..i + 33);
        if secret.is_some_and(|s| s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            && bytes.get(i + 33) == Some(&b'@')
        {
            panic!("a password shows at byte {i}:\n{text}");
        }
    }
}
