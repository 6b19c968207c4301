//! Acquiring over the quorum: a `try` that retries split votes, and the waiting acquire.
//!
//! A waiter joins the wake-up queue on every node. A release on any node wakes the head of that
//! node's queue (one message, to one client); waiters also re-check on a bounded timer. A
//! newcomer never jumps a live queue, but any queued waiter may win: the nodes may order
//! waiters differently, so insisting on each node's head could split the votes for ever. A
//! waiter keeps its place in every node's queue until it has won (a grant to a queued waiter
//! leaves its entry, and a split vote gives back the lock but not the place), so one lost vote
//! does not send it to the back of some queues and not others. After a split vote, both sides
//! back off for a random time before trying again, so they do not retry in lockstep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_redis::node::{self, Mode, RECHECK};
use futures_util::future::join_all;
use lockcore::{AcquireOptions, Lease, LockName, Result};

use crate::BACKEND;
use crate::masters::Masters;
use crate::vote::{self, Attempt};

/// How many times a non-waiting acquire tries after split votes before it says `None`.
const SPLIT_RETRIES: usize = 5;

/// The random pause after a split vote is drawn from a window this many times as long as the
/// vote took: contenders must come back more than a vote apart, or they split again.
const SPLIT_WINDOW_ROUNDS: u32 = 10;

/// Bounds of that window: at least this (a vote on loopback takes a fraction of a
/// millisecond)...
const SPLIT_BACKOFF_MIN: Duration = Duration::from_millis(2);

/// ...and at most this (a slow vote must not stretch the pause without bound).
const SPLIT_BACKOFF: Duration = Duration::from_millis(15);

/// A random pause after a split vote that took `round`.
fn split_pause(round: Duration) -> Duration {
    let window = (round * SPLIT_WINDOW_ROUNDS).clamp(SPLIT_BACKOFF_MIN, SPLIT_BACKOFF);
    window.mul_f64(rand::random::<f64>())
}

/// One acquire that does not wait for a holder. A split vote is not "held by another":
/// contenders that split the nodes (nobody won a majority) each give their grants back and
/// try again after a random pause ([`split_pause`]), up to [`SPLIT_RETRIES`]
/// times, so that simultaneous `try_lock`s do not all fail. Every attempt uses the
/// acquisition's one owner id (the caller's, if it chose one); a split vote's grants are
/// given back before the next attempt, so no undo is still on its way to hit its grant.
pub(crate) async fn try_acquire(
    masters: &Arc<Masters>,
    name: &LockName,
    opts: &AcquireOptions,
) -> Result<Option<Lease>> {
    node::min_token_arg(BACKEND, opts)?;
    let owner = opts.owner_or_random();
    for _ in 0..SPLIT_RETRIES {
        match vote::attempt(masters, name, owner, opts, Mode::Try).await? {
            Attempt::Won(lease) => return Ok(Some(lease)),
            Attempt::Lost {
                split: true, round, ..
            } => {
                tokio::time::sleep(split_pause(round)).await;
            }
            Attempt::Lost { .. } => return Ok(None),
        }
    }
    Ok(None)
}

/// Waits for the lock until `deadline`, on every node's queue at once (see the module docs).
pub(crate) async fn acquire_wait(
    masters: &Arc<Masters>,
    name: &LockName,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
) -> Result<Option<Lease>> {
    node::min_token_arg(BACKEND, opts)?;
    let owner = opts.owner_or_random();
    let waiter = owner.to_string();
    // Registered before the first request, so a wake-up that names us is never dropped.
    let (registrations, subscribed): (Vec<_>, Vec<bool>) = masters
        .nodes
        .iter()
        .map(|n| n.node.register(&waiter, name))
        .unzip();
    // Already subscribed everywhere (a client that waited before): every wake-up published
    // from now on reaches this waiter, so the first lost vote needs no second look.
    let mut subscribed = subscribed.into_iter().all(|s| s);
    let guard = vote::arm(masters, name, owner);
    let limit = masters.node_limit(opts.ttl_value());
    loop {
        let (split, wake_hint, round) =
            match vote::attempt(masters, name, owner, opts, Mode::Member).await? {
                Attempt::Won(lease) => {
                    let _ = guard.disarm();
                    return Ok(Some(lease));
                }
                Attempt::Lost {
                    split,
                    wake_hint,
                    round,
                } => (split, wake_hint, round),
            };
        if !subscribed {
            // Subscribe on every node, then check again at once: a release between the
            // attempt above and the subscription is caught by that second attempt. A node
            // that cannot subscribe is covered by the re-check timer.
            join_all(masters.nodes.iter().map(|n| async move {
                let subscribed = tokio::time::timeout(limit, n.node.ensure_subscribed(name)).await;
                if let Err(e) = subscribed
                    .map_err(|_| format!("no answer within {limit:?}"))
                    .and_then(|r| r.map_err(|e| e.to_string()))
                {
                    tracing::debug!(node = %n.addr, error = %e, "redlock: cannot subscribe; re-checking on the timer");
                }
            }))
            .await;
            subscribed = true;
            continue;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            // Leaves every queue; a failure is logged by the nodes' ttls and liveness bound
            // what is left.
            let _ = guard.run_now().await;
            return Ok(None);
        }
        let mut wake = if split {
            // Both sides of a split gave their grants back; whoever comes back first wins.
            now + split_pause(round)
        } else {
            // Jittered, so waiters that missed a wake-up do not all come back at once.
            now + RECHECK.mul_f64(0.75 + rand::random::<f64>() / 2.0)
        };
        if let Some(hint) = wake_hint {
            wake = wake.min(now + hint);
        }
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        if !split {
            let woken = futures_util::future::select_all(
                registrations.iter().map(|r| Box::pin(r.notified())),
            );
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        } else {
            tokio::time::sleep_until(wake.into()).await;
        }
        subscribed = masters.nodes.iter().all(|n| n.node.is_subscribed(name));
    }
}
