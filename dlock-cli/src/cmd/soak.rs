//! `dlock soak`: random faults for minutes on a store dlock starts itself, judged on the recorded
//! history.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use conformance_tests::Persistence;
use conformance_tests::spawn::{SpawnName, Stack};
use dlock_cli::soak::{self, FaultKind, SoakOptions, SoakProgress, SoakReport, Store};

use crate::args::parse_duration;
use crate::exit;

#[derive(Debug, Args)]
pub(crate) struct SoakArgs {
    /// The backend to start with the test kit: sqlite, postgres, mariadb, redis, redis-cluster,
    /// redlock-3, redlock-5, tair, zk, zk-ensemble or dual (ZooKeeper first, Redis second).
    ///
    /// The servers listen on 127.0.0.1 and keep their data in temp dirs only you can enter.
    /// PostgreSQL, MariaDB and Redis admit only a password generated for the run, which is never
    /// printed and only your user can read. ZooKeeper has no authentication: any local user can
    /// connect to it while it runs.
    #[arg(long, value_name = "BACKEND", value_parser = parse_spawn)]
    pub(crate) spawn: SpawnName,

    /// How long the clients contend.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub(crate) duration: Duration,

    /// Contending clients (each a thread with its own connections).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) clients: usize,

    /// Lock names they share.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) names: usize,

    /// Faults to apply, comma-separated: kill, pause, blackhole, delay, restart, client-pause,
    /// session-kill [default: every one the backend can take].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_fault)]
    pub(crate) faults: Vec<FaultKind>,

    /// Seed of every random choice (printed, and in soak.json, to run the schedule again)
    /// [default: from the clock].
    #[arg(long, value_name = "N")]
    pub(crate) seed: Option<u64>,

    /// Lease ttl (on ZooKeeper also the session timeout).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// Start the Redis servers of a Redis-based backend without persistence: a kill or restart
    /// then empties them, which the backend is documented not to survive safely, and what it
    /// does is reported as documented, not as anomalies.
    #[arg(long)]
    pub(crate) no_persistence: bool,

    /// Where to write soak.json (created if missing) [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

fn parse_spawn(s: &str) -> Result<SpawnName, String> {
    s.parse()
}

fn parse_fault(s: &str) -> Result<FaultKind, String> {
    s.parse()
}

/// Entry point; returns the process exit code.
pub async fn main(args: SoakArgs) -> u8 {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let opts = SoakOptions {
        duration: args.duration,
        clients: args.clients,
        names: args.names,
        faults: args.faults.clone(),
        seed,
        ttl: args.ttl,
    };
    if let Err(why) = opts.validate() {
        eprintln!("dlock: {why}");
        return exit::USAGE;
    }
    let out_dir = args.out.clone().unwrap_or_else(|| PathBuf::from("."));
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        eprintln!("dlock: cannot create {}: {e}", out_dir.display());
        return exit::CANNOT_CREATE;
    }
    eprintln!("dlock soak: starting {} (seed {seed})", args.spawn);
    let persistence = if args.no_persistence {
        if !args.spawn.redis_based() {
            eprintln!(
                "dlock: --no-persistence is for the Redis-based backends (redis, redis-cluster, \
                 redlock-3, redlock-5, tair); {} always persists",
                args.spawn
            );
            return exit::USAGE;
        }
        Persistence::None
    } else {
        Persistence::Durable
    };
    let stack = match Stack::start_with(args.spawn, opts.clients, persistence).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dlock: cannot start {}: {e}", args.spawn);
            return exit::UNAVAILABLE;
        }
    };
    let store = Store::of_stack(&stack);
    let kinds = match store.faults_for(&opts.faults) {
        Ok(kinds) => kinds,
        Err(e) => {
            eprintln!("dlock: {e}");
            return exit::USAGE;
        }
    };
    let names: Vec<_> = kinds.iter().map(|k| k.as_str()).collect();
    eprintln!(
        "dlock soak: {} clients on {} names for {}, ttl {}, faults {}",
        opts.clients,
        opts.names,
        humantime::format_duration(opts.duration),
        humantime::format_duration(opts.ttl),
        names.join(",")
    );
    let terminal = std::io::stderr().is_terminal();
    let seen = AtomicU64::new(0);
    let progress = move |p: &SoakProgress| {
        let secs = p.elapsed.as_secs();
        // The checker runs over the history so far every second: say at once when it finds
        // something (the end judges it against the declared faults).
        if p.suspicious > seen.swap(p.suspicious, Ordering::Relaxed) {
            if terminal {
                eprintln!();
            }
            eprintln!(
                "dlock soak: at {secs}s the history so far has {} overlap(s) or token \
                 reversal(s); the end judges them against the faults the store declares unsafe",
                p.suspicious
            );
        }
        if p.finishing {
            if terminal {
                eprintln!();
            }
            eprintln!(
                "dlock soak: contention over ({} acquisitions, {} faults); waiting for the last \
                 holds, then checking that the store is left clean",
                p.acquisitions, p.faults
            );
            return;
        }
        // One line every 10 s in a log, an updating line on a terminal.
        if !terminal && !secs.is_multiple_of(10) {
            return;
        }
        let left = p.total.saturating_sub(p.elapsed).as_secs();
        let line = format!(
            "dlock soak: {secs}s, {left}s left: {} acquisitions, {} faults, {} suspicious",
            p.acquisitions, p.faults, p.suspicious
        );
        if terminal {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
    };
    let report = match soak::soak(&store, &opts, &progress).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("\ndlock: soak could not run: {e}");
            return exit::USAGE;
        }
    };
    if terminal {
        eprintln!();
    }
    drop(store);
    drop(stack);
    let path = out_dir.join("soak.json");
    match serde_json::to_string_pretty(&report) {
        Ok(text) => {
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("dlock: cannot write {}: {e}", path.display());
                return exit::CANNOT_CREATE;
            }
        }
        Err(e) => {
            eprintln!("dlock: cannot encode the report: {e}");
            return exit::SOFTWARE;
        }
    }
    print!("{}", render(&report));
    println!("report: {}", path.display());
    if report.is_clean() {
        exit::OK
    } else {
        exit::VIOLATION
    }
}

/// The summary table.
fn render(r: &SoakReport) -> String {
    let mut out = String::new();
    let lost: Vec<String> = r.lost.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let kinds: Vec<String> = r
        .faults
        .by_kind
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let rows = [
        ("backend", r.backend.clone()),
        ("seed", r.seed.to_string()),
        (
            "ran",
            format!(
                "{:.0}s, {} clients, {} names, ttl {} ms",
                r.duration_secs, r.clients, r.names, r.ttl_ms
            ),
        ),
        (
            "acquisitions",
            format!(
                "{} ({} timeouts, {} store errors)",
                r.acquisitions, r.timeouts, r.errors
            ),
        ),
        (
            "faults",
            format!(
                "{} ({} combined): {}",
                r.faults.total,
                r.faults.combined,
                kinds.join(", ")
            ),
        ),
        (
            "aimed",
            format!(
                "{} near a renewal, {} near a hand-off, {} near a lease end",
                r.faults.near_renewal, r.faults.near_handoff, r.faults.near_lease_end
            ),
        ),
        (
            "fenced writes",
            format!(
                "{} accepted, {} stale refused, {} late but accepted",
                r.writes_accepted, r.stale_writes_refused, r.late_writes_accepted
            ),
        ),
        (
            "leases lost",
            if lost.is_empty() {
                "none".to_owned()
            } else {
                lost.join(", ")
            },
        ),
    ];
    for (k, v) in rows {
        out.push_str(&format!("{k:>14}  {v}\n"));
    }
    for n in &r.per_name {
        out.push_str(&format!(
            "{:>14}  {} grants, held {:.1}% of the time, longest gap {:.1}s (from {:.1}s)\n",
            n.name,
            n.acquisitions,
            n.availability * 100.0,
            n.longest_gap_secs,
            n.longest_gap_at_secs
        ));
    }
    // What a fault the store is documented not to survive did: counted by kind, the first of
    // each shown (soak.json has them all).
    let mut documented: BTreeMap<&str, Vec<&dlock_cli::soak::Anomaly>> = BTreeMap::new();
    for d in &r.documented_unsafe {
        documented.entry(d.kind.as_str()).or_default().push(d);
    }
    for (kind, found) in documented {
        out.push_str(&format!(
            "    documented  {} x{} (first at {:.2}s: {})\n",
            kind,
            found.len(),
            found[0].at_secs,
            found[0].detail
        ));
    }
    if r.anomalies.is_empty() {
        out.push_str("     anomalies  none\n");
    } else {
        for a in &r.anomalies {
            out.push_str(&format!(
                "       ANOMALY  {} at {:.2}s: {}\n",
                a.kind, a.at_secs, a.detail
            ));
            for f in &a.faults_around {
                out.push_str(&format!("                  near fault {f}\n"));
            }
        }
    }
    out
}
