//! What the soak's parts share: the options, the store, the faults, and the state clients and
//! the nemesis write while the judge reads it afterwards.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use conformance_tests::kit::{Proxy, ServerControl};
use conformance_tests::spawn::{SpawnName, Stack};
use conformance_tests::{BoxFuture, Connect, FencedResource, History, Hold, Persistence, check};
use lockcore::DistributedLock;
use serde::Serialize;

/// A fault the nemesis can apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The server is killed (SIGKILL) and restarted after a while.
    Kill,
    /// The server is stopped (SIGSTOP) and continued after a while.
    Pause,
    /// Some clients' links lose every reply, or every request, for a while.
    Blackhole,
    /// Some clients' links get 5–150 ms of latency each way for a while.
    Delay,
    /// The server is killed and restarted at once.
    Restart,
    /// One client is frozen for a while (its keep-alive too), as a stopped process.
    ClientPause,
    /// The server ends its clients' sessions (connections killed; on ZooKeeper, one client's
    /// links are down past its session timeout so the session expires).
    SessionKill,
}

impl FaultKind {
    /// Every kind, as `--faults` lists them.
    pub const ALL: &'static [FaultKind] = &[
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Blackhole,
        FaultKind::Delay,
        FaultKind::Restart,
        FaultKind::ClientPause,
        FaultKind::SessionKill,
    ];

    /// The name `--faults` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Delay => "delay",
            FaultKind::Restart => "restart",
            FaultKind::ClientPause => "client-pause",
            FaultKind::SessionKill => "session-kill",
        }
    }

    /// Whether the store must have a server for it.
    pub(crate) fn needs_server(self) -> bool {
        !matches!(self, FaultKind::ClientPause)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<_> = Self::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown fault `{s}`: use {}", all.join(", "))
            })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// How long clients contend (faults stop a little earlier, so the end is healed).
    pub duration: Duration,
    /// Contending clients.
    pub clients: usize,
    /// Lock names they share.
    pub names: usize,
    /// The faults the nemesis may apply (empty: every kind the store can take).
    pub faults: Vec<FaultKind>,
    /// Fixes every random choice.
    pub seed: u64,
    /// The leases' ttl (and, on ZooKeeper, the session timeout).
    pub ttl: Duration,
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            duration: Duration::from_secs(600),
            clients: 8,
            names: 3,
            faults: Vec::new(),
            seed: 1,
            ttl: Duration::from_secs(2),
        }
    }
}

impl SoakOptions {
    /// Checks the numbers, before anything starts.
    ///
    /// # Errors
    /// A message saying which option is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if self.duration < Duration::from_secs(5) {
            return Err("--duration must be at least 5s".into());
        }
        if !(1..=64).contains(&self.clients) {
            return Err("--clients must be 1 to 64".into());
        }
        if !(1..=64).contains(&self.names) {
            return Err("--names must be 1 to 64".into());
        }
        if self.ttl < Duration::from_millis(500) || self.ttl > Duration::from_secs(60) {
            return Err("--ttl must be 500ms to 60s".into());
        }
        Ok(())
    }
}

/// The store a soak runs against: the clients' URLs, how to connect, and what the nemesis can
/// break.
pub struct Store<'a> {
    /// The backend's label in the report.
    pub label: String,
    /// Client `i` connects to `client_urls[i % len]`.
    pub client_urls: Vec<String>,
    /// Bypasses every proxy: for looking at the store after the run.
    pub direct_url: String,
    /// New independent clients.
    pub connect: Connect,
    /// The servers (none for an embedded store).
    pub servers: Vec<&'a dyn ServerControl>,
    /// Client `i`'s links, one per server in the order of `servers` (none for an embedded
    /// store, or where proxies cannot stand in the way).
    pub links: &'a [Vec<Proxy>],
    /// Whether a session holds the leases (ZooKeeper, and dual:// whose first store is
    /// ZooKeeper): a session kill is then one client's links down past the session timeout.
    pub sessions: bool,
    /// Faults this store is documented not to survive safely, with the reason: an overlap or a
    /// token going back within one ttl after one of them is reported as documented, not as an
    /// anomaly, and so is a write refused because such a fault set the tokens back.
    pub declared_unsafe: Vec<(FaultKind, String)>,
}

impl<'a> Store<'a> {
    /// The store of a started [`Stack`], connected with [`dlock::connect`].
    pub fn of_stack(stack: &'a Stack) -> Self {
        let connect: Connect = Arc::new(
            |url: String| -> BoxFuture<lockcore::Result<Arc<dyn DistributedLock>>> {
                Box::pin(async move { dlock::connect(&url).await })
            },
        );
        Store {
            label: stack.name.to_string(),
            client_urls: stack.client_urls.clone(),
            direct_url: stack.direct_url.clone(),
            connect,
            servers: stack.servers(),
            links: &stack.links,
            sessions: matches!(
                stack.name,
                SpawnName::Zk | SpawnName::ZkEnsemble | SpawnName::Dual
            ),
            declared_unsafe: match stack.persistence {
                Persistence::Durable => Vec::new(),
                Persistence::None => [FaultKind::Kill, FaultKind::Restart]
                    .into_iter()
                    .map(|k| (k, WITHOUT_PERSISTENCE.to_owned()))
                    .collect(),
            },
        }
    }

    /// The faults a soak applies when `wanted` asks for these (empty: every one this store can
    /// take), sorted and without repeats.
    ///
    /// # Errors
    /// A fault this store cannot take, naming the ones it can.
    pub fn faults_for(&self, wanted: &[FaultKind]) -> Result<Vec<FaultKind>, SoakError> {
        let possible = self.possible_faults();
        if wanted.is_empty() {
            return Ok(possible);
        }
        if let Some(k) = wanted.iter().find(|k| !possible.contains(k)) {
            let can: Vec<_> = possible.iter().map(|k| k.as_str()).collect();
            return Err(SoakError(format!(
                "{} cannot take the fault `{k}` (it has no server or no proxied link); it can \
                 take: {}",
                self.label,
                can.join(", ")
            )));
        }
        let mut kinds = wanted.to_vec();
        kinds.sort();
        kinds.dedup();
        Ok(kinds)
    }

    /// The faults this store can take.
    pub fn possible_faults(&self) -> Vec<FaultKind> {
        FaultKind::ALL
            .iter()
            .copied()
            .filter(|k| !k.needs_server() || !self.servers.is_empty())
            .filter(|k| {
                !matches!(k, FaultKind::Blackhole | FaultKind::Delay) || !self.links.is_empty()
            })
            .collect()
    }
}

/// Why a Redis-based store without persistence is not safe across a kill (its capability sheet
/// says `Fencing::Conditional` unless every server runs `appendfsync always`; the conformance
/// scenario `server_killed_and_restarted_without_persistence` shows it on a fixed schedule).
const WITHOUT_PERSISTENCE: &str = "a Redis server restarted without persistence has forgotten its \
     fence counters and keys: tokens start again at 1 and a lock held before the kill is free \
     after it (fencing is Conditional on appendfsync always)";

/// How far a soak has got, for a progress line.
#[derive(Clone, Debug)]
pub struct SoakProgress {
    /// Time into the run.
    pub elapsed: Duration,
    /// The run's length.
    pub total: Duration,
    /// Acquisitions so far.
    pub acquisitions: u64,
    /// Faults applied so far.
    pub faults: u64,
    /// Overlaps and token reversals in the history so far (judged at the end against the
    /// faults the store declares unsafe).
    pub suspicious: u64,
    /// Set once, when the contention is over and the clients' last holds and the check of the
    /// store remain.
    pub finishing: bool,
}

/// A write through a fenced resource, as a client made it.
#[derive(Clone, Debug)]
pub(crate) struct WriteRecord {
    pub(crate) client: usize,
    pub(crate) name: usize,
    pub(crate) token: u64,
    /// When the write was made.
    pub(crate) at: Instant,
    /// The writer's `valid_until` when it wrote.
    pub(crate) valid_until: Instant,
    pub(crate) accepted: bool,
}

/// A fault as applied.
#[derive(Clone, Debug)]
pub(crate) struct FaultRecord {
    pub(crate) kinds: Vec<FaultKind>,
    pub(crate) started: Instant,
    pub(crate) healed: Instant,
    pub(crate) detail: String,
}

/// What clients and the nemesis share.
pub(crate) struct Shared {
    pub(crate) names: Vec<String>,
    pub(crate) history: History,
    pub(crate) fenced: Vec<FencedResource>,
    pub(crate) writes: Mutex<Vec<WriteRecord>>,
    pub(crate) faults: Mutex<Vec<FaultRecord>>,
    pub(crate) counters: Mutex<Counters>,
    /// Per name: the client holding it and the hold's planned end, for the nemesis's aim.
    pub(crate) holders: Mutex<Vec<Option<(usize, Instant)>>>,
    pub(crate) ttl: Duration,
    pub(crate) start: Instant,
    pub(crate) deadline: Instant,
    pub(crate) seed: u64,
}

/// Client-side counts.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) per_client: Vec<u64>,
    pub(crate) timeouts: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) lost: BTreeMap<String, u64>,
    /// Releases that found the lease gone although the client still thought it valid, with
    /// the time and client.
    pub(crate) gone_while_valid: Vec<(Instant, usize, String)>,
}

/// Locks `m`, going on past a panic in another holder (the data is counts and records).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn counters(&self) -> MutexGuard<'_, Counters> {
        lock(&self.counters)
    }

    /// The holds that acted on a lock: a grant that reached its client after its lease had
    /// already ended never did, and its place among grants cannot be observed, so the checker
    /// leaves it out (at the end and while the run goes).
    pub(crate) fn acted_holds(&self) -> Vec<Hold> {
        let mut holds = self.history.holds();
        holds.retain(|h| h.window_end() > h.acquired);
        holds
    }

    /// Where the run stands, for the progress line.
    pub(crate) fn progress(&self, total: Duration, finishing: bool) -> SoakProgress {
        SoakProgress {
            elapsed: self.start.elapsed().min(total),
            total,
            acquisitions: self.counters().per_client.iter().sum(),
            faults: lock(&self.faults).len() as u64,
            suspicious: check(&self.acted_holds()).len() as u64,
            finishing,
        }
    }
}

/// Why a soak could not run at all.
#[derive(Debug)]
pub struct SoakError(pub String);

impl fmt::Display for SoakError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SoakError {}
