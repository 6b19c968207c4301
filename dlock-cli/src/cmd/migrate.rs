//! `dlock migrate check|prepare`: the ZooKeeper → Redis (or any store → any store) migration
//! tools. The work is in `dlock::migrate`; this prints it.

use std::sync::Arc;

use dlock::migrate::{self, Mode, Prepared};
use dlock::{DistributedLock, LockName, redact};
use serde::Serialize;

use clap::{Args, Subcommand};

use crate::exit;

/// `dlock migrate` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum MigrateCommand {
    /// Report what each store holds and whether tokens are ordered for the next phase.
    /// Exit code 1 when a name is held by different owners on the two stores.
    #[command(after_help = exit::ALL)]
    Check(MigrateArgs),
    /// Carry the target store's counters up to the source store's tokens.
    #[command(after_help = exit::ALL)]
    Prepare(PrepareArgs),
}

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The store clients are moving from, e.g. zk://host:2181/app.
    #[arg(long, value_name = "URL")]
    pub(crate) from: String,

    /// The store clients are moving to, e.g. redis://host:6379.
    #[arg(long, value_name = "URL")]
    pub(crate) to: String,

    /// A lock name to include (repeatable); names either store can list are always included.
    #[arg(long = "name", value_name = "NAME")]
    pub(crate) names: Vec<String>,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PrepareArgs {
    #[command(flatten)]
    pub(crate) common: MigrateArgs,

    /// Show what would be raised without changing anything.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// Both stores connected and the names to look at, or an exit code after saying why not.
async fn open(
    args: &MigrateArgs,
) -> Result<
    (
        Arc<dyn DistributedLock>,
        Arc<dyn DistributedLock>,
        Vec<LockName>,
    ),
    u8,
> {
    let mut extra = Vec::new();
    for n in &args.names {
        match LockName::new(n) {
            Ok(n) => extra.push(n),
            Err(e) => {
                eprintln!("dlock: {e}");
                return Err(exit::USAGE);
            }
        }
    }
    for url in [&args.from, &args.to] {
        if let Err(e) = dlock::scheme_of(url) {
            eprintln!("dlock: {e}");
            return Err(exit::USAGE);
        }
    }
    let mut stores = Vec::new();
    for (role, url) in [("--from", &args.from), ("--to", &args.to)] {
        match dlock::connect(url).await {
            Ok(s) => stores.push(s),
            Err(e) => {
                eprintln!("dlock: cannot connect to {role} {}: {e}", redact(url));
                return Err(exit::for_error(&e));
            }
        }
    }
    let target = stores.pop().expect("two stores");
    let source = stores.pop().expect("two stores");
    let (names, notes) = match migrate::names_of(&source, &target, &extra).await {
        Ok(found) => found,
        Err(e) => {
            eprintln!("dlock: cannot list lock names: {e}");
            return Err(exit::for_error(&e));
        }
    };
    for note in notes {
        eprintln!("dlock: note: {note}");
    }
    Ok((source, target, names))
}

#[derive(Serialize)]
struct CheckJson<'a> {
    from: String,
    to: String,
    #[serde(flatten)]
    report: &'a migrate::CheckReport,
}

/// `dlock migrate check`.
pub async fn check(args: MigrateArgs) -> u8 {
    let (source, target, names) = match open(&args).await {
        Ok(v) => v,
        Err(code) => return code,
    };
    let report = match migrate::check(&source, &target, &names).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dlock: {e}");
            return exit::for_error(&e);
        }
    };
    let code = if report.count(Mode::Split) > 0 {
        exit::VIOLATION
    } else {
        exit::OK
    };
    if args.json {
        let out = CheckJson {
            from: redact(&args.from),
            to: redact(&args.to),
            report: &report,
        };
        if let Err(code) = exit::print_json(&out) {
            return code;
        }
        return code;
    }
    println!(
        "from {} ({})  to {} ({})",
        redact(&args.from),
        report.source_backend,
        redact(&args.to),
        report.target_backend
    );
    let width = report
        .names
        .iter()
        .map(|n| n.name.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:width$}  {:11}  {:44}  {:44}  NEXT PHASE",
        "NAME", "MODE", "SOURCE", "TARGET"
    );
    for n in &report.names {
        let next = match (n.ready_for_dual, n.ready_for_target_only) {
            (true, true) => "tokens ordered",
            (true, false) => "dual ok; prepare before target-only",
            (false, true) => "target ahead: no source-only clients",
            (false, false) => "?",
        };
        println!(
            "{:width$}  {:11}  {:44}  {:44}  {next}",
            n.name,
            n.mode.as_str(),
            n.source.describe(),
            n.target.describe()
        );
    }
    println!(
        "{} name(s): {} dual, {} source-only, {} target-only, {} split, {} free",
        report.names.len(),
        report.count(Mode::Dual),
        report.count(Mode::SourceOnly),
        report.count(Mode::TargetOnly),
        report.count(Mode::Split),
        report.count(Mode::Free)
    );
    for w in &report.warnings {
        println!("warning: {w}");
    }
    code
}

#[derive(Serialize)]
struct PrepareJson<'a> {
    from: String,
    to: String,
    dry_run: bool,
    names: &'a [migrate::PrepareReport],
}

/// `dlock migrate prepare`.
pub async fn prepare(args: PrepareArgs) -> u8 {
    let (source, target, names) = match open(&args.common).await {
        Ok(v) => v,
        Err(code) => return code,
    };
    let done = match migrate::prepare(&source, &target, &names, args.dry_run).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("dlock: {e}");
            return exit::for_error(&e);
        }
    };
    if args.common.json {
        let out = PrepareJson {
            from: redact(&args.common.from),
            to: redact(&args.common.to),
            dry_run: args.dry_run,
            names: &done,
        };
        if let Err(code) = exit::print_json(&out) {
            return code;
        }
        return exit::OK;
    }
    let mut held = 0;
    for r in &done {
        let line = match r.outcome {
            Prepared::Raised { from, to } => format!("raised counter {from} -> {to}"),
            Prepared::WouldRaise { from, to } => format!("would raise counter {from} -> {to}"),
            Prepared::AlreadyAhead { counter } => format!("already at {counter}"),
            Prepared::NothingToCarry => "no token on the source".to_owned(),
            Prepared::Held => {
                held += 1;
                "held on the target; left alone (run prepare again later)".to_owned()
            }
        };
        println!("{}: {line}", r.name);
    }
    println!(
        "{} name(s){}",
        done.len(),
        if args.dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        }
    );
    if held > 0 {
        println!("warning: {held} name(s) were held on the target and not raised");
    }
    exit::OK
}
