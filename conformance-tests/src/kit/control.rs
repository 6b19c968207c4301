//! [`ServerControl`]: what a fault scenario may do to a server, whatever its kind.

use std::fmt::Debug;
use std::net::SocketAddr;

use lockcore::async_trait;

use super::error::{KitError, KitErrorKind, KitResult};
use super::{
    MariaDb, Postgres, Redis, RedisCluster, RedisReply, RedisSet, ZkEnsemble, ZkNode, ZooKeeper,
};

/// The lifecycle handle every kit server offers, so that the shared fault scenarios
/// (`conformance_tests::faults`) can kill, pause and restart any store without knowing its kind.
///
/// Implemented by [`super::Redis`], [`super::Postgres`], [`super::MariaDb`],
/// [`super::ZooKeeper`] and each [`super::ZkNode`], and by the groups [`super::RedisSet`],
/// [`super::RedisCluster`] and [`super::ZkEnsemble`], whose every server a fault reaches at once.
#[async_trait]
pub trait ServerControl: Send + Sync + Debug {
    /// What runs (`redis-server`, `postgres`, `mariadb`, `zookeeper`), for messages.
    fn label(&self) -> &str;

    /// `127.0.0.1:{port}`, the same across restarts (put a [`super::Proxy`] in front of it).
    fn addr(&self) -> SocketAddr;

    /// Every address a client of the store connects to (a [`super::Proxy`] in front of each
    /// cuts a client off the whole store): [`ServerControl::addr`] alone, unless the store has
    /// several servers a client talks to (Redlock's nodes).
    fn addrs(&self) -> Vec<SocketAddr> {
        vec![self.addr()]
    }

    /// SIGKILLs the server and every process it started (a crash); connections fail at once.
    fn kill9(&self);

    /// SIGSTOPs the server and its processes: connections hang, nothing is refused.
    fn pause(&self);

    /// SIGCONTs the server after [`ServerControl::pause`].
    fn resume(&self);

    /// Starts the server again on the same port and data, killing it first if it runs, and
    /// waits until it answers.
    ///
    /// # Errors
    /// A server that does not answer within the kit's start-up timeout.
    async fn restart(&self) -> KitResult<()>;

    /// Ends every client connection the server has, from the server side (`CLIENT KILL`,
    /// `pg_terminate_backend`, `KILL CONNECTION`) and returns how many it ended. The server
    /// keeps running and keeps its data.
    ///
    /// # Errors
    /// The admin command failing.
    async fn kill_client_connections(&self) -> KitResult<usize>;
}

/// Delegates the synchronous lifecycle methods (`restart` is written out in each impl, where
/// `async_trait` can see it) to the kind's own inherent methods of the same names.
macro_rules! delegate_lifecycle {
    ($label:expr) => {
        fn label(&self) -> &str {
            $label
        }

        fn addr(&self) -> SocketAddr {
            Self::addr(self)
        }

        fn kill9(&self) {
            Self::kill9(self)
        }

        fn pause(&self) {
            Self::pause(self)
        }

        fn resume(&self) {
            Self::resume(self)
        }
    };
}

fn command_error(what: &str, detail: impl std::fmt::Display) -> KitError {
    KitError::new(KitErrorKind::Command, format!("{what}: {detail}"))
}

#[async_trait]
impl ServerControl for Redis {
    delegate_lifecycle!("redis-server");

    async fn restart(&self) -> KitResult<()> {
        Self::restart(self).await
    }

    /// `CLIENT KILL TYPE normal SKIPME yes`, then the same for `pubsub`.
    async fn kill_client_connections(&self) -> KitResult<usize> {
        let mut killed = 0;
        for kind in ["normal", "pubsub"] {
            match self
                .command(&["CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"])
                .await?
            {
                RedisReply::Integer(n) => killed += usize::try_from(n).unwrap_or(0),
                other => return Err(command_error("CLIENT KILL", format!("{other:?}"))),
            }
        }
        Ok(killed)
    }
}

/// Every server of the set at once: a fault scenario written for one server breaks all of
/// Redlock's masters (its `addr` is the first node's; `addrs` names every node).
#[async_trait]
impl ServerControl for RedisSet {
    fn label(&self) -> &str {
        "redis-server (every node)"
    }

    fn addr(&self) -> SocketAddr {
        self.nodes()[0].addr()
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes().iter().map(Redis::addr).collect()
    }

    fn kill9(&self) {
        self.nodes().iter().for_each(Redis::kill9);
    }

    fn pause(&self) {
        self.nodes().iter().for_each(Redis::pause);
    }

    fn resume(&self) {
        self.nodes().iter().for_each(Redis::resume);
    }

    async fn restart(&self) -> KitResult<()> {
        for node in self.nodes() {
            node.restart().await?;
        }
        Ok(())
    }

    async fn kill_client_connections(&self) -> KitResult<usize> {
        let mut killed = 0;
        for node in self.nodes() {
            killed += ServerControl::kill_client_connections(node).await?;
        }
        Ok(killed)
    }
}

/// Every master of the cluster at once (the catalog starts it without replicas, so nothing fails
/// over): a fault scenario written for one server breaks the whole cluster.
#[async_trait]
impl ServerControl for RedisCluster {
    fn label(&self) -> &str {
        "redis-server (every cluster master)"
    }

    fn addr(&self) -> SocketAddr {
        self.node(0).addr()
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes().iter().map(Redis::addr).collect()
    }

    fn kill9(&self) {
        self.nodes().iter().for_each(Redis::kill9);
    }

    fn pause(&self) {
        self.nodes().iter().for_each(Redis::pause);
    }

    fn resume(&self) {
        self.nodes().iter().for_each(Redis::resume);
    }

    /// [`RedisCluster::restart_all`]: the cluster re-forms from every node's `nodes.conf`.
    async fn restart(&self) -> KitResult<()> {
        self.restart_all().await
    }

    async fn kill_client_connections(&self) -> KitResult<usize> {
        let mut killed = 0;
        for node in self.nodes() {
            killed += ServerControl::kill_client_connections(node).await?;
        }
        Ok(killed)
    }
}

#[async_trait]
impl ServerControl for Postgres {
    delegate_lifecycle!("postgres");

    async fn restart(&self) -> KitResult<()> {
        Self::restart(self).await
    }

    /// `pg_terminate_backend` of every client backend but the one asking.
    async fn kill_client_connections(&self) -> KitResult<usize> {
        let out = self
            .query(
                "postgres",
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
            )
            .await?;
        out.trim()
            .parse()
            .map_err(|e| command_error("pg_terminate_backend count", format!("{out:?}: {e}")))
    }
}

#[async_trait]
impl ServerControl for MariaDb {
    delegate_lifecycle!("mariadb");

    async fn restart(&self) -> KitResult<()> {
        Self::restart(self).await
    }

    /// `KILL CONNECTION` of every client connection but the one asking (system threads and
    /// connections that ended meanwhile are skipped).
    async fn kill_client_connections(&self) -> KitResult<usize> {
        let ids = self
            .query(
                "mysql",
                "SELECT id FROM information_schema.PROCESSLIST WHERE id <> CONNECTION_ID() \
                 AND command NOT IN ('Daemon', 'Binlog Dump') \
                 AND user NOT IN ('system user', 'event_scheduler')",
            )
            .await?;
        let mut killed = 0;
        for id in ids.split_whitespace() {
            // A connection may end by itself meanwhile ("Unknown thread id").
            if self
                .query("mysql", &format!("KILL CONNECTION {id}"))
                .await
                .is_ok()
            {
                killed += 1;
            }
        }
        Ok(killed)
    }
}

/// ZooKeeper has no admin command that ends a client's connection from the server's side.
fn zk_cannot_kill_connections() -> KitError {
    KitError::new(
        KitErrorKind::InvalidArgument,
        "ZooKeeper cannot end client connections from the server side: blackhole the client's \
         link with a Proxy instead",
    )
}

#[async_trait]
impl ServerControl for ZooKeeper {
    delegate_lifecycle!("zookeeper");

    async fn restart(&self) -> KitResult<()> {
        Self::restart(self).await
    }

    /// Always an error: ZooKeeper has no admin command that ends a client's connection.
    async fn kill_client_connections(&self) -> KitResult<usize> {
        Err(zk_cannot_kill_connections())
    }
}

#[async_trait]
impl ServerControl for ZkNode {
    delegate_lifecycle!("zookeeper");

    async fn restart(&self) -> KitResult<()> {
        Self::restart(self).await
    }

    /// Always an error: ZooKeeper has no admin command that ends a client's connection.
    async fn kill_client_connections(&self) -> KitResult<usize> {
        Err(zk_cannot_kill_connections())
    }
}

/// Every member of the ensemble at once: a fault scenario written for one server breaks the
/// whole ensemble (its `addr` is the first member's, so a proxy covers one member only).
#[async_trait]
impl ServerControl for ZkEnsemble {
    fn label(&self) -> &str {
        "zookeeper (every member)"
    }

    fn addr(&self) -> SocketAddr {
        self.node(0).addr()
    }

    fn kill9(&self) {
        self.nodes().iter().for_each(ZkNode::kill9);
    }

    fn pause(&self) {
        self.nodes().iter().for_each(ZkNode::pause);
    }

    fn resume(&self) {
        self.nodes().iter().for_each(ZkNode::resume);
    }

    /// Kills every member, starts them again one by one on their data, and waits until all
    /// of them serve with one leader.
    async fn restart(&self) -> KitResult<()> {
        self.kill9();
        for node in self.nodes() {
            node.restart().await?;
        }
        self.wait_for_all().await.map(drop)
    }

    /// Always an error: ZooKeeper has no admin command that ends a client's connection.
    async fn kill_client_connections(&self) -> KitResult<usize> {
        Err(zk_cannot_kill_connections())
    }
}

/// A ZooKeeper server and a Redis server handled as one (the pair a `dual://` store over
/// ZooKeeper then Redis uses): a fault breaks both at once.
#[derive(Debug)]
pub struct ZkAndRedis {
    /// The first store's server.
    pub zk: ZooKeeper,
    /// The second store's server.
    pub redis: Redis,
}

#[async_trait]
impl ServerControl for ZkAndRedis {
    fn label(&self) -> &str {
        "zookeeper + redis-server"
    }

    /// The Redis server's address (the ZooKeeper server has its own, [`ZooKeeper::addr`]).
    fn addr(&self) -> SocketAddr {
        self.redis.addr()
    }

    fn kill9(&self) {
        self.zk.kill9();
        self.redis.kill9();
    }

    fn pause(&self) {
        self.zk.pause();
        self.redis.pause();
    }

    fn resume(&self) {
        self.zk.resume();
        self.redis.resume();
    }

    async fn restart(&self) -> KitResult<()> {
        let (zk, redis) = tokio::join!(self.zk.restart(), self.redis.restart());
        zk.and(redis)
    }

    /// ZooKeeper cannot end its clients' connections; this ends Redis's only.
    async fn kill_client_connections(&self) -> KitResult<usize> {
        ServerControl::kill_client_connections(&self.redis).await
    }
}
