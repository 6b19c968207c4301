//! Renewing leases: a lease's node stays as long as the session, so a renewal only checks that
//! the node is still the lease's and this client still holds it, and moves the lease's end
//! in this client's book (the reaper deletes the nodes whose end passed); many at once are
//! read with one multi-read per [`MULTI_READ`] nodes.

use std::time::{Duration, Instant};

use lockcore::{DistributedLock, Error, Lease, Result};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::lock::{Held, ZkLock, effective_ttl, parse_handle};
use crate::session::{no_answer, timed, zk_error};

/// Nodes read per multi-read when renewing many leases (each answer is a stat of about 100
/// bytes, far below the server's 1 MB packet limit).
const MULTI_READ: usize = 1000;

impl ZkLock {
    /// Whether this client may renew its node `path` of a lease made in session `of` (`None`:
    /// not known): it still holds it, in the current `session` (a node of an earlier session
    /// ended with that session, and is forgotten).
    pub(crate) fn may_renew(&self, path: &str, of: Option<i64>, session: i64) -> bool {
        if of.is_some_and(|of| of != session) {
            self.held().remove(path);
            return false;
        }
        self.held()
            .get(path)
            .is_some_and(|held| held.until > Instant::now())
    }

    /// The end of a renewal of `lease`, whose node `path` a read started at `started` found
    /// with `stat` (`None`: gone): renewed for `ttl` when the node is still the lease's (its
    /// `czxid` the token, its ephemeral owner `session`) and this client still holds it; else
    /// `LockLost`, and a node that is no longer the lease's is forgotten.
    pub(crate) fn renewed(
        &self,
        lease: &Lease,
        path: &str,
        stat: Option<&zk::Stat>,
        session: i64,
        started: Instant,
        ttl: Duration,
    ) -> Result<Lease> {
        let lost = || Error::lock_lost(BACKEND, lease.name(), "extend");
        let ours =
            stat.is_some_and(|s| s.czxid as u64 == lease.token().0 && s.ephemeral_owner == session);
        let mut held = self.held();
        if !ours {
            held.remove(path);
            return Err(lost());
        }
        match held.get_mut(path) {
            Some(Held { until, .. }) if *until > Instant::now() => {
                *until = started + ttl;
                Ok(lease.renewed(started, ttl))
            }
            _ => Err(lost()),
        }
    }

    /// [`DistributedLock::extend_many`] (see its doc on [`ZkLock`]'s impl).
    pub(crate) async fn renew_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let lost = |lease: &Lease| Error::lock_lost(BACKEND, lease.name(), "extend");
        let mut out: Vec<Option<Result<Lease>>> = leases.iter().map(|_| None).collect();
        let client = match self.inner.session.client().await {
            Ok(c) => c,
            Err(e) => {
                let retryable = e.is_retryable();
                let why = e.to_string();
                return leases
                    .iter()
                    .map(|(l, _)| {
                        Err(Error::backend(
                            BACKEND,
                            "extend",
                            Some(l.name()),
                            retryable,
                            why.clone(),
                        ))
                    })
                    .collect();
            }
        };
        let session = client.session_id().0;
        // (index, node path) of the leases to read.
        let mut reads = Vec::new();
        for (i, (lease, ttl)) in leases.iter().enumerate() {
            if let Err(e) = lockcore::backend_support::check_ttl(*ttl) {
                out[i] = Some(Err(e));
                continue;
            }
            let Some((of, path)) = lease.handle().and_then(parse_handle) else {
                out[i] = Some(self.extend(lease, *ttl).await);
                continue;
            };
            if !self.may_renew(path, Some(of), session) {
                out[i] = Some(Err(lost(lease)));
                continue;
            }
            reads.push((i, path.to_owned()));
        }
        for chunk in reads.chunks(MULTI_READ) {
            let started = Instant::now();
            let mut reader = client.new_multi_reader();
            let added = chunk
                .iter()
                .try_for_each(|(_, path)| reader.add_get_data(path));
            let answered = match added {
                Ok(()) => timed(self.limit(), reader.commit()).await,
                Err(e) => Ok(Err(e)),
            };
            let results = match answered {
                Ok(Ok(results)) if results.len() == chunk.len() => results,
                failed => {
                    for (i, _) in chunk {
                        let name = leases[*i].0.name();
                        out[*i] = Some(Err(match &failed {
                            Ok(Err(e)) => zk_error("renew the lock nodes", Some(name), e.clone()),
                            Ok(Ok(_)) => Error::backend(
                                BACKEND,
                                "extend",
                                Some(name),
                                true,
                                "a multi-read answered for another count of nodes",
                            ),
                            Err(()) => no_answer("renew the lock nodes", Some(name), self.limit()),
                        }));
                    }
                    continue;
                }
            };
            let session_timeout = client.session_timeout();
            for ((i, path), result) in chunk.iter().zip(results) {
                let (lease, ttl) = &leases[*i];
                let stat = match result {
                    zk::MultiReadResult::Data { stat, .. } => Some(stat),
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    } => None,
                    zk::MultiReadResult::Error { err } => {
                        let name = Some(lease.name());
                        out[*i] = Some(Err(zk_error("renew the lock node", name, err)));
                        continue;
                    }
                    // Only data was asked for (the enum is non-exhaustive).
                    _ => None,
                };
                let ttl = effective_ttl(*ttl, session_timeout);
                out[*i] = Some(self.renewed(lease, path, stat.as_ref(), session, started, ttl));
            }
        }
        out.into_iter()
            .zip(leases)
            .map(|(r, (lease, _))| r.unwrap_or_else(|| Err(lost(lease))))
            .collect()
    }
}
