//! Judging a soak: the history checker over the holds, the fenced writes, what `lost()` said,
//! what is left in the store at the end, and whether the nemesis did enough.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use conformance_tests::{Hold, check};
use lockcore::{LockName, Wait};
use serde::Serialize;

use super::model::{FaultKind, FaultRecord, Shared, SoakOptions, Store, lock};

/// Something that breaks a promise, with what the nemesis did around it.
#[derive(Clone, Debug, Serialize)]
pub struct Anomaly {
    /// What kind: `overlap`, `token-order`, `write-refused-while-valid`, `lost-unreported`,
    /// `gone-while-valid`, `left-held`, `restart-failed`, `nemesis-too-weak`.
    pub kind: String,
    /// Seconds into the run (0 for findings about the whole run).
    pub at_secs: f64,
    /// In words.
    pub detail: String,
    /// The seed, to run the schedule again.
    pub seed: u64,
    /// The faults that were active within two ttls before or after, with their start times.
    pub faults_around: Vec<String>,
}

/// What the nemesis did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultStats {
    /// Faults applied (a combination counts once).
    pub total: u64,
    /// By kind (a combination counts for each of its kinds).
    pub by_kind: BTreeMap<String, u64>,
    /// By combination (`kill+delay`), single faults included.
    pub by_combination: BTreeMap<String, u64>,
    /// Faults of two kinds at once.
    pub combined: u64,
    /// Faults that began within 200 ms of a holder's renewal.
    pub near_renewal: u64,
    /// Faults that began within 200 ms of a grant or a release (a hand-off).
    pub near_handoff: u64,
    /// Faults that began within 200 ms of a holder's lease (or session) end.
    pub near_lease_end: u64,
    /// What the run had to reach: total, combined, and per kind.
    pub required: [u64; 3],
    /// Every fault as applied: seconds into the run, and what it did.
    pub schedule: Vec<(f64, String)>,
}

/// One name's availability.
#[derive(Clone, Debug, Serialize)]
pub struct NameStats {
    /// The lock name.
    pub name: String,
    /// Grants of it.
    pub acquisitions: u64,
    /// Share of the run in which some holder's validity window covered it.
    pub availability: f64,
    /// The longest stretch without a holder, in seconds.
    pub longest_gap_secs: f64,
    /// When it began, in seconds into the run (compare with the fault schedule).
    pub longest_gap_at_secs: f64,
}

/// What a soak found. Field names are stable (`soak.json`).
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// The backend.
    pub backend: String,
    /// The seed that reproduces the schedule.
    pub seed: u64,
    /// Seconds the clients contended.
    pub duration_secs: f64,
    /// Clients.
    pub clients: usize,
    /// Names.
    pub names: usize,
    /// Lease ttl in milliseconds.
    pub ttl_ms: u64,
    /// The fault kinds the nemesis could apply.
    pub fault_kinds: Vec<FaultKind>,
    /// Grants of a lock, all clients.
    pub acquisitions: u64,
    /// Grants per client.
    pub per_client: Vec<u64>,
    /// Acquires that gave up (the wait ran out), all clients.
    pub timeouts: u64,
    /// Acquires and releases that failed with a store error.
    pub errors: u64,
    /// The first store error, for the record.
    pub first_error: Option<String>,
    /// Leases that `lost()` reported gone, by reason.
    pub lost: BTreeMap<String, u64>,
    /// Writes the fenced resources accepted.
    pub writes_accepted: u64,
    /// Late writes (after a pause, or past the lease) that the fenced resources refused: fencing
    /// at work.
    pub stale_writes_refused: u64,
    /// Late writes accepted because no newer holder had written yet (fencing cannot refuse
    /// those; counted, not anomalies).
    pub late_writes_accepted: u64,
    /// Per name: availability and gaps.
    pub per_name: Vec<NameStats>,
    /// What the nemesis did.
    pub faults: FaultStats,
    /// Everything that breaks a promise; empty when the run is clean.
    pub anomalies: Vec<Anomaly>,
    /// What a fault the store is documented not to survive did (see
    /// [`Store::declared_unsafe`]): shown, never counted as anomalies.
    pub documented_unsafe: Vec<Anomaly>,
}

impl SoakReport {
    /// Whether the run found nothing wrong.
    pub fn is_clean(&self) -> bool {
        self.anomalies.is_empty()
    }
}

/// How near counts as "at" a boundary.
const NEAR: Duration = Duration::from_millis(200);

/// Names still held or queued after every client ended and the leases' ttl passed.
pub(crate) async fn leftovers(store: &Store<'_>, shared: &Shared) -> Vec<String> {
    let client = match (store.connect)(store.direct_url.clone()).await {
        Ok(c) => c,
        Err(e) => return vec![format!("cannot connect to look at the store: {e}")],
    };
    // Ended clients released what they held; a paused one's lease or a dead session's nodes end
    // within a ttl or two.
    let give_up = Instant::now() + shared.ttl * 3 + Duration::from_secs(10);
    let mut left = Vec::new();
    for name in &shared.names {
        let Ok(lock_name) = LockName::new(name) else {
            continue;
        };
        loop {
            let seen = client.inspect(&lock_name).await;
            let busy = match &seen {
                Ok(Some(info)) => info.is_held() || info.waiters.unwrap_or(0) > 0,
                Ok(None) => false,
                Err(_) => true,
            };
            if !busy {
                break;
            }
            if Instant::now() >= give_up {
                left.push(format!("{name}: {seen:?}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The store must also still grant every name at once.
    let opts = lockcore::AcquireOptions::new().wait(Wait::For(shared.ttl * 2));
    for name in &shared.names {
        use lockcore::LockExt as _;
        match client.lock(name, &opts).await {
            Ok(guard) => {
                let _ = guard.release().await;
            }
            Err(e) => left.push(format!("{name}: not grantable after the run: {e}")),
        }
    }
    left
}

/// Builds the report.
pub(crate) fn report(
    store: &Store<'_>,
    opts: &SoakOptions,
    kinds: Vec<FaultKind>,
    shared: &Shared,
    ended: Instant,
    leftovers: Vec<String>,
) -> SoakReport {
    let start = shared.start;
    let secs = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
    let faults = lock(&shared.faults).clone();
    let around = |t: Instant| -> Vec<String> {
        let span = shared.ttl * 2;
        faults
            .iter()
            .filter(|f| f.started <= t + span && f.healed + span >= t)
            .map(|f| format!("{:.2}s: {}", secs(f.started), f.detail))
            .collect()
    };
    // Faults the store is documented not to survive, and the highest token granted before
    // each began.
    let all_holds = shared.history.holds();
    let unsafe_faults: Vec<(&FaultRecord, u64)> = faults
        .iter()
        .filter(|f| {
            f.kinds
                .iter()
                .any(|k| store.declared_unsafe.iter().any(|(d, _)| d == k))
        })
        .map(|f| {
            let before = all_holds.iter().filter(|h| h.acquired < f.started);
            (f, before.map(|h| h.token).max().unwrap_or(0))
        })
        .collect();
    // Whether a finding at `t` (by a holder with `token`, for refused writes) is what such a
    // fault does: within one ttl after it, or a token it set back below earlier ones.
    let documented = |kind: &str, t: Instant, token: Option<u64>| {
        unsafe_faults
            .iter()
            .any(|(f, highest)| match (kind, token) {
                ("write-refused-while-valid", Some(token)) => f.started <= t && token <= *highest,
                ("overlap" | "token-order", _) => f.started <= t && f.healed + shared.ttl >= t,
                _ => false,
            })
    };
    let (mut anomalies, mut documented_unsafe) = (Vec::new(), Vec::new());
    let mut flag = |kind: &str, at: Option<Instant>, token: Option<u64>, detail: String| {
        let finding = Anomaly {
            kind: kind.to_owned(),
            at_secs: at.map_or(0.0, secs),
            detail,
            seed: shared.seed,
            faults_around: at.map(&around).unwrap_or_default(),
        };
        if at.is_some_and(|t| documented(kind, t, token)) {
            documented_unsafe.push(finding);
        } else {
            anomalies.push(finding);
        }
    };

    let holds = shared.acted_holds();
    for v in check(&holds) {
        flag(v.kind(), Some(v.at()), None, v.to_string());
    }

    let writes = lock(&shared.writes).clone();
    let (mut accepted, mut refused_late, mut accepted_late) = (0, 0, 0);
    for w in &writes {
        match (w.accepted, w.at <= w.valid_until) {
            (true, true) => accepted += 1,
            (true, false) => {
                accepted += 1;
                accepted_late += 1;
            }
            (false, false) => refused_late += 1,
            (false, true) => flag(
                "write-refused-while-valid",
                Some(w.at),
                Some(w.token),
                format!(
                    "client {} wrote {:?} with token {} within its lease and the fenced resource \
                     refused it: it had accepted a higher token before",
                    w.client, shared.names[w.name], w.token
                ),
            ),
        }
    }

    let counters = shared.counters();
    if let Some(n) = counters.lost.get("unreported") {
        flag(
            "lost-unreported",
            None,
            None,
            format!("{n} lease(s) were gone at release and lost() never said why"),
        );
    }
    for (at, client, name) in &counters.gone_while_valid {
        // A release retried after its first reply was lost finds its own release done: only
        // when no fault was near is a lease gone early a finding.
        let quiet = !faults
            .iter()
            .any(|f| f.started <= *at && f.healed + shared.ttl + Duration::from_secs(2) >= *at);
        if quiet {
            flag(
                "gone-while-valid",
                Some(*at),
                None,
                format!(
                    "client {client}'s release found {name:?} no longer its own while its lease \
                     was valid, with no fault near"
                ),
            );
        }
    }
    for left in &leftovers {
        flag("left-held", None, None, left.clone());
    }
    for f in &faults {
        if f.detail.contains("FAILED") {
            flag("restart-failed", Some(f.started), None, f.detail.clone());
        }
    }

    let stats = fault_stats(&faults, &all_holds, shared, &kinds, opts.duration);
    let [need_total, need_combined, need_each] = stats.required;
    let weak_kinds: Vec<String> = kinds
        .iter()
        .filter(|k| stats.by_kind.get(k.as_str()).copied().unwrap_or(0) < need_each)
        .map(|k| k.to_string())
        .collect();
    if stats.total < need_total || stats.combined < need_combined || !weak_kinds.is_empty() {
        flag(
            "nemesis-too-weak",
            None,
            None,
            format!(
                "{} faults ({} combined) where at least {need_total} ({need_combined} combined) \
                 and {need_each} of each kind were required; short of it: {}",
                stats.total,
                stats.combined,
                if weak_kinds.is_empty() {
                    "-".to_owned()
                } else {
                    weak_kinds.join(", ")
                }
            ),
        );
    }

    let per_name = shared
        .names
        .iter()
        .map(|name| name_stats(name, &holds, start, ended))
        .collect();
    SoakReport {
        backend: store.label.clone(),
        seed: shared.seed,
        duration_secs: opts.duration.as_secs_f64(),
        clients: opts.clients,
        names: opts.names,
        ttl_ms: u64::try_from(shared.ttl.as_millis()).unwrap_or(u64::MAX),
        fault_kinds: kinds,
        acquisitions: counters.per_client.iter().sum(),
        per_client: counters.per_client.clone(),
        timeouts: counters.timeouts,
        errors: counters.errors,
        first_error: counters.first_error.clone(),
        lost: counters.lost.clone(),
        writes_accepted: accepted,
        stale_writes_refused: refused_late,
        late_writes_accepted: accepted_late,
        per_name,
        faults: stats,
        anomalies,
        documented_unsafe,
    }
}

/// Counts the faults, and how many began near a renewal, a hand-off or a lease end.
fn fault_stats(
    faults: &[FaultRecord],
    holds: &[Hold],
    shared: &Shared,
    kinds: &[FaultKind],
    duration: Duration,
) -> FaultStats {
    let near = |a: Instant, b: Instant| a.max(b).duration_since(a.min(b)) <= NEAR;
    let every = shared.ttl / 3;
    let mut stats = FaultStats::default();
    for f in faults {
        stats.total += 1;
        for k in &f.kinds {
            *stats.by_kind.entry(k.to_string()).or_default() += 1;
        }
        let combination: Vec<&str> = f.kinds.iter().map(|k| k.as_str()).collect();
        *stats
            .by_combination
            .entry(combination.join("+"))
            .or_default() += 1;
        if f.kinds.len() > 1 {
            stats.combined += 1;
        }
        let t = f.started;
        let renewal = holds.iter().any(|h| {
            let end = h.ended.unwrap_or(h.valid_until);
            t > h.acquired && t < end + NEAR && {
                // The renewal nearest t: grant + k × ttl/3.
                let k = (t.duration_since(h.acquired).as_secs_f64() / every.as_secs_f64()).round();
                k >= 1.0 && near(t, h.acquired + every.mul_f64(k))
            }
        });
        let handoff = holds
            .iter()
            .any(|h| near(t, h.acquired) || h.ended.is_some_and(|e| near(t, e)));
        let lease_end = holds.iter().any(|h| near(t, h.valid_until));
        stats.near_renewal += u64::from(renewal);
        stats.near_handoff += u64::from(handoff);
        stats.near_lease_end += u64::from(lease_end);
        stats.schedule.push((
            f.started
                .saturating_duration_since(shared.start)
                .as_secs_f64(),
            f.detail.clone(),
        ));
    }
    // 30 faults, 5 of them combined, each kind twice, in ten minutes; in proportion for shorter
    // runs (no per-kind floor under five minutes, where chance may skip a kind).
    let minutes = duration.as_secs_f64() / 60.0;
    let each = if minutes >= 5.0 { 2 } else { 0 };
    let combined = if kinds.len() > 1 {
        (minutes / 2.0) as u64
    } else {
        0
    };
    stats.required = [(minutes * 3.0) as u64, combined, each];
    stats
}

/// A name's availability and longest gap over `[start, end]`.
fn name_stats(name: &str, holds: &[Hold], start: Instant, end: Instant) -> NameStats {
    let mut windows: Vec<(Instant, Instant)> = holds
        .iter()
        .filter(|h| h.name == name)
        .map(|h| (h.acquired.max(start), h.window_end().min(end)))
        .filter(|(a, b)| b > a)
        .collect();
    windows.sort();
    let total = end.saturating_duration_since(start).as_secs_f64().max(1e-9);
    let (mut covered, mut longest_gap, mut cursor) = (0.0, (0.0_f64, start), start);
    let mut gap = |from: Instant, to: Instant| {
        let length = to.saturating_duration_since(from).as_secs_f64();
        if length > longest_gap.0 {
            longest_gap = (length, from);
        }
    };
    for (a, b) in &windows {
        gap(cursor, *a);
        if *b > cursor {
            covered += b.duration_since((*a).max(cursor)).as_secs_f64();
            cursor = *b;
        }
    }
    gap(cursor, end);
    NameStats {
        name: name.to_owned(),
        acquisitions: holds.iter().filter(|h| h.name == name).count() as u64,
        availability: covered / total,
        longest_gap_secs: longest_gap.0,
        longest_gap_at_secs: longest_gap.1.saturating_duration_since(start).as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(name: &str, from_ms: u64, to_ms: u64, base: Instant) -> Hold {
        Hold {
            client: 0,
            name: name.into(),
            token: from_ms,
            acquired: base + Duration::from_millis(from_ms),
            valid_until: base + Duration::from_millis(to_ms),
            ended: None,
        }
    }

    #[test]
    fn availability_and_gaps_follow_the_windows() {
        let base = Instant::now();
        let end = base + Duration::from_millis(1000);
        let holds = [
            hold("a", 100, 300, base),
            hold("a", 200, 400, base), // overlapping windows count once
            hold("a", 700, 800, base),
            hold("b", 0, 1000, base),
        ];
        let a = name_stats("a", &holds, base, end);
        assert!((a.availability - 0.4).abs() < 1e-6, "{a:?}");
        assert!((a.longest_gap_secs - 0.3).abs() < 1e-6, "{a:?}");
        assert!((a.longest_gap_at_secs - 0.4).abs() < 1e-6, "{a:?}");
        assert_eq!(a.acquisitions, 3);
        let b = name_stats("b", &holds, base, end);
        assert!(
            (b.availability - 1.0).abs() < 1e-6 && b.longest_gap_secs < 1e-6,
            "{b:?}"
        );
    }
}
