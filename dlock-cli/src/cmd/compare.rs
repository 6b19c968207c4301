//! `dlock compare`: every backend side by side on the same cases, faults and benchmark.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use conformance_tests::spawn::SpawnName;
use dlock_cli::compare::{self, CompareOptions, Source, Status, render};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::signal::unix::SignalKind;

use crate::args::parse_duration;
use crate::exit;

#[derive(Debug, Args)]
pub(crate) struct CompareArgs {
    /// Backends to start with the test kit, comma-separated: sqlite, postgres, mariadb, redis,
    /// redis-cluster, redlock-3, redlock-5, tair, zk, zk-ensemble, dual [default: all of
    /// them, unless --url is given].
    ///
    /// The servers listen on 127.0.0.1 and keep their data in temp dirs only you can enter.
    /// PostgreSQL, MariaDB and Redis admit only a password generated for the run, which is never
    /// printed and only your user can read. ZooKeeper has no authentication: any local user can
    /// connect to it while it runs.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_spawn)]
    pub(crate) spawn: Vec<SpawnName>,

    /// An existing store to add (repeatable). Its fault scenarios show as "needs --spawn":
    /// breaking servers needs servers dlock started.
    #[arg(long, value_name = "URL")]
    pub(crate) url: Vec<String>,

    /// Shorter benchmarks (1 s a phase instead of 5 s) and more cases at once: about a
    /// minute for sqlite, redis and zk.
    #[arg(long)]
    pub(crate) quick: bool,

    /// Where to write report.json, report.md and report.html (created if missing).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub(crate) out: PathBuf,

    /// How many cases or fault scenarios of one backend run at once [default: 2; 4 with
    /// --quick]. 1 is slowest and gives the timing-sensitive cases the machine to themselves.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) jobs: Option<u64>,

    /// How long one case or fault scenario may run before it counts as failed.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub(crate) case_timeout: Duration,
}

fn parse_spawn(s: &str) -> Result<SpawnName, String> {
    s.trim().parse()
}

/// Entry point; returns the process exit code.
pub async fn main(args: CompareArgs) -> u8 {
    let mut sources: Vec<Source> = Vec::new();
    let mut seen = Vec::new();
    for name in &args.spawn {
        if !seen.contains(name) {
            seen.push(*name);
            sources.push(Source::Spawn(*name));
        }
    }
    for url in &args.url {
        if url.trim().is_empty() {
            eprintln!("dlock: --url is empty");
            return exit::USAGE;
        }
        // A malformed URL or an unknown scheme is refused here, before any file or server.
        if let Err(e) = dlock::native_primitives(url) {
            eprintln!("dlock: --url {}: {e}", dlock::redact(url));
            return exit::for_error(&e);
        }
        sources.push(Source::Url(url.clone()));
    }
    if sources.is_empty() {
        sources = SpawnName::ALL.iter().map(|n| Source::Spawn(*n)).collect();
    }
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("dlock: cannot create {}: {e}", args.out.display());
        return exit::CANNOT_CREATE;
    }
    let mut options = CompareOptions::new(sources);
    options.quick = args.quick;
    options.case_timeout = args.case_timeout;
    options.jobs = args.jobs.map(|n| n as usize);
    eprintln!(
        "dlock compare: {} backend(s){}; reports go to {}",
        options.sources.len(),
        if args.quick { ", quick" } else { "" },
        args.out.display()
    );
    let terminal = std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if !terminal {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let progress = Arc::new(Reporter {
        bar: bar.clone(),
        terminal,
        last: Mutex::new((String::new(), String::new(), Instant::now())),
    });
    let watcher = progress.clone();
    // A failing case panics in its own task, and its message is in the report: keep the
    // default hook's output off the terminal.
    // Listening before anything starts: a Ctrl-C that comes while the first server starts is
    // not lost (`ctrl_c()` would listen only once first polled).
    let mut interrupt = match tokio::signal::unix::signal(SignalKind::interrupt()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dlock: cannot listen for Ctrl-C: {e}");
            return exit::SOFTWARE;
        }
    };
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let run = compare::run(&options, Arc::new(move |s: &Status| watcher.show(s)));
    let report = tokio::select! {
        report = run => report,
        _ = interrupt.recv() => {
            std::panic::set_hook(previous);
            bar.finish_and_clear();
            // The run's future is dropped here: its cases stop and the kit's servers are killed.
            eprintln!("dlock compare: interrupted; the servers it started are stopped, no report written");
            return 130;
        }
    };
    std::panic::set_hook(previous);
    bar.finish_and_clear();
    let paths = match render::write(&report, &args.out) {
        Ok(paths) => paths,
        Err(e) => {
            eprintln!(
                "dlock: cannot write the report to {}: {e}",
                args.out.display()
            );
            return exit::CANNOT_CREATE;
        }
    };
    print!("{}", render::table(&report));
    for path in paths {
        println!("report: {}", path.display());
    }
    match report.outcome() {
        compare::RunOutcome::Clean => exit::OK,
        compare::RunOutcome::Problems => exit::VIOLATION,
        compare::RunOutcome::Unmeasured => exit::UNAVAILABLE,
    }
}

/// Draws the status: an updating line on a terminal; in a log, one line when a backend starts
/// or its phase changes kind (cases, bench), and every 10 s.
struct Reporter {
    bar: ProgressBar,
    terminal: bool,
    last: Mutex<(String, String, Instant)>,
}

impl Reporter {
    fn show(&self, s: &Status) {
        let left = humantime::format_duration(Duration::from_secs(s.left.as_secs()));
        let line = format!(
            "[{}/{}] {}: {} (~{left} left)",
            s.index, s.of, s.backend, s.phase
        );
        if self.terminal {
            self.bar.set_message(line);
            return;
        }
        let kind = s.phase.split(' ').next().unwrap_or("").to_owned();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.0 != s.backend || last.1 != kind || last.2.elapsed() >= Duration::from_secs(10) {
            *last = (s.backend.clone(), kind, Instant::now());
            eprintln!("dlock compare: {line}");
        }
    }
}
