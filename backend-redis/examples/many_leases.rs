//! Holds many leases at once from one process with keep-alive and reports how the renewals
//! travel (batches and pipelines from the backend's counters), renewals per second and the
//! process's CPU use while holding.
//!
//! ```text
//! cargo run --release -p fencedlock-redis --example many_leases -- \
//!     redis://127.0.0.1:6379 [leases=10000] [ttl_ms=3000] [hold_s=30] [pause_ms]
//! ```
//!
//! Leases are acquired 500 at a time; with `pause_ms` the example pauses that long after each
//! 500 (0: all at once, which lockcore's renewer takes in one pass).

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_redis::{RedisConfig, RedisLock};
use futures_util::future::join_all;
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, Wait};

/// User + system CPU time of this process, from /proc/self/stat (clock ticks of 1/100 s).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) are utime and stime; after the comm they are at 11 and 12.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args
        .first()
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let leases: usize = args.get(1).map_or(Ok(10_000), |a| a.parse())?;
    let ttl = Duration::from_millis(args.get(2).map_or(Ok(3000), |a| a.parse())?);
    let hold = Duration::from_secs(args.get(3).map_or(Ok(30), |a| a.parse())?);
    let pace = args
        .get(4)
        .map(|a| a.parse().map(Duration::from_millis))
        .transpose()?;

    let config = RedisConfig::parse(&url)?;
    let lock = Arc::new(RedisLock::connect(&config).await?);
    let client: Arc<dyn DistributedLock> = lock.clone();
    let opts = AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::No);
    let run = format!("many-leases/{:08x}", rand::random::<u32>());

    let started = Instant::now();
    let mut guards = Vec::with_capacity(leases);
    for chunk in (0..leases).collect::<Vec<_>>().chunks(500) {
        let batch = join_all(chunk.iter().map(|i| {
            let (client, opts, name) = (client.clone(), opts.clone(), format!("{run}/{i}"));
            async move { client.lock(&name, &opts).await }
        }))
        .await;
        for g in batch {
            guards.push(g?);
        }
        if let Some(pause) = pace {
            tokio::time::sleep(pause).await;
        }
    }
    println!(
        "acquired {leases} leases (ttl {ttl:?}, keep-alive every ttl/3) in {:.2?}",
        started.elapsed()
    );

    let (stats0, cpu0, t0) = (lock.stats(), cpu_time(), Instant::now());
    for s in 0..hold.as_secs() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if s < 5 {
            let lost = guards.iter().filter(|g| !g.is_held()).count();
            println!(
                "  t={}s: renewals so far {}, guards not held {lost}",
                s + 1,
                lock.stats().renewals - stats0.renewals
            );
        }
    }
    let (stats1, cpu1, elapsed) = (lock.stats(), cpu_time(), t0.elapsed());

    let lost = guards.iter().filter(|g| !g.is_held()).count();
    let renewals = stats1.renewals - stats0.renewals;
    let batches = stats1.renewal_batches - stats0.renewal_batches;
    let pipelines = stats1.renewal_pipelines - stats0.renewal_pipelines;
    let secs = elapsed.as_secs_f64();
    let cpu = (cpu1 - cpu0).as_secs_f64();
    println!("held for {elapsed:.2?}:");
    println!(
        "  renewals: {renewals} ({:.0}/s; expected about {:.0}/s for {leases} leases renewed every ttl/3)",
        renewals as f64 / secs,
        leases as f64 / (ttl.as_secs_f64() / 3.0)
    );
    println!(
        "  keep-alive batches (extend_many calls): {batches} ({:.1}/s), pipelines: {pipelines}, leases per pipeline: {:.0}",
        batches as f64 / secs,
        renewals as f64 / pipelines.max(1) as f64
    );
    println!(
        "  renewal errors: {}, leases lost: {}, guards not held: {lost}",
        stats1.renewal_errors - stats0.renewal_errors,
        stats1.renewals_lost - stats0.renewals_lost
    );
    println!(
        "  process CPU while holding: {cpu:.2} s in {secs:.1} s = {:.1} % of one core",
        100.0 * cpu / secs
    );

    let released = join_all(guards.into_iter().map(|g| g.release())).await;
    let failed = released.iter().filter(|r| r.is_err()).count();
    println!("released all ({failed} errors)");
    Ok(())
}
