//! `dlock`: run a command under a distributed lock, inspect a lock, benchmark a lock store.
//!
//! Every exit code is listed in `dlock --help` and in the crate README.

mod args;
mod cmd;
mod exit;
mod store;
mod sys;

use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

/// Distributed locks from the command line: run a command under a lock, show who holds one,
/// benchmark a lock store.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = exit::ALL, propagate_version = true)]
struct Cli {
    /// More logging on stderr: -v info, -vv debug, -vvv trace (default: warnings only;
    /// without -v, RUST_LOG is used when set).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lock; the lock is released when it exits.
    ///
    /// The command gets DLOCK_FENCING_TOKEN (the acquisition's fencing token, a decimal number
    /// that grows with every acquisition of the name) and DLOCK_LOCK_NAME in its environment.
    /// The lease is renewed in the background (at ttl/3) while the command runs. If renewals
    /// fail, the command (with the processes it started) gets SIGTERM and then SIGKILL before
    /// the lease ends (see --grace), and dlock exits 76. SIGINT,
    /// SIGTERM and SIGHUP sent to dlock are forwarded to the command (a Ctrl-C typed at the
    /// terminal already reaches it and is not sent twice); dlock waits for it (SIGKILL after
    /// --grace), releases the lock and exits with the command's own status (128+N if signal N
    /// ended it). Interrupted while still waiting for the lock, dlock exits 128+signal.
    #[command(after_help = exit::ALL)]
    Run(cmd::run::RunArgs),
    /// Show who holds a lock, its fencing token and time left, or that it is free / never used.
    #[command(after_help = exit::ALL)]
    Status(cmd::status::StatusArgs),
    /// Measure a lock store: uncontended pairs against its raw floor, and contention.
    #[command(after_help = exit::ALL)]
    Bench(cmd::bench::BenchArgs),
    /// Run the shared conformance suite against a store: does my deployment behave?
    ///
    /// Runs every case the store's capabilities admit, one after another, under lock names
    /// unique to the run (dlock-check/<random>/...), releases everything it took, and prints
    /// one row per case: pass, FAIL with the message, or n/a with the reason (beside the one
    /// dlock's own tests pin for a store of the same kind). Fault scenarios
    /// (servers killed, paused, cut off) need a server dlock starts itself, so here they are
    /// listed as "needs --spawn". Exit code 1 when any case fails.
    #[command(after_help = exit::ALL)]
    Check(cmd::check::CheckArgs),
    /// Move locks from one store to another (ZooKeeper to Redis) through dual:// clients.
    ///
    /// `check` shows, per lock name, who holds it on each store and in which mode (dual,
    /// source-only, target-only) and whether the tokens are ordered for the next phase;
    /// `prepare` moves the target store's counters up to the source's tokens (run it before
    /// the first dual client starts, and again before the first target-only client). The
    /// README's migration guide walks through the phases.
    #[command(subcommand)]
    Migrate(cmd::migrate::MigrateCommand),
    /// Random faults for minutes on a store dlock starts itself, judged on the recorded history.
    ///
    /// Clients contend on a few names and write through one fenced resource per name while a
    /// nemesis kills, pauses and restarts the server, blackholes and delays links, freezes
    /// clients and ends sessions, alone or up to three at once, for durations around the ttl.
    /// At the end: no two holders' validity windows may overlap, tokens must grow, no write
    /// made within its lease may be refused, nothing may be left held. Writes soak.json; exit
    /// code 1 on any anomaly. The seed reproduces the fault schedule.
    #[command(after_help = exit::ALL)]
    Soak(cmd::soak::SoakArgs),
    /// Every backend side by side: the same cases, fault scenarios and benchmark, one report.
    ///
    /// For each backend (--spawn starts throwaway servers with the test kit and stops them
    /// afterwards, also on Ctrl-C; --url adds existing stores): its capability sheet, every
    /// conformance case, every fault scenario with its verdict (safe; documented unsafe and
    /// observed as documented; violation), and the benchmark (uncontended pairs against the
    /// raw floor, 8 contending clients). Writes report.json, report.md and report.html (charts
    /// inline, opens from disk) to --out and prints the summary table. Exit code 1 when a case
    /// fails or a scenario shows a violation; 69 when a backend could not be started or
    /// reached (the others still run).
    #[command(after_help = exit::ALL)]
    Compare(cmd::compare::CompareArgs),
}

/// Logs on stderr. Colour only when stderr is a terminal and `NO_COLOR` is unset or empty.
/// `quiet` (for `check` and `soak`, which lose locks on purpose) keeps the default level at
/// errors.
fn init_tracing(verbose: u8, quiet: bool) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let default = if quiet { "error" } else { "warn" };
    let filter = match (verbose, std::env::var("RUST_LOG")) {
        (0, Ok(spec)) if !spec.trim().is_empty() => {
            EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new(default))
        }
        (0, _) => EnvFilter::new(default),
        (1, _) => EnvFilter::new("info"),
        (2, _) => EnvFilter::new("debug"),
        _ => EnvFilter::new("trace"),
    };
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .init();
}

/// The clap command, with the default store location filled into the help of run and status.
fn command() -> clap::Command {
    let long = format!("{}\n\n{}", store::help_text(), exit::ALL);
    Cli::command()
        .mut_subcommand("run", |c| c.after_long_help(long.clone()))
        .mut_subcommand("status", |c| c.after_long_help(long.clone()))
}

/// How long dlock waits on exit for clean-ups still on their way to the store.
const CLEANUP_LIMIT: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    // `dlock compare`'s holder_process_killed scenario runs this binary again as the holder,
    // and `dlock bench --processes` as each contended client; each role is chosen by a hidden
    // first argument, never by the environment alone.
    if let Some(code) = dlock_cli::compare::holder_child() {
        return code;
    }
    if let Some(code) = dlock_cli::bench::client_child() {
        return code;
    }
    let matches = match command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(exit::USAGE);
        }
    };
    init_tracing(
        cli.verbose,
        matches!(
            cli.command,
            Command::Check(_) | Command::Soak(_) | Command::Compare(_)
        ),
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => cmd::run::main(args).await,
            Command::Status(args) => cmd::status::main(args).await,
            Command::Bench(args) => cmd::bench::main(args).await,
            Command::Check(args) if args.list => cmd::check::list(),
            Command::Soak(args) => cmd::soak::main(args).await,
            Command::Compare(args) => cmd::compare::main(args).await,
            Command::Check(mut args) => {
                args.verbose = cli.verbose;
                cmd::check::main(args).await
            }
            Command::Migrate(cmd::migrate::MigrateCommand::Check(args)) => {
                cmd::migrate::check(args).await
            }
            Command::Migrate(cmd::migrate::MigrateCommand::Prepare(args)) => {
                cmd::migrate::prepare(args).await
            }
        }
    });
    // Clean-ups of an interrupted acquire or a dropped guard (a queue entry, a node) get a
    // moment to reach the store; then stray background tasks (a keep-alive) are not waited for.
    runtime.block_on(async {
        if !dlock::cleanup::settle(CLEANUP_LIMIT).await {
            tracing::warn!(
                pending = dlock::cleanup::pending(),
                "clean-up did not finish within {CLEANUP_LIMIT:?}; what it left ends at its ttl or session"
            );
        }
    });
    runtime.shutdown_background();
    ExitCode::from(code)
}
