//! Throwaway stores that a command starts with the test kit (`dlock soak --spawn NAME`): one
//! list of backend names, and a [`Stack`] per name with the servers a nemesis may break and one
//! URL per client, each through that client's own fault-injecting [`Proxy`], so a link fault
//! can hit one client and spare the others.
//!
//! Redis Cluster has no proxies: its redirections name the nodes' own ports, so only server
//! faults apply to it.
//!
//! The servers listen on 127.0.0.1; PostgreSQL, MariaDB and Redis admit only the kit's password
//! for this process ([`crate::kit::password`]), which the URLs carry; ZooKeeper has no password,
//! so any local user can connect to it while it runs (see [`crate::kit`]).
//!
//! Servers are started durable (Redis with `appendfsync always`; the SQL servers and ZooKeeper
//! keep their data across a kill), so that killing one is a fault every backend must survive
//! safely, unless a Redis-based backend is asked to run without persistence
//! ([`Stack::start_with`]). They are the kit's children: dropping the stack kills them.

use std::fmt;
use std::str::FromStr;

use crate::Persistence;
use crate::kit::{
    KitError, KitErrorKind, KitResult, MariaDb, Postgres, Proxy, Redis, RedisCluster, RedisSet,
    ServerControl, ZkEnsemble, ZooKeeper,
};

/// A backend the kit can start, by its `--spawn` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpawnName {
    /// A SQLite file in a temp dir (no server: client faults only).
    Sqlite,
    /// A private PostgreSQL server.
    Postgres,
    /// A private MariaDB server.
    Mariadb,
    /// A private redis-server.
    Redis,
    /// A 3-master Redis Cluster.
    RedisCluster,
    /// Redlock over 3 redis-servers.
    Redlock3,
    /// Redlock over 5 redis-servers.
    Redlock5,
    /// The Tair emulation on a private redis-server.
    Tair,
    /// A standalone ZooKeeper.
    Zk,
    /// A 3-node ZooKeeper ensemble.
    ZkEnsemble,
    /// `dual://` over ZooKeeper then Redis.
    Dual,
}

impl SpawnName {
    /// Every name, in the order help texts list them.
    pub const ALL: &'static [SpawnName] = &[
        SpawnName::Sqlite,
        SpawnName::Postgres,
        SpawnName::Mariadb,
        SpawnName::Redis,
        SpawnName::RedisCluster,
        SpawnName::Redlock3,
        SpawnName::Redlock5,
        SpawnName::Tair,
        SpawnName::Zk,
        SpawnName::ZkEnsemble,
        SpawnName::Dual,
    ];

    /// The name as `--spawn` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SpawnName::Sqlite => "sqlite",
            SpawnName::Postgres => "postgres",
            SpawnName::Mariadb => "mariadb",
            SpawnName::Redis => "redis",
            SpawnName::RedisCluster => "redis-cluster",
            SpawnName::Redlock3 => "redlock-3",
            SpawnName::Redlock5 => "redlock-5",
            SpawnName::Tair => "tair",
            SpawnName::Zk => "zk",
            SpawnName::ZkEnsemble => "zk-ensemble",
            SpawnName::Dual => "dual",
        }
    }

    /// Whether its servers are Redis servers (the only ones that can run without persistence).
    pub fn redis_based(self) -> bool {
        matches!(
            self,
            SpawnName::Redis
                | SpawnName::RedisCluster
                | SpawnName::Redlock3
                | SpawnName::Redlock5
                | SpawnName::Tair
        )
    }

    /// Every name, comma-separated, for messages.
    pub fn list() -> String {
        Self::ALL
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for SpawnName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SpawnName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| format!("unknown backend `{s}`: use one of {}", Self::list()))
    }
}

/// The `dual://` URL over the stores at `first` and `second`.
pub fn dual_url(first: &str, second: &str) -> String {
    format!(
        "dual://?first={}&second={}",
        lockcore::percent_encode(first),
        lockcore::percent_encode(second)
    )
}

/// A started backend: its servers, and one URL per client.
pub struct Stack {
    /// Which backend.
    pub name: SpawnName,
    /// Client `i` connects to `client_urls[i]`.
    pub client_urls: Vec<String>,
    /// Client `i`'s links: one proxy per server, in the order of [`Stack::servers`] (none for
    /// SQLite, and none for Redis Cluster, whose redirections name the nodes' own ports).
    pub links: Vec<Vec<Proxy>>,
    /// A URL that bypasses the proxies, for looking at the store after the run.
    pub direct_url: String,
    /// Whether the servers keep acknowledged writes across a kill.
    pub persistence: Persistence,
    own: Vec<Box<dyn ServerControl>>,
    ensemble: Option<ZkEnsemble>,
    cluster: Option<RedisCluster>,
    _dir: Option<tempfile::TempDir>,
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("name", &self.name)
            .field("servers", &self.servers().len())
            .field("clients", &self.client_urls.len())
            .finish_non_exhaustive()
    }
}

/// Redis with every write fsynced to its AOF before it is acknowledged.
const DURABLE_REDIS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

impl Stack {
    /// Starts `name` for `clients` clients, its servers durable.
    ///
    /// # Cancel safety
    /// A dropped call kills whatever it had started.
    ///
    /// # Errors
    /// A missing server binary (the message names the package to install), or a server failing
    /// to start.
    pub async fn start(name: SpawnName, clients: usize) -> KitResult<Stack> {
        Self::start_with(name, clients, Persistence::Durable).await
    }

    /// Starts `name` for `clients` clients; with [`Persistence::None`], the Redis servers of a
    /// Redis-based backend keep nothing on disk (a kill empties them).
    ///
    /// # Cancel safety
    /// A dropped call kills whatever it had started.
    ///
    /// # Errors
    /// As [`Stack::start`]; [`Persistence::None`] for a backend that is not Redis-based (its
    /// servers always persist).
    pub async fn start_with(
        name: SpawnName,
        clients: usize,
        persistence: Persistence,
    ) -> KitResult<Stack> {
        if persistence == Persistence::None && !name.redis_based() {
            return Err(KitError::new(
                KitErrorKind::InvalidArgument,
                format!(
                    "`{name}` always persists: running without persistence is for the Redis-based \
                     backends (redis, redis-cluster, redlock-3, redlock-5, tair)"
                ),
            ));
        }
        let redis_args: &[&str] = match persistence {
            Persistence::Durable => DURABLE_REDIS,
            Persistence::None => &[],
        };
        let mut stack = Stack {
            name,
            client_urls: Vec::new(),
            links: Vec::new(),
            direct_url: String::new(),
            persistence,
            own: Vec::new(),
            ensemble: None,
            cluster: None,
            _dir: None,
        };
        // Each URL part names its servers by address; a client's copy names its proxies.
        let parts: Vec<(String, Vec<usize>)> = match name {
            SpawnName::Sqlite => {
                let dir = tempfile::tempdir().map_err(|e| {
                    KitError::new(KitErrorKind::Io, format!("cannot make a temp dir: {e}"))
                })?;
                let url = format!("sqlite://{}", dir.path().join("soak.db").display());
                stack._dir = Some(dir);
                stack.client_urls = vec![url.clone(); clients];
                stack.direct_url = url;
                return Ok(stack);
            }
            SpawnName::Postgres => {
                let pg = Postgres::start().await?;
                let url = pg.create_database("soak").await?;
                stack.own.push(Box::new(pg));
                vec![(url, vec![0])]
            }
            SpawnName::Mariadb => {
                let db = MariaDb::start().await?;
                let url = db.create_database("soak").await?;
                stack.own.push(Box::new(db));
                vec![(url, vec![0])]
            }
            SpawnName::Redis | SpawnName::Tair => {
                let redis = Redis::start_with(redis_args).await?;
                let url = redis.url();
                stack.own.push(Box::new(redis));
                let url = if name == SpawnName::Tair {
                    url.replacen("redis://", "tair://", 1)
                } else {
                    url
                };
                vec![(url, vec![0])]
            }
            SpawnName::Redlock3 | SpawnName::Redlock5 => {
                let n = if name == SpawnName::Redlock3 { 3 } else { 5 };
                let set = RedisSet::start(n, redis_args).await?;
                let url = set.redlock_url();
                for node in set.into_nodes() {
                    stack.own.push(Box::new(node));
                }
                vec![(url, (0..n).collect())]
            }
            SpawnName::Zk => {
                let zk = ZooKeeper::start().await?;
                let url = zk.url();
                stack.own.push(Box::new(zk));
                vec![(url, vec![0])]
            }
            SpawnName::ZkEnsemble => {
                let ensemble = ZkEnsemble::start(3).await?;
                let url = ensemble.url();
                stack.ensemble = Some(ensemble);
                vec![(url, vec![0, 1, 2])]
            }
            SpawnName::RedisCluster => {
                let cluster = RedisCluster::start_with(3, redis_args).await?;
                let url = cluster.url();
                stack.cluster = Some(cluster);
                stack.client_urls = vec![url.clone(); clients];
                stack.direct_url = url;
                return Ok(stack);
            }
            SpawnName::Dual => {
                let zk = ZooKeeper::start().await?;
                let redis = Redis::start_with(redis_args).await?;
                let parts = vec![(zk.url(), vec![0]), (redis.url(), vec![1])];
                stack.own.push(Box::new(zk));
                stack.own.push(Box::new(redis));
                parts
            }
        };
        let addrs: Vec<String> = stack
            .servers()
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        let compose = |parts: &[String]| match name {
            SpawnName::Dual => dual_url(&parts[0], &parts[1]),
            _ => parts[0].clone(),
        };
        let direct: Vec<String> = parts.iter().map(|(u, _)| u.clone()).collect();
        stack.direct_url = compose(&direct);
        for _ in 0..clients {
            let mut links = Vec::with_capacity(addrs.len());
            for server in stack.servers() {
                links.push(Proxy::start(server.addr()).await?);
            }
            let mine: Vec<String> = parts
                .iter()
                .map(|(url, servers)| {
                    servers.iter().fold(url.clone(), |url, &i| {
                        url.replacen(&addrs[i], &links[i].addr().to_string(), 1)
                    })
                })
                .collect();
            stack.client_urls.push(compose(&mine));
            stack.links.push(links);
        }
        Ok(stack)
    }

    /// The servers a nemesis may kill, pause and restart (none for SQLite), in the order of
    /// each client's [`links`](Self::links).
    pub fn servers(&self) -> Vec<&dyn ServerControl> {
        let mut out: Vec<&dyn ServerControl> = self.own.iter().map(|s| s.as_ref()).collect();
        if let Some(e) = &self.ensemble {
            out.extend(e.nodes().iter().map(|n| n as &dyn ServerControl));
        }
        if let Some(c) = &self.cluster {
            out.extend(c.nodes().iter().map(|n| n as &dyn ServerControl));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_list_the_choices() {
        for name in SpawnName::ALL {
            assert_eq!(name.as_str().parse::<SpawnName>(), Ok(*name));
        }
        let err = "redis-sentinel".parse::<SpawnName>().unwrap_err();
        assert!(
            err.contains("redis-sentinel") && err.contains("zk-ensemble"),
            "{err}"
        );
    }
}
