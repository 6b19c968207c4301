//! A semaphore in Curator's (`InterProcessSemaphoreV2`) or kazoo's (`Semaphore`) layout: an
//! internal mutex, taken with the lock recipe, serialises acquirers; its holder creates a lease
//! node once fewer than `permits` exist, else waits for the leases to change.

use std::time::Instant;

use lockcore::{AcquireOptions, Lease, LockName, Result};
use zookeeper_client as zk;

use super::{CURATOR_LEASE, MutexHold, PERMIT_REQUESTS, Paths, node_gone, permits_of, wait_change};
use crate::cleanup::arm_attempt;
use crate::lock::ZkLock;
use crate::names::{self, Layout};
use crate::session::{acls, no_answer, timed, zk_error};

impl ZkLock {
    /// Curator's and kazoo's layouts, with the internal mutex held.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn library_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        paths: &Paths,
        mutex: &LockName,
        deadline: Option<Instant>,
        wait: bool,
        hold: &mut MutexHold,
    ) -> Result<Option<Lease>> {
        const OP: &str = "acquire a permit";
        let layout = self.layout();
        let client = hold.client.clone();
        let owner = opts.owner_or_random();
        let parent = &paths.leases;
        self.check_count(&client, name, permits, paths, mutex)
            .await?;
        let mut guard = arm_attempt(name, &client, layout, parent, owner, &PERMIT_REQUESTS);
        let data = owner.to_string().into_bytes();
        // Curator creates its lease first and counts it; kazoo counts, then creates.
        let mut created = None;
        if layout == Layout::Curator {
            let prefix = format!(
                "{parent}/{}{CURATOR_LEASE}",
                names::curator_protected(owner)
            );
            let node_opts = zk::CreateMode::EphemeralSequential.with_acls(acls(&self.inner.config));
            let (stat, seq) =
                match timed(self.limit(), client.create(&prefix, &data, &node_opts)).await {
                    Ok(Ok(made)) => made,
                    Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                    Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                };
            let path = format!("{prefix}{seq}");
            guard.state_mut().path = Some(path.clone());
            created = Some((path, stat));
        }
        loop {
            let checked_at = Instant::now();
            let (children, parent_stat, watcher) =
                match timed(self.limit(), client.get_and_watch_children(parent)).await {
                    Ok(Ok(listed)) => listed,
                    Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                    Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                };
            // With credentials: refused, the armed guard deletes a Curator lease node made.
            self.check_parent(&client, OP, parent, name, Some(parent_stat.czxid), None)
                .await?;
            match &created {
                Some((path, stat)) => {
                    let me = path.rsplit('/').next().unwrap_or_default();
                    if !children.iter().any(|c| c == me) {
                        guard.disarm();
                        return Err(node_gone(&client, name, "while it waited"));
                    }
                    // Curator's rule: every child of `leases` counts, this one's included.
                    if children.len() <= permits as usize {
                        let lease = self.permit_lease(&client, name, opts, path, stat, checked_at);
                        hold.release(self).await;
                        guard.disarm();
                        return Ok(Some(lease));
                    }
                }
                None => {
                    let taken = permits_of(Layout::Kazoo, &children).len();
                    if taken < permits as usize {
                        let path = format!("{parent}/{owner}");
                        let node_opts =
                            zk::CreateMode::Ephemeral.with_acls(acls(&self.inner.config));
                        guard.state_mut().path = Some(path.clone());
                        let stat = match timed(
                            self.limit(),
                            client.create(&path, &data, &node_opts),
                        )
                        .await
                        {
                            Ok(Ok((stat, _))) => stat,
                            Ok(Err(e)) => return Err(zk_error(OP, Some(name), e)),
                            Err(()) => return Err(no_answer(OP, Some(name), self.limit())),
                        };
                        let lease =
                            self.permit_lease(&client, name, opts, &path, &stat, checked_at);
                        hold.release(self).await;
                        guard.disarm();
                        return Ok(Some(lease));
                    }
                }
            }
            if !wait || deadline.is_some_and(|d| Instant::now() >= d) {
                let withdrawn = match &created {
                    Some((path, _)) => matches!(
                        timed(self.limit(), client.delete(path, None)).await,
                        Ok(Ok(()) | Err(zk::Error::NoNode))
                    ),
                    None => true,
                };
                if withdrawn {
                    guard.disarm();
                }
                return Ok(None);
            }
            wait_change(watcher, deadline).await;
        }
    }
}
