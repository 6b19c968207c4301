//! What the dual test binaries share: connecting a store URL of any kind these tests use, a
//! dual URL over two of them, and a server handle that breaks both stores at once.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use conformance_tests::kit::{KitResult, Redis, ServerControl, ZooKeeper};
use lockcore::{DistributedLock, MemoryLock, Result, async_trait};

/// Connects one store URL (`memory://`, `zk://`, `redis://`), as the facade would.
pub async fn store(url: String) -> Result<Arc<dyn DistributedLock>> {
    if url.starts_with("memory:") {
        Ok(Arc::new(MemoryLock::from_url(&url)?))
    } else if url.starts_with("zk:") {
        backend_zk::connect(&url).await
    } else {
        backend_redis::connect(&url).await
    }
}

/// Connects a `dual://` URL over stores [`store`] knows.
pub async fn dual(url: String) -> Result<Arc<dyn DistributedLock>> {
    backend_dual::connect(&url, store).await
}

/// Percent-encodes a whole URL for a query value.
pub fn enc(url: &str) -> String {
    url::form_urlencoded::byte_serialize(url.as_bytes()).collect()
}

/// `dual://?first=..&second=..` with both URLs encoded, plus `extra` options.
pub fn dual_url(first: &str, second: &str, extra: &str) -> String {
    let mut url = format!("dual://?first={}&second={}", enc(first), enc(second));
    if !extra.is_empty() {
        url.push('&');
        url.push_str(extra);
    }
    url
}

/// A ZooKeeper server and a Redis server handled as one: fault scenarios kill, pause and
/// restart both.
#[derive(Debug)]
pub struct Both {
    pub zk: ZooKeeper,
    pub redis: Redis,
}

#[async_trait]
impl ServerControl for Both {
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
