//! `dlock check`: does my deployment behave? The shared conformance suite against a store.

use std::io::IsTerminal as _;
use std::time::Duration;

use dlock::redact;
use dlock_cli::check::{self, CheckOptions, CheckRun};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use clap::Args;

use crate::args::parse_duration;
use crate::exit;

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// Lock store URL to check (required: the check writes locks under its own names there).
    #[arg(
        long,
        env = "DLOCK_URL",
        hide_env_values = true,
        value_name = "URL",
        required_unless_present = "list"
    )]
    pub(crate) url: Option<String>,

    /// Only the cases whose name matches this regular expression (e.g. 'fencing|expiry').
    #[arg(long, value_name = "REGEX")]
    pub(crate) cases: Option<String>,

    /// How long one case may run before it counts as failed.
    #[arg(long, value_name = "DURATION", default_value = "180s", value_parser = parse_duration)]
    pub(crate) case_timeout: Duration,

    /// Print the run as JSON (every case with its outcome and duration; no progress bar).
    #[arg(long)]
    pub(crate) json: bool,

    /// List the cases and fault scenarios with what each needs, and exit.
    #[arg(long)]
    pub(crate) list: bool,

    #[arg(skip)]
    pub(crate) verbose: u8,
}

/// The `--json` output.
#[derive(Serialize)]
struct CheckJson<'a> {
    url: String,
    #[serde(flatten)]
    run: &'a CheckRun,
}

/// Entry point; returns the process exit code.
pub async fn main(args: CheckArgs) -> u8 {
    let cases = match args.cases.as_deref().map(regex::Regex::new).transpose() {
        Ok(re) => re,
        Err(e) => {
            eprintln!("dlock: --cases is not a valid regular expression: {e}");
            return exit::USAGE;
        }
    };
    let options = CheckOptions {
        cases,
        case_timeout: args.case_timeout,
        jobs: 1,
    };
    let total = check::selected(&options).len();
    if total == 0 {
        eprintln!(
            "dlock: --cases {:?} matches no case; `dlock check --list` shows them",
            args.cases.unwrap_or_default()
        );
        return exit::USAGE;
    }
    let Some(url) = args.url.filter(|u| !u.trim().is_empty()) else {
        eprintln!("dlock: check needs --url (or DLOCK_URL): the store to check");
        return exit::USAGE;
    };
    let shown = redact(&url);
    let client = match dlock::connect(&url).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dlock: cannot connect to {shown}: {e}");
            return exit::for_error(&e);
        }
    };
    let label = client.capabilities().backend;
    let target = check::target_for_url(&url, label);
    if !args.json {
        eprintln!(
            "dlock check: {total} case(s) against {shown} ({}), names under {}/",
            client.capabilities(),
            target.name_prefix()
        );
    }
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    if args.json || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    // A failing case panics; its message is in the report, so keep the default hook's
    // backtrace noise off the terminal (unless -v asked for detail).
    let quiet = args.verbose == 0;
    let previous = quiet.then(std::panic::take_hook);
    if quiet {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let run = check::run(&target, &client, &options, |done, _, report| {
        bar.set_position(done as u64);
        bar.set_message(report.case.clone());
        if check::is_failure(report) {
            bar.println(format!("FAIL {}", report.case));
        }
    })
    .await;
    if let Some(hook) = previous {
        std::panic::set_hook(hook);
    }
    bar.finish_and_clear();
    if args.json {
        let out = CheckJson {
            url: shown,
            run: &run,
        };
        if let Err(code) = exit::print_json(&out) {
            return code;
        }
    } else {
        print!("{}", check::render(&run));
    }
    if run.ok() { exit::OK } else { exit::VIOLATION }
}

/// `dlock check --list`: every case and fault scenario, with what it needs.
pub fn list() -> u8 {
    for case in conformance_tests::registry() {
        let kind = match case.kind {
            conformance_tests::Kind::Case => "case ",
            conformance_tests::Kind::Fault => "fault",
        };
        println!("{kind}  {:48}  needs {}", case.name, case.needs.label);
    }
    exit::OK
}
