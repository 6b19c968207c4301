//! Redlock's acquire latency with one node silent, next to the fenced fan-out floor.
//!
//! Give the Redlock URL and the pid of one of its nodes' `redis-server`. With every node
//! healthy, the example measures the fenced fan-out floor's pair and Redlock's `try_acquire`;
//! then it stops that node (`SIGSTOP`: its connections stay open and nothing answers, a
//! blackhole), measures `try_acquire` again, and resumes the node (`SIGCONT`). It prints each
//! p50 and the node timeout in force.
//!
//! ```text
//! cargo run --release -p fencedlock-bench --example redlock_blackhole -- \
//!     'redlock://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103,127.0.0.1:7104,127.0.0.1:7105?node_timeout=20ms' \
//!     "$(cat /path/to/7105.pid)" [samples=200]
//! ```

use std::time::{Duration, Instant};

use backend_redis::config::RedisConfig;
use backend_redlock::RedlockLock;
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockName, Wait};

fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// `try_acquire` latencies of `samples` acquisitions (each released right after, unmeasured).
async fn acquires(
    lock: &RedlockLock,
    name: &LockName,
    opts: &AcquireOptions,
    samples: usize,
) -> lockcore::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        let lease = lock
            .try_acquire(name, opts)
            .await?
            .expect("a majority is free");
        out.push(t0.elapsed());
        lock.release(&lease).await?;
    }
    Ok(out)
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid and a signal number has no memory-safety preconditions.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> lockcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: redlock_blackhole REDLOCK_URL NODE_PID [samples]";
    let url = args.next().expect(usage);
    let pid: i32 = args.next().expect(usage).trim().parse().expect(usage);
    let samples: usize = args.next().map_or(200, |n| n.parse().expect(usage));
    let lock = RedlockLock::connect(&RedisConfig::parse(&url)?).await?;
    let opts = AcquireOptions::new()
        .ttl(Duration::from_secs(30))
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No);
    let name = LockName::new("redlock-blackhole")?;
    let floors = dlock_bench::floor::connect(&url).await?;
    let floor = floors.fenced.expect("redlock has a fenced floor");
    let floor_name = LockName::new("redlock-blackhole-floor")?;
    let mut floor_pairs = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        floor.pair(&floor_name).await?;
        floor_pairs.push(t0.elapsed());
    }
    let mut healthy = acquires(&lock, &name, &opts, samples).await?;
    signal(pid, libc::SIGSTOP);
    let silent = acquires(&lock, &name, &opts, samples).await;
    signal(pid, libc::SIGCONT);
    let mut silent = silent?;
    println!(
        "node timeout:                           {:?}",
        lock.node_timeout(opts.ttl_value())
    );
    println!(
        "fenced fan-out floor pair p50 (healthy): {:?}",
        p50(&mut floor_pairs)
    );
    println!(
        "acquire p50, every node healthy:         {:?}",
        p50(&mut healthy)
    );
    println!(
        "acquire p50, one node silent:            {:?}",
        p50(&mut silent)
    );
    Ok(())
}
