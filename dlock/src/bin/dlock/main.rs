//! `dlock`: run a command under a distributed lock, inspect a lock, benchmark a lock store.
//!
//! Every exit code is listed in `dlock --help` and in the crate README.

mod bench_cmd;
mod check_cmd;
mod exit;
mod migrate_cmd;
mod run;
mod status;
mod store;
mod sys;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use dlock::Wait;

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
    /// The lease is renewed in the background (at ttl/3) while the command runs. If the lock is
    /// lost, the command gets SIGTERM, then SIGKILL after --grace, and dlock exits 76. SIGINT,
    /// SIGTERM and SIGHUP sent to dlock are forwarded to the command (a Ctrl-C typed at the
    /// terminal already reaches it and is not sent twice); dlock waits for it (SIGKILL after
    /// --grace), releases the lock and exits 128+signal.
    #[command(after_help = exit::ALL)]
    Run(RunArgs),
    /// Show who holds a lock, its fencing token and time left, or that it is free / never used.
    #[command(after_help = exit::ALL)]
    Status(StatusArgs),
    /// Measure a lock store: uncontended pairs against its raw floor, and contention.
    #[command(after_help = exit::ALL)]
    Bench(BenchArgs),
    /// Run the shared conformance suite against a store: does my deployment behave?
    ///
    /// Runs every case the store's capabilities admit, one after another, under lock names
    /// unique to the run (dlock-check/<random>/...), releases everything it took, and prints
    /// one row per case: pass, FAIL with the message, or n/a with the reason. Fault scenarios
    /// (servers killed, paused, cut off) need a server dlock starts itself, so here they are
    /// listed as "needs --spawn". Exit code 1 when any case fails.
    #[command(after_help = exit::ALL)]
    Check(CheckArgs),
    /// Move locks from one store to another (ZooKeeper to Redis) through dual:// clients.
    ///
    /// `check` shows, per lock name, who holds it on each store and in which mode (dual,
    /// source-only, target-only) and whether the tokens are ordered for the next phase;
    /// `prepare` moves the target store's counters up to the source's tokens (run it before
    /// the first dual client starts, and again before the first target-only client). The
    /// README's migration guide walks through the phases.
    #[command(subcommand)]
    Migrate(MigrateCommand),
}

/// `dlock migrate` subcommands.
#[derive(Debug, Subcommand)]
enum MigrateCommand {
    /// Report what each store holds and whether tokens are ordered for the next phase.
    /// Exit code 1 when a name is held by different owners on the two stores.
    #[command(after_help = exit::ALL)]
    Check(MigrateArgs),
    /// Carry the target store's counters up to the source store's tokens.
    #[command(after_help = exit::ALL)]
    Prepare(PrepareArgs),
}

#[derive(Debug, Args)]
struct MigrateArgs {
    /// The store clients are moving from, e.g. zk://host:2181/app.
    #[arg(long, value_name = "URL")]
    from: String,

    /// The store clients are moving to, e.g. redis://host:6379.
    #[arg(long, value_name = "URL")]
    to: String,

    /// A lock name to include (repeatable); names either store can list are always included.
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,

    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PrepareArgs {
    #[command(flatten)]
    common: MigrateArgs,

    /// Show what would be raised without changing anything.
    #[arg(long)]
    dry_run: bool,
}

/// Where the locks live (run and status).
#[derive(Debug, Args)]
struct StoreArg {
    /// Lock store URL, e.g. redis://host:6379, postgres://user:pass@host/db, memory://x.
    /// Default: $DLOCK_URL, else a per-user SQLite file (shown below).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true, value_name = "URL")]
    url: Option<String>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    store: StoreArg,

    /// Lock name (any UTF-8 up to 1024 bytes without NUL; case-sensitive).
    #[arg(long, value_name = "NAME")]
    name: String,

    /// Lease ttl, 10ms ..= 7d; renewed at ttl/3 while the command runs [default: the URL's ttl
    /// option, else 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
    ttl: Option<Duration>,

    /// How long to wait for a lock held by someone else: 0, a duration (10s, 500ms) or forever.
    #[arg(long, value_name = "0|DURATION|forever", default_value = "forever", value_parser = parse_wait)]
    wait: Wait,

    /// After SIGTERM (lock lost, or dlock interrupted), how long the command has before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    grace: Duration,

    /// The command and its arguments (put them after `--`).
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    store: StoreArg,

    /// Lock name.
    #[arg(value_name = "NAME")]
    name: String,

    /// Print JSON instead of a sentence.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    Uncontended,
    Contended,
    All,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Lock store URL (required here so a benchmark never writes into the default per-user store).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true, value_name = "URL")]
    url: String,

    /// Which measurements to run.
    #[arg(long, value_enum, default_value_t = ModeArg::All)]
    mode: ModeArg,

    /// Measured time per phase.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    duration: Duration,

    /// Unmeasured warm-up before each phase.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,

    /// Contending clients, each with its own connection.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    clients: u16,

    /// How long each contended acquisition holds the lock.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = parse_duration)]
    hold: Duration,

    /// Lock name prefix [default: dlock-bench/<random>].
    #[arg(long, value_name = "PREFIX")]
    name: Option<String>,

    /// Print the report as JSON (no progress bar).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// Lock store URL to check (required: the check writes locks under its own names there).
    #[arg(
        long,
        env = "DLOCK_URL",
        hide_env_values = true,
        value_name = "URL",
        required_unless_present = "list"
    )]
    url: Option<String>,

    /// Only the cases whose name matches this regular expression (e.g. 'fencing|expiry').
    #[arg(long, value_name = "REGEX")]
    cases: Option<String>,

    /// How long one case may run before it counts as failed.
    #[arg(long, value_name = "DURATION", default_value = "180s", value_parser = parse_duration)]
    case_timeout: Duration,

    /// Print the run as JSON (every case with its outcome and duration; no progress bar).
    #[arg(long)]
    json: bool,

    /// List the cases and fault scenarios with what each needs, and exit.
    #[arg(long)]
    list: bool,

    #[arg(skip)]
    verbose: u8,
}

fn parse_duration(text: &str) -> Result<Duration, dlock::Error> {
    dlock::parse_duration("duration", text)
}

/// A duration within the ttl bounds, refused before anything connects.
fn parse_ttl(text: &str) -> Result<Duration, dlock::Error> {
    let ttl = parse_duration(text)?;
    dlock::check_ttl(ttl)?;
    Ok(ttl)
}

fn parse_wait(text: &str) -> Result<Wait, dlock::Error> {
    Wait::parse(text)
}

/// Logs on stderr. Colour only when stderr is a terminal and `NO_COLOR` is unset or empty.
/// `quiet` (for `check`, whose cases lose locks on purpose) keeps the default level at errors.
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

fn main() -> ExitCode {
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
    init_tracing(cli.verbose, matches!(cli.command, Command::Check(_)));
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
            Command::Run(args) => run::main(args).await,
            Command::Status(args) => status::main(args).await,
            Command::Bench(args) => bench_cmd::main(args).await,
            Command::Check(args) if args.list => check_cmd::list(),
            Command::Check(mut args) => {
                args.verbose = cli.verbose;
                check_cmd::main(args).await
            }
            Command::Migrate(MigrateCommand::Check(args)) => migrate_cmd::check(args).await,
            Command::Migrate(MigrateCommand::Prepare(args)) => migrate_cmd::prepare(args).await,
        }
    });
    // Do not wait for stray background tasks (e.g. a keep-alive) when leaving.
    runtime.shutdown_background();
    ExitCode::from(code)
}
