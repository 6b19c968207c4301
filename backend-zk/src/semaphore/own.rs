//! A semaphore in dlock's own layout: one EPHEMERAL_SEQUENTIAL request node per acquirer
//! under the semaphore's container, created in one transaction with a versioned write of the
//! count; the first `permits` nodes hold, and a waiter watches the nodes right ahead of its own
//! (or, with many permits, the children).

use std::time::Instant;

use lockcore::{AcquireOptions, Error, Lease, LockName, Result, backend_support::permits_mismatch};
use zookeeper_client as zk;

use super::{
    DLOCK_PERMIT, PERMIT_REQUESTS, Paths, PermitNode, node_gone, permits_of, recorded, wait_change,
};
use crate::BACKEND;
use crate::cleanup::arm_attempt;
use crate::lock::ZkLock;
use crate::names::Layout;
use crate::session::{acls, no_answer, timed, until, zk_error};

/// Up to this many permits, a waiter in dlock's layout watches the `permits` nodes right ahead
/// of its own (see [`ZkLock::wait_ahead`]); above it, the semaphore's children.
const WATCH_AHEAD_MAX: usize = 16;

/// The watches a waiter in dlock's layout keeps while it waits (see [`ZkLock::wait_ahead`]).
#[derive(Default)]
struct Watching {
    /// The nodes ahead with an `exists` watch not yet fired.
    nodes: std::collections::HashSet<String>,
    /// Their events, by node.
    changes: tokio::task::JoinSet<(String, zk::EventType)>,
    /// The watch on the waiter's own node, once set and until it fires.
    own: Option<std::pin::Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>>,
}

/// What ended one wait of [`ZkLock::wait_ahead`].
enum Woke {
    /// The waiter's own node changed.
    Own,
    /// A node ahead was found gone as its watch was set.
    FoundGone,
    /// A watched node ahead had this event.
    Node(String, zk::EventType),
    /// The watch task ended without an event (it never does unless the client goes away).
    Lost,
}

impl ZkLock {
    /// dlock's layout: queue, and hold among the first `permits`.
    pub(super) async fn dlock_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        paths: &Paths,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Lease>> {
        const OP: &str = "acquire a permit";
        let client = self.inner.session.client().await?;
        let owner = opts.owner_or_random();
        let parent = &paths.leases;
        let mut guard = arm_attempt(
            name,
            &client,
            Layout::Dlock,
            parent,
            owner,
            &PERMIT_REQUESTS,
        );
        let count = permits.to_string();
        let prefix = format!("{parent}/{DLOCK_PERMIT}{owner}-");
        let node_opts = zk::CreateMode::EphemeralSequential.with_acls(acls(&self.inner.config));
        // Admission: the count read with the children, written back in the transaction that
        // creates the node, at the version read (so any admission in between sends us round).
        // Whether this session's server was brought up to date before reporting a mismatch.
        let mut synced = false;
        let path = loop {
            let data = client.get_data(parent);
            let listed = client.get_children(parent);
            let (data, listed) =
                tokio::join!(timed(self.limit(), data), timed(self.limit(), listed));
            let (data, listed) = match (data, listed) {
                (Ok(Ok(d)), Ok(Ok(l))) => (d, l),
                (Ok(Err(zk::Error::NoNode)), _) | (_, Ok(Err(zk::Error::NoNode))) => {
                    let containers = zk::CreateMode::Container.with_acls(acls(&self.inner.config));
                    match timed(
                        self.limit(),
                        client.create(parent, count.as_bytes(), &containers),
                    )
                    .await
                    {
                        Ok(Ok(_) | Err(zk::Error::NodeExists)) => continue,
                        Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                        Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                    }
                }
                (Ok(Err(e)), _) | (_, Ok(Err(e))) => return Err(zk_error(OP, Some(name), e)),
                _ => return Err(no_answer(OP, Some(name), self.limit())),
            };
            let ((data, stat), (children, listed_stat)) = (data, listed);
            if stat.version != listed_stat.version {
                continue;
            }
            // With credentials, before the node is made. Only these credentials may replace
            // the parent once it and the base node passed (the versioned write below does not
            // tell one parent from another).
            self.check_parent(&client, OP, parent, name, Some(listed_stat.czxid), None)
                .await?;
            let in_use = !permits_of(Layout::Dlock, &children).is_empty();
            if let Some(r) = recorded(&data).filter(|r| in_use && *r != u64::from(permits)) {
                // A follower may still list holders that have left through another server: a
                // mismatch is reported only from what the session sees once caught up.
                if !synced {
                    self.caught_up(&client, parent, name, OP).await?;
                    synced = true;
                    continue;
                }
                return Err(permits_mismatch(name, r, permits));
            }
            let mut multi = client.new_multi_writer();
            multi
                .add_set_data(parent, count.as_bytes(), Some(stat.version))
                .and_then(|()| multi.add_create(&prefix, &[], &node_opts))
                .map_err(|e| zk_error(OP, Some(name), e))?;
            match timed(self.limit(), multi.commit()).await {
                Ok(Ok(results)) => match results.into_iter().nth(1) {
                    Some(zk::MultiWriteResult::Create { path, .. }) => {
                        guard.state_mut().path = Some(path.clone());
                        break path;
                    }
                    _ => {
                        return Err(Error::backend(
                            BACKEND,
                            OP,
                            Some(name),
                            false,
                            "the server's reply to the transaction lacks the create",
                        ));
                    }
                },
                Ok(Err(e)) => match zk::Error::from(e) {
                    zk::Error::BadVersion | zk::Error::NoNode => continue,
                    // The guard finds a node that was made after all by its owner id.
                    e => return Err(zk_error(OP, Some(name), e)),
                },
                Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
            }
        };
        let me = path.rsplit('/').next().unwrap_or_default().to_owned();
        // Few permits: watch the nodes right ahead (see `wait_ahead`); many: the children.
        let watch_children = permits as usize > WATCH_AHEAD_MAX;
        let mut stat = None;
        // Set when this request was the first waiter (exactly `permits` nodes ahead, all
        // watched) and one of them went while its node stood: fewer than `permits` are ahead
        // then, and no node can be created below an existing one, so it holds without reading
        // the children again (dlock's layout has only dlock clients).
        let mut ahead_gone = false;
        let mut watching = Watching::default();
        loop {
            let checked_at = Instant::now();
            let listed = if ahead_gone {
                Ok(Ok((vec![me.clone()], None)))
            } else if watch_children {
                let listed = timed(self.limit(), client.list_and_watch_children(parent)).await;
                listed.map(|r| r.map(|(children, w)| (children, Some(w))))
            } else {
                let listed = timed(self.limit(), client.list_children(parent)).await;
                listed.map(|r| r.map(|children| (children, None)))
            };
            let (children, watcher) = match listed {
                Ok(Ok(listed)) => listed,
                Ok(Err(zk::Error::NoNode)) => (Vec::new(), None),
                Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
            };
            let queue = permits_of(Layout::Dlock, &children);
            let Some(at) = queue.iter().position(|c| c.node == me) else {
                guard.disarm();
                return Err(node_gone(&client, name, "while it waited"));
            };
            if at < permits as usize {
                let stat = match stat.take() {
                    Some(stat) => Some(stat),
                    None => self.czxid(&client, &path, name).await?,
                };
                let Some(stat) = stat else {
                    guard.disarm();
                    return Err(node_gone(&client, name, "as it became a holder"));
                };
                let lease = self.permit_lease(&client, name, opts, &path, &stat, checked_at);
                guard.disarm();
                return Ok(Some(lease));
            }
            if !wait || deadline.is_some_and(|d| Instant::now() >= d) {
                self.withdraw(&client, &path, guard).await;
                return Ok(None);
            }
            // The node's stat (its czxid is the token) is read while waiting, once, so that it
            // is not a round trip between the release ahead and this grant. (The listing just
            // made shows the node stands; the stat a create returns cannot be trusted on every
            // server, see `czxid`.)
            if stat.is_none() {
                stat = self.czxid(&client, &path, name).await?;
            }
            match watcher {
                Some(watcher) => wait_change(watcher, deadline).await,
                None => {
                    let ahead = &queue[at - permits as usize..at];
                    let gone = self
                        .wait_ahead(&client, name, parent, ahead, &path, &mut watching, deadline)
                        .await?;
                    ahead_gone = gone && at == permits as usize;
                }
            }
        }
    }

    /// Waits, in dlock's layout, until one of the `ahead` nodes (the `permits` nodes right
    /// ahead of this request's node `mine`) or `mine` itself changes, the session breaks, or
    /// `deadline` passes; returns at once if one of them is gone already. Says `true` only
    /// when a node of `ahead` is known deleted while `mine` is known to stand.
    ///
    /// While all `permits` of them stand, at least `permits` nodes are ahead, so this request
    /// cannot hold, whatever happens further ahead; it can only move up once one of them goes.
    /// So a release wakes only the waiters that have the freed node among their `permits`
    /// predecessors, not every waiter (and a new request behind wakes nobody), where a watch
    /// on the children would wake every waiter at every change.
    ///
    /// The watches stay in `watching` across calls: a node stays among the `permits` right
    /// ahead until it goes (nodes ahead only ever go), so after a release a waiter sends one
    /// `exists` for the node that moved into its window, not one for each.
    ///
    /// `mine`'s own watch is looked at first, and the client hands a session's watch events
    /// and replies over in the server's order, so a deletion of `mine` that came before is
    /// seen first (as the lock's `wait_for` does).
    #[allow(clippy::too_many_arguments)]
    async fn wait_ahead(
        &self,
        client: &zk::Client,
        name: &LockName,
        parent: &str,
        ahead: &[PermitNode],
        mine: &str,
        watching: &mut Watching,
        deadline: Option<Instant>,
    ) -> Result<bool> {
        // Every new watch is on the wire before any reply is awaited, `mine` last: if a node
        // ahead is gone and `mine` stands after, `mine` stood when that node was read.
        let sent: Vec<_> = ahead
            .iter()
            .filter(|n| !watching.nodes.contains(&n.node))
            .map(|n| {
                let watch = client.check_and_watch_stat(&format!("{parent}/{}", n.node));
                (n.node.clone(), watch)
            })
            .collect();
        let own = watching
            .own
            .is_none()
            .then(|| client.check_and_watch_stat(mine));
        let mut gone = false;
        for (node, watch) in sent {
            let (stat, watcher) = self.watched(name, watch).await?;
            match stat {
                Some(_) => {
                    watching.nodes.insert(node.clone());
                    watching
                        .changes
                        .spawn(async move { (node, watcher.changed().await.event_type) });
                }
                None => gone = true,
            }
        }
        if let Some(own) = own {
            let (stat, watcher) = self.watched(name, own).await?;
            if stat.is_none() {
                return Ok(false);
            }
            watching.own = Some(Box::pin(watcher.changed()));
        }
        let Some(own_changed) = watching.own.as_mut() else {
            return Ok(false);
        };
        loop {
            // Own first: when both events are already in, the deletion of this request's node
            // must not be missed.
            let changed = async {
                tokio::select! {
                    biased;
                    _ = own_changed.as_mut() => Woke::Own,
                    () = std::future::ready(()), if gone => Woke::FoundGone,
                    event = watching.changes.join_next() => match event {
                        Some(Ok((node, event))) => Woke::Node(node, event),
                        _ => Woke::Lost,
                    },
                }
            };
            match until(deadline, changed).await {
                None | Some(Woke::Lost) => return Ok(false),
                Some(Woke::FoundGone) => return Ok(true),
                Some(Woke::Own) => {
                    // Its watch is spent.
                    watching.own = None;
                    return Ok(false);
                }
                Some(Woke::Node(node, event)) => {
                    watching.nodes.remove(&node);
                    // A node that went before the listing `ahead` comes from: nothing to do.
                    if ahead.iter().any(|n| n.node == node) {
                        return Ok(event == zk::EventType::NodeDeleted);
                    }
                }
            }
        }
    }
}
