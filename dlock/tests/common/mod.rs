//! Running the `dlock` binary, for the CLI tests against kit servers.

use std::process::{Command, Output, Stdio};

/// `dlock` with no store or log level inherited from the environment.
pub fn dlock() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env_remove("DLOCK_URL").env_remove("RUST_LOG");
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

/// `url` percent-encoded as a query value (for `dual://?first=...&second=...`).
#[allow(dead_code)]
pub fn enc(url: &str) -> String {
    dlock::percent_encode(url)
}
