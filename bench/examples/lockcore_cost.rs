//! What lockcore's own layer costs a pair, on the in-memory backend where the store costs
//! little: the backend's `try_acquire` + `release` alone, then lockcore's `lock()` + guard
//! `release()` without keep-alive, then with it (the default). It prints the time a pair takes
//! and the process's CPU time over the wall time, which shows work done on another thread (a
//! renewer task woken per guard would show as CPU above 1.0 × wall).
//!
//! ```text
//! cargo run --release -p fencedlock-bench --example lockcore_cost -- [pairs=200000]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, DistributedLock, KeepAlive, LockExt, LockName, MemoryLock, Released, Wait,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pairs: u32 = match std::env::args().nth(1).map(|s| s.parse()) {
        None => 200_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: lockcore_cost [pairs > 0]");
            std::process::exit(2);
        }
    };
    let backend: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("lockcore-cost"));
    let name = LockName::new("pair").expect("a valid name");
    let opts = |keep_alive| {
        AcquireOptions::new()
            .wait(Wait::No)
            .ttl(Duration::from_secs(30))
            .keep_alive(keep_alive)
    };
    let (off, renew) = (opts(KeepAlive::Off), opts(KeepAlive::renew()));
    println!("{:<44} {:>10} {:>12}", "step", "ns/pair", "cpu ÷ wall");
    for round in 0..3 {
        for step in 0..3 {
            let (wall, cpu0) = (Instant::now(), cpu_seconds());
            for _ in 0..pairs {
                match step {
                    0 => {
                        let lease = backend.try_acquire(&name, &off).await.expect("acquire");
                        let lease = lease.expect("the name is free");
                        let released = backend.release(&lease).await.expect("release");
                        assert_eq!(released, Released::Released);
                    }
                    _ => {
                        let opts = if step == 1 { &off } else { &renew };
                        let guard = backend.lock("pair", opts).await.expect("acquire");
                        guard.release().await.expect("release");
                    }
                }
            }
            let wall = wall.elapsed();
            let label = [
                "backend: try_acquire + release",
                "lockcore: lock() + release(), no keep-alive",
                "lockcore: lock() + release(), keep-alive",
            ][step];
            println!(
                "{:<44} {:>10.0} {:>12.2}   (round {round})",
                label,
                wall.as_nanos() as f64 / f64::from(pairs),
                (cpu_seconds() - cpu0) / wall.as_secs_f64(),
            );
        }
    }
}

/// This process's user + system CPU time, in seconds (`/proc/self/stat`, in clock ticks of
/// 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
