//! Redis Cluster: redis-rs's cluster connection (slot map, MOVED/ASK redirects, reconnects) for
//! commands, and one plain connection to any reachable node for pub/sub (a `PUBLISH` on one
//! node of a cluster reaches the subscribers of every node).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::PubSub;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult};

use crate::single::timeout_error;

/// The number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// A cluster connection plus the seed nodes for the subscriber.
pub(crate) struct Cluster {
    connection: ClusterConnection,
    nodes: Vec<ConnectionInfo>,
    next_node: AtomicUsize,
    timeout: Duration,
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
        let connection =
            match tokio::time::timeout(timeout * 2, client.get_async_connection()).await {
                Ok(r) => r?,
                Err(_) => return Err(timeout_error("connecting to the cluster", timeout * 2)),
            };
        Ok(Cluster {
            connection,
            nodes,
            next_node: AtomicUsize::new(0),
            timeout,
        })
    }

    /// A handle on the shared cluster connection (cheap to clone).
    pub(crate) fn connection(&self) -> ClusterConnection {
        self.connection.clone()
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
