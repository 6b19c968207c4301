//! Redis Cluster: redis-rs's cluster connection (slot map, MOVED/ASK redirects, reconnects) for
//! commands, and one plain connection to any reachable node for pub/sub (a `PUBLISH` on one
//! node of a cluster reaches the subscribers of every node).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use redis::aio::PubSub;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisResult, Value,
};

use super::single::timeout_error;

/// The number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// A master's address as the cluster announces it.
pub(crate) type NodeAddr = (String, u16);

/// A cluster connection, the seed nodes for the subscriber, and our own copy of the slot map
/// (used only to group pipelined renewals by node; redis-rs routes everything else).
///
/// Once every master has been down at once, redis-rs's cluster connection can be left without
/// any node connection for good, failing every command with `ClusterConnectionNotFound` after
/// the masters are back. A command that fails so makes [`Cluster::with`] build a new
/// connection from the seed nodes.
pub(crate) struct Cluster {
    client: ClusterClient,
    /// The connection and how many times it was rebuilt.
    connection: RwLock<(u64, ClusterConnection)>,
    rebuilding: tokio::sync::Mutex<()>,
    nodes: Vec<ConnectionInfo>,
    next_node: AtomicUsize,
    timeout: Duration,
    slots: RwLock<Vec<(u16, u16, NodeAddr)>>,
}

impl Cluster {
    /// Connects to the cluster through `nodes` (seed nodes with credentials already set).
    pub(crate) async fn connect(
        nodes: Vec<ConnectionInfo>,
        timeout: Duration,
    ) -> RedisResult<Self> {
        let client = ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(3)
            .build()?;
        let connection = open(&client, timeout).await?;
        let cluster = Cluster {
            client,
            connection: RwLock::new((0, connection)),
            rebuilding: tokio::sync::Mutex::new(()),
            nodes,
            next_node: AtomicUsize::new(0),
            timeout,
            slots: RwLock::new(Vec::new()),
        };
        if let Err(e) = cluster.refresh_slots().await {
            tracing::debug!(error = %e, "redis cluster: CLUSTER SLOTS failed at connect");
        }
        Ok(cluster)
    }

    /// Reloads the slot map with `CLUSTER SLOTS`.
    pub(crate) async fn refresh_slots(&self) -> RedisResult<()> {
        let reply: Value = self
            .with(|mut con| async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut con)
                    .await
            })
            .await?;
        let mut map = Vec::new();
        if let Value::Array(ranges) = reply {
            for range in ranges {
                let Value::Array(items) = range else { continue };
                let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(master))) =
                    (items.first(), items.get(1), items.get(2))
                else {
                    continue;
                };
                let host = match master.first() {
                    Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    Some(Value::SimpleString(s)) => s.clone(),
                    _ => continue,
                };
                let Some(Value::Int(port)) = master.get(1) else {
                    continue;
                };
                if let (Ok(lo), Ok(hi), Ok(port)) =
                    (u16::try_from(*lo), u16::try_from(*hi), u16::try_from(*port))
                {
                    map.push((lo, hi, (host, port)));
                }
            }
        }
        *self.slots.write().unwrap_or_else(PoisonError::into_inner) = map;
        Ok(())
    }

    /// The master serving `slot` per our slot map, if known.
    pub(crate) fn node_of(&self, slot: u16) -> Option<NodeAddr> {
        self.slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, node)| node.clone())
    }

    /// Whether the slot map was loaded.
    /// The masters of the slot map, refreshed first, each once.
    pub(crate) async fn masters(&self) -> RedisResult<Vec<NodeAddr>> {
        self.refresh_slots().await?;
        let mut masters: Vec<NodeAddr> = self
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(_, _, node)| node.clone())
            .collect();
        masters.sort();
        masters.dedup();
        Ok(masters)
    }

    /// Runs `cmd` on the master at `node`.
    pub(crate) async fn query_node(&self, node: &NodeAddr, cmd: redis::Cmd) -> RedisResult<Value> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: node.0.clone(),
            port: node.1,
        });
        self.current().route_command(cmd, routing).await
    }

    pub(crate) fn has_slots(&self) -> bool {
        !self
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// A handle on the shared cluster connection, for a request to a named node: its
    /// `ClusterConnectionNotFound` says only that this node is not connected now.
    pub(crate) fn current(&self) -> ClusterConnection {
        self.connection
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// Runs `request` on a handle of the shared cluster connection. When it fails with
    /// `ClusterConnectionNotFound`, the connection is replaced by a new one from the seed nodes
    /// (once, however many requests failed on it) for the next requests; this one's error is
    /// returned, retryable.
    pub(crate) async fn with<T, F, Fut>(&self, request: F) -> RedisResult<T>
    where
        F: FnOnce(ClusterConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (generation, connection) = self
            .connection
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let result = request(connection).await;
        if let Err(e) = &result
            && e.kind() == ErrorKind::ClusterConnectionNotFound
        {
            self.rebuild(generation).await;
        }
        result
    }

    /// Replaces the connection of `generation` (if it is still the current one) with a new one
    /// from the seed nodes; keeps it when no seed node answers. A request that fails while
    /// another rebuilds returns at once.
    async fn rebuild(&self, generation: u64) {
        let Ok(_one_at_a_time) = self.rebuilding.try_lock() else {
            return;
        };
        if self
            .connection
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            != generation
        {
            return;
        }
        match open(&self.client, self.timeout).await {
            Ok(connection) => {
                let next = generation + 1;
                *self
                    .connection
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = (next, connection);
                tracing::debug!(nodes = %self.describe(), "redis cluster: connection rebuilt from the seed nodes");
            }
            Err(e) => {
                tracing::debug!(error = %e, "redis cluster: rebuilding the connection failed");
            }
        }
    }

    /// A new pub/sub connection to one of the seed nodes, trying each in turn (starting after
    /// the one used last, so a dead node is not retried first).
    pub(crate) async fn pubsub(&self) -> RedisResult<PubSub> {
        let start = self.next_node.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for i in 0..self.nodes.len() {
            let info = self.nodes[(start + i) % self.nodes.len()].clone();
            let attempt = async {
                let client = Client::open(info.into_connection_info()?)?;
                client.get_async_pubsub().await
            };
            match tokio::time::timeout(self.timeout, attempt).await {
                Ok(Ok(pubsub)) => return Ok(pubsub),
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(timeout_error("connecting the subscriber", self.timeout)),
            }
        }
        Err(last.unwrap_or_else(|| timeout_error("connecting the subscriber", self.timeout)))
    }

    /// A new cluster connection for shard-channel subscriptions (RESP3), passing every push
    /// (messages, subscription changes, lost node connections) to `push`. redis-rs sends each
    /// `SSUBSCRIBE` to the node serving the channel's slot and subscribes again after it
    /// reconnects.
    pub(crate) async fn subscriber(
        &self,
        push: impl redis::aio::AsyncPushSender,
    ) -> RedisResult<ClusterConnection> {
        let client = ClusterClient::builder(self.nodes.clone())
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout)
            .retries(3)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push)
            .build()?;
        match tokio::time::timeout(self.timeout * 2, client.get_async_connection()).await {
            Ok(r) => r,
            Err(_) => Err(timeout_error("connecting the subscriber", self.timeout * 2)),
        }
    }

    /// Whether the cluster knows shard channels (`SPUBLISH`, Redis 7.0 and later).
    pub(crate) async fn has_shard_channels(&self) -> RedisResult<bool> {
        let reply: Value = self
            .with(|mut con| async move {
                redis::cmd("COMMAND")
                    .arg("INFO")
                    .arg("SPUBLISH")
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(
            matches!(reply, Value::Array(entries) if entries.first().is_some_and(|e| *e != Value::Nil)),
        )
    }

    /// The seed nodes' addresses (for messages).
    pub(crate) fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(|n| match n.addr() {
                ConnectionAddr::Tcp(h, p)
                | ConnectionAddr::TcpTls {
                    host: h, port: p, ..
                } => {
                    format!("{h}:{p}")
                }
                other => format!("{other}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A new cluster connection through `client`'s seed nodes, within twice `timeout`.
async fn open(client: &ClusterClient, timeout: Duration) -> RedisResult<ClusterConnection> {
    match tokio::time::timeout(timeout * 2, client.get_async_connection()).await {
        Ok(r) => r,
        Err(_) => Err(timeout_error("connecting to the cluster", timeout * 2)),
    }
}

/// The Cluster hash slot of `key` (CRC16/XMODEM of the hash tag, or of the whole key).
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }
}
