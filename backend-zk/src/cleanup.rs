//! The deletes that must get through: undoing an acquisition that ends without its lock or
//! permit (the state of its clean-up guard), and deleting a node while the connection is down
//! but the session lives (a node left behind would block the queue for the session's life).

use std::time::Duration;

use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::{LockName, OwnerId};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::names::Layout;

/// What an acquisition (of a lock or of a permit) has created under `parent` so far: the state
/// of its clean-up guard.
pub(crate) struct Attempt {
    pub(crate) client: zk::Client,
    pub(crate) layout: Layout,
    pub(crate) parent: String,
    pub(crate) owner: OwnerId,
    /// The attempt's node, once the create's reply (or a search after a lost one) named it.
    pub(crate) path: Option<String>,
    /// The kind of node it makes.
    pub(crate) nodes: &'static Nodes,
}

/// The nodes an acquisition makes, as its clean-up knows them.
pub(crate) struct Nodes {
    /// Among a parent's children, the node that an owner created, if any: how the clean-up
    /// finds the node when the create's reply never came.
    pub(crate) node_of: fn(Layout, &[String], OwnerId) -> Option<String>,
    /// What the node is, for the clean-up's log lines.
    pub(crate) what: &'static str,
}

/// Arms the clean-up guard of an acquisition by `owner` under `parent` of `name` that has
/// created nothing yet: if it ends without the lock or permit, [`undo_attempt`] deletes the node
/// it made (one of `nodes`).
pub(crate) fn arm_attempt(
    name: &LockName,
    client: &zk::Client,
    layout: Layout,
    parent: &str,
    owner: OwnerId,
    nodes: &'static Nodes,
) -> CleanupGuard<Attempt> {
    let attempt = Attempt {
        client: client.clone(),
        layout,
        parent: parent.to_owned(),
        owner,
        path: None,
        nodes,
    };
    CleanupGuard::arm(BACKEND, name, attempt, undo_attempt)
}

/// Undoes an acquisition that ends without the lock: deletes its node or, if the create's reply
/// never came, the node carrying its owner id. The delete of a known node is sent right here
/// (the client sends a request when it is called), so it goes out even where no runtime is left
/// to await its reply; awaiting it, retrying while the connection is down, and finding a node by
/// its owner id run as a counted clean-up.
pub(crate) fn undo_attempt(attempt: Attempt) -> Undo {
    let Attempt {
        client,
        layout,
        parent,
        owner,
        path,
        nodes: Nodes { node_of, what },
    } = attempt;
    if let Some(path) = path {
        let sent = client.delete(&path, None);
        return Undo::Spawn(Box::pin(async move {
            let first = sent.await;
            Ok(retry_delete(client, path, first, what).await)
        }));
    }
    Undo::Spawn(Box::pin(async move {
        let found = loop {
            match client.list_children(&parent).await {
                Ok(children) => {
                    break node_of(layout, &children, owner).map(|n| format!("{parent}/{n}"));
                }
                Err(zk::Error::NoNode) => break None,
                Err(e) if retry_cleanup(&client, &e) => tokio::time::sleep(CLEANUP_RETRY).await,
                Err(_) => break None,
            }
        };
        Ok(match found {
            Some(path) => delete_eventually(client, path, what).await,
            None => false,
        })
    }))
}

/// Whether the session is over (expired, closed, or its authentication failed): the server
/// deletes its ephemeral nodes, so there is nothing left to clean up.
pub(crate) fn session_ended(state: zk::SessionState) -> bool {
    matches!(
        state,
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
    )
}

/// Pause between clean-up attempts while the session is disconnected.
const CLEANUP_RETRY: Duration = Duration::from_millis(200);

/// Whether a clean-up step that failed with `e` is worth trying again: the session is still
/// alive (disconnected, say), so its nodes stay until someone deletes them.
fn retry_cleanup(client: &zk::Client, e: &zk::Error) -> bool {
    crate::session::is_retryable(e) && !session_ended(client.state())
}

/// Deletes `path`, retrying while the connection is down and the session lives (a node left
/// behind would block the queue for the session's whole life); gives up when the session
/// ends, which deletes the node anyway. `true` when this call deleted the node.
pub(crate) async fn delete_eventually(
    client: zk::Client,
    path: String,
    what: &'static str,
) -> bool {
    let first = client.delete(&path, None).await;
    retry_delete(client, path, first, what).await
}

/// [`delete_eventually`] for a delete already sent, which answered `result`.
async fn retry_delete(
    client: zk::Client,
    path: String,
    mut result: std::result::Result<(), zk::Error>,
    what: &'static str,
) -> bool {
    loop {
        match result {
            Ok(()) => {
                tracing::debug!(node = %path, "{what} node deleted");
                return true;
            }
            Err(zk::Error::NoNode) => return false,
            Err(e) if retry_cleanup(&client, &e) => {
                tokio::time::sleep(CLEANUP_RETRY).await;
                result = client.delete(&path, None).await;
            }
            Err(e) => {
                tracing::warn!(node = %path, error = %e, "{what} node not deleted; the session's end removes it");
                return false;
            }
        }
    }
}
