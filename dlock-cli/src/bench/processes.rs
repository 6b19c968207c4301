//! Contended clients as processes of their own (`dlock bench --processes`).
//!
//! In one process, clients of a backend that wakes waiters by a notification (PostgreSQL's
//! `LISTEN/NOTIFY`, Redis pub/sub, ZooKeeper watches) still talk to each other only through the
//! store, but they share a runtime, a scheduler and the CPU caches, and nothing guarantees that
//! a backend never takes a shortcut between clients of one process. Here each client is this
//! program run again ([`client_child`]): it connects, says `ready`, waits for the start time,
//! runs the same acquire / hold / release loop as an in-process client until the end time, and
//! prints every hold it made. The parent merges the holds on the system clock and computes the
//! same report: exclusion violations and the mean number of holders from the merged history,
//! the hand-off from one client's release to the next client's acquire, the waits, and the
//! acquisitions per client.
//!
//! The times are the system clock's (`SystemTime`), in nanoseconds since the Unix epoch, so
//! the processes' records can be compared; a clock step during a run would spoil it.

use std::io::Write;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::client::{ClientStats, Round, Tally, acquire_until, hold_for};
use super::report::record;
use super::{BenchOptions, Phase, Progress};
use dlock::{AcquireOptions, Error, KeepAlive, Released, Result, Wait};

/// The first argument that makes `dlock` a contended bench client. Only the argument chooses
/// the role, never the environment alone (which a user's shell may pass on).
pub const CLIENT_ARG: &str = "__dlock-bench-client";

/// The environment variable that holds a bench client's task as JSON, store URL included (kept
/// out of the argument list, which every user of the machine can read). Set by the parent only.
pub const CLIENT_ENV: &str = "DLOCK_BENCH_CLIENT";

/// How long a client may take to connect and say `ready`.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// What a client process is to do.
#[derive(Serialize, Deserialize)]
struct Task {
    url: String,
    name: String,
    permits: Option<u32>,
    hold_ns: u64,
    ttl_ns: u64,
}

/// What a client process did: every hold as `[acquired, released, waited]` (the first two on
/// the system clock, all in ns), and its failures.
#[derive(Serialize, Deserialize)]
struct Outcome {
    holds: Vec<[u64; 3]>,
    errors: u64,
    first_error: Option<String>,
}

/// The system clock, in ns since the Unix epoch.
fn now_ns() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs this process as a contended bench client when its first argument is [`CLIENT_ARG`]
/// (call it first thing in `main`); `None` otherwise. The exit code is 0 when the client ran
/// to its end time (failed operations are counted in what it prints), 1 when it could not
/// start.
pub fn client_child() -> Option<ExitCode> {
    std::env::args_os().nth(1).filter(|a| a == CLIENT_ARG)?;
    let Ok(task) = std::env::var(CLIENT_ENV) else {
        println!("error: {CLIENT_ENV} is not set");
        return Some(ExitCode::FAILURE);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            println!("error: no runtime: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    // On a runtime worker, as the in-process clients run (see `run_with_progress`).
    let outcome = runtime.block_on(async move {
        tokio::spawn(async move { client(&task).await })
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    });
    Some(match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error: {e}");
            ExitCode::FAILURE
        }
    })
}

/// One client process: connect, `ready`, read the window, contend, print the holds.
async fn client(task: &str) -> std::result::Result<(), String> {
    let task: Task = serde_json::from_str(task).map_err(|e| format!("bad task: {e}"))?;
    let backend = dlock::connect(&task.url).await.map_err(|e| e.to_string())?;
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let mut window = line.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(start)), Some(Ok(end))) = (window.next(), window.next()) else {
        return Err(format!("bad window `{}`", line.trim()));
    };
    let opts = AcquireOptions::new()
        .ttl(Duration::from_nanos(task.ttl_ns))
        .wait(Wait::Forever)
        .keep_alive(KeepAlive::Off);
    let hold = Duration::from_nanos(task.hold_ns);
    if let Some(wait) = start.checked_sub(now_ns()) {
        tokio::time::sleep(Duration::from_nanos(wait)).await;
    }
    let mut stats = ClientStats::new();
    let mut holds = Vec::new();
    let stop = Instant::now() + Duration::from_nanos(end.saturating_sub(now_ns()));
    while Instant::now() < stop {
        let t0 = Instant::now();
        let round = acquire_until(&backend, &task.name, task.permits, &opts, stop, &mut stats);
        let guard = match round.await {
            Round::Held(g) => g,
            Round::Failed => continue,
            Round::Ended => break,
        };
        let waited = t0.elapsed();
        let at = now_ns();
        if hold.is_zero() {
            tokio::task::yield_now().await;
        } else {
            hold_for(hold).await;
        }
        holds.push([at, now_ns(), ns(waited)]);
        match guard.release().await {
            Ok(Released::Released) => {}
            Ok(Released::NotHeld) => {
                stats.error("release found the lease gone (ttl too short for the hold time?)");
            }
            Err(e) => stats.error(e),
        }
    }
    // The acquire given up at the window's end may have been granted (a release hands the
    // lock to the queue's head on MySQL and SQLite): its clean-up frees that grant, and must
    // reach the store before this process exits, or the lock stays held until its ttl.
    if !dlock::cleanup::settle(CLEANUP_LIMIT).await {
        stats.error("clean-up after the window did not finish; what it left ends at its ttl");
    }
    let outcome = Outcome {
        holds,
        errors: stats.errors,
        first_error: stats.first_error,
    };
    println!(
        "{}",
        serde_json::to_string(&outcome).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// How long a client process waits at its end for its clean-ups to reach the store.
const CLEANUP_LIMIT: Duration = Duration::from_secs(2);

/// A client process the parent started.
struct Child {
    process: tokio::process::Child,
    stdout: BufReader<tokio::process::ChildStdout>,
}

fn failed(what: impl Into<String>) -> Error {
    Error::backend("bench", "client process", None, false, what.into())
}

/// Starts `opts.clients` client processes on `name`, runs them over one window (warm-up, then
/// the measured time) and merges what they recorded.
pub(super) async fn contend(
    opts: &BenchOptions,
    name: &str,
    ttl: Duration,
    progress: Arc<dyn Progress>,
) -> Result<Tally> {
    let program = std::env::current_exe().map_err(|e| failed(format!("own program: {e}")))?;
    let task = serde_json::to_string(&Task {
        url: opts.url.clone(),
        name: name.to_owned(),
        permits: opts.permits,
        hold_ns: ns(opts.hold),
        ttl_ns: ns(ttl),
    })
    .map_err(|e| failed(e.to_string()))?;
    let mut children = Vec::with_capacity(opts.clients);
    for _ in 0..opts.clients {
        let mut process = tokio::process::Command::new(&program)
            .arg(CLIENT_ARG)
            .env(CLIENT_ENV, &task)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot start {}: {e}", program.display())))?;
        let stdout = process.stdout.take().expect("piped stdout");
        children.push(Child {
            process,
            stdout: BufReader::new(stdout),
        });
    }
    // Every client connected before the clock starts.
    for child in &mut children {
        let mut line = String::new();
        let read = tokio::time::timeout(READY_LIMIT, child.stdout.read_line(&mut line)).await;
        match read {
            Ok(Ok(_)) if line.trim() == "ready" => {}
            Ok(_) => return Err(failed(format!("did not start: {}", line.trim()))),
            Err(_) => return Err(failed(format!("not ready within {READY_LIMIT:?}"))),
        }
    }
    let start = now_ns() + ns(Duration::from_millis(50));
    let from = start + ns(opts.warmup);
    let end = from + ns(opts.duration);
    for child in &mut children {
        let mut stdin = child.process.stdin.take().expect("piped stdin");
        stdin
            .write_all(format!("{start} {end}\n").as_bytes())
            .await
            .map_err(|e| failed(format!("cannot start the clock: {e}")))?;
    }
    let total = opts.warmup + opts.duration;
    let began = Instant::now();
    let ticker = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(100));
        loop {
            every.tick().await;
            progress.update(Phase::Contended, began.elapsed().min(total), total);
        }
    });
    let mut outcomes = Vec::with_capacity(children.len());
    for mut child in children {
        let mut out = String::new();
        let read = child.stdout.read_to_string(&mut out).await;
        let status = child.process.wait().await;
        let last = out.lines().last().unwrap_or("").to_owned();
        match (read, status) {
            (Ok(_), Ok(s)) if s.success() => outcomes.push(
                serde_json::from_str::<Outcome>(&last)
                    .map_err(|e| failed(format!("unreadable report ({e}): {last}")))?,
            ),
            (_, status) => {
                ticker.abort();
                return Err(failed(format!("ended with {status:?}: {last}")));
            }
        }
    }
    ticker.abort();
    Ok(merge(
        &outcomes,
        opts.holders(),
        opts.permits.is_none(),
        from,
        end,
    ))
}

/// The report's figures from every client's holds: `most` may hold at once; `handoffs` for a
/// lock; the measured window is `[from, end)`.
fn merge(outcomes: &[Outcome], most: usize, handoffs: bool, from: u64, end: u64) -> Tally {
    let mut tally = Tally::new(outcomes.len());
    // (time, +1 acquired / -1 released); at equal times the release goes first.
    let mut events = Vec::new();
    // (acquired, released, waited, client) of every hold.
    let mut holds = Vec::new();
    for (client, outcome) in outcomes.iter().enumerate() {
        tally.errors += outcome.errors;
        if tally.first_error.is_none() {
            tally.first_error.clone_from(&outcome.first_error);
        }
        for &[acquired, released, waited] in &outcome.holds {
            events.push((acquired, 1_i8));
            events.push((released, -1_i8));
            holds.push((acquired, released, waited, client));
            if (from..end).contains(&acquired) {
                tally.per_client[client] += 1;
                record(&mut tally.wait, Duration::from_nanos(waited));
            }
        }
    }
    events.sort_unstable();
    let (mut holding, mut since, mut area) = (0_usize, from, 0_f64);
    for (at, delta) in events {
        let (a, b) = (since.clamp(from, end), at.clamp(from, end));
        area += (b - a) as f64 * holding as f64;
        since = at;
        if delta > 0 {
            holding += 1;
            if holding > most {
                tally.violations += 1;
            }
        } else {
            holding = holding.saturating_sub(1);
        }
    }
    let tail = end.saturating_sub(since.clamp(from, end));
    area += tail as f64 * holding as f64;
    tally.mean_holders = area / (end - from) as f64;
    if handoffs {
        // A hand-over: a different client's acquire returned after this release started, and
        // that client was already waiting when it did.
        holds.sort_unstable();
        for pair in holds.windows(2) {
            let ((_, released, _, giver), (acquired, _, waited, taker)) = (pair[0], pair[1]);
            if giver != taker
                && acquired >= released
                && acquired.saturating_sub(waited) <= released
                && (from..end).contains(&acquired)
            {
                record(
                    &mut tally.handoff,
                    Duration::from_nanos(acquired - released),
                );
            }
        }
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(holds: &[[u64; 3]]) -> Outcome {
        Outcome {
            holds: holds.to_vec(),
            errors: 0,
            first_error: None,
        }
    }

    #[test]
    fn merged_holds_give_holders_handoffs_and_overlaps() {
        // Window 0..100: A holds 10..40, B waited from 30 and holds 45..95.
        let a = outcome(&[[10, 40, 5]]);
        let b = outcome(&[[45, 95, 15]]);
        let t = merge(&[a, b], 1, true, 0, 100);
        assert_eq!(t.violations, 0);
        assert!((t.mean_holders - 0.8).abs() < 1e-9, "{}", t.mean_holders);
        assert_eq!(t.per_client, vec![1, 1]);
        assert_eq!(t.handoff.len(), 1);
        assert_eq!(t.handoff.max(), 5);

        // Overlapping holds of a lock are a violation; of a semaphore of 2 they are not.
        let overlapping = || [outcome(&[[10, 50, 0]]), outcome(&[[40, 60, 0]])];
        assert_eq!(merge(&overlapping(), 1, true, 0, 100).violations, 1);
        let two = merge(&overlapping(), 2, false, 0, 100);
        assert_eq!(two.violations, 0);
        assert!(
            (two.mean_holders - 0.6).abs() < 1e-9,
            "{}",
            two.mean_holders
        );
        assert!(two.handoff.is_empty());

        // Holds touching end to start do not overlap; holds outside the window are not counted.
        let touching = [
            outcome(&[[10, 50, 0], [200, 210, 0]]),
            outcome(&[[50, 90, 0]]),
        ];
        let t = merge(&touching, 1, true, 0, 100);
        assert_eq!(t.violations, 0);
        assert_eq!(t.per_client, vec![1, 1]);
    }
}
