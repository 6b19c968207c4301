//! [`RedlockLock`]: Redlock over N independent Redis masters (`redlock://h1:p1,h2:p2,h3:p3`),
//! with fencing tokens and waiters woken by any node. Connecting, capabilities and the
//! [`DistributedLock`] impl are here, with release, extend and the names, which go to every
//! node and count a majority; the vote is in `vote.rs`, the waiting in `wait.rs`, `inspect` in
//! `inspect.rs`.
//!
//! Every node is backend-redis's single-master primitives ([`Node`]): the same connection code
//! (TLS, ACL, timeouts), the same scripts and the same wake-up hub as a single server. What
//! Redlock adds is the vote:
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

use backend_redis::RedisConfig;
use backend_redis::config::Deployment;
use backend_redis::node::{self, Node};
use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, Lease, LockInfo, LockName, Released, Result, WaitMechanism, async_trait,
};

use crate::BACKEND;
use crate::masters::{Flow, MIN_GRACE, Master, Masters, gather};
use crate::{inspect, wait};

/// Keeps probing the nodes that had not answered when connect returned, until each answers or
/// the client is dropped; a node whose persistence turns out not to keep its counters turns the
/// client's fencing claim conditional from then on (and says so).
async fn probe_late_nodes(inner: std::sync::Weak<Masters>, mut late: Vec<usize>) {
    let mut pause = Duration::from_millis(200);
    while !late.is_empty() {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let before = strong.fencing();
        let probes = late.iter().map(|&i| {
            let node = &strong.nodes[i];
            async move { (i, node.probe().await) }
        });
        let mut still = Vec::new();
        for (i, outcome) in join_all(probes).await {
            let node = &strong.nodes[i];
            match outcome {
                Ok(fencing) => {
                    tracing::info!(node = %node.addr, ?fencing, "redlock: a node that was silent at connect answered");
                }
                Err(e) => {
                    tracing::debug!(node = %node.addr, error = %e, "redlock: node still silent");
                    still.push(i);
                }
            }
        }
        if before == Fencing::Strict && strong.fencing() != Fencing::Strict {
            tracing::warn!(
                url = %strong.redacted,
                "redlock: a node that answered late does not keep its counters \
                 (appendonly yes + appendfsync always, no eviction): fencing is conditional from now on"
            );
        }
        drop(strong);
        late = still;
        if !late.is_empty() {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

/// A Redlock client over N independent masters. Cheap to clone.
#[derive(Clone)]
pub struct RedlockLock {
    inner: Arc<Masters>,
}

impl fmt::Debug for RedlockLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLock")
            .field("url", &self.inner.redacted)
            .field("nodes", &self.inner.nodes.len())
            .field("quorum", &self.inner.quorum)
            .field("fencing", &self.inner.fencing())
            .finish()
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
                BACKEND,
                format!("`{}` is not a redlock:// URL", config.redacted_url()),
            ));
        };
        let redacted = config.redacted_url().to_owned();
        let nodes_built = nodes
            .iter()
            .map(|(host, port)| {
                let addr = format!("{host}:{port}");
                let shown = format!("node {addr} of {redacted}");
                Ok(Master::new(
                    Node::open(config, host, *port, *tls, shown)?,
                    addr,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let quorum = nodes.len() / 2 + 1;
        let inner = Arc::new(Masters {
            nodes: nodes_built,
            quorum,
            node_timeout: config.node_timeout,
            defaults: config.defaults.clone(),
            redacted,
        });
        // Probed in parallel; connect returns as soon as a majority has answered, and the
        // others are probed on in the background (every request tries them anyway).
        let mut pending: FuturesUnordered<_> = (0..inner.nodes.len())
            .map(|i| {
                let inner = inner.clone();
                async move { (i, inner.nodes[i].probe().await) }
            })
            .collect();
        let (mut answered, mut failures) = (Vec::new(), Vec::new());
        while answered.len() < quorum {
            let Some((i, outcome)) = pending.next().await else {
                break;
            };
            match outcome {
                Ok(_) => answered.push(i),
                Err(e) => failures.push((i, e)),
            }
        }
        if answered.len() < quorum {
            let why: Vec<String> = failures
                .iter()
                .map(|(i, e)| format!("{}: {e}", inner.nodes[*i].addr))
                .collect();
            // Refused credentials are the reason worth reporting: retrying cannot help.
            if let Some((_, denied)) = failures
                .into_iter()
                .find(|(_, e)| matches!(e, Error::AccessDenied { .. }))
            {
                return Err(denied);
            }
            return Err(Error::backend(
                BACKEND,
                "connect",
                None,
                true,
                format!(
                    "only {} of {} nodes of {} answered, {quorum} needed ({})",
                    answered.len(),
                    inner.nodes.len(),
                    inner.redacted,
                    why.join("; ")
                ),
            ));
        }
        for (i, e) in &failures {
            tracing::warn!(node = %inner.nodes[*i].addr, error = %e, "redlock: node unreachable at connect; it is tried again on every request");
        }
        let mut late: Vec<usize> = failures.iter().map(|(i, _)| *i).collect();
        if !pending.is_empty() || !late.is_empty() {
            // The probes still running are finished, not dropped: a connection being set up
            // would otherwise start over on the node's first request, whose node timeout may
            // be shorter than connecting takes on a busy machine.
            let weak = Arc::downgrade(&inner);
            tokio::spawn(async move {
                while let Some((i, outcome)) = pending.next().await {
                    if outcome.is_err() {
                        late.push(i);
                    }
                }
                probe_late_nodes(weak, late).await;
            });
        }
        Ok(RedlockLock { inner })
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
        self.inner.nodes.iter().map(|n| n.node.wakeups()).sum()
    }

    /// How long one node may take to answer one request for a lease of `ttl`: the URL's
    /// `node_timeout`, else ttl/100 but at least [`MIN_NODE_TIMEOUT`](crate::MIN_NODE_TIMEOUT).
    pub fn node_timeout(&self, ttl: Duration) -> Duration {
        self.inner.node_limit(ttl)
    }
}

impl Masters {
    /// The lease an extend renewed, from each node's answer to it. Per node: `Some(true)` extended, `Some(false)` refused (not this lease's any more),
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
            return Err(Error::lock_lost(BACKEND, lease.name(), "extend"));
        }
        if refused >= self.quorum || !lease.is_valid() {
            return Err(Error::lock_lost(BACKEND, lease.name(), "extend"));
        }
        Err(self.quorum_error("extend", ok))
    }
}

#[async_trait]
impl DistributedLock for RedlockLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            self.inner.fencing(),
            Expiry::Ttl,
            Fairness::Unordered,
            WaitMechanism::PubSub,
        )
        .native(crate::NATIVE)
        // Every node request is bounded by the node timeout.
        .bounded_requests(true)
        // The token is lifted to the minimum and written back to a majority before it is
        // returned.
        .min_token(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        wait::try_acquire(&self.inner, name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        wait::acquire_wait(&self.inner, name, opts, deadline).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let inner = &self.inner;
        let limit = inner.node_limit(lease.ttl());
        // Decided once a majority deleted: the lock is no longer held, since no majority can
        // name this lease any more. The caller is not kept waiting for the slowest node: those
        // still unanswered finish in a task of their own, where their answers change nothing.
        // Until they land, any client (this one too: a delete that met `NOSCRIPT` is sent again
        // behind the script's load, after whatever this client sent meanwhile) finds at most a
        // minority still holding, and a majority free.
        let mut pending: FuturesUnordered<_> = inner
            .nodes
            .iter()
            .map(|n| {
                let release = n.node.release(lease);
                async move { release.await.ok() }
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
            lockcore::cleanup::spawn_counted(
                async move { while pending.next().await.is_some() {} },
            );
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
        lockcore::backend_support::check_ttl(ttl)?;
        let inner = &self.inner;
        let started = Instant::now();
        let limit = inner.node_limit(ttl);
        let mut pending: FuturesUnordered<_> = inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| async move { (i, n.node.extend(lease, ttl).await.ok()) })
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
        let (mut out, sent) = node::checked_batch(leases);
        if sent.is_empty() {
            return out.into_iter().flatten().collect();
        }
        let shortest = sent.iter().map(|&i| leases[i].1).min().unwrap_or_default();
        let limit = inner.node_limit(shortest);
        let started = Instant::now();
        let batch: Vec<(&Lease, Duration)> =
            sent.iter().map(|&i| (&leases[i].0, leases[i].1)).collect();
        // One pipeline per node, all nodes at once, under one deadline.
        let mut pending: FuturesUnordered<_> = inner
            .nodes
            .iter()
            .enumerate()
            .map(|(n, master)| {
                let batch = &batch;
                async move { (n, master.node.extend_many(batch).await) }
            })
            .collect();
        let mut per_node: Vec<Vec<Option<bool>>> = vec![vec![None; sent.len()]; inner.nodes.len()];
        gather(&mut pending, limit, |(n, replies)| {
            per_node[n] = replies.into_iter().map(Result::ok).collect();
            Flow::More
        })
        .await;
        for (k, &i) in sent.iter().enumerate() {
            let answers: Vec<Option<bool>> = per_node.iter().map(|node| node[k]).collect();
            let (lease, ttl) = &leases[i];
            out[i] = Some(inner.extend_outcome(lease, started, *ttl, &answers));
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(Error::backend(BACKEND, "extend", None, false, "no reply")))
            })
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        inspect::inspect(&self.inner, name).await
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
                    .map(|i| async move { (i, inner.nodes[i].node.forget(name).await) }),
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
        let answers = join_all(self.inner.nodes.iter().map(|n| n.node.names())).await;
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
}
