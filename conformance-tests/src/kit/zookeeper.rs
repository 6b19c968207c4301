//! ZooKeeper servers: a standalone [`ZooKeeper`] and an [`ZkEnsemble`] of N nodes.
//!
//! Each node is `java -cp /usr/share/java/zookeeper.jar:... QuorumPeerMain zoo.cfg` (Debian's
//! `zookeeper` package; its jar's manifest carries the rest of the classpath), logging through
//! slf4j-simple to a file in the node's temp dir, with the four-letter words `ruok`, `srvr`,
//! `stat`, `mntr` (and a few more) enabled, the admin HTTP server disabled, and a short tick
//! (500 ms) so elections and session expiry are quick. Session timeouts from 1 s to 60 s are
//! accepted.
//!
//! ZooKeeper has no password of its own (unlike the kit's other servers): while one runs, any
//! local user can connect to its loopback port and use nodes that carry no ACL. Its data stays
//! in a 0700 temp dir.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::error::{KitError, KitErrorKind, KitResult};
use super::host::find_binary;
use super::process::STARTUP_TIMEOUT;
use super::server::{Launch, Server, server_lifecycle};
use super::{free_port, loopback};

const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";

/// Sends a four-letter word (`ruok`, `srvr`, `mntr`, ...) and returns the whole answer.
///
/// # Errors
/// Connection errors, or no complete answer within `within`.
pub async fn zk_four_letter(addr: SocketAddr, word: &str, within: Duration) -> KitResult<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(word.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        std::io::Result::Ok(answer)
    };
    match tokio::time::timeout(within, exchange).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(KitError::io(format!("zookeeper {addr} {word}"), e)),
        Err(_) => Err(KitError::new(
            KitErrorKind::Io,
            format!("zookeeper {addr} {word}: no answer within {within:?}"),
        )),
    }
}

/// The `Mode:` line of `srvr`: `leader`, `follower`, `standalone`, or None while not serving.
async fn serving_mode(addr: SocketAddr, within: Duration) -> Option<String> {
    let answer = zk_four_letter(addr, "srvr", within).await.ok()?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_string())
}

async fn imok(addr: SocketAddr, within: Duration) -> bool {
    matches!(zk_four_letter(addr, "ruok", within).await, Ok(a) if a == "imok")
}

/// The ports of one ensemble member.
#[derive(Debug, Clone, Copy)]
struct Member {
    client: u16,
    quorum: u16,
    election: u16,
}

/// One ZooKeeper server process: standalone, or a member of a [`ZkEnsemble`].
#[derive(Debug)]
pub struct ZkNode {
    server: Server,
    /// `myid`, 1-based.
    id: usize,
    /// Every member of the ensemble (this one included); empty for standalone.
    members: Vec<Member>,
    java: PathBuf,
    classpath: String,
}

impl ZkNode {
    fn new(id: usize, members: Vec<Member>) -> KitResult<ZkNode> {
        let java = find_binary("java", "default-jre-headless")?;
        if !Path::new(ZK_JAR).exists() {
            return Err(KitError::missing(ZK_JAR, "zookeeper"));
        }
        let mut classpath = ZK_JAR.to_string();
        if Path::new(SLF4J_SIMPLE).exists() {
            classpath.push(':');
            classpath.push_str(SLF4J_SIMPLE);
        }
        let port = members.get(id.wrapping_sub(1)).map_or(0, |m| m.client);
        let server = Server::new(
            "zookeeper",
            format!("zookeeper node {id}"),
            "zookeeper.log",
            port,
        )?;
        let data = server.dir().join("data");
        std::fs::create_dir_all(&data)
            .map_err(|e| KitError::io("cannot create the zookeeper data dir", e))?;
        if !members.is_empty() {
            std::fs::write(data.join("myid"), format!("{id}\n"))
                .map_err(|e| KitError::io("cannot write myid", e))?;
        }
        Ok(ZkNode {
            server,
            id,
            members,
            java,
            classpath,
        })
    }

    server_lifecycle!("node");

    /// `127.0.0.1:{port}`: this node alone.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// `myid` of this node (1-based).
    pub fn id(&self) -> usize {
        self.id
    }

    /// `leader`, `follower` or `standalone` from `srvr`; None while not serving (or down).
    pub async fn mode(&self) -> Option<String> {
        serving_mode(self.addr(), Duration::from_secs(2)).await
    }

    /// Whether `ruok` answers `imok` within 2 s.
    pub async fn ruok(&self) -> bool {
        imok(self.addr(), Duration::from_secs(2)).await
    }

    fn write_config(&self) -> KitResult<PathBuf> {
        let data = self.dir().join("data");
        let mut cfg = String::new();
        let _ = writeln!(cfg, "tickTime=500");
        let _ = writeln!(cfg, "initLimit=20");
        let _ = writeln!(cfg, "syncLimit=10");
        let _ = writeln!(cfg, "dataDir={}", data.display());
        let _ = writeln!(cfg, "clientPort={}", self.port());
        let _ = writeln!(cfg, "clientPortAddress=127.0.0.1");
        let _ = writeln!(cfg, "minSessionTimeout=1000");
        let _ = writeln!(cfg, "maxSessionTimeout=60000");
        let _ = writeln!(cfg, "maxClientCnxns=0");
        let _ = writeln!(cfg, "admin.enableServer=false");
        let _ = writeln!(
            cfg,
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,isro,cons,wchs,dump"
        );
        let _ = writeln!(cfg, "forceSync=no");
        let _ = writeln!(cfg, "preAllocSize=1024");
        let _ = writeln!(cfg, "autopurge.purgeInterval=0");
        for (i, m) in self.members.iter().enumerate() {
            let _ = writeln!(
                cfg,
                "server.{}=127.0.0.1:{}:{}",
                i + 1,
                m.quorum,
                m.election
            );
        }
        let path = self.dir().join("zoo.cfg");
        std::fs::write(&path, cfg).map_err(|e| KitError::io("cannot write zoo.cfg", e))?;
        Ok(path)
    }
}

impl Launch for ZkNode {
    fn command(&self, server: &Server) -> KitResult<Command> {
        let cfg = self.write_config()?;
        let mut cmd = Command::new(&self.java);
        cmd.args([
            "-Xms32m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
        ])
        .args(["-XX:-UsePerfData", "-Djava.net.preferIPv4Stack=true"])
        .arg(format!("-Djava.io.tmpdir={}", server.dir().display()))
        .args([
            "-Dzookeeper.cnxTimeout=2000",
            "-Dzookeeper.jmx.log4j.disable=true",
        ])
        .args([
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
        ])
        .arg("-cp")
        .arg(&self.classpath)
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(cfg)
        .current_dir(server.dir());
        Ok(cmd)
    }

    /// Serving; or, for an ensemble member without enough running peers for a quorum, alive.
    async fn ready(&self, _server: &Server) -> bool {
        if !self.ruok().await {
            return false;
        }
        if self.mode().await.is_some() {
            return true;
        }
        if self.members.is_empty() {
            return false;
        }
        let mut running = 1;
        for (i, m) in self.members.iter().enumerate() {
            if i + 1 != self.id && imok(loopback(m.client), Duration::from_millis(500)).await {
                running += 1;
            }
        }
        running <= self.members.len() / 2
    }
}

/// A standalone ZooKeeper server on a free port.
#[derive(Debug)]
pub struct ZooKeeper {
    node: ZkNode,
}

impl ZooKeeper {
    /// Starts a private standalone server.
    ///
    /// # Errors
    /// `java` or the `zookeeper` package missing (naming the package), or no `Mode:
    /// standalone` from `srvr` within 60 s (with the log tail).
    pub async fn start() -> KitResult<ZooKeeper> {
        let node = ZkNode::new(1, Vec::new())?;
        node.server.first_boot(&node).await?;
        Ok(ZooKeeper { node })
    }

    /// The server shared by every test of this test process, started on first use. Tests on
    /// it should use their own chroot or paths; never kill or pause it.
    ///
    /// # Errors
    /// As [`ZooKeeper::start`]; a failed start is remembered and returned to every caller.
    pub async fn shared() -> KitResult<&'static ZooKeeper> {
        static SHARED: OnceCell<Result<ZooKeeper, KitError>> = OnceCell::const_new();
        SHARED
            .get_or_init(Self::start)
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `127.0.0.1:{port}`.
    pub fn connect_string(&self) -> String {
        self.node.connect_string()
    }

    /// `zk://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// The client port (the same across restarts).
    pub fn port(&self) -> u16 {
        self.node.port()
    }

    /// `127.0.0.1:{port}`.
    pub fn addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// The server as a [`ZkNode`] (mode, ruok, dir).
    pub fn node(&self) -> &ZkNode {
        &self.node
    }

    /// SIGKILLs the server.
    pub fn kill9(&self) {
        self.node.kill9();
    }

    /// SIGSTOPs the server.
    pub fn pause(&self) {
        self.node.pause();
    }

    /// SIGCONTs the server.
    pub fn resume(&self) {
        self.node.resume();
    }

    /// Starts the server again on the same port and data dir (znodes and sessions are
    /// recovered) and waits until it serves.
    ///
    /// # Errors
    /// A server that does not answer within 60 s.
    pub async fn restart(&self) -> KitResult<()> {
        self.node.restart().await
    }
}

/// An ensemble of N ZooKeeper nodes on loopback (client, quorum and election ports all free).
#[derive(Debug)]
pub struct ZkEnsemble {
    nodes: Vec<ZkNode>,
}

impl ZkEnsemble {
    /// Starts `n` nodes (n ≥ 1; 3 is the usual) and waits until every node serves and exactly
    /// one is the leader.
    ///
    /// # Errors
    /// `java` or `zookeeper` missing, a node exiting early, or no elected leader within 60 s
    /// (with every node's log tail).
    pub async fn start(n: usize) -> KitResult<ZkEnsemble> {
        if n == 0 {
            return Err(KitError::new(
                KitErrorKind::InvalidArgument,
                "an ensemble needs at least one node",
            ));
        }
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            match Self::start_once(n).await {
                // A port taken between free_port() and the node's bind: try other ports.
                Err(e) if e.kind() == KitErrorKind::ServerExited && attempt < ATTEMPTS => {
                    tracing::warn!("dlock kit: ensemble start failed, trying other ports: {e}");
                }
                result => return result,
            }
        }
        unreachable!("the last attempt always returns")
    }

    async fn start_once(n: usize) -> KitResult<ZkEnsemble> {
        let members: Vec<Member> = (0..n)
            .map(|_| Member {
                client: free_port(),
                quorum: free_port(),
                election: free_port(),
            })
            .collect();
        let nodes = (1..=n)
            .map(|id| ZkNode::new(id, members.clone()))
            .collect::<KitResult<Vec<_>>>()?;
        for node in &nodes {
            node.server.spawn(node)?;
        }
        let ensemble = ZkEnsemble { nodes };
        ensemble.wait_for_leader(true).await?;
        Ok(ensemble)
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,...` (every node, running or not).
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(ZkNode::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zk://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// Node `i` (0-based; its `myid` is i + 1).
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn node(&self, i: usize) -> &ZkNode {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[ZkNode] {
        &self.nodes
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the ensemble has no nodes (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The index of the node whose `srvr` says `leader` (or `standalone` in an ensemble of
    /// one), if one does now.
    pub async fn leader(&self) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            if matches!(node.mode().await.as_deref(), Some("leader" | "standalone")) {
                return Some(i);
            }
        }
        None
    }

    /// Waits until a majority of nodes serve with exactly one leader among them (after a
    /// fault or a restart) and returns the leader's index. Nodes that are down or paused are
    /// ignored as long as a majority serves.
    ///
    /// # Errors
    /// No quorum within 60 s (with every node's log tail).
    pub async fn wait_for_quorum(&self) -> KitResult<usize> {
        self.wait_for_leader(false).await
    }

    /// Waits until every node serves with exactly one leader among them (after every node
    /// was restarted) and returns the leader's index.
    ///
    /// # Errors
    /// A node exiting, or no such ensemble within 60 s (with every node's log tail).
    pub async fn wait_for_all(&self) -> KitResult<usize> {
        self.wait_for_leader(true).await
    }

    /// Polls `srvr` on every node until one leader and enough serving nodes (all of them when
    /// `all`, else a majority).
    async fn wait_for_leader(&self, all: bool) -> KitResult<usize> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let needed = if all {
            self.nodes.len()
        } else {
            self.nodes.len() / 2 + 1
        };
        loop {
            let mut leaders = Vec::new();
            let mut serving = 0;
            for (i, node) in self.nodes.iter().enumerate() {
                if all && let Some(status) = node.server.exited() {
                    return Err(self.error(
                        KitErrorKind::ServerExited,
                        &format!("zookeeper node {} exited ({status})", i + 1),
                    ));
                }
                match node.mode().await.as_deref() {
                    // An ensemble of one runs standalone: its own leader.
                    Some("leader" | "standalone") => {
                        leaders.push(i);
                        serving += 1;
                    }
                    Some("follower") => serving += 1,
                    _ => {}
                }
            }
            if leaders.len() == 1 && serving >= needed {
                return Ok(leaders[0]);
            }
            if Instant::now() >= deadline {
                return Err(self.error(
                    KitErrorKind::NotReady,
                    &format!(
                        "no zookeeper quorum within {}s ({serving} of {} serving, {needed} \
                         needed, leaders {leaders:?})",
                        STARTUP_TIMEOUT.as_secs(),
                        self.nodes.len()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn error(&self, kind: KitErrorKind, what: &str) -> KitError {
        let mut message = format!("{what} in ensemble {}", self.connect_string());
        for node in &self.nodes {
            let _ = write!(
                message,
                "\n--- node {}: {}",
                node.id,
                node.server.log_tail()
            );
        }
        KitError::new(kind, message)
    }
}
