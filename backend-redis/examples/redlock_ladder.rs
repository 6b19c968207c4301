//! What Redlock costs an uncontended acquire + release, step by step from `dlock bench`'s
//! fenced fan-out floor.
//!
//! 0. the floor: on all nodes at once one script `SET NX PX` + `INCR`, then all
//!    compare-and-deletes;
//! 1. the least any script can do that keeps the backend's promises to waiters: the floor's
//!    scripts plus `EXISTS queue` in both (a newcomer never jumps a queue; a release knows
//!    whether to wake someone), with no owner echo and an owner-only release;
//! 2. the same two rounds with the backend's real scripts (`acquire.lua` in `try` mode and
//!    `release.lua`, with the owner echo, queue check and token-checked release), fanned out
//!    inline on plain multiplexed connections;
//! 3. this backend through `DistributedLock` (`try_acquire` + `release`: the vote, its single
//!    deadline and grace, the undo bookkeeping);
//! 4. lockcore's `lock()` and guard.
//!
//! The steps alternate in blocks of 200 pairs, in a new order each round; each prints its
//! median, mean and p90 pair, and its pairs/s relative to the floor's.
//!
//! ```text
//! cargo run --release -p backend-redis --example redlock_ladder -- redlock://h1:p1,h2:p2,h3:p3 [rounds=50]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_redis::config::{Deployment, RedisConfig};
use futures_util::future::join_all;
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LockName, Wait};
use redis::Script;
use redis::aio::MultiplexedConnection;

type Failure = Box<dyn std::error::Error + Send + Sync>;

const STEPS: [&str; 5] = [
    "floor: fan-out SET NX PX + INCR script, then compare-and-delete",
    "+ EXISTS queue in both scripts (the least that keeps the queue)",
    "+ the real scripts, fanned out inline",
    "this backend: try_acquire + release",
    "lockcore: lock() + guard.release()",
];

const OWNER: &str = "0123456789abcdef0123456789abcdef";

/// Step 1's acquire: the floor's fenced acquire, refused while someone is queued.
const FAIR: &str = "if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end return redis.call('INCR', KEYS[2])";
/// Step 1's release: the floor's compare-and-delete, which also looks at the queue.
const FAIR_DELETE: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('DEL', KEYS[1]) if redis.call('EXISTS', KEYS[2]) == 0 then return 1 end return 2";

/// One pair of step 1 on every connection at once.
async fn fair_pair(
    acquire: &Script,
    release: &Script,
    cons: &[MultiplexedConnection],
) -> Result<(), Failure> {
    let [lock, fence, queue] = ["lock", "fence", "queue"].map(|k| format!("{{ladder-fair}}:{k}"));
    let tokens = join_all(cons.iter().map(|con| {
        let mut con = con.clone();
        let mut call = acquire.prepare_invoke();
        call.key(&lock)
            .key(&fence)
            .key(&queue)
            .arg(OWNER)
            .arg(10_000);
        async move { call.invoke_async::<i64>(&mut con).await }
    }))
    .await;
    for t in tokens {
        if t? < 1 {
            return Err("not granted".into());
        }
    }
    let released = join_all(cons.iter().map(|con| {
        let mut con = con.clone();
        let mut call = release.prepare_invoke();
        call.key(&lock).key(&queue).arg(OWNER);
        async move { call.invoke_async::<i64>(&mut con).await }
    }))
    .await;
    for r in released {
        if r? != 1 {
            return Err("not released".into());
        }
    }
    Ok(())
}

/// One pair of step 1 on every connection at once.
async fn scripts_pair(
    acquire: &Script,
    release: &Script,
    cons: &[MultiplexedConnection],
) -> Result<(), Failure> {
    let keys = ["lock", "fence", "queue", "alive", "seq"].map(|k| format!("{{ladder-rl}}:{k}"));
    let tokens = join_all(cons.iter().map(|con| {
        let mut con = con.clone();
        let mut call = acquire.prepare_invoke();
        for k in &keys {
            call.key(k);
        }
        call.arg(OWNER)
            .arg(10_000)
            .arg("try")
            .arg(2_000)
            .arg("0000000000000000")
            .arg("ladder:wake:")
            .arg(0);
        async move {
            let reply: redis::Value = call.invoke_async(&mut con).await?;
            match reply {
                redis::Value::Array(items) => match items.first() {
                    Some(redis::Value::Int(1)) => match items.get(1) {
                        Some(redis::Value::Int(t)) => Ok(*t),
                        _ => Err(Failure::from("no token")),
                    },
                    _ => Err("not granted".into()),
                },
                other => Err(format!("unexpected {other:?}").into()),
            }
        }
    }))
    .await;
    let tokens = tokens.into_iter().collect::<Result<Vec<i64>, _>>()?;
    let released = join_all(cons.iter().zip(tokens).map(|(con, token)| {
        let mut con = con.clone();
        let mut call = release.prepare_invoke();
        for k in &keys[..4] {
            call.key(k);
        }
        call.arg(OWNER).arg(token).arg("ladder:wake:");
        async move { call.invoke_async::<i64>(&mut con).await }
    }))
    .await;
    for r in released {
        if r? != 1 {
            return Err("not released".into());
        }
    }
    Ok(())
}

async fn ladder(url: String, rounds: usize) -> Result<(), Failure> {
    let config = RedisConfig::parse(&url)?;
    let Deployment::Redlock { nodes, .. } = &config.deployment else {
        return Err("not a redlock:// URL".into());
    };
    let mut cons = Vec::new();
    for (host, port) in nodes {
        let client = redis::Client::open(format!("redis://{host}:{port}"))?;
        cons.push(client.get_multiplexed_async_connection().await?);
    }
    let with_common =
        |body: &str| body.replacen("--@common", include_str!("../src/lua/common.lua"), 1);
    let (fair, fair_delete) = (Script::new(FAIR), Script::new(FAIR_DELETE));
    let acquire = Script::new(&with_common(include_str!("../src/lua/acquire.lua")));
    let release = Script::new(&with_common(include_str!("../src/lua/release.lua")));
    let backend: Arc<dyn DistributedLock> = backend_redis::connect(&url).await?;
    let floor = backend.fenced_floor().ok_or("no fenced floor")?;
    let floor_name = LockName::new("ladder-floor")?;
    let name = LockName::new("ladder-backend")?;
    let opts = AcquireOptions::new()
        .wait(Wait::No)
        .keep_alive(KeepAlive::Off);
    let direct_opts = opts.clone().with_defaults(&backend.defaults());

    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); STEPS.len()];
    let mut order: Vec<usize> = (0..STEPS.len()).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..=rounds {
        for i in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        for &step in &order {
            for _ in 0..200 {
                let t = Instant::now();
                match step {
                    0 => floor.pair(&floor_name).await?,
                    1 => fair_pair(&fair, &fair_delete, &cons).await?,
                    2 => scripts_pair(&acquire, &release, &cons).await?,
                    3 => {
                        let lease = backend
                            .try_acquire(&name, &direct_opts)
                            .await?
                            .ok_or("the backend's name was held")?;
                        backend.release(&lease).await?;
                    }
                    _ => {
                        let guard = backend.lock("ladder-lockcore", &opts).await?;
                        guard.release().await?;
                    }
                }
                if round > 0 {
                    samples[step].push(t.elapsed());
                }
            }
        }
    }
    println!(
        "{:<64} {:>9} {:>9} {:>9} {:>9}",
        "step", "median", "mean", "p90", "÷ floor"
    );
    let mean_of =
        |v: &[Duration]| v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap_or(u32::MAX);
    let floor_mean = mean_of(&samples[0]);
    for (label, mut v) in STEPS.iter().zip(samples) {
        v.sort_unstable();
        let mean = mean_of(&v);
        let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
        let ratio = floor_mean.as_secs_f64() / mean.as_secs_f64();
        println!(
            "{label:<64} {:>9.1?} {:>9.1?} {:>9.1?} {ratio:>9.3}",
            at(0.5),
            mean,
            at(0.9)
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args
        .first()
        .cloned()
        .ok_or("usage: redlock_ladder REDLOCK_URL [rounds]")?;
    let rounds: usize = args.get(1).map_or(Ok(50), |a| a.parse())?;
    // In a task on a worker thread, where applications make their lock calls.
    tokio::spawn(ladder(url, rounds))
        .await?
        .map_err(|e| e.to_string().into())
}
