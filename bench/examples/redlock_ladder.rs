//! What Redlock costs an uncontended acquire + release, step by step from `dlock bench`'s
//! fenced fan-out floor.
//!
//! 0. the floor: on all nodes at once one script `SET NX PX` + `INCR`, then all
//!    compare-and-deletes;
//! 1. the same floor with its delete round decided once a majority deleted (the backend's
//!    release returns then; the other deletes finish in a task of their own), so that what the
//!    quorum release saves can be told apart from the rest;
//! 2. the least any script can do that keeps the backend's promises to waiters: the floor's
//!    scripts plus `EXISTS queue` in both (a newcomer never jumps a queue; a release knows
//!    whether to wake someone), with no owner echo and an owner-only release;
//! 3. the backend's `try` script instead (it echoes the owner: a reply for another request
//!    never grants), with step 1's release;
//! 4. step 2's acquire with the backend's release script (owner and token checked, the queue's
//!    dead waiters pruned and its head woken when there is one);
//! 5. both of the backend's scripts, fanned out inline;
//! 6. this backend through `DistributedLock` (`try_acquire` + `release`: the vote, its single
//!    deadline and grace, the undo bookkeeping);
//! 7. lockcore's `lock()` and guard;
//! 8. step 6 with a token minimum above every node's counter, so that each acquire pays the
//!    fence write-back round (which a plain uncontended acquire skips: its nodes agree).
//!
//! The steps alternate in blocks of 200 pairs, in a new order each round; each prints its
//! median, mean and p90 pair, and its pairs/s relative to the floor's.
//!
//! ```text
//! cargo run --release -p fencedlock-bench --example redlock_ladder -- redlock://h1:p1,h2:p2,h3:p3 [rounds=50]
//! ```

use std::sync::Arc;
use std::time::Instant;

use backend_redis::config::{Deployment, RedisConfig};
use dlock_bench::ladder::{self, FAIR, FAIR_DELETE, Failure, OWNER, RealScripts};
use futures_util::StreamExt as _;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LockName, Wait};
use redis::Script;
use redis::aio::MultiplexedConnection;

const STEPS: [&str; 9] = [
    "floor: fan-out SET NX PX + INCR script, then compare-and-delete",
    "  its deletes decided at a majority (the rest in a task)",
    "+ EXISTS queue in both scripts (the least that keeps the queue)",
    "  with the real try script (owner echo)",
    "  with the real release script (token check, queue upkeep)",
    "the real scripts, fanned out inline",
    "this backend: try_acquire + release",
    "lockcore: lock() + guard.release()",
    "this backend, each acquire with a fence write-back round",
];

/// The scripts of the inline steps.
struct Scripts {
    floor_fenced: Script,
    floor_delete: Script,
    fair: Script,
    fair_delete: Script,
    try_fast: Script,
    release: Script,
}

/// One acquire + release on every connection at once: the real `try` script or the least one
/// (`real_acquire`), then the real release script or the least one (`real_release`).
async fn inline_pair(
    scripts: &Scripts,
    real_acquire: bool,
    real_release: bool,
    cons: &[MultiplexedConnection],
) -> Result<(), Failure> {
    let [lock, fence, queue, alive] =
        ["lock", "fence", "queue", "alive"].map(|k| format!("{{ladder-rl}}:{k}"));
    let tokens = join_all(cons.iter().map(|con| {
        let mut con = con.clone();
        let mut call = if real_acquire {
            scripts.try_fast.prepare_invoke()
        } else {
            scripts.fair.prepare_invoke()
        };
        call.key(&lock).key(&fence);
        if real_acquire {
            // The real fast script needs no queue key: the lock key itself says whether
            // anyone waits.
            call.arg(OWNER).arg(10_000).arg(0);
        } else {
            call.key(&queue).arg(OWNER).arg(10_000);
        }
        async move { ladder::granted_token(&call.invoke_async::<redis::Value>(&mut con).await?) }
    }))
    .await;
    let tokens = tokens.into_iter().collect::<Result<Vec<i64>, _>>()?;
    let released = join_all(cons.iter().zip(tokens).map(|(con, token)| {
        let mut con = con.clone();
        let mut call = if real_release {
            scripts.release.prepare_invoke()
        } else {
            scripts.fair_delete.prepare_invoke()
        };
        if real_release {
            call.key(&lock).key(&fence).key(&queue).key(&alive);
            call.arg(OWNER).arg(token).arg("ladder:wake:");
        } else {
            call.key(&lock).key(&queue).arg(OWNER);
        }
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

/// The fenced floor on every connection at once, its delete round decided as soon as a
/// majority deleted: the deletes still unanswered finish in a task of their own.
async fn majority_floor_pair(
    scripts: &Scripts,
    cons: &[MultiplexedConnection],
) -> Result<(), Failure> {
    let [key, fence] = ["lock", "fence"].map(|k| format!("{{ladder-rl-majority}}:{k}"));
    let taken = join_all(cons.iter().map(|con| {
        let mut con = con.clone();
        let mut call = scripts.floor_fenced.prepare_invoke();
        call.key(&key).key(&fence).arg(OWNER).arg(10_000);
        async move { call.invoke_async::<i64>(&mut con).await }
    }))
    .await;
    for t in taken {
        if t? == 0 {
            return Err("the majority floor's key was held".into());
        }
    }
    let mut deletes: FuturesUnordered<_> = cons
        .iter()
        .map(|con| {
            let (mut con, script, key) = (con.clone(), scripts.floor_delete.clone(), key.clone());
            async move {
                script
                    .key(&key)
                    .arg(OWNER)
                    .invoke_async::<i64>(&mut con)
                    .await
            }
        })
        .collect();
    let quorum = cons.len() / 2 + 1;
    let mut deleted = 0;
    while deleted < quorum {
        match deletes.next().await {
            Some(Ok(1)) => deleted += 1,
            Some(other) => return Err(format!("not deleted: {other:?}").into()),
            None => return Err("fewer deletes than a majority".into()),
        }
    }
    if !deletes.is_empty() {
        tokio::spawn(async move { while deletes.next().await.is_some() {} });
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
    let real = RealScripts::load();
    let scripts = Scripts {
        floor_fenced: real.floor_fenced,
        floor_delete: real.floor_delete,
        fair: Script::new(FAIR),
        fair_delete: Script::new(FAIR_DELETE),
        try_fast: real.try_fast,
        release: real.release,
    };
    let backend: Arc<dyn DistributedLock> = backend_redlock::connect(&url).await?;
    let floor = dlock_bench::floor::connect(&url)
        .await?
        .fenced
        .ok_or("no fenced floor")?;
    let floor_name = LockName::new("ladder-floor")?;
    let name = LockName::new("ladder-backend")?;
    let opts = AcquireOptions::new()
        .wait(Wait::No)
        .keep_alive(KeepAlive::Off);
    let direct_opts = opts.clone().with_defaults(&backend.defaults());
    let written_back = LockName::new("ladder-write-back")?;
    // Start above whatever counters an earlier run left.
    let first = backend
        .try_acquire(&written_back, &direct_opts)
        .await?
        .ok_or("the write-back name was held")?;
    backend.release(&first).await?;
    let mut next_floor = first.token().0;

    let mut schedule = ladder::Schedule::new(STEPS.len(), rounds);
    while let Some(step) = schedule.next_step() {
        let t = Instant::now();
        match step {
            0 => floor.pair(&floor_name).await?,
            1 => majority_floor_pair(&scripts, &cons).await?,
            2 => inline_pair(&scripts, false, false, &cons).await?,
            3 => inline_pair(&scripts, true, false, &cons).await?,
            4 => inline_pair(&scripts, false, true, &cons).await?,
            5 => inline_pair(&scripts, true, true, &cons).await?,
            6 => {
                let lease = backend
                    .try_acquire(&name, &direct_opts)
                    .await?
                    .ok_or("the backend's name was held")?;
                backend.release(&lease).await?;
            }
            7 => {
                let guard = backend.lock("ladder-lockcore", &opts).await?;
                guard.release().await?;
            }
            _ => {
                // Above every counter: the granting nodes are raised to it.
                next_floor += 1_000;
                let floored = direct_opts
                    .clone()
                    .min_token(lockcore::FencingToken(next_floor));
                let lease = backend
                    .try_acquire(&written_back, &floored)
                    .await?
                    .ok_or("the write-back name was held")?;
                backend.release(&lease).await?;
                if lease.token().0 != next_floor {
                    return Err(format!("token {} for floor {next_floor}", lease.token().0).into());
                }
            }
        }
        schedule.record(step, t.elapsed());
    }
    ladder::report(&STEPS, schedule.into_samples());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let usage = "usage: redlock_ladder REDLOCK_URL [rounds]";
    ladder::run(None, usage, 50, ladder).await
}
