//! [`RedisLock`]: the client, connecting, capabilities, and the [`DistributedLock`] impl.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, RawFloor, Released, Result, WaitMechanism,
    async_trait,
};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value,
};

use crate::BACKEND;
use crate::cluster::Cluster;
use crate::config::{Deployment, RedisConfig};
use crate::queue::millis;
use crate::scripts::{self, Call, Key, Keys};
use crate::single::Single;
use crate::store::{Store, backend_error, protocol_error};
use crate::waiters::Hub;

/// Fencing assumption of a single server without synchronous persistence.
pub const ASSUMPTION_NO_PERSISTENCE: &str = "the Redis server is never restarted and never evicts keys: it does not run with appendonly yes + appendfsync always (or may evict keys under maxmemory), so a restart or an eviction resets the fence counter";

/// Fencing assumption when the server's persistence could not be read at connect.
pub const ASSUMPTION_UNKNOWN: &str = "the Redis server keeps its data across restarts (appendonly yes + appendfsync always) and never evicts keys; CONFIG GET was not permitted, so this could not be checked at connect";

/// Fencing assumption of a Redis Cluster.
pub const ASSUMPTION_CLUSTER: &str = "no Cluster failover loses acknowledged writes (replication to replicas is asynchronous) and every master persists with appendonly yes + appendfsync always";

/// Counters of one client, for benchmarks and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Leases extended successfully (by `extend` or keep-alive).
    pub renewals: u64,
    /// Leases an extend found gone (`LockLost`).
    pub renewals_lost: u64,
    /// Extends that failed with a store error.
    pub renewal_errors: u64,
    /// `extend_many` calls (keep-alive batches).
    pub renewal_batches: u64,
    /// Pipelines sent for renewals (one per batch on a single server; one per hash slot in a
    /// Cluster, sent concurrently).
    pub renewal_pipelines: u64,
    /// Wake-up messages this client's subscriber received. A release wakes only the head
    /// waiter's client, so a client whose waiters are not at the head receives none.
    pub wakeups: u64,
}

#[derive(Default)]
struct Counters {
    renewals: AtomicU64,
    renewals_lost: AtomicU64,
    renewal_errors: AtomicU64,
    renewal_batches: AtomicU64,
    renewal_pipelines: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) hub: Arc<Hub>,
    pub(crate) prefix: String,
    /// This client's id (16 hex digits): queue entries carry it after the owner id.
    pub(crate) client: String,
    /// The prefix of every client's wake-up channel (`<prefix>:wake:`); a client's channel is
    /// this followed by its id.
    pub(crate) wakes: String,
    defaults: ClientDefaults,
    fencing: Fencing,
    redacted: String,
    counters: Counters,
}

/// A client of one Redis server or Redis Cluster. Cheap to clone (one shared connection, one
/// subscriber).
#[derive(Clone)]
pub struct RedisLock {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("url", &self.inner.redacted)
            .field("prefix", &self.inner.prefix)
            .field("fencing", &self.inner.fencing)
            .finish()
    }
}

fn connection_info(
    config: &RedisConfig,
    host: &str,
    port: u16,
    tls: bool,
) -> redis::RedisResult<ConnectionInfo> {
    let addr = if tls {
        ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_owned(), port)
    };
    let mut settings = RedisConnectionInfo::default().set_db(config.db);
    if let Some(user) = &config.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password.expose());
    }
    Ok(addr.into_connection_info()?.set_redis_settings(settings))
}

/// A connect failure as a backend error naming the (redacted) URL.
pub(crate) fn connect_error(redacted: &str, e: redis::RedisError) -> Error {
    let retryable = crate::store::is_retryable(&e);
    Error::backend(
        BACKEND,
        "connect",
        None,
        retryable,
        format!("cannot connect to {redacted}: {e}"),
    )
}

/// The one place a connection to one server is built: address, TLS (CA, client certificate),
/// ACL user and password, database, and the `timeout` that bounds connecting and every round
/// trip. No I/O: the connection opens on first use. Single Redis and every Redlock node use it.
pub(crate) fn open_single(
    config: &RedisConfig,
    host: &str,
    port: u16,
    tls: bool,
) -> Result<Single> {
    let redacted = config.redacted_url();
    let info = connection_info(config, host, port, tls).map_err(|e| connect_error(redacted, e))?;
    let client = if tls {
        // redis-rs builds rustls configs with the process-wide default provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let read = |what: &str, path: &std::path::PathBuf| {
            std::fs::read(path).map_err(|e| {
                Error::invalid_config(
                    BACKEND,
                    format!("cannot read the {what} file {}: {e}", path.display()),
                )
            })
        };
        let root_cert = config
            .ca_file
            .as_ref()
            .map(|path| read("CA", path))
            .transpose()?;
        let client_tls = match &config.client_cert {
            None => None,
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read("client certificate", cert)?,
                client_key: read("client key", key)?,
            }),
        };
        if root_cert.is_none() && client_tls.is_none() {
            Client::open(info).map_err(|e| connect_error(redacted, e))?
        } else {
            // redis-rs parses the files here; its messages say which one is bad and never
            // show their contents.
            Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls,
                    root_cert,
                },
            )
            .map_err(|e| {
                Error::invalid_config(BACKEND, format!("the TLS files are not usable: {e}"))
            })?
        }
    } else {
        Client::open(info).map_err(|e| connect_error(redacted, e))?
    };
    Ok(Single::new(client, config.defaults.timeout))
}

impl RedisLock {
    /// Connects per `config`, checks that the server answers (and accepts the credentials), and
    /// reads its persistence settings to decide the fencing guarantee.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened; nothing is held yet.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an unreadable or invalid CA file; [`Error::Backend`] when the
    /// server cannot be reached within `timeout` (retryable) or refuses the credentials (not
    /// retryable). Messages name the URL with its password redacted.
    pub async fn connect(config: &RedisConfig) -> Result<RedisLock> {
        let timeout = config.defaults.timeout;
        let redacted = config.redacted_url().to_owned();
        let (store, fencing) = match &config.deployment {
            Deployment::Single { host, port, tls } => {
                let single = open_single(config, host, *port, *tls)?;
                single
                    .connection()
                    .await
                    .map_err(|e| connect_error(&redacted, e))?;
                let store = Store::Single(Box::new(single));
                let fencing = detect_fencing(&store).await;
                (store, fencing)
            }
            Deployment::Cluster { nodes } => {
                let infos = nodes
                    .iter()
                    .map(|(h, p)| connection_info(config, h, *p, false))
                    .collect::<redis::RedisResult<Vec<_>>>()
                    .map_err(|e| connect_error(&redacted, e))?;
                let cluster = Cluster::connect(infos, timeout)
                    .await
                    .map_err(|e| connect_error(&redacted, e))?;
                tracing::debug!(nodes = %cluster.describe(), "redis: connected to the cluster");
                let store = Store::Cluster(cluster);
                // A first round trip, so bad credentials or a cluster that is down fail here.
                store
                    .query(&redis::cmd("PING"))
                    .await
                    .map_err(|e| connect_error(&redacted, e))?;
                (
                    store,
                    Fencing::Conditional {
                        assumption: ASSUMPTION_CLUSTER,
                    },
                )
            }
            Deployment::Redlock { .. } => {
                return Err(Error::invalid_config(
                    BACKEND,
                    format!(
                        "`{redacted}` is a Redlock URL: connect it with backend_redis::connect or RedlockLock::connect"
                    ),
                ));
            }
        };
        Ok(Self::from_store(config, store, fencing, redacted))
    }

    /// A client over `store`, already connected, with the fencing guarantee it was found to
    /// give; `redacted` names it in messages.
    pub(crate) fn from_store(
        config: &RedisConfig,
        store: Store,
        fencing: Fencing,
        redacted: String,
    ) -> RedisLock {
        let client = format!("{:016x}", rand::random::<u64>());
        let wakes = format!("{}:wake:", config.prefix);
        RedisLock {
            inner: Arc::new(Inner {
                store,
                hub: Arc::new(Hub::new(
                    format!("{wakes}{client}"),
                    config.defaults.timeout,
                )),
                prefix: config.prefix.clone(),
                client,
                wakes,
                defaults: config.defaults.clone(),
                fencing,
                redacted,
                counters: Counters::default(),
            }),
        }
    }

    /// This client's counters.
    pub fn stats(&self) -> RedisStats {
        let c = &self.inner.counters;
        RedisStats {
            renewals: c.renewals.load(Ordering::Relaxed),
            renewals_lost: c.renewals_lost.load(Ordering::Relaxed),
            renewal_errors: c.renewal_errors.load(Ordering::Relaxed),
            renewal_batches: c.renewal_batches.load(Ordering::Relaxed),
            renewal_pipelines: c.renewal_pipelines.load(Ordering::Relaxed),
            wakeups: self.inner.hub.received(),
        }
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// One pair of the plain floor: `SET NX PX`, then the compare-and-delete script.
    pub(crate) async fn plain_floor_pair(&self, name: &LockName) -> Result<()> {
        let (key, value) = self.floor_acquire(name, false).await?;
        self.floor_delete(name, &key, &value).await
    }

    /// One pair of the fenced floor: the minimal fenced acquire (`SET NX PX` + `INCR` of a
    /// fence counter in one script), then the floor's compare-and-delete.
    pub(crate) async fn fenced_floor_pair(&self, name: &LockName) -> Result<()> {
        let (key, value) = self.floor_acquire(name, true).await?;
        self.floor_delete(name, &key, &value).await
    }

    /// The floor's acquire, plain (`SET NX PX`) or fenced (one script: `SET NX PX` + `INCR`);
    /// returns the key and the value to delete it with.
    pub(crate) async fn floor_acquire(
        &self,
        name: &LockName,
        fenced: bool,
    ) -> Result<(String, String)> {
        let base = format!("{{{}:floor:{}}}", self.inner.prefix, name.escaped());
        let key = format!("{base}:lock");
        let value = lockcore::OwnerId::random().to_string();
        let taken = if fenced {
            let take = Call::on(&scripts::FLOOR_FENCED, &[&key, &format!("{base}:fence")])
                .arg(value.as_str())
                .arg(10_000);
            let reply = self.inner.store.eval(&take).await;
            reply.map(|r| r != Value::Int(0))
        } else {
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(&value).arg("NX").arg("PX").arg(10_000);
            self.inner.store.query(&set).await.map(|r| r != Value::Nil)
        };
        match taken.map_err(|e| backend_error("floor acquire", Some(name), e))? {
            true => Ok((key, value)),
            false => Err(Error::backend(
                BACKEND,
                "floor acquire",
                Some(name),
                true,
                "the floor key was held",
            )),
        }
    }

    /// The floor's compare-and-delete.
    pub(crate) async fn floor_delete(&self, name: &LockName, key: &str, value: &str) -> Result<()> {
        let del = Call::on(&scripts::FLOOR_DELETE, &[key]).arg(value);
        self.inner
            .store
            .eval(&del)
            .await
            .map_err(|e| backend_error("floor delete", Some(name), e))?;
        Ok(())
    }
}

/// `Strict` only for a server that fsyncs every write to its AOF and never evicts keys.
pub(crate) async fn detect_fencing(store: &Store) -> Fencing {
    let mut values = Vec::new();
    for param in ["appendonly", "appendfsync", "maxmemory", "maxmemory-policy"] {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(param);
        match store.query(&cmd).await {
            Ok(v) => values.push(config_value(&v).unwrap_or_default()),
            Err(e) => {
                tracing::debug!(error = %e, "redis: CONFIG GET not permitted; fencing is conditional");
                return Fencing::Conditional {
                    assumption: ASSUMPTION_UNKNOWN,
                };
            }
        }
    }
    let no_eviction =
        values[2] == "0" || values[3] == "noeviction" || values[3].starts_with("volatile-");
    if values[0] == "yes" && values[1] == "always" && no_eviction {
        Fencing::Strict
    } else {
        Fencing::Conditional {
            assumption: ASSUMPTION_NO_PERSISTENCE,
        }
    }
}

/// The value of a one-parameter `CONFIG GET` reply (`[name, value]` or a map).
fn config_value(v: &Value) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match v {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

impl Inner {
    /// The owner- and token-checked release of `lease`, waking the head waiter.
    pub(crate) fn release_call(&self, lease: &Lease) -> Call {
        Keys::new(&self.prefix, lease.name())
            .call(
                &scripts::RELEASE,
                &[Key::Lock, Key::Fence, Key::Queue, Key::Alive],
            )
            .owner_arg(lease.owner())
            .arg(lease.token().0)
            .arg(self.wakes.as_str())
            .arg(self.client.as_str())
    }

    pub(crate) fn extend_call(&self, lease: &Lease, ttl: Duration) -> Call {
        Keys::new(&self.prefix, lease.name())
            .call(&scripts::EXTEND, &[Key::Lock, Key::Fence])
            .owner_arg(lease.owner())
            .arg(lease.token().0)
            .arg(millis(ttl))
    }

    fn extend_outcome(
        &self,
        lease: &Lease,
        started: Instant,
        ttl: Duration,
        reply: redis::RedisResult<Value>,
    ) -> Result<Lease> {
        let c = &self.counters;
        let value = reply.map_err(|e| {
            c.renewal_errors.fetch_add(1, Ordering::Relaxed);
            backend_error("extend", Some(lease.name()), e)
        })?;
        match scripts::parse_flag(&value) {
            Ok(true) => {
                c.renewals.fetch_add(1, Ordering::Relaxed);
                Ok(lease.renewed(started, ttl))
            }
            Ok(false) => {
                c.renewals_lost.fetch_add(1, Ordering::Relaxed);
                Err(Error::lock_lost(BACKEND, lease.name(), "extend"))
            }
            Err(e) => Err(protocol_error("extend", Some(lease.name()), e)),
        }
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            self.inner.fencing,
            Expiry::Ttl,
            Fairness::Fifo,
            WaitMechanism::PubSub,
        )
        // On a single server every request runs on a connection with a response timeout of
        // `timeout`, and connecting is bounded by it too. The Cluster client retries a request
        // after a timeout, so there lockcore keeps its own bound.
        .bounded_requests(matches!(self.inner.store, Store::Single(_)))
        // The acquire scripts raise the fence counter to the floor in the granting step.
        .token_floor(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.inner.try_acquire(name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.inner.acquire_wait(name, opts, deadline).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let value = self
            .inner
            .store
            .eval(&self.inner.release_call(lease))
            .await
            .map_err(|e| backend_error("release", Some(lease.name()), e))?;
        match scripts::parse_flag(&value) {
            Ok(true) => Ok(Released::Released),
            Ok(false) => Ok(Released::NotHeld),
            Err(e) => Err(protocol_error("release", Some(lease.name()), e)),
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::check_ttl(ttl)?;
        let started = Instant::now();
        let reply = self
            .inner
            .store
            .eval(&self.inner.extend_call(lease, ttl))
            .await;
        self.inner.extend_outcome(lease, started, ttl, reply)
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let inner = &self.inner;
        let (mut out, sent) = crate::queue::checked_batch(leases);
        let calls: Vec<Call> = sent
            .iter()
            .map(|&i| inner.extend_call(&leases[i].0, leases[i].1))
            .collect();
        inner
            .counters
            .renewal_batches
            .fetch_add(1, Ordering::Relaxed);
        let pipelines = match &inner.store {
            Store::Single(_) => u64::from(!calls.is_empty()),
            Store::Cluster(c) => {
                let mut nodes: Vec<Option<crate::cluster::NodeAddr>> = calls
                    .iter()
                    .map(|call| c.node_of(crate::cluster::slot(call.first_key())))
                    .collect();
                nodes.sort_unstable();
                nodes.dedup();
                nodes.len() as u64
            }
        };
        inner
            .counters
            .renewal_pipelines
            .fetch_add(pipelines, Ordering::Relaxed);
        let started = Instant::now();
        let replies = inner.store.eval_many(&calls).await;
        for (i, reply) in sent.into_iter().zip(replies) {
            let (lease, ttl) = &leases[i];
            out[i] = Some(inner.extend_outcome(lease, started, *ttl, reply));
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(protocol_error("extend", None, "no reply".into()))))
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let keys = Keys::new(&self.inner.prefix, name);
        let call = keys.call(
            &scripts::INSPECT,
            &[Key::Lock, Key::Fence, Key::Queue, Key::Alive],
        );
        let value = self
            .inner
            .store
            .eval(&call)
            .await
            .map_err(|e| backend_error("inspect", Some(name), e))?;
        let r =
            scripts::parse_inspect(&value).map_err(|e| protocol_error("inspect", Some(name), e))?;
        if r.holder.is_none() && r.fence.is_none() && r.queued == 0 {
            return Ok(None);
        }
        // Tokens are drawn only by a grant, so while the lock is held the fence counter is
        // its holder's token; when free it is the last one handed out.
        Ok(Some(LockInfo::new(
            name,
            r.holder,
            r.fence.map(FencingToken),
            (r.pttl > 0).then(|| Duration::from_millis(r.pttl as u64)),
            Some(usize::try_from(r.live_waiters).unwrap_or(0)),
        )))
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        let keys = Keys::new(&self.inner.prefix, name);
        let call = keys.call(
            &scripts::FORGET,
            &[Key::Lock, Key::Fence, Key::Queue, Key::Alive, Key::Seq],
        );
        let value = self
            .inner
            .store
            .eval(&call)
            .await
            .map_err(|e| backend_error("forget", Some(name), e))?;
        match value {
            redis::Value::Int(n) => Ok(n == 1),
            other => Err(protocol_error(
                "forget",
                Some(name),
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// Every name with a fence counter under this client's prefix (a name gets one with its
    /// first grant and keeps it until `forget`), found with `SCAN`, which does not block the
    /// server; in a Cluster, on every master of the slot map.
    async fn names(&self) -> Result<Vec<LockName>> {
        let inner = &self.inner;
        let pattern = scripts::fence_pattern(&inner.prefix);
        let mut names = std::collections::BTreeSet::new();
        let masters = match &inner.store {
            Store::Single(_) => vec![None],
            Store::Cluster(c) => c
                .masters()
                .await
                .map_err(|e| backend_error("list names", None, e))?
                .into_iter()
                .map(Some)
                .collect(),
        };
        for master in &masters {
            let mut cursor = 0_u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply = match (&inner.store, master) {
                    (Store::Cluster(c), Some(node)) => c.query_node(node, scan).await,
                    _ => inner.store.query(&scan).await,
                }
                .map_err(|e| backend_error("list names", None, e))?;
                let (next, keys) = scripts::parse_scan(&reply)
                    .map_err(|e| protocol_error("list names", None, e))?;
                names.extend(
                    keys.iter()
                        .filter_map(|k| scripts::name_of_fence_key(&inner.prefix, k)),
                );
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(names.into_iter().collect())
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(RedisFloor {
            client: self.clone(),
        }))
    }

    fn fenced_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(RedisFencedFloor {
            client: self.clone(),
        }))
    }
}

/// `SET NX PX` + an `EVALSHA` compare-and-delete on the client's own multiplexed connection.
struct RedisFloor {
    client: RedisLock,
}

#[async_trait]
impl RawFloor for RedisFloor {
    fn description(&self) -> String {
        "SET NX PX + EVALSHA compare-and-delete, on the same multiplexed connection".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        self.client.plain_floor_pair(name).await
    }
}

/// One script doing `SET NX PX` + `INCR` of a fence counter, then the same compare-and-delete:
/// the floor with the guarantee a fenced lock gives.
struct RedisFencedFloor {
    client: RedisLock,
}

#[async_trait]
impl RawFloor for RedisFencedFloor {
    fn description(&self) -> String {
        "one script SET NX PX + INCR fence, then EVALSHA compare-and-delete, on the same multiplexed connection".into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        self.client.fenced_floor_pair(name).await
    }
}
