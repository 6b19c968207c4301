//! Redlock over N independent Redis masters (`redlock://h1:p1,h2:p2,h3:p3`), with fencing
//! tokens and waiters woken by any node.
//!
//! Every node is a single-server client of this crate ([`RedisLock`]): the same connection code
//! (TLS, ACL, timeouts), the same scripts and the same wake-up hub. What Redlock adds is the vote:
//!
//! * **Acquire.** The acquire script runs on every node at once, each request bounded by the
//!   node timeout. The lock is won when a majority (N/2+1) granted and the lease is still valid
//!   (`start + ttl − drift` lies ahead; the lease's clock starts before the first request). A lost
//!   vote is undone on every node that granted or did not answer (the undo follows the request
//!   on the same connection, so it lands after a late grant). An acquire dropped mid-vote arms a
//!   clean-up that does the same on every node at once, so cancelling leaves nothing behind.
//! * **Fencing without a single point of failure.** Each node keeps a per-name counter, bumped
//!   by its grant; a refusing node reports its counter too. Once a majority granted, the vote
//!   still listens to the other nodes for as long again as the majority took (healthy nodes
//!   answer together; a silent one costs that grace, not the node timeout), and the token is
//!   above every counter it heard: the largest
//!   granting counter, or a refusing node's counter + 1. Before the lease is returned, every
//!   granting node below the token gets a max-only write-back, and a majority must hold the
//!   token. Any later majority shares a node with that one, so the next token is larger, as long
//!   as no node loses its counter; hearing every node also carries the counters across the loss
//!   of one (a node restarted empty is outvoted by the counters of the others that answer).
//! * **Waiting.** A waiter joins the wake-up queue on every node. A release on any node wakes
//!   the head of that node's queue (one message, to one client); waiters also re-check on a
//!   bounded timer. A newcomer never jumps a live queue, but any queued waiter may win: the
//!   nodes may order waiters differently, so insisting on each node's head could split the
//!   votes for ever. A waiter keeps its place in every node's queue until it has won (a grant
//!   to a queued waiter leaves its entry, and a split vote gives back the lock but not the
//!   place), so one lost vote does not send it to the back of some queues and not others.
//!   After a split vote, both sides back off for a random time before trying again, so they
//!   do not retry in lockstep.
//! * **Extend** counts only when a majority extends within the lease's remaining validity;
//!   **release** goes to every node in parallel and returns once a majority deleted the lock
//!   (it also takes the holder's leftover queue entries off the nodes). Both check owner and
//!   token on each node, as the single-server scripts do (the write-back leaves every granting
//!   node's counter at the token).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, OwnerId, RawFloor, Released, Result,
    WaitMechanism, async_trait,
};

use crate::config::{Deployment, RedisConfig};
use crate::lock::{ASSUMPTION_UNKNOWN, RedisLock, detect_fencing, open_single};
use crate::queue::RECHECK;
use crate::scripts::{self, AcquireReply, Call, Key, Keys};
use crate::store::{Store, protocol_error};

/// The backend name in capabilities and error messages.
pub const REDLOCK: &str = "redlock";

/// URL schemes of Redlock (`redlocks://` speaks TLS to every node).
pub const REDLOCK_SCHEMES: &[&str] = &["redlock", "redlocks"];

/// Fencing assumption of Redlock when not every node persists every write.
pub const ASSUMPTION_REDLOCK: &str = "no node loses its fence counters: every node runs with appendonly yes + appendfsync always and never evicts keys (a node restarted empty can let a later majority start below an earlier token; keeping it out for the maximum ttl protects mutual exclusion, not the counters)";

/// The smallest default node timeout. ttl/100 is the default; below this a busy machine's
/// scheduling pauses alone would make healthy nodes look dead.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// Once a majority has answered, how long the others are still waited for: as long again as
/// the majority took, but at least this. Healthy nodes answer together, so their answers (and
/// fence counters) are heard; a silent node costs this, not the node timeout.
pub const MIN_GRACE: Duration = Duration::from_millis(2);

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

struct Node {
    client: RedisLock,
    addr: String,
}

struct Inner {
    nodes: Vec<Node>,
    quorum: usize,
    node_timeout: Option<Duration>,
    defaults: ClientDefaults,
    fencing: Fencing,
    redacted: String,
}

/// A Redlock client over N independent masters. Cheap to clone.
#[derive(Clone)]
pub struct RedlockLock {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedlockLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLock")
            .field("url", &self.inner.redacted)
            .field("nodes", &self.inner.nodes.len())
            .field("quorum", &self.inner.quorum)
            .field("fencing", &self.inner.fencing)
            .finish()
    }
}

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

/// What the acquirer decided after a vote; [`Inner::settle`] carries it out on the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Won: granting nodes keep the lock; the others are left (queue entry, late grant). The
    /// winner's queue entries go with its release.
    Keep,
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
enum Attempt {
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

/// What [`gather`] does after an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Wait for the next answer.
    More,
    /// Stop: the round is decided.
    Stop,
    /// The round is won; listen to the others only for as long again as the round took so far
    /// (at least [`MIN_GRACE`]).
    Grace,
}

/// Drives one round of node requests, all started together, under a single deadline (`limit`
/// from now) for all of them: one timer per round, not one per node (on a multi-threaded
/// runtime a timer can cost more than a request's own bookkeeping). `step` sees each answer as
/// it comes. Requests still pending at the end stay in `pending`.
async fn gather<F: Future>(
    pending: &mut FuturesUnordered<F>,
    limit: Duration,
    mut step: impl FnMut(F::Output) -> Flow,
) {
    let started = Instant::now();
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    let mut graced = false;
    loop {
        let answer = tokio::select! {
            biased;
            answer = pending.next() => answer,
            () = &mut deadline => return,
        };
        let Some(answer) = answer else {
            return;
        };
        match step(answer) {
            Flow::More => {}
            Flow::Stop => return,
            Flow::Grace if graced => {}
            Flow::Grace => {
                graced = true;
                let until = tokio::time::Instant::now() + started.elapsed().max(MIN_GRACE);
                if until < deadline.deadline() {
                    deadline.as_mut().reset(until);
                }
            }
        }
    }
}

impl RedlockLock {
    /// Connects to every node of a `redlock://` URL at once and reads each node's persistence
    /// settings. A minority of nodes may be down: they are tried again on every request.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened; nothing is held yet.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a URL that is not Redlock's or unusable TLS files (before any
    /// I/O); [`Error::Backend`] (retryable) naming each unreachable node when fewer than a
    /// majority answer within `timeout`. Messages never contain the password.
    pub async fn connect(config: &RedisConfig) -> Result<RedlockLock> {
        let Deployment::Redlock { nodes, tls } = &config.deployment else {
            return Err(Error::invalid_config(
                REDLOCK,
                format!("`{}` is not a redlock:// URL", config.redacted_url()),
            ));
        };
        let redacted = config.redacted_url().to_owned();
        let singles = nodes
            .iter()
            .map(|(host, port)| open_single(config, host, *port, *tls))
            .collect::<Result<Vec<_>>>()?;
        let probes = singles
            .into_iter()
            .zip(nodes)
            .map(|(single, (host, port))| async move {
                let reached = single.connection().await.err();
                let store = Store::Single(Box::new(single));
                let fencing = match reached {
                    None => detect_fencing(&store).await,
                    Some(_) => Fencing::Conditional {
                        assumption: ASSUMPTION_UNKNOWN,
                    },
                };
                (store, fencing, reached, format!("{host}:{port}"))
            });
        let probed = join_all(probes).await;
        let quorum = nodes.len() / 2 + 1;
        let reached = probed.iter().filter(|p| p.2.is_none()).count();
        if reached < quorum {
            let why: Vec<String> = probed
                .iter()
                .filter_map(|(_, _, e, addr)| e.as_ref().map(|e| format!("{addr}: {e}")))
                .collect();
            return Err(Error::backend(
                REDLOCK,
                "connect",
                None,
                true,
                format!(
                    "only {reached} of {} nodes of {redacted} answered, {quorum} needed ({})",
                    nodes.len(),
                    why.join("; ")
                ),
            ));
        }
        let all_strict = probed.iter().all(|p| p.1 == Fencing::Strict);
        let nodes = probed
            .into_iter()
            .map(|(store, fencing, error, addr)| {
                if let Some(e) = error {
                    tracing::warn!(node = %addr, error = %e, "redlock: node unreachable at connect; it is tried again on every request");
                }
                let shown = format!("node {addr} of {redacted}");
                Node {
                    client: RedisLock::from_store(config, store, fencing, shown),
                    addr,
                }
            })
            .collect();
        Ok(RedlockLock {
            inner: Arc::new(Inner {
                nodes,
                quorum,
                node_timeout: config.node_timeout,
                defaults: config.defaults.clone(),
                fencing: if all_strict {
                    Fencing::Strict
                } else {
                    Fencing::Conditional {
                        assumption: ASSUMPTION_REDLOCK,
                    }
                },
                redacted,
            }),
        })
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes must agree (N/2+1).
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Wake-up messages this client's subscribers received, over every node.
    pub fn wakeups(&self) -> u64 {
        self.inner
            .nodes
            .iter()
            .map(|n| n.client.stats().wakeups)
            .sum()
    }

    /// How long one node may take to answer one request for a lease of `ttl`: the URL's
    /// `node_timeout`, else ttl/100 but at least [`MIN_NODE_TIMEOUT`].
    pub fn node_timeout(&self, ttl: Duration) -> Duration {
        self.inner.node_limit(ttl)
    }
}

impl Inner {
    fn node_limit(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 100).max(MIN_NODE_TIMEOUT))
    }

    fn quorum_error(&self, operation: &'static str, got: usize) -> Error {
        Error::QuorumNotReached {
            backend: REDLOCK,
            operation,
            got,
            needed: self.quorum,
        }
    }

    /// One vote: the acquire script (`mode` `try` or `member`) on every node at once, each
    /// request bounded by the node timeout. Not just a majority is heard: each answer brings its
    /// fence counter, and the more counters the token is above, the more node losses fencing
    /// survives. Once a majority granted, the others get a grace as long as the majority took
    /// (at least [`MIN_GRACE`]). A vote that can no longer be won ends at once. Nodes not heard
    /// are listed in [`Tally::unheard`].
    async fn vote(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: &'static str,
    ) -> Tally {
        let limit = self.node_limit(opts.ttl_value());
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| async move {
                let node = &n.client.inner;
                let keys = Keys::new(&node.prefix, name);
                // No floor on the nodes: the acquirer lifts the token to it and the
                // write-back carries it (see `decide`).
                let reply = if mode == "try" {
                    node.try_once(name, &keys, owner, opts, 0).await
                } else {
                    node.attempt(name, &keys, owner, opts, mode, 0).await
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
    async fn settle(
        self: &Arc<Self>,
        name: &LockName,
        owner: OwnerId,
        mode: &'static str,
        decision: Decision,
        tally: &Tally,
        limit: Duration,
    ) {
        let queued = mode != "try";
        let keep_place = queued && decision == Decision::Retry;
        let mut undo: Vec<usize> = tally.failed.iter().map(|(i, _)| *i).collect();
        undo.extend(&tally.unheard);
        if decision != Decision::Keep {
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
                    if let Err(e) = node.client.inner.give_back(name, owner, keep_place).await {
                        tracing::debug!(lock = %name, node = %node.addr, error = %e, "redlock: undoing a node's part of an acquire failed; its ttl and queue liveness bound it");
                    }
                }
            }))
            .await;
        };
        match decision {
            Decision::Retry if !queued => {
                let _ = tokio::time::timeout(limit, tokio::spawn(work)).await;
            }
            Decision::Retry => work.await,
            Decision::Keep | Decision::Undo => {
                tokio::spawn(work);
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
            .map(|&(i, _)| {
                let node = &self.nodes[i].client.inner;
                let call = Keys::new(&node.prefix, name)
                    .call(&scripts::FENCE_MAX, &[Key::Fence])
                    .arg(token);
                async move { node.store.eval(&call).await }
            })
            .collect();
        gather(&mut writes, limit, |written| {
            if matches!(written, Ok(redis::Value::Int(v)) if v >= token as i64) {
                at_token += 1;
            }
            Flow::More
        })
        .await;
        at_token
    }

    /// One attempt: vote, and on a won vote the fence write-back and the validity check.
    async fn attempt(
        self: &Arc<Self>,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: &'static str,
    ) -> Result<Attempt> {
        let started = Instant::now();
        // Dropped before the vote is settled: everything this attempt may have left goes.
        let mut guard = Abandon {
            inner: self.clone(),
            name: name.clone(),
            owner,
            armed: true,
        };
        let tally = self.vote(name, owner, opts, mode).await;
        let (decision, outcome) = self.decide(name, owner, opts, mode, started, &tally).await;
        let limit = self.node_limit(opts.ttl_value());
        self.settle(name, owner, mode, decision, &tally, limit)
            .await;
        guard.armed = false;
        outcome
    }

    async fn decide(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: &'static str,
        started: Instant,
        tally: &Tally,
    ) -> (Decision, Result<Attempt>) {
        let q = self.quorum;
        if tally.granted.len() >= q {
            // Above every counter heard of: the granting nodes' counters already count this
            // grant; a refusing node's counter may be its holder's token. At least the
            // caller's floor: the write-back below carries it to the granting nodes' counters
            // before the lease is returned, as it does for any token above theirs.
            let granted = tally.granted.iter().map(|(_, t)| *t);
            let refused = tally.refused.iter().map(|(_, _, _, f)| f + 1);
            let floor = opts.token_floor_value().map_or(0, |f| f.0);
            let token = granted.chain(refused).max().unwrap_or(1).max(floor);
            let limit = self.node_limit(opts.ttl_value());
            let written = self.write_back(name, &tally.granted, token, limit).await;
            if written < q {
                return (
                    Decision::Undo,
                    Err(self.quorum_error("fence write-back", written)),
                );
            }
            let lease = crate::lock::Inner::lease(name, owner, token, started, opts);
            if !lease.is_valid() {
                let late = Error::backend(
                    REDLOCK,
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
            return (Decision::Keep, Ok(Attempt::Won(lease)));
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
        let decision = if mode == "try" && !split {
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

    /// Leaves every node's queue and deletes any lock granted to `owner` there.
    async fn cancel_everywhere(&self, name: &LockName, owner: OwnerId) {
        join_all(
            self.nodes
                .iter()
                .map(|n| async move { n.client.inner.cancel(name, owner).await }),
        )
        .await;
    }

    /// One acquire that does not wait for a holder. A split vote is not "held by another":
    /// contenders that split the nodes (nobody won a majority) each give their grants back and
    /// try again after a random pause ([`split_pause`]), up to [`SPLIT_RETRIES`]
    /// times, so that simultaneous `try_lock`s do not all fail. Every attempt uses the
    /// acquisition's one owner id (the caller's, if it chose one); a split vote's grants are
    /// given back before the next attempt, so no undo is still on its way to hit its grant.
    async fn try_acquire(
        self: &Arc<Self>,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        scripts::floor_arg(REDLOCK, opts)?;
        let owner = opts.owner_or_random();
        for _ in 0..SPLIT_RETRIES {
            match self.attempt(name, owner, opts, "try").await? {
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

    async fn acquire_wait(
        self: &Arc<Self>,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        scripts::floor_arg(REDLOCK, opts)?;
        let owner = opts.owner_or_random();
        let waiter = owner.to_string();
        // Registered before the first request, so a wake-up that names us is never dropped.
        let (registrations, subscribed): (Vec<_>, Vec<bool>) = self
            .nodes
            .iter()
            .map(|n| n.client.inner.hub.register(&waiter))
            .unzip();
        // Already subscribed everywhere (a client that waited before): every wake-up published
        // from now on reaches this waiter, so the first lost vote needs no second look.
        let mut subscribed = subscribed.into_iter().all(|s| s);
        let mut guard = Abandon {
            inner: self.clone(),
            name: name.clone(),
            owner,
            armed: true,
        };
        let limit = self.node_limit(opts.ttl_value());
        loop {
            let (split, wake_hint, round) = match self.attempt(name, owner, opts, "member").await? {
                Attempt::Won(lease) => {
                    guard.armed = false;
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
                join_all(self.nodes.iter().map(|n| async move {
                    let node = &n.client.inner;
                    let subscribed =
                        tokio::time::timeout(limit, node.hub.ensure_subscribed(&node.store)).await;
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
                guard.armed = false;
                self.cancel_everywhere(name, owner).await;
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
            subscribed = self
                .nodes
                .iter()
                .all(|n| n.client.inner.hub.is_subscribed());
        }
    }

    /// Per node: `Some(true)` extended, `Some(false)` refused (not this lease's any more),
    /// `None` no usable answer.
    fn extend_outcome(
        &self,
        lease: &Lease,
        started: Instant,
        ttl: Duration,
        answers: &[Option<bool>],
    ) -> Result<Lease> {
        let ok = answers.iter().filter(|a| **a == Some(true)).count();
        let refused = answers.iter().filter(|a| **a == Some(false)).count();
        if ok >= self.quorum {
            // Counts only within the validity the lease had: never resurrects an expired one.
            if lease.is_valid() {
                return Ok(lease.renewed(started, ttl));
            }
            return Err(Error::lock_lost(REDLOCK, lease.name(), "extend"));
        }
        if refused >= self.quorum || !lease.is_valid() {
            return Err(Error::lock_lost(REDLOCK, lease.name(), "extend"));
        }
        Err(self.quorum_error("extend", ok))
    }
}

/// Undoes a waiting acquire whose future was dropped: leaves every queue and deletes any lock
/// granted meanwhile, in a task spawned at once (never blocking in `drop`).
struct Abandon {
    inner: Arc<Inner>,
    name: LockName,
    owner: OwnerId,
    armed: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (inner, name, owner) = (self.inner.clone(), self.name.clone(), self.owner);
        lockcore::spawn_cleanup(REDLOCK, &self.name, async move {
            inner.cancel_everywhere(&name, owner).await;
            Ok(true)
        });
    }
}

#[async_trait]
impl DistributedLock for RedlockLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            REDLOCK,
            self.inner.fencing,
            Expiry::Ttl,
            Fairness::Unordered,
            WaitMechanism::PubSub,
        )
        // Every node request is bounded by the node timeout.
        .bounded_requests(true)
        // The token is lifted to the floor and written back to a majority before it is
        // returned.
        .token_floor(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.inner.try_acquire(name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.inner.acquire_wait(name, opts, deadline).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let inner = &self.inner;
        let limit = inner.node_limit(lease.ttl());
        // Decided once a majority deleted: the lock is no longer held, since no majority can
        // name this lease any more. The caller is not kept waiting for the slowest node. Every
        // request is on its node's connection by then (each future is polled at once, and a
        // connection sends in order, so this client's next request to that node comes after
        // it); those still unanswered finish in a task of their own, where their answers change
        // nothing. Another client meanwhile finds at most a minority still holding, and a
        // majority free.
        let mut pending: FuturesUnordered<_> = inner
            .nodes
            .iter()
            .map(|n| {
                let node = n.client.clone();
                let call = node.inner.release_call(lease);
                async move { decode_flag(node.inner.store.eval(&call).await) }
            })
            .collect();
        let (mut deleted, mut kept, mut failed) = (0, 0, 0);
        let q = inner.quorum;
        gather(&mut pending, limit, |answer| {
            match answer {
                Some(true) => deleted += 1,
                Some(false) => kept += 1,
                None => failed += 1,
            }
            if deleted >= q { Flow::Stop } else { Flow::More }
        })
        .await;
        if !pending.is_empty() {
            tokio::spawn(async move { while pending.next().await.is_some() {} });
        }
        if deleted >= q {
            Ok(Released::Released)
        } else if deleted + failed >= q {
            // A majority may still hold it: the release could not be confirmed.
            Err(inner.quorum_error("release", deleted + kept))
        } else {
            Ok(Released::NotHeld)
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::check_ttl(ttl)?;
        let inner = &self.inner;
        let started = Instant::now();
        let limit = inner.node_limit(ttl);
        let mut pending: FuturesUnordered<_> = inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let node = &n.client.inner;
                let call = node.extend_call(lease, ttl);
                async move { (i, decode_flag(node.store.eval(&call).await)) }
            })
            .collect();
        let mut answers = vec![None; inner.nodes.len()];
        let (mut ok, mut refused) = (0, 0);
        gather(&mut pending, limit, |(i, answer)| {
            ok += usize::from(answer == Some(true));
            refused += usize::from(answer == Some(false));
            answers[i] = answer;
            if ok >= inner.quorum || refused >= inner.quorum {
                Flow::Stop
            } else {
                Flow::More
            }
        })
        .await;
        inner.extend_outcome(lease, started, ttl, &answers)
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let inner = &self.inner;
        let (mut out, sent) = crate::queue::checked_batch(leases);
        if sent.is_empty() {
            return out.into_iter().flatten().collect();
        }
        let shortest = sent.iter().map(|&i| leases[i].1).min().unwrap_or_default();
        let limit = inner.node_limit(shortest);
        let started = Instant::now();
        // One pipeline per node, all nodes at once, under one deadline.
        let mut pending: FuturesUnordered<_> = inner
            .nodes
            .iter()
            .enumerate()
            .map(|(n, node)| {
                let node = &node.client.inner;
                let calls: Vec<Call> = sent
                    .iter()
                    .map(|&i| node.extend_call(&leases[i].0, leases[i].1))
                    .collect();
                async move { (n, node.store.eval_many(&calls).await) }
            })
            .collect();
        let mut per_node: Vec<Vec<Option<bool>>> = vec![vec![None; sent.len()]; inner.nodes.len()];
        gather(&mut pending, limit, |(n, replies)| {
            per_node[n] = replies.into_iter().map(decode_flag).collect();
            Flow::More
        })
        .await;
        for (k, &i) in sent.iter().enumerate() {
            let answers: Vec<Option<bool>> = per_node.iter().map(|node| node[k]).collect();
            let (lease, ttl) = &leases[i];
            out[i] = Some(inner.extend_outcome(lease, started, *ttl, &answers));
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(protocol_error("extend", None, "no reply".into()))))
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let inner = &self.inner;
        let limit = inner.node_limit(inner.defaults.ttl);
        let asked = inner.nodes.iter().map(|n| {
            let node = &n.client.inner;
            let call = Keys::new(&node.prefix, name).call(
                &scripts::INSPECT,
                &[Key::Lock, Key::Fence, Key::Queue, Key::Alive],
            );
            async move {
                match node.store.eval(&call).await {
                    Ok(v) => scripts::parse_inspect(&v),
                    Err(e) => Err(e.to_string()),
                }
            }
        });
        let mut views: Vec<std::result::Result<scripts::InspectReply, String>> = inner
            .nodes
            .iter()
            .map(|_| Err(format!("no answer within {limit:?}")))
            .collect();
        let mut pending: FuturesUnordered<_> = asked
            .enumerate()
            .map(|(i, f)| async move { (i, f.await) })
            .collect();
        gather(&mut pending, limit, |(i, view)| {
            views[i] = view;
            Flow::More
        })
        .await;
        let answered = views.iter().filter(|v| v.is_ok()).count();
        if answered < inner.quorum {
            return Err(inner.quorum_error("inspect", answered));
        }
        let mut details = Vec::with_capacity(views.len());
        let mut holders: Vec<(String, i64)> = Vec::new();
        let (mut token, mut waiters, mut seen) = (None::<u64>, 0usize, false);
        for (node, view) in inner.nodes.iter().zip(&views) {
            let line = match view {
                Err(e) => format!("node {}: unreachable ({e})", node.addr),
                Ok(v) => {
                    seen |= v.holder.is_some() || v.fence.is_some() || v.queued > 0;
                    token = token.max(v.fence);
                    waiters = waiters.max(usize::try_from(v.live_waiters).unwrap_or(0));
                    let fence = v.fence.map_or("none".to_owned(), |f| f.to_string());
                    match &v.holder {
                        Some(h) => {
                            holders.push((h.clone(), v.pttl));
                            format!(
                                "node {}: held by {h} ({} ms left), fence {fence}, {} waiting",
                                node.addr, v.pttl, v.live_waiters
                            )
                        }
                        None => format!(
                            "node {}: free, fence {fence}, {} waiting",
                            node.addr, v.live_waiters
                        ),
                    }
                }
            };
            details.push(line);
        }
        if !seen {
            return Ok(None);
        }
        // The holder is the owner a majority of nodes name; its lease lasts while a majority
        // still holds it: the quorum-th longest remaining time among them.
        let mut holder = None;
        let mut remaining = None;
        for (candidate, _) in &holders {
            let mut left: Vec<i64> = holders
                .iter()
                .filter(|(h, _)| h == candidate)
                .map(|(_, pttl)| *pttl)
                .collect();
            if left.len() >= inner.quorum {
                left.sort_unstable_by(|a, b| b.cmp(a));
                remaining = u64::try_from(left[inner.quorum - 1])
                    .ok()
                    .map(Duration::from_millis);
                holder = Some(candidate.clone());
                break;
            }
        }
        Ok(Some(
            LockInfo::new(
                name,
                holder,
                token.map(FencingToken),
                remaining,
                Some(waiters),
            )
            .with_details(details),
        ))
    }

    /// Forgets the name on every node. A release returns once a majority deleted the lock, so
    /// right after one (by any client) a minority may still hold it until that release's
    /// delete lands there: once a majority has forgotten the name (no majority can hold it),
    /// the nodes that refused are asked again for up to the node timeout. A node that still
    /// refuses then (a lease left there by a client that died) keeps the answer `false`.
    async fn forget(&self, name: &LockName) -> Result<bool> {
        let inner = &self.inner;
        let forget_on = |nodes: Vec<usize>| {
            join_all(
                nodes
                    .into_iter()
                    .map(|i| async move { (i, inner.nodes[i].client.forget(name).await) }),
            )
        };
        let mut answers: Vec<Option<Result<bool>>> = Vec::new();
        answers.resize_with(inner.nodes.len(), || None);
        let mut ask = (0..inner.nodes.len()).collect();
        let until = Instant::now() + inner.node_limit(inner.defaults.ttl);
        loop {
            for (i, answer) in forget_on(ask).await {
                answers[i] = Some(answer);
            }
            let forgotten = answers
                .iter()
                .filter(|a| matches!(a, Some(Ok(true))))
                .count();
            ask = (0..answers.len())
                .filter(|&i| matches!(answers[i], Some(Ok(false))))
                .collect();
            if ask.is_empty() || forgotten < inner.quorum || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(MIN_GRACE).await;
        }
        let mut all = true;
        for answer in answers.into_iter().flatten() {
            all &= answer?;
        }
        Ok(all)
    }

    /// The names any node knows (each node lists its fence counters with `SCAN`): a name
    /// granted by a majority is on most nodes, and one a node missed is still found on the
    /// others. Nodes that fail are skipped while at least one answers.
    async fn names(&self) -> Result<Vec<LockName>> {
        let answers = join_all(self.inner.nodes.iter().map(|n| n.client.names())).await;
        let mut names = std::collections::BTreeSet::new();
        let mut failure = None;
        let mut answered = 0;
        for answer in answers {
            match answer {
                Ok(found) => {
                    answered += 1;
                    names.extend(found);
                }
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            Some(e) if answered == 0 => Err(e),
            _ => Ok(names.into_iter().collect()),
        }
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(FanOutFloor {
            nodes: self.inner.nodes.iter().map(|n| n.client.clone()).collect(),
            fenced: false,
        }))
    }

    fn fenced_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(FanOutFloor {
            nodes: self.inner.nodes.iter().map(|n| n.client.clone()).collect(),
            fenced: true,
        }))
    }
}

/// `Some(true)` for a reply of 1, `Some(false)` for 0, `None` for anything else (an error or a
/// reply that does not decode).
fn decode_flag(reply: redis::RedisResult<redis::Value>) -> Option<bool> {
    reply.ok().and_then(|v| scripts::parse_flag(&v).ok())
}

/// The parallel fan-out floors, in Redlock's two rounds: on every node at once the plain
/// (`SET NX PX`) or the minimal fenced acquire (one script: `SET NX PX` + `INCR` of a fence
/// counter), all answers awaited, then on every node at once the compare-and-delete. Each node
/// is reached over its own connection, as Redlock's are.
struct FanOutFloor {
    nodes: Vec<RedisLock>,
    fenced: bool,
}

#[async_trait]
impl RawFloor for FanOutFloor {
    fn description(&self) -> String {
        let acquire = if self.fenced {
            "one script SET NX PX + INCR fence"
        } else {
            "SET NX PX"
        };
        format!(
            "on all {} nodes in parallel: {acquire}; once all answered, EVALSHA compare-and-delete on all",
            self.nodes.len()
        )
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let taken = join_all(
            self.nodes
                .iter()
                .map(|n| n.floor_acquire(name, self.fenced)),
        )
        .await;
        let taken = taken.into_iter().collect::<Result<Vec<_>>>()?;
        let deleted = join_all(
            self.nodes
                .iter()
                .zip(&taken)
                .map(|(n, (key, value))| n.floor_delete(name, key, value)),
        )
        .await;
        deleted.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}
