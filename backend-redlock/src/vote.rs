//! One vote and how it is carried out: the acquire script on every node at once, the tally, the
//! decision (keep, retry, undo), the fence write-back that puts the token on a majority, and
//! the settling that gives back on each node what the decision says must go.
//!
//! * **Acquire.** The lock is won when a majority (N/2+1) granted and the lease is still valid
//!   (`start + ttl − drift` lies ahead; the lease's clock starts before the first request). A
//!   lost vote is undone on every node that granted or did not answer (the undo follows the
//!   request on the same connection, so it lands after a late grant).
//! * **Fencing without a single point of failure.** Each node keeps a per-name counter, bumped
//!   by its grant; a refusing node reports its counter too. Once a majority granted, the vote
//!   still listens to the other nodes for as long again as the majority took (healthy nodes
//!   answer together; a silent one costs that grace, not the node timeout), and the token is
//!   above every counter it heard: the largest granting counter, or a refusing node's counter
//!   plus one. Before the lease is returned, every granting node below the token gets a
//!   max-only write-back, and a majority must hold the token. Any later majority shares a node
//!   with that one, so the next token is larger, as long as no node loses its counter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_redis::node::{self, AcquireReply, Mode};
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use lockcore::cleanup::CleanupGuard;
use lockcore::{AcquireOptions, Error, FencingToken, Lease, LockName, OwnerId, Result};

use crate::BACKEND;
use crate::masters::{Attempted, Flow, Masters, gather, leave_everywhere};

/// What one node said to one acquire request.
#[derive(Debug)]
enum Vote {
    /// Granted; the node's fence counter after its grant.
    Granted(u64),
    /// Held by another owner or queued for; `pttl` of the holder, this owner's `rank`, and the
    /// node's fence counter.
    Refused { pttl: i64, rank: i64, fence: u64 },
    /// No usable answer within the node timeout.
    Failed(String),
}

/// What the acquirer decided after a vote; [`Masters::settle`] carries it out on the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Won with this token: granting nodes keep the lock. A node not heard in time is undone
    /// (its late queue entry, or a late grant below the token), except a late grant that
    /// carries the token itself: that one is part of the lease (see [`Masters::settle`]). The
    /// winner's queue entries go with its release.
    Keep(u64),
    /// Lost a split vote and will try again: grants are given back, queue entries (this
    /// waiter's place on every node) stay.
    Retry,
    /// Lost (or the acquirer went away): everything this attempt left on any node goes.
    Undo,
}

/// The votes of one attempt.
struct Tally {
    granted: Vec<(usize, u64)>,
    /// `(node, pttl, rank, fence)`.
    refused: Vec<(usize, i64, i64, u64)>,
    failed: Vec<(usize, String)>,
    /// Nodes whose answer the vote did not wait for (it could no longer be won).
    unheard: Vec<usize>,
}

/// How one attempt ended.
pub(crate) enum Attempt {
    Won(Lease),
    /// Not won. `split`: some node granted (the vote split, so back off at random);
    /// `wake_hint`: when the holder's lease runs out on a node whose queue this owner heads;
    /// `round`: how long the attempt took.
    Lost {
        split: bool,
        wake_hint: Option<Duration>,
        round: Duration,
    },
}

impl Masters {
    /// One vote: the acquire script (`mode` `try` or `member`) on every node at once, each
    /// request bounded by the node timeout. Not just a majority is heard: each answer brings its
    /// fence counter, and the more counters the token is above, the more node losses fencing
    /// survives. Once a majority granted, the others get a grace as long as the majority took
    /// (at least [`MIN_GRACE`](crate::MIN_GRACE)). A vote that can no longer be won ends at once. Nodes not heard
    /// are listed in [`Tally::unheard`].
    async fn vote(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
    ) -> Tally {
        let limit = self.node_limit(opts.ttl_value());
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| async move {
                // No minimum on the nodes: the acquirer lifts the token to it and the
                // write-back carries it (see `decide`).
                let reply = if mode == Mode::Try {
                    n.node.try_once(name, owner, opts, 0).await
                } else {
                    n.node.acquire(name, owner, opts, mode, 0).await
                };
                let vote = match reply {
                    Ok(AcquireReply::Granted(token)) => Vote::Granted(token),
                    Ok(AcquireReply::Waiting { pttl, rank, fence }) => {
                        Vote::Refused { pttl, rank, fence }
                    }
                    Err(e) => Vote::Failed(e.to_string()),
                };
                (i, vote)
            })
            .collect();
        let mut tally = Tally {
            granted: Vec::new(),
            refused: Vec::new(),
            failed: Vec::new(),
            unheard: Vec::new(),
        };
        let mut heard = vec![false; self.nodes.len()];
        let q = self.quorum;
        gather(&mut pending, limit, |(i, vote)| {
            heard[i] = true;
            match vote {
                Vote::Granted(t) => tally.granted.push((i, t)),
                Vote::Refused { pttl, rank, fence } => tally.refused.push((i, pttl, rank, fence)),
                Vote::Failed(e) => tally.failed.push((i, e)),
            }
            if tally.refused.len() >= q || tally.failed.len() >= q {
                Flow::Stop
            } else if tally.granted.len() >= q {
                Flow::Grace
            } else {
                Flow::More
            }
        })
        .await;
        tally.unheard = (0..heard.len()).filter(|&i| !heard[i]).collect();
        tally
    }

    /// Carries out `decision` on the nodes: gives back what this attempt left where the
    /// decision says it must go (see [`Decision`]). A request that was not answered (timed out,
    /// or dropped with the vote) may still land: its node gets the undo after it, on the same
    /// connection.
    ///
    /// A [`Decision::Retry`] is carried out before this returns: the next attempt uses the same
    /// owner id, and an undo still on its way could delete that attempt's grant. A split `try`
    /// waits for it at most `limit` (the node timeout, as long as a vote may take), so a node
    /// that does not answer cannot stretch a non-waiting acquire: an undo still unanswered then
    /// went out on that node's connection ahead of the next attempt's request, and a late
    /// grant of a node that stays silent is undone by that attempt's own settling. The others
    /// run in a task of their own (this acquisition is over).
    ///
    /// After a won vote the undo runs beside the winner's next requests, so it spares a late
    /// grant holding the winning token: an extend checks owner and token on each node, counts
    /// such a grant, and may leave another node unextended once a majority said yes; deleting
    /// the late grant after that would leave the extended lease on a minority. (A late grant
    /// with another token is never counted by extend or release, so it goes.)
    async fn settle(
        self: &Arc<Self>,
        name: &LockName,
        owner: OwnerId,
        mode: Mode,
        decision: Decision,
        tally: &Tally,
        limit: Duration,
    ) {
        let queued = mode != Mode::Try;
        let keep_place = queued && decision == Decision::Retry;
        let spare = match decision {
            Decision::Keep(token) => Some(FencingToken(token)),
            Decision::Retry | Decision::Undo => None,
        };
        let mut undo: Vec<usize> = tally.failed.iter().map(|(i, _)| *i).collect();
        undo.extend(&tally.unheard);
        if spare.is_none() {
            undo.extend(tally.granted.iter().map(|(i, _)| *i));
        }
        if queued && decision != Decision::Retry {
            undo.extend(tally.refused.iter().map(|(i, ..)| *i));
        }
        if undo.is_empty() {
            return;
        }
        let (inner, name) = (self.clone(), name.clone());
        let work = async move {
            join_all(undo.into_iter().map(|i| {
                let (node, name) = (&inner.nodes[i], &name);
                async move {
                    if let Err(e) = node.node.give_back(name, owner, keep_place, spare).await {
                        tracing::debug!(lock = %name, node = %node.addr, error = %e, "redlock: undoing a node's part of an acquire failed; its ttl and queue liveness bound it");
                    }
                }
            }))
            .await;
        };
        match decision {
            Decision::Retry if !queued => {
                if let Some(undo) = lockcore::cleanup::spawn_counted(work) {
                    let _ = tokio::time::timeout(limit, undo).await;
                }
            }
            Decision::Retry => work.await,
            Decision::Keep(_) | Decision::Undo => {
                lockcore::cleanup::spawn_counted(work);
            }
        }
    }

    /// Raises the fence counter of every granting node that is below `token` to `token`, and
    /// returns how many granting nodes hold `token` afterwards (a majority must). Every one is
    /// waited for (within the node timeout), not just a majority: release and extend check the
    /// token on each node, and a node left below it would keep the lock until its ttl.
    async fn write_back(
        &self,
        name: &LockName,
        granted: &[(usize, u64)],
        token: u64,
        limit: Duration,
    ) -> usize {
        let mut at_token = granted.iter().filter(|(_, t)| *t >= token).count();
        if at_token == granted.len() {
            return at_token;
        }
        let mut writes: FuturesUnordered<_> = granted
            .iter()
            .filter(|(_, t)| *t < token)
            .map(|&(i, _)| self.nodes[i].node.fence_max(name, token))
            .collect();
        gather(&mut writes, limit, |written| {
            if matches!(written, Ok(v) if v >= token) {
                at_token += 1;
            }
            Flow::More
        })
        .await;
        at_token
    }

    async fn decide(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        started: Instant,
        tally: &Tally,
    ) -> (Decision, Result<Attempt>) {
        let q = self.quorum;
        if tally.granted.len() >= q {
            // Above every counter heard of: the granting nodes' counters already count this
            // grant; a refusing node's counter may be its holder's token. At least the
            // caller's minimum: the write-back below carries it to the granting nodes' counters
            // before the lease is returned, as it does for any token above theirs.
            let granted = tally.granted.iter().map(|(_, t)| *t);
            let refused = tally.refused.iter().map(|(_, _, _, f)| f + 1);
            let min_token = opts.min_token_value().map_or(0, |f| f.0);
            let token = granted.chain(refused).max().unwrap_or(1).max(min_token);
            let limit = self.node_limit(opts.ttl_value());
            let written = self.write_back(name, &tally.granted, token, limit).await;
            if written < q {
                return (
                    Decision::Undo,
                    Err(self.quorum_error("fence write-back", written)),
                );
            }
            let lease = node::lease(name, owner, token, started, opts);
            if !lease.is_valid() {
                let late = Error::backend(
                    BACKEND,
                    "acquire",
                    Some(name),
                    true,
                    format!(
                        "a majority granted the lock only after its validity (ttl {:?} − drift) had run out; released it on every node",
                        opts.ttl_value()
                    ),
                );
                return (Decision::Undo, Err(late));
            }
            return (Decision::Keep(token), Ok(Attempt::Won(lease)));
        }
        let answered = tally.granted.len() + tally.refused.len();
        if answered < q {
            let why: Vec<String> = tally
                .failed
                .iter()
                .map(|(i, e)| format!("{}: {e}", self.nodes[*i].addr))
                .collect();
            tracing::debug!(lock = %name, failures = %why.join("; "), "redlock: no majority answered");
            return (Decision::Undo, Err(self.quorum_error("acquire", answered)));
        }
        let split = !tally.granted.is_empty();
        let wake_hint = tally
            .refused
            .iter()
            .filter(|(_, pttl, rank, _)| *rank == 0 && *pttl >= 0)
            .map(|(_, pttl, _, _)| Duration::from_millis(*pttl as u64 + 1))
            .min();
        // A `try` that split the vote tries again with the same owner id (one per
        // acquisition, maybe the caller's): its grants must be given back before that, as for
        // a waiter.
        let decision = if mode == Mode::Try && !split {
            Decision::Undo
        } else {
            Decision::Retry
        };
        let round = started.elapsed();
        (
            decision,
            Ok(Attempt::Lost {
                split,
                wake_hint,
                round,
            }),
        )
    }
}

/// The clean-up guard of `owner`'s acquire on `name`, armed before its first request.
pub(crate) fn arm(
    masters: &Arc<Masters>,
    name: &LockName,
    owner: OwnerId,
) -> CleanupGuard<Attempted> {
    CleanupGuard::arm(
        BACKEND,
        name,
        (masters.clone(), name.clone(), owner),
        leave_everywhere,
    )
}

/// One attempt: vote, and on a won vote the fence write-back and the validity check.
pub(crate) async fn attempt(
    masters: &Arc<Masters>,
    name: &LockName,
    owner: OwnerId,
    opts: &AcquireOptions,
    mode: Mode,
) -> Result<Attempt> {
    let started = Instant::now();
    // Dropped before the vote is settled: everything this attempt may have left goes.
    let guard = arm(masters, name, owner);
    let tally = masters.vote(name, owner, opts, mode).await;
    let (decision, outcome) = masters
        .decide(name, owner, opts, mode, started, &tally)
        .await;
    let limit = masters.node_limit(opts.ttl_value());
    masters
        .settle(name, owner, mode, decision, &tally, limit)
        .await;
    let _ = guard.disarm();
    outcome
}
