//! The nemesis: applies random faults, alone or two or three at once, for durations around the
//! ttl, aimed at renewals and hand-offs half the time, and heals each before the next.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::kit::Fault;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

use super::client::Pauser;
use super::model::{FaultKind, FaultRecord, Shared, Store, lock};

pub(crate) struct Nemesis<'a> {
    store: &'a Store<'a>,
    kinds: Vec<FaultKind>,
    shared: Arc<Shared>,
    pausers: Vec<Pauser>,
}

/// Multiples of the ttl a fault lasts: below it (survived by renewal), just below and just
/// above it (the lease's boundary), and well past it.
const SPANS: &[f64] = &[0.25, 0.5, 0.9, 1.1, 1.5, 2.5];

impl<'a> Nemesis<'a> {
    pub(crate) fn new(
        store: &'a Store<'a>,
        kinds: &[FaultKind],
        shared: &Arc<Shared>,
        pausers: Vec<Pauser>,
    ) -> Self {
        Nemesis {
            store,
            kinds: kinds.to_vec(),
            shared: shared.clone(),
            pausers,
        }
    }

    /// Applies faults until shortly before the deadline (so the end of the run is healed), then
    /// waits for the deadline.
    pub(crate) async fn run(self) {
        let shared = &self.shared;
        let ttl = shared.ttl;
        let mut rng = StdRng::seed_from_u64(shared.seed);
        // The longest fault is 2.5 ttl (plus jitter); leave the clients a ttl after it.
        let stop_at = shared.deadline.checked_sub(ttl * 4).unwrap_or(shared.start);
        while !self.kinds.is_empty() {
            let gap = Duration::from_millis(rng.random_range(300..=2500));
            if Instant::now() + gap >= stop_at {
                break;
            }
            tokio::time::sleep(gap).await;
            // One fault, or two or three at once: at most one on the servers, one on links and
            // one on a client, so that none undoes another.
            let mut chosen = vec![self.kinds[rng.random_range(0..self.kinds.len())]];
            while chosen.len() < 3 && rng.random_bool(0.3) {
                let partners: Vec<FaultKind> = self
                    .kinds
                    .iter()
                    .copied()
                    .filter(|k| chosen.iter().all(|c| self.area(*c) != self.area(*k)))
                    .collect();
                if partners.is_empty() {
                    break;
                }
                chosen.push(partners[rng.random_range(0..partners.len())]);
            }
            let aim = rng.random_bool(0.5);
            let lead = Duration::from_millis(rng.random_range(0..150));
            let mut plans: Vec<Option<Plan>> = chosen
                .iter()
                .map(|k| Some(self.plan(*k, &mut rng)))
                .collect();
            plans.resize_with(3, || None);
            if aim {
                self.aim(&mut rng, lead).await;
            }
            let started = Instant::now();
            let [a, b, c]: [Option<Plan>; 3] = plans.try_into().unwrap_or([None, None, None]);
            let (da, db, dc) = tokio::join!(self.apply(a), self.apply(b), self.apply(c));
            let detail = [da, db, dc]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" + ");
            let kinds = chosen;
            lock(&shared.faults).push(FaultRecord {
                kinds,
                started,
                healed: Instant::now(),
                detail,
            });
        }
        tokio::time::sleep_until(shared.deadline.into()).await;
    }

    /// What a fault acts on: 0 the servers, 1 client links, 2 a client.
    fn area(&self, kind: FaultKind) -> u8 {
        match kind {
            FaultKind::Kill | FaultKind::Pause | FaultKind::Restart => 0,
            FaultKind::SessionKill if !self.store.sessions => 0,
            FaultKind::SessionKill | FaultKind::Blackhole | FaultKind::Delay => 1,
            FaultKind::ClientPause => 2,
        }
    }

    /// Waits until just before a holder's next renewal or planned release, when someone holds.
    async fn aim(&self, rng: &mut StdRng, lead: Duration) {
        let holders: Vec<(usize, Instant)> = lock(&self.shared.holders)
            .iter()
            .flatten()
            .copied()
            .collect();
        if holders.is_empty() {
            return;
        }
        let (_, planned_end) = holders[rng.random_range(0..holders.len())];
        let now = Instant::now();
        let target = if rng.random_bool(0.5) {
            // The keep-alive renews every ttl/3 from the grant; a third of a ttl from now is
            // within 200 ms of one renewal or another only by chance, so aim at the hand-off
            // (the planned release) instead when it is near.
            planned_end
        } else {
            now + self.shared.ttl / 3
        };
        if let Some(wait) = target.checked_duration_since(now)
            && wait < self.shared.ttl * 2
        {
            tokio::time::sleep(wait.saturating_sub(lead)).await;
        }
    }

    /// Picks what a fault of `kind` does: its length and its targets.
    fn plan(&self, kind: FaultKind, rng: &mut StdRng) -> Plan {
        let ttl = self.shared.ttl.as_secs_f64();
        let span = SPANS[rng.random_range(0..SPANS.len())] * rng.random_range(0.9..1.1);
        let mut length = Duration::from_secs_f64(ttl * span);
        let links = subset(self.store.links.len(), rng);
        // Which of a client's links (one per server): some of them, so a quorum store may keep
        // its majority or lose it.
        let nodes = subset(self.store.servers.len(), rng);
        let server = rng.random_range(0..self.store.servers.len().max(1));
        let client = self.pick_client(rng);
        let latency = Duration::from_millis(rng.random_range(5..=150));
        let replies = rng.random_bool(0.5);
        match kind {
            FaultKind::Restart => length = Duration::ZERO,
            FaultKind::SessionKill if !self.store.sessions => length = Duration::ZERO,
            // Past the session timeout (the ttl), so the session expires.
            FaultKind::SessionKill => {
                length = Duration::from_secs_f64(ttl * rng.random_range(1.5..2.5))
            }
            _ => {}
        }
        Plan {
            kind,
            length,
            links,
            nodes,
            server,
            client,
            latency,
            replies,
        }
    }

    /// A client to pause or cut off: a current holder seven times in ten.
    fn pick_client(&self, rng: &mut StdRng) -> usize {
        let holders: Vec<usize> = lock(&self.shared.holders)
            .iter()
            .flatten()
            .map(|(c, _)| *c)
            .collect();
        if !holders.is_empty() && rng.random_bool(0.7) {
            holders[rng.random_range(0..holders.len())]
        } else {
            rng.random_range(0..self.pausers.len().max(1))
        }
    }

    /// Applies `plan`, waits its length, heals; returns what it did, in words.
    async fn apply(&self, plan: Option<Plan>) -> Option<String> {
        let plan = plan?;
        let store = self.store;
        let secs = format!("{:.2}s", plan.length.as_secs_f64());
        let links = |ids: &[usize]| {
            ids.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let set_links = |clients: &[usize], nodes: &[usize], fault: Fault| {
            for &c in clients {
                for &n in nodes {
                    store.links[c][n].set(fault);
                }
            }
        };
        let nodes = if store.servers.len() > 1 {
            format!(" to nodes {}", links(&plan.nodes))
        } else {
            String::new()
        };
        Some(match plan.kind {
            FaultKind::Kill | FaultKind::Restart => {
                let server = store.servers[plan.server];
                server.kill9();
                tokio::time::sleep(plan.length).await;
                let restarted = restart(server).await;
                format!(
                    "{} server {} ({secs} down{})",
                    plan.kind,
                    server.addr(),
                    restarted.map_or_else(|e| format!(", RESTART FAILED: {e}"), |()| String::new())
                )
            }
            FaultKind::Pause => {
                let server = store.servers[plan.server];
                server.pause();
                tokio::time::sleep(plan.length).await;
                server.resume();
                format!("pause server {} for {secs}", server.addr())
            }
            FaultKind::SessionKill if store.sessions => {
                let every: Vec<usize> = (0..store.servers.len()).collect();
                set_links(&[plan.client], &every, Fault::Down);
                tokio::time::sleep(plan.length).await;
                set_links(&[plan.client], &every, Fault::PassThrough);
                format!("session-kill client {} (links down {secs})", plan.client)
            }
            FaultKind::SessionKill => {
                let server = store.servers[plan.server];
                match server.kill_client_connections().await {
                    Ok(n) => format!("session-kill: {n} connections ended by the server"),
                    Err(e) => format!("session-kill failed: {e}"),
                }
            }
            FaultKind::Blackhole => {
                let fault = if plan.replies {
                    Fault::BlackholeReplies
                } else {
                    Fault::BlackholeRequests
                };
                set_links(&plan.links, &plan.nodes, fault);
                tokio::time::sleep(plan.length).await;
                set_links(&plan.links, &plan.nodes, Fault::PassThrough);
                let which = if plan.replies { "replies" } else { "requests" };
                format!(
                    "blackhole {which} of clients {}{nodes} for {secs}",
                    links(&plan.links)
                )
            }
            FaultKind::Delay => {
                set_links(&plan.links, &plan.nodes, Fault::Latency(plan.latency));
                tokio::time::sleep(plan.length).await;
                set_links(&plan.links, &plan.nodes, Fault::PassThrough);
                format!(
                    "delay {} ms on clients {}{nodes} for {secs}",
                    plan.latency.as_millis(),
                    links(&plan.links)
                )
            }
            FaultKind::ClientPause => {
                let _ = self.pausers[plan.client].send(plan.length);
                tokio::time::sleep(plan.length).await;
                format!("client-pause client {} for {secs}", plan.client)
            }
        })
    }
}

/// What one fault does.
struct Plan {
    kind: FaultKind,
    length: Duration,
    /// Clients whose links a link fault hits.
    links: Vec<usize>,
    /// Which of each such client's links (by server).
    nodes: Vec<usize>,
    /// Server index, for server faults.
    server: usize,
    /// Client, for client faults.
    client: usize,
    latency: Duration,
    /// Blackhole replies rather than requests.
    replies: bool,
}

/// A random non-empty subset of `0..n` (empty when `n` is 0).
fn subset(n: usize, rng: &mut StdRng) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    all.shuffle(rng);
    let keep = if n == 0 { 0 } else { rng.random_range(1..=n) };
    all.truncate(keep);
    all.sort_unstable();
    all
}

/// Restarts a killed server, trying three times.
async fn restart(server: &dyn conformance_tests::kit::ServerControl) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..3 {
        match server.restart().await {
            Ok(()) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}
