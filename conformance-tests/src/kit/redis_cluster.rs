//! A Redis Cluster of the kit's own: N masters, each a [`Redis`] started with
//! `cluster-enabled yes`, slots assigned by the kit with `CLUSTER ADDSLOTSRANGE`, joined with
//! `CLUSTER MEET`, and ready once every node reports `cluster_state:ok`. Started with
//! [`RedisCluster::start_with_replicas`], every master has one replica, which
//! [`RedisCluster::promote_replica`] makes master with `CLUSTER FAILOVER TAKEOVER`.
//!
//! Each node keeps its `nodes.conf` in its own temp dir, so a node restarted with
//! [`RedisCluster::restart_node`] or [`RedisCluster::restart_all`] rejoins with the same id and
//! slots (its keys are gone unless the cluster was started with persistence arguments).

use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use super::error::{KitError, KitErrorKind, KitResult};
use super::free_port;
use super::redis::{Redis, RedisReply};

/// How long the kit waits for `cluster_state:ok` on every node.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A Redis Cluster of `len()` masters on loopback, each with a replica or none.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Redis>,
    bus_ports: Vec<u16>,
    /// `replicas[i]` replicates `nodes[i]`; empty for a cluster of masters only.
    replicas: Vec<Redis>,
}

impl RedisCluster {
    /// Starts a private cluster of `masters` masters without persistence.
    ///
    /// # Cancel safety
    /// Dropping the future kills the nodes started so far (each [`Redis`] is killed on drop).
    ///
    /// # Errors
    /// `redis-server` missing (naming the package), a node that does not start, or a cluster
    /// that does not reach `cluster_state:ok` within 60 s.
    pub async fn start(masters: usize) -> KitResult<RedisCluster> {
        Self::start_with(masters, &[]).await
    }

    /// Starts a private cluster whose nodes get `extra_args` after the cluster settings (for
    /// example `["--appendonly", "yes", "--appendfsync", "always"]`).
    ///
    /// # Cancel safety
    /// As [`RedisCluster::start`].
    ///
    /// # Errors
    /// As [`RedisCluster::start`].
    pub async fn start_with(masters: usize, extra_args: &[&str]) -> KitResult<RedisCluster> {
        Self::start_nodes(masters, false, extra_args).await
    }

    /// Starts a private cluster of `masters` masters, each with one replica (`2 * masters`
    /// nodes, all with `extra_args`), and waits until every replica's link to its master is up
    /// and every node reports `cluster_state:ok`.
    ///
    /// # Cancel safety
    /// As [`RedisCluster::start`].
    ///
    /// # Errors
    /// As [`RedisCluster::start`]; also a replica that does not sync within 60 s.
    pub async fn start_with_replicas(
        masters: usize,
        extra_args: &[&str],
    ) -> KitResult<RedisCluster> {
        Self::start_nodes(masters, true, extra_args).await
    }

    async fn start_nodes(
        masters: usize,
        with_replicas: bool,
        extra_args: &[&str],
    ) -> KitResult<RedisCluster> {
        if masters == 0 {
            return Err(KitError::new(
                KitErrorKind::InvalidArgument,
                "a cluster needs at least one master",
            ));
        }
        let mut nodes = Vec::with_capacity(masters);
        let mut bus_ports = Vec::with_capacity(masters);
        let mut replicas = Vec::new();
        let mut replica_bus_ports = Vec::new();
        for _ in 0..masters {
            let (node, bus) = start_node(extra_args).await?;
            nodes.push(node);
            bus_ports.push(bus);
        }
        if with_replicas {
            for _ in 0..masters {
                let (node, bus) = start_node(extra_args).await?;
                replicas.push(node);
                replica_bus_ports.push(bus);
            }
        }
        let cluster = RedisCluster {
            nodes,
            bus_ports,
            replicas,
        };
        // Distinct config epochs from the start (as `redis-cli --cluster create` sets them): a
        // node that becomes a replica keeps its epoch, and one that shares its master's would,
        // once promoted by a takeover, claim the slots with an epoch no higher than the old
        // owner's, which the other nodes ignore.
        for (epoch, node) in (1..).zip(cluster.nodes.iter().chain(&cluster.replicas)) {
            expect_ok(node, &["CLUSTER", "SET-CONFIG-EPOCH", &format!("{epoch}")]).await?;
        }
        cluster.assign_slots_and_meet().await?;
        if with_replicas {
            cluster.join_replicas(&replica_bus_ports).await?;
        }
        cluster.wait_ok(CLUSTER_READY_TIMEOUT).await?;
        Ok(cluster)
    }

    /// The 3-master cluster shared by every test of this test process, started on first use (no
    /// persistence). Never kill, pause or restart its nodes.
    ///
    /// # Cancel safety
    /// Another caller finishes a start that a dropped caller began.
    ///
    /// # Errors
    /// As [`RedisCluster::start`]; a failed start is remembered and returned to every caller.
    pub async fn shared() -> KitResult<&'static RedisCluster> {
        static SHARED: OnceCell<Result<RedisCluster, KitError>> = OnceCell::const_new();
        SHARED
            .get_or_init(|| Self::start(3))
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `redis+cluster://:{password}@127.0.0.1:p1,127.0.0.1:p2,...` (every master as a seed
    /// node; the masters share the kit's password).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        format!(
            "redis+cluster://:{}@{}",
            lockcore::percent_encode(self.nodes[0].password()),
            hosts.join(",")
        )
    }

    /// The masters, in the order their slot ranges were assigned (node 0 has slot 0). A
    /// promoted replica stays in [`RedisCluster::replica`].
    pub fn nodes(&self) -> &[Redis] {
        &self.nodes
    }

    /// Node `i` (kill9/pause/resume through its [`Redis`] handle).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn node(&self, i: usize) -> &Redis {
        &self.nodes[i]
    }

    /// The replica of master `i`, if the cluster was started with replicas.
    pub fn replica(&self, i: usize) -> Option<&Redis> {
        self.replicas.get(i)
    }

    /// Promotes the replica of master `i` with `CLUSTER FAILOVER TAKEOVER` (no agreement from
    /// the master or the other masters needed, so it works with master `i` killed or paused),
    /// then waits until the replica reports `role:master` and every other node, master `i`
    /// aside, lists it as a master with slots (so a client that refreshes its slot map from
    /// any of them finds it) and reports `cluster_state:ok`.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the failover in progress; call it again.
    ///
    /// # Errors
    /// No replica for master `i`, the takeover refused, or not done within 60 s.
    pub async fn promote_replica(&self, i: usize) -> KitResult<()> {
        let replica = self.replicas.get(i).ok_or_else(|| {
            KitError::new(
                KitErrorKind::InvalidArgument,
                format!("master {i} has no replica"),
            )
        })?;
        expect_ok(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]).await?;
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        loop {
            let role = info_field(replica, "replication", "role").await;
            if role.as_deref() == Some("master") {
                break;
            }
            if Instant::now() >= deadline {
                return Err(KitError::new(
                    KitErrorKind::NotReady,
                    format!(
                        "replica 127.0.0.1:{} not master after a takeover: role {role:?}",
                        replica.port()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let others: Vec<&Redis> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, n)| n)
            .chain(&self.replicas)
            .collect();
        let addr = format!("127.0.0.1:{}@", replica.port());
        for node in &others {
            loop {
                // A `CLUSTER NODES` line: id addr@bus flags master ping pong epoch link slots...
                let nodes = node.command(&["CLUSTER", "NODES"]).await?;
                let line = nodes.as_text().and_then(|text| {
                    text.lines()
                        .find(|l| l.split(' ').nth(1).is_some_and(|a| a.starts_with(&addr)))
                        .map(str::to_owned)
                });
                let fields: Vec<&str> = line.as_deref().unwrap_or_default().split(' ').collect();
                let flags = fields.get(2).copied().unwrap_or_default();
                if flags.split(',').any(|f| f == "master") && fields.len() > 8 {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(KitError::new(
                        KitErrorKind::NotReady,
                        format!(
                            "redis 127.0.0.1:{} does not list the promoted replica as a master \
                             with slots: {line:?}",
                            node.port()
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.wait_ok_on(&others, deadline.saturating_duration_since(Instant::now()))
            .await
    }

    /// The number of masters.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least one master.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The index of the node that serves `slot` (ranges are contiguous and equal-sized).
    pub fn node_for_slot(&self, slot: u16) -> usize {
        let n = self.nodes.len();
        (0..n)
            .find(|&i| slot <= Self::range(i, n).1)
            .unwrap_or(n - 1)
    }

    /// Restarts node `i` (kill -9 first if it runs) and waits until the cluster is ok again.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the node stopped; call it again.
    ///
    /// # Errors
    /// The node does not start, or the cluster does not recover within 60 s.
    pub async fn restart_node(&self, i: usize) -> KitResult<()> {
        self.nodes[i].restart().await?;
        self.wait_ok(CLUSTER_READY_TIMEOUT).await
    }

    /// Kills every node, starts each again with its `nodes.conf` (same id, slots and peers),
    /// and waits until the cluster is ok again.
    ///
    /// # Cancel safety
    /// Dropping the future may leave nodes stopped; call it again.
    ///
    /// # Errors
    /// A node does not start, or the cluster does not recover within 60 s.
    pub async fn restart_all(&self) -> KitResult<()> {
        self.nodes.iter().for_each(Redis::kill9);
        for node in &self.nodes {
            node.restart().await?;
        }
        self.wait_ok(CLUSTER_READY_TIMEOUT).await
    }

    /// Waits until every node reports `cluster_state:ok` and knows every node and slot.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    ///
    /// # Errors
    /// Not ok within `within`; the message shows the last `CLUSTER INFO` seen.
    pub async fn wait_ok(&self, within: Duration) -> KitResult<()> {
        let all: Vec<&Redis> = self.nodes.iter().chain(&self.replicas).collect();
        self.wait_ok_on(&all, within).await
    }

    async fn wait_ok_on(&self, nodes: &[&Redis], within: Duration) -> KitResult<()> {
        let deadline = Instant::now() + within;
        let want_nodes = format!(
            "cluster_known_nodes:{}",
            self.nodes.len() + self.replicas.len()
        );
        loop {
            let mut last = String::new();
            let mut all_ok = true;
            for node in nodes {
                let info = match node.command(&["CLUSTER", "INFO"]).await {
                    Ok(reply) => reply.as_text().unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                let ok = info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_assigned:16384")
                    && info.contains(&want_nodes);
                if !ok {
                    all_ok = false;
                    last = format!("node 127.0.0.1:{}: {}", node.port(), info.trim());
                    break;
                }
            }
            if all_ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(KitError::new(
                    KitErrorKind::NotReady,
                    format!("redis cluster not ok within {}s; {last}", within.as_secs()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn range(i: usize, n: usize) -> (u16, u16) {
        const SLOTS: usize = 16384;
        ((i * SLOTS / n) as u16, ((i + 1) * SLOTS / n - 1) as u16)
    }

    async fn assign_slots_and_meet(&self) -> KitResult<()> {
        let n = self.nodes.len();
        for (i, node) in self.nodes.iter().enumerate() {
            let (lo, hi) = Self::range(i, n);
            expect_ok(
                node,
                &["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()],
            )
            .await?;
        }
        let first = &self.nodes[0];
        for (node, bus) in self.nodes.iter().zip(&self.bus_ports).skip(1) {
            expect_ok(
                first,
                &[
                    "CLUSTER",
                    "MEET",
                    "127.0.0.1",
                    &node.port().to_string(),
                    &bus.to_string(),
                ],
            )
            .await?;
        }
        Ok(())
    }

    /// Each replica meets master 0, replicates its master, and has its link up.
    async fn join_replicas(&self, bus_ports: &[u16]) -> KitResult<()> {
        let first = &self.nodes[0];
        for (replica, bus) in self.replicas.iter().zip(bus_ports) {
            expect_ok(
                first,
                &[
                    "CLUSTER",
                    "MEET",
                    "127.0.0.1",
                    &replica.port().to_string(),
                    &bus.to_string(),
                ],
            )
            .await?;
        }
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        for (master, replica) in self.nodes.iter().zip(&self.replicas) {
            let id = match master.command(&["CLUSTER", "MYID"]).await? {
                reply @ (RedisReply::Bulk(Some(_)) | RedisReply::Status(_)) => {
                    reply.as_text().unwrap_or_default()
                }
                other => {
                    return Err(KitError::new(
                        KitErrorKind::Command,
                        format!("CLUSTER MYID: unexpected reply {other:?}"),
                    ));
                }
            };
            // The replica must know the master first: retried until the MEET has spread.
            loop {
                match replica.command(&["CLUSTER", "REPLICATE", &id]).await? {
                    RedisReply::Status(s) if s == "OK" => break,
                    other if Instant::now() >= deadline => {
                        return Err(KitError::new(
                            KitErrorKind::NotReady,
                            format!(
                                "redis 127.0.0.1:{} CLUSTER REPLICATE {id}: {other:?}",
                                replica.port()
                            ),
                        ));
                    }
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        for replica in &self.replicas {
            loop {
                let link = info_field(replica, "replication", "master_link_status").await;
                if link.as_deref() == Some("up") {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(KitError::new(
                        KitErrorKind::NotReady,
                        format!(
                            "replica 127.0.0.1:{} not in sync: master_link_status {link:?}",
                            replica.port()
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

/// Starts one cluster node; returns it with its bus port.
async fn start_node(extra_args: &[&str]) -> KitResult<(Redis, u16)> {
    // The bus port is picked by the kit too: the default (port + 10000) could be taken.
    let bus = free_port();
    let bus_text = bus.to_string();
    let mut args = vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-port",
        bus_text.as_str(),
        "--cluster-node-timeout",
        "2000",
    ];
    args.extend_from_slice(extra_args);
    Ok((Redis::start_with(&args).await?, bus))
}

/// `field` of `INFO section` on `node`, or `None` if the node does not answer or lacks it.
async fn info_field(node: &Redis, section: &str, field: &str) -> Option<String> {
    let info = node.command(&["INFO", section]).await.ok()?.as_text()?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|v| v.trim().to_owned())
}

async fn expect_ok(node: &Redis, args: &[&str]) -> KitResult<()> {
    match node.command(args).await? {
        RedisReply::Status(s) if s == "OK" => Ok(()),
        other => Err(KitError::new(
            KitErrorKind::Command,
            format!(
                "redis 127.0.0.1:{} {}: unexpected reply {other:?}",
                node.port(),
                args.join(" ")
            ),
        )),
    }
}
