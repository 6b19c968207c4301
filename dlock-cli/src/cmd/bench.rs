//! `dlock bench`: runs [`dlock_cli::bench`] and formats its report.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use dlock_cli::bench::{
    self, BenchOptions, BenchReport, FloorReport, LatencySummary, Mode, Phase, Progress,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use clap::{Args, ValueEnum};

use crate::args::parse_duration;
use crate::exit;

/// What to measure: the lock, or a counting semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PrimitiveArg {
    Lock,
    Semaphore,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum ModeArg {
    Uncontended,
    Contended,
    All,
    /// One client holding --leases leases with keep-alive for --duration.
    Hold,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Lock store URL (required here so a benchmark never writes into the default per-user store).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true, value_name = "URL")]
    pub(crate) url: String,

    /// Which measurements to run.
    #[arg(long, value_enum, default_value_t = ModeArg::All)]
    pub(crate) mode: ModeArg,

    /// Measured time per phase.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub(crate) duration: Duration,

    /// Unmeasured warm-up before each phase.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub(crate) warmup: Duration,

    /// Contending clients, each with its own connection.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) clients: u16,

    /// How long each contended acquisition holds the lock.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = parse_duration)]
    pub(crate) hold: Duration,

    /// What to measure: the lock, or a semaphore (of --permits permits, 4 by default).
    #[arg(long, value_enum, default_value_t = PrimitiveArg::Lock)]
    pub(crate) primitive: PrimitiveArg,

    /// The semaphore's permits (implies --primitive semaphore).
    #[arg(long, value_name = "N", value_parser = crate::args::parse_permits)]
    pub(crate) permits: Option<u32>,

    /// Run each contended client as a process of its own (dlock run again), so no two
    /// clients share a runtime or could take a shortcut within one process.
    #[arg(long)]
    pub(crate) processes: bool,

    /// Leases held at once with --mode hold.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) leases: u32,

    /// The leases' ttl with --mode hold (keep-alive renews every third of it).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// Lock name prefix [default: dlock-bench/<random>].
    #[arg(long, value_name = "PREFIX")]
    pub(crate) name: Option<String>,

    /// Print the report as JSON (no progress bar).
    #[arg(long)]
    pub(crate) json: bool,
}

/// Draws the bench's progress on stderr.
struct Bar(ProgressBar);

impl Progress for Bar {
    fn update(&self, phase: Phase, elapsed: Duration, total: Duration) {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.0.set_prefix(phase.to_string());
        self.0.set_length(ms(total).max(1));
        self.0.set_position(ms(elapsed));
    }
}

/// Entry point; returns the process exit code.
pub async fn main(args: BenchArgs) -> u8 {
    let mode = match args.mode {
        ModeArg::Uncontended => Mode::Uncontended,
        ModeArg::Contended => Mode::Contended,
        ModeArg::All => Mode::All,
        ModeArg::Hold => Mode::Hold,
    };
    let mut opts = BenchOptions::new(args.url.clone())
        .mode(mode)
        .duration(args.duration)
        .warmup(args.warmup)
        .clients(usize::from(args.clients))
        .hold(args.hold)
        .processes(args.processes)
        .leases(args.leases as usize, args.ttl);
    if let Some(prefix) = &args.name {
        opts = opts.name(prefix.clone());
    }
    if args.primitive == PrimitiveArg::Semaphore || args.permits.is_some() {
        opts = opts.permits(args.permits.unwrap_or(4));
        let native = dlock::native_primitives(&args.url).map(|n| n.semaphore);
        if let Ok(false) = native {
            eprintln!(
                "dlock: --primitive semaphore: the {}:// store has no semaphores",
                dlock::scheme_of(&args.url).unwrap_or_default()
            );
            return exit::USAGE;
        }
    }

    let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::stderr());
    if args.json || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {percent:>3}%")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let result = bench::run_with_progress(&opts, Arc::new(Bar(bar.clone()))).await;
    bar.finish_and_clear();

    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "dlock: bench against {} failed: {e}",
                dlock::redact(&args.url)
            );
            return exit::for_error(&e);
        }
    };
    if args.json {
        if let Err(code) = exit::print_json(&report) {
            return code;
        }
    } else {
        print!("{}", render(&report));
    }
    if let Some(h) = &report.hold
        && (h.lost > 0 || h.acquired < h.leases)
    {
        eprintln!(
            "dlock: {} of {} leases lost while held, {} not acquired",
            h.lost,
            h.acquired,
            h.leases - h.acquired
        );
        return exit::LOST;
    }
    match &report.contended {
        Some(c) if c.violations > 0 => {
            eprintln!(
                "dlock: {} exclusion violation(s): more clients held {:?} at once than it admits",
                c.violations, c.name
            );
            exit::VIOLATION
        }
        _ => exit::OK,
    }
}

/// A microsecond value with a unit people read at a glance.
fn fmt_us(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.1}µs")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1_000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

fn fmt_rate(per_sec: f64) -> String {
    if per_sec >= 100.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec:.1}")
    }
}

fn fmt_secs(s: f64) -> String {
    humantime::format_duration(Duration::from_millis((s * 1000.0).round() as u64)).to_string()
}

/// Aligned columns: the first left-aligned, the others right-aligned; every line indented.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::from("  ");
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            if c == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// How steady a floor's ratio was, under its ratio line: the per-round quartiles and the floor
/// against itself (empty when the run had too few rounds to say).
fn spread_line(f: &FloorReport) -> String {
    match (f.ratio_p25, f.ratio_p75, f.self_ratio) {
        (Some(p25), Some(p75), Some(own)) => format!(
            "      per round {p25:.3} – {p75:.3} (quartiles of {}); the floor against itself {own:.3}\n",
            f.rounds
        ),
        _ => String::new(),
    }
}

fn latency_cells(l: &LatencySummary) -> Vec<String> {
    vec![
        fmt_us(l.p50_us),
        fmt_us(l.p99_us),
        fmt_us(l.p999_us),
        fmt_us(l.max_us),
        l.count.to_string(),
    ]
}

/// The report as people read it.
fn render(r: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dlock bench  {}  (backend {}, fairness {}, waiters woken by {})",
        r.url, r.backend, r.fairness, r.wait_mechanism
    );
    let _ = writeln!(
        out,
        "{} measured per phase after {} of warm-up",
        fmt_secs(r.duration_secs),
        fmt_secs(r.warmup_secs)
    );

    if let Some(h) = &r.hold {
        let _ = writeln!(
            out,
            "\nhold: 1 client holding {} leases (ttl {}, keep-alive every third of it) for {}",
            h.leases,
            fmt_secs(h.ttl_ms as f64 / 1000.0),
            fmt_secs(h.held_secs)
        );
        let lines = [
            (
                "acquired",
                format!(
                    "{} of {} in {}",
                    h.acquired,
                    h.leases,
                    fmt_secs(h.acquire_secs)
                ),
            ),
            (
                "renewal calls",
                format!(
                    "{} ({}/s)",
                    h.renewal_calls,
                    fmt_rate(h.renewal_calls_per_sec)
                ),
            ),
            (
                "leases renewed",
                format!(
                    "{} ({}/s), {:.1} per call",
                    h.renewals,
                    fmt_rate(h.renewals_per_sec),
                    h.leases_per_call
                ),
            ),
            (
                "late renewals",
                format!("{} (less than a third of the ttl left)", h.late_renewals),
            ),
            (
                "failed renewals",
                format!("{}; leases lost: {}", h.failed_renewals, h.lost),
            ),
            (
                "client CPU",
                format!("{:.1} % of one core while holding", h.cpu_share * 100.0),
            ),
            (
                "memory",
                format!("{:.0} bytes resident per lease", h.bytes_per_lease),
            ),
            ("errors", h.errors.to_string()),
        ];
        for (label, value) in lines {
            let _ = writeln!(out, "  {label:<16} {value}");
        }
        if let Some(e) = &h.first_error {
            let _ = writeln!(out, "  first error      {e}");
        }
    }

    if let Some(u) = &r.uncontended {
        let _ = writeln!(
            out,
            "\nuncontended: 1 client, acquire (Wait::No, keep-alive off) + release on one name;\n             dlock and the floors alternate in 200 ms turns over the same window"
        );
        let mut rows = vec![
            [
                "", "pairs/s", "p50", "p99", "p99.9", "max", "pairs", "errors",
            ]
            .map(String::from)
            .to_vec(),
        ];
        let mut row = vec!["dlock".to_owned(), fmt_rate(u.pairs_per_sec)];
        row.extend(latency_cells(&u.latency));
        row.push(u.errors.to_string());
        rows.push(row);
        let floors = [
            ("raw floor", &u.floor),
            ("fenced floor", &u.fenced_floor),
            ("recipe floor", &u.recipe_floor),
        ];
        for (label, floor) in floors {
            if let Some(f) = floor {
                let mut row = vec![label.to_owned(), fmt_rate(f.pairs_per_sec)];
                row.extend(latency_cells(&f.latency));
                row.push(f.errors.to_string());
                rows.push(row);
            }
        }
        out.push_str(&table(&rows));
        match &u.floor {
            Some(f) => {
                let _ = writeln!(
                    out,
                    "  ratio dlock/floor = {:.3}   (floor: {})",
                    f.ratio, f.description
                );
                out.push_str(&spread_line(f));
                if let Some(f) = &u.fenced_floor {
                    let _ = writeln!(
                        out,
                        "  ratio dlock/fenced floor = {:.3}   (same guarantee: {})",
                        f.ratio, f.description
                    );
                    out.push_str(&spread_line(f));
                }
                if let Some(f) = &u.recipe_floor {
                    let _ = writeln!(
                        out,
                        "  ratio dlock/recipe floor = {:.3}   (the recipe's own calls, bare: {}; not a target)",
                        f.ratio, f.description
                    );
                }
            }
            None => {
                let _ = writeln!(
                    out,
                    "  no floor: the backend offers no raw-command baseline"
                );
            }
        }
        if let Some(e) = &u.first_error {
            let _ = writeln!(out, "  first error: {e}");
        }
    }

    if let Some(c) = &r.contended {
        let what = match c.permits {
            Some(p) => format!("a semaphore of {p} permits"),
            None => "one name".to_owned(),
        };
        let _ = writeln!(
            out,
            "\ncontended: {} clients ({}) on {what}, hold {} (a thread sleeps, then spins to the exact deadline), ttl {}, Wait::Forever",
            c.clients,
            if c.processes {
                "a process each"
            } else {
                "own connections"
            },
            fmt_us(c.hold_ms * 1000.0),
            fmt_secs(c.ttl_ms as f64 / 1000.0)
        );
        let mut rows = vec![
            ["", "p50", "p99", "p99.9", "max", "samples"]
                .map(String::from)
                .to_vec(),
        ];
        if c.permits.is_none() {
            let mut row = vec!["handoff (release start -> other client holds)".to_owned()];
            row.extend(latency_cells(&c.handoff));
            rows.push(row);
        }
        let mut row = vec!["waiter wait".to_owned()];
        row.extend(latency_cells(&c.wait));
        rows.push(row);
        out.push_str(&table(&rows));
        let mut summary = vec![vec![
            "acquisitions/s".to_owned(),
            format!(
                "{} ({} in total)",
                fmt_rate(c.acquisitions_per_sec),
                c.acquisitions
            ),
        ]];
        if let (Some(limit), Some(of), Some(floor)) =
            (c.limit_per_sec, c.of_limit, c.floor_pair_p50_us)
        {
            summary.push(vec![
                match c.permits {
                    Some(p) => format!("limit {p}/(hold + floor p50)"),
                    None => "limit 1/(hold + floor p50)".to_owned(),
                },
                format!(
                    "{}/s (floor pair p50 {}); acquisitions/s ÷ limit = {of:.2}",
                    fmt_rate(limit),
                    fmt_us(floor)
                ),
            ]);
        }
        summary.extend([
            vec![
                "per-client acquisitions".to_owned(),
                format!(
                    "min {}, max {}, min/max {:.2} ({} of {} clients acquired)",
                    c.per_client_min,
                    c.per_client_max,
                    c.fairness,
                    c.clients_that_acquired,
                    c.clients
                ),
            ],
            vec![
                "mean holders at once".to_owned(),
                match c.permits {
                    Some(p) => format!(
                        "{:.2} of {p} (time-weighted, from the recorded holds)",
                        c.mean_holders
                    ),
                    None => format!(
                        "{:.2} of 1 (time-weighted, from the recorded holds)",
                        c.mean_holders
                    ),
                },
            ],
            vec![
                "waiter wait in holds".to_owned(),
                {
                    let mut line = format!("p50 {:.1}, p99 {:.1}", c.wait_p50_holds, c.wait_p99_holds);
                    if c.permits.is_none() && c.hold_ms > 0.0 && c.handoff.count > 0 {
                        // FIFO: every waiter ahead holds once and hands over once.
                        let turn = 1.0 + c.handoff.p50_us / (c.hold_ms * 1000.0);
                        line.push_str(&format!(
                            " (FIFO keeps it near {:.1}: {} waiters ahead, each a hold and a handoff p50)",
                            c.clients.saturating_sub(1) as f64 * turn,
                            c.clients.saturating_sub(1)
                        ));
                    }
                    line
                },
            ],
            vec!["exclusion violations".to_owned(), c.violations.to_string()],
            vec!["errors".to_owned(), c.errors.to_string()],
        ]);
        if let Some(s) = &c.server_connections {
            let mut line = format!(
                "{} at peak, {} before the clients: {:.2} per client; the server's limit is {}",
                s.peak, s.before, s.per_client, s.limit
            );
            if let Some(refused) = s.refused {
                line.push_str(&format!("; {refused} refused"));
            }
            if s.reached_limit {
                line.push_str(" (the server was full: connections asked for then were refused)");
            }
            summary.push(vec!["server connections".to_owned(), line]);
        }
        // Left-align the values here: they are sentences, not numbers.
        let width = summary
            .iter()
            .map(|r| r[0].chars().count())
            .max()
            .unwrap_or(0);
        for row in summary {
            let _ = writeln!(out, "  {:<width$}  {}", row[0], row[1]);
        }
        if let Some(e) = &c.first_error {
            let _ = writeln!(out, "  first error: {e}");
        }
    }
    out
}
