//! Writes `docs/benchmarks.md` whole: `dlock bench` against every backend on servers the test
//! kit starts, each figure the median of interleaved runs, with the machine, date and build at
//! the top. Given a second `dlock` binary (`--baseline`), runs it in turn with the first on the
//! same servers and reports both, so a change is judged against the bench's own noise.
//!
//! ```text
//! scripts/benchmarks [--runs N] [--baseline PATH] [--only sqlite,redis,...] [--speedup-runs N]
//! ```
//!
//! Then, for each SQL backend, what each of its speed-ups buys: the same bench with contending
//! clients as processes, and a semaphore's contended acquisitions, with every speed-up on, with
//! none, and with each one off in turn, all interleaved on the same servers, which flush their
//! log at every commit as a production server does.
//! (the script builds the release binaries and calls this with `--dlock target/release/dlock`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use conformance_tests::spawn::{SpawnName, Stack};
use serde_json::Value;

/// The backends measured, in the order of the report.
const BACKENDS: &[SpawnName] = &[
    SpawnName::Sqlite,
    SpawnName::Postgres,
    SpawnName::Mariadb,
    SpawnName::Redis,
    SpawnName::Tair,
    SpawnName::Redlock3,
    SpawnName::Zk,
];

/// What `dlock bench` is asked for each run: one uncontended client beside the floors, then 8
/// contending clients holding 1 ms.
const BENCH_ARGS: &[&str] = &["bench", "--mode", "all"];

/// The semaphore's contended run in the speed-up section: 8 processes sharing 2 permits.
const SEMAPHORE_ARGS: &[&str] = &[
    "bench",
    "--mode",
    "contended",
    "--permits",
    "2",
    "--processes",
];

/// What every run is asked besides: its length, its clients and their hold, JSON.
const RUN_ARGS: &[&str] = &[
    "--duration",
    "2s",
    "--warmup",
    "500ms",
    "--clients",
    "8",
    "--hold",
    "1ms",
    "--json",
];

/// The SQL backends' speed-ups, as the `speedups` URL option names them.
const SQL_SPEEDUPS: &[&str] = &[
    "doorbell",
    "sqlite-write-queue",
    "connection-cache",
    "hand-over",
    "background-dequeue",
    "mysql-procedures",
];

struct Options {
    dlock: PathBuf,
    baseline: Option<PathBuf>,
    runs: usize,
    /// Runs of each speed-up variant (0: no speed-up section).
    speedup_runs: usize,
    only: Option<Vec<String>>,
    out: PathBuf,
}

fn usage() -> ! {
    eprintln!(
        "usage: benchmarks --dlock PATH [--baseline PATH] [--runs N (odd, default 5)] \
         [--only sqlite,postgres,...] [--speedup-runs N (odd or 0, default 3)] \
         [--out docs/benchmarks.md]"
    );
    std::process::exit(2)
}

impl Options {
    fn wanted(&self, name: SpawnName) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|n| n == name.as_str()))
    }
}

fn options() -> Options {
    let mut o = Options {
        dlock: PathBuf::new(),
        baseline: None,
        runs: 5,
        speedup_runs: 3,
        only: None,
        out: PathBuf::from("docs/benchmarks.md"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--dlock" => o.dlock = value.into(),
            "--baseline" => o.baseline = Some(value.into()),
            "--runs" => {
                o.runs = value
                    .parse()
                    .ok()
                    .filter(|n| n % 2 == 1)
                    .unwrap_or_else(|| usage())
            }
            "--speedup-runs" => {
                o.speedup_runs = value
                    .parse()
                    .ok()
                    .filter(|n| n % 2 == 1 || *n == 0)
                    .unwrap_or_else(|| usage())
            }
            "--only" => o.only = Some(value.split(',').map(str::to_owned).collect()),
            "--out" => o.out = value.into(),
            _ => usage(),
        }
    }
    if o.dlock.as_os_str().is_empty() {
        usage();
    }
    for binary in std::iter::once(&o.dlock).chain(&o.baseline) {
        if !binary.is_file() {
            eprintln!("benchmarks: no dlock binary at {}", binary.display());
            std::process::exit(2);
        }
    }
    o
}

/// One run's figures, from `dlock bench --json`.
#[derive(Clone, Copy, Default)]
struct Figures {
    pairs_per_sec: f64,
    /// dlock's pairs/s over the floor with its guarantee (the fenced floor where there is one).
    of_floor: Option<f64>,
    /// That floor against itself over the same run: the bench's own noise.
    floor_self: Option<f64>,
    acquisitions_per_sec: f64,
    /// Contended acquisitions over the limit `holders / (hold + floor pair)`.
    of_limit: Option<f64>,
    /// A semaphore's contended acquisitions/s (the speed-up section's second run).
    semaphore_per_sec: Option<f64>,
}

fn figures(report: &Value) -> Figures {
    let u = &report["uncontended"];
    let floor = if u["fenced_floor"].is_object() {
        &u["fenced_floor"]
    } else {
        &u["floor"]
    };
    let c = &report["contended"];
    Figures {
        pairs_per_sec: u["pairs_per_sec"].as_f64().unwrap_or(0.0),
        of_floor: floor["ratio"].as_f64(),
        floor_self: floor["self_ratio"].as_f64(),
        acquisitions_per_sec: c["acquisitions_per_sec"].as_f64().unwrap_or(0.0),
        of_limit: c["of_limit"].as_f64(),
        semaphore_per_sec: None,
    }
}

fn bench(binary: &PathBuf, url: &str, extra: &[&str]) -> Result<Figures, String> {
    bench_with(binary, url, BENCH_ARGS, extra)
}

fn bench_with(
    binary: &PathBuf,
    url: &str,
    args: &[&str],
    extra: &[&str],
) -> Result<Figures, String> {
    let out = Command::new(binary)
        .args(args)
        .args(RUN_ARGS)
        .args(extra)
        .arg("--url")
        .arg(url)
        .output()
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    let report: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(figures(&report))
}

/// The median and the range of `values`.
fn spread(mut values: Vec<f64>) -> Option<(f64, f64, f64)> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let mid = *values.get(values.len() / 2)?;
    Some((mid, values[0], values[values.len() - 1]))
}

fn cell(values: Vec<f64>, digits: usize) -> String {
    match spread(values) {
        Some((m, lo, hi)) => format!("{m:.digits$} ({lo:.digits$}–{hi:.digits$})"),
        None => "–".into(),
    }
}

fn column(runs: &[Figures], of: impl Fn(&Figures) -> Option<f64>) -> Vec<f64> {
    runs.iter().filter_map(of).collect()
}

/// One table row per build: the medians of its runs, each with its range.
fn row(label: &str, runs: &[Figures]) -> String {
    format!(
        "| {label} | {} | {} | {} | {} | {} |\n",
        cell(column(runs, |f| Some(f.pairs_per_sec)), 0),
        cell(column(runs, |f| f.of_floor), 3),
        cell(column(runs, |f| f.floor_self), 3),
        cell(column(runs, |f| Some(f.acquisitions_per_sec)), 0),
        cell(column(runs, |f| f.of_limit), 3),
    )
}

fn shell(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!(
        "{model}, {cores} cores, {mem_gib:.0} GiB, {}",
        shell("uname", &["-sr"])
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = options();
    let builds: Vec<(&str, &PathBuf)> = match &o.baseline {
        Some(base) => vec![("before", base), ("after", &o.dlock)],
        None => vec![("dlock", &o.dlock)],
    };
    let mut doc = String::new();
    let _ = writeln!(doc, "# Benchmarks\n");
    let _ = writeln!(
        doc,
        "Written whole by `scripts/benchmarks`; every run replaces it.\n\n\
         - Machine: {}\n- Date: {} UTC\n- Build: {} at {}, {}, release profile\n",
        machine(),
        shell("date", &["-u", "+%Y-%m-%d %H:%M"]),
        shell(&o.dlock.display().to_string(), &["--version"]),
        shell("git", &["describe", "--always", "--dirty"]),
        shell("rustc", &["--version"]),
    );
    let _ = writeln!(
        doc,
        "Each backend runs on servers the test kit starts on this machine. A run is `dlock {}`; \
         each cell is the median of {} runs and their range. `× floor` is dlock's uncontended \
         pairs/s over the floor with the same guarantee (fenced where there is one), measured in \
         alternating 200 ms turns; `floor ÷ itself` is that floor's odd turns over its even \
         ones, the bench's own noise: a difference smaller than its distance from 1 is noise. \
         `× limit` is contended acquisitions/s over `holders / (hold + floor pair)`.{}\n",
        [BENCH_ARGS, RUN_ARGS].concat().join(" "),
        o.runs,
        if o.baseline.is_some() {
            " `before` and `after` are two builds run in turn on the same servers."
        } else {
            ""
        },
    );
    let _ = writeln!(
        doc,
        "| backend | pairs/s | × floor | floor ÷ itself | contended/s | × limit |\n|---|---|---|---|---|---|"
    );
    for &name in BACKENDS {
        if !o.wanted(name) {
            continue;
        }
        eprintln!("benchmarks: {name}: starting its servers");
        let stack = match Stack::start(name, 1).await {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(doc, "| {name} | not run: {} | | | | |", e.message());
                continue;
            }
        };
        let mut runs: Vec<Vec<Figures>> = vec![Vec::new(); builds.len()];
        let mut failed = None;
        for r in 0..o.runs {
            // Alternate which build goes first, so neither always runs on a warmer store.
            for i in 0..builds.len() {
                let i = if r % 2 == 0 { i } else { builds.len() - 1 - i };
                eprintln!(
                    "benchmarks: {name}: {} run {}/{}",
                    builds[i].0,
                    r + 1,
                    o.runs
                );
                match bench(builds[i].1, &stack.direct_url, &[]) {
                    Ok(f) => runs[i].push(f),
                    Err(e) => failed = Some(e),
                }
            }
        }
        for ((label, _), figures) in builds.iter().zip(&runs) {
            let label = if builds.len() > 1 {
                format!("{name} {label}")
            } else {
                name.to_string()
            };
            doc.push_str(&row(&label, figures));
        }
        if let Some(e) = failed {
            let _ = writeln!(
                doc,
                "| {name} | a run failed: {} | | | | |",
                e.replace('\n', " ")
            );
        }
        drop(stack);
    }
    if o.speedup_runs > 0 {
        speedups(&o, &mut doc).await;
    }
    if let Err(e) = std::fs::write(&o.out, doc) {
        eprintln!("benchmarks: cannot write {}: {e}", o.out.display());
        std::process::exit(1);
    }
    eprintln!("benchmarks: wrote {}", o.out.display());
}

/// What each SQL speed-up buys: per backend, the bench with every speed-up on (`all`), with none,
/// and with each one off, interleaved in rotating order; each ratio is a variant's figure over
/// `all`'s in the same round, so drift between rounds cancels.
async fn speedups(o: &Options, doc: &mut String) {
    let _ = writeln!(
        doc,
        "\n## What each SQL speed-up buys\n\n\
         The same bench with `--processes` (each contending client a process of its own, as \
         separate services would be), then a semaphore's contended run (`dlock {}`), with the \
         `speedups` URL option set as in the first column. The servers flush their log at every \
         commit here (PostgreSQL `fsync=on`, MariaDB `innodb_flush_log_at_trx_commit=1`, \
         SQLite `synchronous=full`), so what a speed-up saves in commits shows. Each cell is the \
         median of {} rounds and their range; `÷ all` is a variant's figure over the all-on \
         figure of the same round. A speed-up that does not apply to a backend reads as `all` \
         within the noise (`floor ÷ itself`).\n",
        [SEMAPHORE_ARGS, RUN_ARGS].concat().join(" "),
        o.speedup_runs,
    );
    let mut variants = vec!["all".to_owned(), "none".to_owned()];
    variants.extend(SQL_SPEEDUPS.iter().map(|s| format!("-{s}")));
    for name in [SpawnName::Sqlite, SpawnName::Postgres, SpawnName::Mariadb] {
        if !o.wanted(name) {
            continue;
        }
        eprintln!("benchmarks: {name} speed-ups: starting its servers");
        let stack = match Stack::start(name, 1).await {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(doc, "{name}: not run: {}\n", e.message());
                continue;
            }
        };
        if let Err(e) = make_durable(name, &stack.direct_url).await {
            let _ = writeln!(
                doc,
                "{name}: not run: cannot make its server durable: {e}\n"
            );
            continue;
        }
        let url_of = |variant: &str| {
            let sep = if stack.direct_url.contains('?') {
                '&'
            } else {
                '?'
            };
            format!("{}{sep}speedups={variant}", stack.direct_url)
        };
        // runs[v][r]: variant v in round r (None when that run failed).
        let mut runs: Vec<Vec<Option<Figures>>> = vec![Vec::new(); variants.len()];
        let mut failed = None;
        for r in 0..o.speedup_runs {
            for k in 0..variants.len() {
                let v = (k + r) % variants.len();
                eprintln!(
                    "benchmarks: {name} speedups={}: round {}/{}",
                    variants[v],
                    r + 1,
                    o.speedup_runs
                );
                let url = url_of(&variants[v]);
                let result = bench(&o.dlock, &url, &["--processes"]).and_then(|mut f| {
                    let semaphore = bench_with(&o.dlock, &url, SEMAPHORE_ARGS, &[])?;
                    f.semaphore_per_sec = Some(semaphore.acquisitions_per_sec);
                    Ok(f)
                });
                if let Err(e) = &result {
                    failed = Some(e.clone());
                }
                runs[v].push(result.ok());
            }
        }
        let _ = writeln!(
            doc,
            "### {name}\n\n| speedups= | pairs/s | ÷ all | contended/s | ÷ all | \
             semaphore/s | ÷ all | floor ÷ itself |\n|---|---|---|---|---|---|---|---|"
        );
        for (v, variant) in variants.iter().enumerate() {
            let ok: Vec<Figures> = runs[v].iter().flatten().copied().collect();
            let paired = |of: fn(&Figures) -> Option<f64>| -> Vec<f64> {
                runs[v]
                    .iter()
                    .zip(&runs[0])
                    .filter_map(|(x, all)| Some(of(x.as_ref()?)? / of(all.as_ref()?)?))
                    .collect()
            };
            let _ = writeln!(
                doc,
                "| {variant} | {} | {} | {} | {} | {} | {} | {} |",
                cell(column(&ok, |f| Some(f.pairs_per_sec)), 0),
                cell(paired(|f| Some(f.pairs_per_sec)), 3),
                cell(column(&ok, |f| Some(f.acquisitions_per_sec)), 0),
                cell(paired(|f| Some(f.acquisitions_per_sec)), 3),
                cell(column(&ok, |f| f.semaphore_per_sec), 0),
                cell(paired(|f| f.semaphore_per_sec), 3),
                cell(column(&ok, |f| f.floor_self), 3),
            );
        }
        if let Some(e) = failed {
            let _ = writeln!(doc, "\nA run failed: {}", e.replace('\n', " "));
        }
        doc.push('\n');
        drop(stack);
    }
}

/// Makes the kit's server at `url` flush its log at every commit, as a production server does:
/// the kit starts its servers without (the tests' speed), which hides what a speed-up saves in
/// commits. SQLite already runs with `synchronous=full`.
async fn make_durable(name: SpawnName, url: &str) -> Result<(), String> {
    use sqlx::Connection as _;
    let e = |e: sqlx::Error| e.to_string();
    match name {
        SpawnName::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await.map_err(e)?;
            for sql in [
                "ALTER SYSTEM SET fsync = on",
                "ALTER SYSTEM SET full_page_writes = on",
                "SELECT pg_reload_conf()",
            ] {
                sqlx::raw_sql(sql).execute(&mut conn).await.map_err(e)?;
            }
            conn.close().await.map_err(e)
        }
        SpawnName::Mariadb => {
            let mut conn = sqlx::MySqlConnection::connect(url).await.map_err(e)?;
            sqlx::raw_sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
                .execute(&mut conn)
                .await
                .map_err(e)?;
            conn.close().await.map_err(e)
        }
        _ => Ok(()),
    }
}
