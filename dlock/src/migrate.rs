//! Moving locks from one store to another while services run (ZooKeeper → Redis, through
//! `dual://` clients): what each store holds, whether the tokens are ordered for the next
//! phase ([`check`]), and carrying the target store's counters up to the source's tokens
//! ([`prepare`]). Results are data; the `dlock migrate` command prints them.
//!
//! The phases, in order: all clients on the source → source and dual clients → all dual →
//! dual and target clients → all target. In every phase any two clients share a store, so
//! mutual exclusion holds throughout; the guide in the README says what to watch at each step.

use std::sync::Arc;

use serde::Serialize;

use crate::{AcquireOptions, DistributedLock, Error, LockExt, LockInfo, LockName, Result, Wait};

/// How a name is held across the two stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Held on neither store.
    Free,
    /// Held on both by the same owner: a dual client.
    Dual,
    /// Held on the source only: a source-only client (or a dual client between its two steps).
    SourceOnly,
    /// Held on the target only: a target-only client.
    TargetOnly,
    /// Held on each store by a different owner. Normal for a moment while dual and
    /// target-only clients run together (a dual client holding the source waits for a
    /// target-only holder); with no target-only clients running it means a source-only and a
    /// target-only client hold the lock at once: a phase was skipped.
    Split,
}

impl Mode {
    /// Lowercase words for tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Free => "free",
            Mode::Dual => "dual",
            Mode::SourceOnly => "source-only",
            Mode::TargetOnly => "target-only",
            Mode::Split => "SPLIT",
        }
    }
}

/// One store's view of a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SideView {
    /// Whether the store has seen the name at all.
    pub known: bool,
    /// The holder's owner id.
    pub holder: Option<String>,
    /// The holder's token, or when free the store's last/high-water token.
    pub token: Option<u64>,
    /// Clients queued, where the store queues.
    pub waiters: Option<usize>,
}

impl SideView {
    fn of(info: &Option<LockInfo>) -> SideView {
        SideView {
            known: info.is_some(),
            holder: info.as_ref().and_then(|i| i.holder.clone()),
            token: info.as_ref().and_then(|i| i.token).map(|t| t.0),
            waiters: info.as_ref().and_then(|i| i.waiters),
        }
    }

    /// A short description for tables.
    pub fn describe(&self) -> String {
        if !self.known {
            return "never used".to_owned();
        }
        let mut s = match &self.holder {
            Some(h) => format!("held by {}", &h[..h.len().min(12)]),
            None => "free".to_owned(),
        };
        if let Some(t) = self.token {
            s.push_str(&format!(", token {t}"));
        }
        if let Some(w) = self.waiters.filter(|&w| w > 0) {
            s.push_str(&format!(", {w} waiting"));
        }
        s
    }
}

/// One name in a [`CheckReport`].
#[derive(Clone, Debug, Serialize)]
pub struct NameReport {
    /// The lock name.
    pub name: String,
    /// How it is held.
    pub mode: Mode,
    /// The source store's view.
    pub source: SideView,
    /// The target store's view.
    pub target: SideView,
    /// Whether dual clients may start: the target's counter is not above the source's token,
    /// so dual tokens (`max(counter + 1, source token)`) stay below later source-only tokens.
    pub ready_for_dual: bool,
    /// Whether target-only clients may start: the target's counter is at least the source's
    /// token, so their tokens are above every token the source handed out.
    pub ready_for_target_only: bool,
}

/// What [`check`] found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    /// The source store's backend name.
    pub source_backend: &'static str,
    /// The target store's backend name.
    pub target_backend: &'static str,
    /// One entry per name, sorted by name.
    pub names: Vec<NameReport>,
    /// Warnings: a store that cannot list its names, split holds, counters out of order.
    pub warnings: Vec<String>,
}

impl CheckReport {
    /// How many names are in `mode`.
    pub fn count(&self, mode: Mode) -> usize {
        self.names.iter().filter(|n| n.mode == mode).count()
    }
}

/// The names to look at: `extra`, plus every name either store can list. Notes say which
/// store could not list.
///
/// # Cancel safety
/// Read-only; safe to drop.
///
/// # Errors
/// Store failures other than a store that cannot list names.
pub async fn names_of(
    source: &Arc<dyn DistributedLock>,
    target: &Arc<dyn DistributedLock>,
    extra: &[LockName],
) -> Result<(Vec<LockName>, Vec<String>)> {
    let mut names = extra.to_vec();
    let mut notes = Vec::new();
    for (role, store) in [("source", source), ("target", target)] {
        match store.names().await {
            Ok(found) => names.extend(found),
            Err(Error::Unsupported { .. }) => notes.push(format!(
                "the {role} store ({}) cannot list its lock names; pass --name for names only it knows",
                store.capabilities().backend
            )),
            Err(e) => return Err(e),
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    Ok((names, notes))
}

/// Reports, for each of `names`, who holds it on each store and in which mode, and whether
/// the tokens are ordered for the next phase.
///
/// # Cancel safety
/// Read-only; safe to drop.
///
/// # Errors
/// The first store failure.
pub async fn check(
    source: &Arc<dyn DistributedLock>,
    target: &Arc<dyn DistributedLock>,
    names: &[LockName],
) -> Result<CheckReport> {
    let mut reports = Vec::with_capacity(names.len());
    let mut warnings = Vec::new();
    for name in names {
        let (a, b) = tokio::join!(source.inspect(name), target.inspect(name));
        let (a, b) = (SideView::of(&a?), SideView::of(&b?));
        let mode = match (&a.holder, &b.holder) {
            (None, None) => Mode::Free,
            (Some(x), Some(y)) if x == y => Mode::Dual,
            (Some(_), None) => Mode::SourceOnly,
            (None, Some(_)) => Mode::TargetOnly,
            (Some(_), Some(_)) => Mode::Split,
        };
        let (source_token, counter) = (a.token.unwrap_or(0), b.token.unwrap_or(0));
        let ready_for_dual = counter <= source_token;
        let ready_for_target_only = counter >= source_token;
        if mode == Mode::Split {
            warnings.push(format!(
                "{}: held by different owners on the two stores; unless dual and target-only \
                 clients run together right now, a source-only and a target-only client hold it \
                 at once (a skipped phase)",
                name.as_str()
            ));
        }
        if !ready_for_dual {
            warnings.push(format!(
                "{}: the target's counter ({counter}) is above the source's token \
                 ({source_token}): dual tokens would run ahead of source-only clients' tokens; \
                 start dual clients only after every source-only client is gone",
                name.as_str()
            ));
        }
        reports.push(NameReport {
            name: name.as_str().to_owned(),
            mode,
            source: a,
            target: b,
            ready_for_dual,
            ready_for_target_only,
        });
    }
    let behind = reports.iter().filter(|r| !r.ready_for_target_only).count();
    if behind > 0 {
        warnings.push(format!(
            "{behind} name(s) have a target counter below the source's token: run `dlock migrate \
             prepare` before any target-only client starts"
        ));
    }
    Ok(CheckReport {
        source_backend: source.capabilities().backend,
        target_backend: target.capabilities().backend,
        names: reports,
        warnings,
    })
}

/// What [`prepare`] did for one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Prepared {
    /// The target's counter was moved up: its next token is above `to`.
    Raised {
        /// The counter before.
        from: u64,
        /// The counter now (the source's token, or one above the old counter).
        to: u64,
    },
    /// Would be raised (a dry run).
    WouldRaise {
        /// The counter now.
        from: u64,
        /// The source's token.
        to: u64,
    },
    /// The target's counter is already at or above the source's token.
    AlreadyAhead {
        /// The counter.
        counter: u64,
    },
    /// The source has no token for the name: nothing to carry.
    NothingToCarry,
    /// Someone holds the name on the target; its holder's acquisition already carried or will
    /// carry the counter. Run prepare again later to be sure.
    Held,
}

/// One name's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct PrepareReport {
    /// The lock name.
    pub name: String,
    /// The source's token (held: the holder's; free: its high-water mark).
    pub source_token: Option<u64>,
    /// What was done.
    #[serde(flatten)]
    pub outcome: Prepared,
}

/// Moves the target store's counter of each of `names` up to at least the source store's
/// token, so that target-only clients' tokens are above every source token and dual tokens
/// follow the source's. Does this by one acquisition on the target with a token minimum
/// ([`AcquireOptions::min_token`]) and an immediate release; a name held on the target is
/// left alone. Safe to run at any phase and more than once: counters only move up, and never
/// above a token the source has handed out.
///
/// # Cancel safety
/// Each name is either raised or not; a dropped call may leave one short acquisition to its
/// ttl (2 s).
///
/// # Errors
/// [`Error::Unsupported`] when the target cannot carry a token minimum; store failures.
pub async fn prepare(
    source: &Arc<dyn DistributedLock>,
    target: &Arc<dyn DistributedLock>,
    names: &[LockName],
    dry_run: bool,
) -> Result<Vec<PrepareReport>> {
    if !target.capabilities().min_token {
        return Err(Error::Unsupported {
            operation: "raising counters (token minimum)",
            backend: target.capabilities().backend,
        });
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let source_token = source
            .inspect(name)
            .await?
            .and_then(|i| i.token)
            .map(|t| t.0);
        let counter = target
            .inspect(name)
            .await?
            .and_then(|i| i.token)
            .map_or(0, |t| t.0);
        let outcome = match source_token {
            None => Prepared::NothingToCarry,
            Some(t) if counter >= t => Prepared::AlreadyAhead { counter },
            Some(t) if dry_run => Prepared::WouldRaise {
                from: counter,
                to: t,
            },
            Some(t) => {
                let opts = AcquireOptions::new()
                    .ttl(std::time::Duration::from_secs(2))
                    .keep_alive(crate::KeepAlive::Off)
                    .wait(Wait::No)
                    .min_token(crate::FencingToken(t));
                match target.try_lock(name.as_str(), &opts).await? {
                    Some(guard) => {
                        let to = guard.fencing_token().0;
                        guard.release().await?;
                        Prepared::Raised { from: counter, to }
                    }
                    None => Prepared::Held,
                }
            }
        };
        out.push(PrepareReport {
            name: name.as_str().to_owned(),
            source_token,
            outcome,
        });
    }
    Ok(out)
}
