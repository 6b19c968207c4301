//! `inspect` over the quorum: every node's view, the holder a majority names, and how long a
//! majority still holds it.

use std::time::Duration;

use backend_redis::node::InspectReply;
use futures_util::stream::FuturesUnordered;
use lockcore::{FencingToken, LockInfo, LockName, Result};

use crate::masters::{Flow, Masters, gather};

/// Each node's view (holder, time left, fence, waiters) in [`LockInfo::details`], the
/// holder a majority names, its token (the highest fence among the nodes that hold it; with no
/// such holder, the highest fence heard), and the most live waiters any node
/// counts; a quorum error when fewer than a majority answer.
pub(crate) async fn inspect(masters: &Masters, name: &LockName) -> Result<Option<LockInfo>> {
    let limit = masters.node_limit(masters.defaults.ttl);
    let asked = masters
        .nodes
        .iter()
        .map(|n| async move { n.node.inspect(name).await.map_err(|e| e.to_string()) });
    let mut views: Vec<std::result::Result<InspectReply, String>> = masters
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
    if answered < masters.quorum {
        return Err(masters.quorum_error("inspect", answered));
    }
    let mut details = Vec::with_capacity(views.len());
    // (owner, ms left, that node's fence) of each node that names a holder.
    let mut holders: Vec<(String, i64, Option<u64>)> = Vec::new();
    let (mut token, mut waiters, mut seen) = (None::<u64>, 0usize, false);
    for (node, view) in masters.nodes.iter().zip(&views) {
        let line = match view {
            Err(e) => format!("node {}: unreachable ({e})", node.addr),
            Ok(v) => {
                seen |= v.holder.is_some() || v.fence.is_some() || v.queued > 0;
                token = token.max(v.fence);
                waiters = waiters.max(usize::try_from(v.live_waiters).unwrap_or(0));
                let fence = v.fence.map_or("none".to_owned(), |f| f.to_string());
                match &v.holder {
                    Some(h) => {
                        holders.push((h.clone(), v.pttl, v.fence));
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
    // still holds it: the quorum-th longest remaining time among them. Its token is the
    // highest fence among the nodes that hold it: a node the holder's vote left out may have
    // counted other clients' refused attempts since, so its fence can be above the holder's.
    let mut holder = None;
    let mut remaining = None;
    for (candidate, _, _) in &holders {
        let theirs = || holders.iter().filter(|(h, _, _)| h == candidate);
        let mut left: Vec<i64> = theirs().map(|(_, pttl, _)| *pttl).collect();
        if left.len() >= masters.quorum {
            left.sort_unstable_by(|a, b| b.cmp(a));
            remaining = u64::try_from(left[masters.quorum - 1])
                .ok()
                .map(Duration::from_millis);
            holder = Some(candidate.clone());
            token = theirs().filter_map(|(_, _, fence)| *fence).max();
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
