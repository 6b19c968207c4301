//! The two deployments behind one interface: run a script (`EVALSHA`, sent again behind a
//! `SCRIPT LOAD` on `NOSCRIPT`, e.g. after a server restart), run many scripts as pipelines,
//! run a plain command, open a subscriber; and map redis errors to [`lockcore::Error`].

use std::collections::BTreeMap;

use futures_util::future::join_all;
use lockcore::{Error, LockName};
use redis::aio::{ConnectionLike, PubSub};
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::cluster::{Cluster, NodeAddr, slot};
use super::scripts::{Call, Lua};
use super::single::Single;
use crate::BACKEND;

/// A single server or a Cluster.
pub(crate) enum Store {
    Single(Box<Single>),
    Cluster(Box<Cluster>),
}

/// The error of a single request's answer, if it failed.
fn failure(r: &RedisResult<Value>) -> Option<&RedisError> {
    r.as_ref().err()
}

/// The first error among a pipeline's answers, if any failed.
#[allow(clippy::ptr_arg)] // `Single::send` passes the pipeline's own output type.
fn first_failure(results: &Vec<RedisResult<Value>>) -> Option<&RedisError> {
    results.iter().find_map(failure)
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

async fn run<C: ConnectionLike>(con: &mut C, cmd: &Cmd) -> RedisResult<Value> {
    cmd.query_async(con).await
}

/// Sends `cmds` as one pipeline on `con`: one result per command, in order (all failed alike
/// when the pipeline failed or its reply count is wrong).
async fn pipeline_of<C: ConnectionLike>(con: &mut C, cmds: Vec<Cmd>) -> Vec<RedisResult<Value>> {
    let n = cmds.len();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for cmd in cmds {
        pipe.add_command(cmd);
    }
    let e = match pipe.query_async::<Vec<RedisResult<Value>>>(con).await {
        Ok(r) if r.len() == n => return r,
        Ok(r) => RedisError::from((
            ErrorKind::Parse,
            "pipeline reply count mismatch",
            format!("{} replies for {n} commands", r.len()),
        )),
        Err(e) => e,
    };
    (0..n).map(|_| Err(e.clone())).collect()
}

fn script_load(lua: &Lua) -> Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(&lua.code);
    cmd
}

/// Runs `calls` as one pipeline on `con`; replies in order, one result per call. Calls the
/// server answered with `NOSCRIPT` did not run: they go again in a second pipeline, behind a
/// `SCRIPT LOAD` of each script they need, so a script the server does not know (after a
/// restart or `SCRIPT FLUSH`) costs one round trip more, and its source is sent once however
/// many calls of it the batch holds. (Not `EVAL` with the source, also one round trip: Redis 8
/// and Valkey 8 evict the oldest of the scripts that `EVAL` cached beyond 500, never one that
/// `SCRIPT LOAD` did, so on a server shared with an application that builds its scripts
/// `EVAL` would keep costing the extra round trip.)
async fn pipeline_on<C: ConnectionLike>(con: &mut C, calls: &[&Call]) -> Vec<RedisResult<Value>> {
    let mut results = pipeline_of(con, calls.iter().map(|c| c.cmd().clone()).collect()).await;
    let missing: Vec<usize> = (0..calls.len())
        .filter(|&i| results[i].as_ref().err().is_some_and(is_noscript))
        .collect();
    if missing.is_empty() {
        return results;
    }
    let mut scripts: Vec<&Lua> = Vec::new();
    for &i in &missing {
        if !scripts.iter().any(|l| l.sha == calls[i].lua.sha) {
            scripts.push(calls[i].lua);
        }
    }
    let again = (scripts.iter().map(|l| script_load(l)))
        .chain(missing.iter().map(|&i| calls[i].cmd().clone()))
        .collect();
    let mut replies = pipeline_of(con, again).await.into_iter();
    let loads: Vec<RedisResult<Value>> = replies.by_ref().take(scripts.len()).collect();
    for (i, r) in missing.into_iter().zip(replies) {
        results[i] = loaded(r, &calls[i].lua.sha, &scripts, &loads);
    }
    results
}

/// A call's answer after its script's `SCRIPT LOAD` went ahead of it: still `NOSCRIPT` where
/// that load failed (an ACL without `SCRIPT LOAD`, say), in which case the load's error is the
/// one that says why.
fn loaded(
    r: RedisResult<Value>,
    sha: &str,
    scripts: &[&Lua],
    loads: &[RedisResult<Value>],
) -> RedisResult<Value> {
    match r {
        Err(e) if is_noscript(&e) => {
            let load = scripts.iter().position(|l| l.sha == sha);
            match load.and_then(|k| loads.get(k)) {
                Some(Err(load_error)) => Err(load_error.clone()),
                _ => Err(e),
            }
        }
        other => other,
    }
}

/// Runs one call on `con`; on `NOSCRIPT` (it did not run), sends its script's `SCRIPT LOAD`
/// and the call again as one pipeline: one round trip more, not two. In a Cluster the pair
/// goes to the call's node, since `SCRIPT LOAD` names no key.
async fn eval_on<C: ConnectionLike>(con: &mut C, call: &Call) -> RedisResult<Value> {
    let cmd = call.cmd();
    match run(con, cmd).await {
        Err(e) if is_noscript(&e) => {
            let mut pair = pipeline_of(con, vec![script_load(call.lua), cmd.clone()]).await;
            let answer = pair.pop().unwrap_or(Err(e));
            loaded(answer, &call.lua.sha, &[call.lua], &pair)
        }
        other => other,
    }
}

impl Store {
    /// Runs one script.
    pub(crate) async fn eval(&self, call: &Call) -> RedisResult<Value> {
        match self {
            Store::Single(s) => {
                let request = |mut con| async move { eval_on(&mut con, call).await };
                s.send(call.lua.repeatable, request, failure, Err).await
            }
            Store::Cluster(c) => {
                c.with(|mut con| async move { eval_on(&mut con, call).await })
                    .await
            }
        }
    }

    /// Runs many scripts with as few round trips as the deployment allows: one pipeline on a
    /// single server; in a Cluster one pipeline per master (grouped by our slot map), all sent
    /// at once.
    pub(crate) async fn eval_many(&self, calls: &[Call]) -> Vec<RedisResult<Value>> {
        if calls.is_empty() {
            return Vec::new();
        }
        match self {
            Store::Single(s) => {
                let refs: Vec<&Call> = calls.iter().collect();
                let refs = &refs;
                let request = |mut con| async move { pipeline_on(&mut con, refs).await };
                let unconnected = |e: RedisError| calls.iter().map(|_| Err(e.clone())).collect();
                let repeatable = calls.iter().all(|c| c.lua.repeatable);
                s.send(repeatable, request, first_failure, unconnected)
                    .await
            }
            Store::Cluster(c) => cluster_many(c, calls).await,
        }
    }

    /// Runs one plain command (routed by its key in a Cluster).
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            // A plain command (a scan, a minimum's step) is not known to be repeatable.
            Store::Single(s) => {
                let request = |mut con| async move { run(&mut con, cmd).await };
                s.send(false, request, failure, Err).await
            }
            Store::Cluster(c) => {
                c.with(|mut con| async move { run(&mut con, cmd).await })
                    .await
            }
        }
    }

    /// Runs plain commands that name no key: as one pipeline on a single server, one by one
    /// in a Cluster (where each goes wherever redis-rs routes it). One result per command.
    pub(crate) async fn query_many(&self, cmds: &[Cmd]) -> Vec<RedisResult<Value>> {
        match self {
            Store::Single(s) => {
                let request = |mut con| async move { pipeline_of(&mut con, cmds.to_vec()).await };
                let unconnected = |e: RedisError| cmds.iter().map(|_| Err(e.clone())).collect();
                s.send(false, request, first_failure, unconnected).await
            }
            Store::Cluster(c) => {
                join_all(
                    cmds.iter()
                        .map(|cmd| c.with(move |mut con| async move { run(&mut con, cmd).await })),
                )
                .await
            }
        }
    }

    /// A new dedicated subscriber connection.
    pub(crate) async fn pubsub(&self) -> RedisResult<PubSub> {
        match self {
            Store::Single(s) => s.pubsub().await,
            Store::Cluster(c) => c.pubsub().await,
        }
    }
}

/// Whether retrying after `e` can help (connection trouble, failover, loading: yes; a refused
/// password, a missing permission, a script error: no).
pub(crate) fn is_retryable(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_cluster_error() {
        return true;
    }
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        ) | ErrorKind::ClusterConnectionNotFound
    )
}

/// The [`Error::AccessDenied`] that `e` stands for, when the server refused this client: no
/// password where one is required (`NOAUTH`, or the connection closed with "unauthenticated
/// ... length" when the first command was a long one), a wrong user name or password
/// (`WRONGPASS`), or an ACL that forbids a command the lock needs (`NOPERM`).
pub(crate) fn access_denied(operation: &'static str, e: &RedisError) -> Option<Error> {
    let text = e.to_string();
    let reason = if e.code() == Some("NOAUTH") || text.contains("unauthenticated") {
        "the server requires a password (NOAUTH): put it in the URL as \
         redis://:PASSWORD@host (or redis://USER:PASSWORD@host for an ACL user)"
            .to_owned()
    } else if e.kind() == ErrorKind::AuthenticationFailed || e.code() == Some("WRONGPASS") {
        "the server refused the user name or password (WRONGPASS)".to_owned()
    } else if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        format!(
            "the server's ACL does not let this user run what the lock needs (NOPERM: {}); \
             it needs EVALSHA, SCRIPT LOAD, PING and SUBSCRIBE on the prefix's keys and channels",
            e.detail().unwrap_or("")
        )
    } else {
        return None;
    };
    Some(Error::access_denied(BACKEND, operation, reason))
}

/// A redis error as a [`lockcore::Error`]: [`Error::AccessDenied`] when the server refused
/// this client (see [`access_denied`]), else [`Error::Backend`].
pub(crate) fn backend_error(
    operation: &'static str,
    name: Option<&LockName>,
    e: RedisError,
) -> Error {
    if let Some(denied) = access_denied(operation, &e) {
        return denied;
    }
    let retryable = is_retryable(&e);
    Error::backend(BACKEND, operation, name, retryable, e)
}

/// A reply that does not decode (a bug or a server we do not understand): not retryable.
pub(crate) fn protocol_error(
    operation: &'static str,
    name: Option<&LockName>,
    what: String,
) -> Error {
    Error::backend(BACKEND, operation, name, false, what)
}

/// A Cluster batch: one pipeline per master, sent concurrently. A call that fails inside its
/// node's pipeline (a slot that moved, a script the node does not know, a node that failed) is
/// sent again on its own through the redirect-aware cluster connection, after a slot map refresh.
async fn cluster_many(c: &Cluster, calls: &[Call]) -> Vec<RedisResult<Value>> {
    if !c.has_slots()
        && let Err(e) = c.refresh_slots().await
    {
        tracing::debug!(error = %e, "redis cluster: CLUSTER SLOTS failed; renewing call by call");
    }
    let mut groups: BTreeMap<Option<NodeAddr>, Vec<usize>> = BTreeMap::new();
    for (i, call) in calls.iter().enumerate() {
        groups
            .entry(c.node_of(slot(call.first_key())))
            .or_default()
            .push(i);
    }
    let runs = groups.iter().map(|(node, indices)| async move {
        let Some((host, port)) = node.clone() else {
            return indices.iter().map(|_| None).collect::<Vec<_>>();
        };
        let mut pipe = redis::pipe();
        for &i in indices {
            pipe.add_command(calls[i].cmd().clone());
        }
        match c
            .current()
            .route_pipeline(
                pipe,
                0,
                indices.len(),
                SingleNodeRoutingInfo::ByAddress { host, port },
            )
            .await
        {
            Ok(values) if values.len() == indices.len() => {
                values.into_iter().map(|v| v.extract_error().ok()).collect()
            }
            _ => indices.iter().map(|_| None).collect(),
        }
    });
    let outcomes = join_all(runs).await;
    let mut results: Vec<Option<RedisResult<Value>>> = calls.iter().map(|_| None).collect();
    for (indices, outcome) in groups.values().zip(outcomes) {
        for (&i, r) in indices.iter().zip(outcome) {
            results[i] = r.map(Ok);
        }
    }
    let retry: Vec<usize> = (0..calls.len()).filter(|&i| results[i].is_none()).collect();
    if !retry.is_empty() {
        if let Err(e) = c.refresh_slots().await {
            tracing::debug!(error = %e, "redis cluster: slot map refresh failed");
        }
        let again =
            join_all(retry.iter().map(|&i| {
                c.with(move |mut con| async move { eval_on(&mut con, &calls[i]).await })
            }))
            .await;
        for (i, r) in retry.into_iter().zip(again) {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(RedisError::from((ErrorKind::Client, "no reply")))))
        .collect()
}

#[cfg(test)]
mod tests;
