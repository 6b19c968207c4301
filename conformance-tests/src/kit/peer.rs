//! Lock clients of other libraries as child processes: Apache Curator 5 (Debian's
//! `libcurator-recipes-java`) in a JVM, and kazoo (from PyPI, in a virtualenv the kit makes) in
//! Python, each with one ZooKeeper session of its own. A test drives one over a line protocol
//! (`CuratorPeer.java` and `kazoo_peer.py` next to this file speak the same one), so that
//! backend-zk's `layout=curator|kazoo` can be checked against the real libraries: who holds,
//! who waits, and in which order.
//!
//! ```no_run
//! # async fn demo() -> conformance_tests::kit::KitResult<()> {
//! use std::time::Duration;
//! use conformance_tests::kit::{LockPeer, PeerLock, ZooKeeper};
//! let zk = ZooKeeper::shared().await?;
//! let curator = LockPeer::curator(&zk.connect_string(), Duration::from_secs(4)).await?;
//! let hold = curator.acquire(PeerLock::Mutex, "/app/orders", Some(Duration::ZERO))?.await?;
//! if let Some(hold) = hold {
//!     println!("Curator holds {} (czxid {})", hold.node, hold.czxid);
//!     curator.release(&hold).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! A missing JDK, Curator or Python is an error naming what to install (`scripts/install-deps`
//! installs them all); installing kazoo needs PyPI.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::future::Future;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{OnceCell, oneshot};

use super::error::{KitError, KitErrorKind, KitResult};
use super::host::{Workdir, find_binary, run_command};
use super::process::{log_tail, send_signal, spawn_registered, unregister_pid};

const CURATOR_SOURCE: &str = include_str!("CuratorPeer.java");
const KAZOO_SOURCE: &str = include_str!("kazoo_peer.py");
const CURATOR_JAR: &str = "/usr/share/java/curator-recipes.jar";
/// Curator logs through slf4j; without a binding it warns on stderr at every start.
const SLF4J_NOP: &str = "/usr/share/java/slf4j-nop.jar";
/// The kazoo release the tests were written against (its node names are what they check).
pub const KAZOO_REQUIREMENT: &str = "kazoo==2.11.0";
/// How long a peer may take to start and open its session.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Which library a [`LockPeer`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLibrary {
    /// Apache Curator 5.
    Curator,
    /// kazoo 2.
    Kazoo,
}

/// Which of the library's locks a request takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLock {
    /// Curator's `InterProcessMutex`, kazoo's `Lock`.
    Mutex,
    /// The read side of Curator's `InterProcessReadWriteLock`, kazoo's `ReadLock`.
    Read,
    /// The write side of Curator's `InterProcessReadWriteLock`, kazoo's `WriteLock`.
    Write,
    /// One lease of a counting semaphore of `max_leases`: Curator's
    /// `InterProcessSemaphoreV2`, kazoo's `Semaphore` (the hold names the lease node).
    Semaphore {
        /// The count the library is given.
        max_leases: u32,
    },
}

impl PeerLock {
    fn verb(self) -> &'static str {
        match self {
            PeerLock::Mutex => "mutex",
            PeerLock::Read => "read",
            PeerLock::Write => "write",
            PeerLock::Semaphore { .. } => "semaphore",
        }
    }

    /// What the request line carries after the wait.
    fn suffix(self) -> String {
        match self {
            PeerLock::Semaphore { max_leases } => format!(" {max_leases}"),
            _ => String::new(),
        }
    }
}

/// A lock a peer holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerHold {
    id: String,
    /// The lock node the library created, as an absolute path.
    pub node: String,
    /// That node's creation zxid: the token dlock would have handed out for it.
    pub czxid: u64,
}

type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<String>>>>;

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One client of another lock library, with its own ZooKeeper session, as a child process of
/// the test (killed when dropped, or with the test process).
pub struct LockPeer {
    library: PeerLibrary,
    child: Mutex<Child>,
    stdin: Mutex<ChildStdin>,
    pending: Pending,
    next: AtomicU64,
    session: String,
    log: PathBuf,
    _dir: Workdir,
}

impl fmt::Debug for LockPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockPeer")
            .field("library", &self.library)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl LockPeer {
    /// Starts a Curator client of the ensemble `connect` (`host:port,...`, with an optional
    /// `/chroot` that Curator takes as part of the connect string) asking for
    /// `session_timeout`, and waits until its session is open. The helper is compiled with
    /// `javac` once per test process.
    ///
    /// # Errors
    /// `javac`, `java` or Curator missing (naming the Debian package), a compile error, or no
    /// session within 60 s (with the helper's output).
    pub async fn curator(connect: &str, session_timeout: Duration) -> KitResult<LockPeer> {
        let java = find_binary("java", "default-jre-headless")?;
        let classes = curator_classes().await?;
        let mut cmd = Command::new(java);
        cmd.args(["-Xms16m", "-Xmx128m", "-XX:+UseSerialGC"])
            .args(["-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"])
            .arg("-cp")
            .arg(format!("{}:{CURATOR_JAR}:{SLF4J_NOP}", classes.display()))
            .arg("CuratorPeer");
        Self::start(PeerLibrary::Curator, cmd, connect, session_timeout).await
    }

    /// Starts a kazoo client of `connect` (as [`LockPeer::curator`]), from a virtualenv with
    /// [`KAZOO_REQUIREMENT`] that the kit makes under `cache` on first use and keeps for later
    /// runs (tests pass `env!("CARGO_TARGET_TMPDIR")`).
    ///
    /// # Errors
    /// `python3` or its `venv` module missing (naming the package), `pip` failing (it needs
    /// PyPI), or no session within 60 s (with the helper's output).
    pub async fn kazoo(
        connect: &str,
        session_timeout: Duration,
        cache: &Path,
    ) -> KitResult<LockPeer> {
        let venv = kazoo_venv(cache).await?;
        let work = Workdir::new("kazoo-peer")?;
        let script = work.path().join("kazoo_peer.py");
        fs::write(&script, KAZOO_SOURCE)
            .map_err(|e| KitError::io("cannot write the kazoo helper", e))?;
        let mut cmd = Command::new(venv.join("bin/python"));
        cmd.arg("-u").arg(&script);
        Self::start_in(PeerLibrary::Kazoo, cmd, connect, session_timeout, work).await
    }

    async fn start(
        library: PeerLibrary,
        cmd: Command,
        connect: &str,
        session_timeout: Duration,
    ) -> KitResult<LockPeer> {
        let work = Workdir::new("lock-peer")?;
        Self::start_in(library, cmd, connect, session_timeout, work).await
    }

    async fn start_in(
        library: PeerLibrary,
        mut cmd: Command,
        connect: &str,
        session_timeout: Duration,
        work: Workdir,
    ) -> KitResult<LockPeer> {
        let log = work.path().join("peer.log");
        let stderr = fs::File::create(&log)
            .map_err(|e| KitError::io(format!("cannot create {}", log.display()), e))?;
        cmd.arg(connect)
            .arg(session_timeout.as_millis().to_string())
            .current_dir(work.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = spawn_registered(cmd)
            .map_err(|e| KitError::io(format!("cannot start the {library:?} helper"), e))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            unreachable!("both pipes were asked for")
        };
        let pending: Pending = Arc::default();
        let (ready_tx, ready_rx) = oneshot::channel();
        locked(&pending).insert("ready".to_owned(), ready_tx);
        let routes = pending.clone();
        let stderr_log = log.clone();
        std::thread::Builder::new()
            .name(format!("dlock-kit-{library:?}-peer").to_lowercase())
            .spawn(move || route_replies(BufReader::new(stdout), &routes, &stderr_log))
            .map_err(|e| KitError::io("cannot start the peer's reader thread", e))?;
        let mut peer = LockPeer {
            library,
            child: Mutex::new(child),
            stdin: Mutex::new(stdin),
            pending,
            next: AtomicU64::new(1),
            session: String::new(),
            log,
            _dir: work,
        };
        match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(session)) => {
                peer.session = session;
                Ok(peer)
            }
            Ok(Err(_)) => Err(peer.failed("exited before it had a session")),
            Err(_) => Err(peer.failed(&format!(
                "had no ZooKeeper session within {}s",
                START_TIMEOUT.as_secs()
            ))),
        }
    }

    /// The library this peer runs.
    pub fn library(&self) -> PeerLibrary {
        self.library
    }

    /// The peer's ZooKeeper session id, in hex.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// Asks the peer to take `lock` on `path` (an absolute znode path, the library's own
    /// naming), waiting up to `wait` (`None`: forever; zero: one attempt). The request is sent
    /// before this returns, so requests queue in the order of these calls; the future resolves
    /// with the hold, or `None` when the library gave up at `wait`.
    ///
    /// # Errors
    /// The peer is gone; the future: the library's error (with the helper's output).
    pub fn acquire(
        &self,
        lock: PeerLock,
        path: &str,
        wait: Option<Duration>,
    ) -> KitResult<impl Future<Output = KitResult<Option<PeerHold>>> + Send + 'static> {
        let id = format!("r{}", self.next.fetch_add(1, Ordering::Relaxed));
        let wait_ms = wait.map_or(-1, |w| w.as_millis() as i64);
        let reply = self.send(
            &id,
            &format!("{} {path} {wait_ms}{}", lock.verb(), lock.suffix()),
        )?;
        let failed = self.failure_context();
        let path = path.to_owned();
        Ok(async move {
            let answer = reply
                .await
                .map_err(|_| failed(&format!("exited during `{id} {path}`")))?;
            let mut words = answer.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("acquired"), Some(node), Some(czxid)) => Ok(Some(PeerHold {
                    id,
                    node: node.to_owned(),
                    czxid: czxid
                        .parse()
                        .map_err(|_| failed(&format!("bad czxid in `{answer}`")))?,
                })),
                (Some("timeout"), None, None) => Ok(None),
                _ => Err(failed(&format!(
                    "answered `{answer}` to an acquire of {path}"
                ))),
            }
        })
    }

    /// Releases `hold` and waits until the library says it did.
    ///
    /// # Errors
    /// The library's error, or the peer is gone.
    pub async fn release(&self, hold: &PeerHold) -> KitResult<()> {
        let reply = self.send(&hold.id, "release")?;
        match reply.await.as_deref() {
            Ok("released") => Ok(()),
            Ok(other) => Err(self.failed(&format!("answered `{other}` to a release"))),
            Err(_) => Err(self.failed("exited during a release")),
        }
    }

    /// SIGSTOPs the peer: its session hears nothing until [`resume`](Self::resume).
    pub fn pause(&self) {
        send_signal(locked(&self.child).id(), libc::SIGSTOP);
    }

    /// SIGCONTs the peer.
    pub fn resume(&self) {
        send_signal(locked(&self.child).id(), libc::SIGCONT);
    }

    fn send(&self, id: &str, command: &str) -> KitResult<oneshot::Receiver<String>> {
        let (tx, rx) = oneshot::channel();
        locked(&self.pending).insert(id.to_owned(), tx);
        let mut stdin = locked(&self.stdin);
        writeln!(stdin, "{id} {command}")
            .and_then(|()| stdin.flush())
            .map_err(|e| KitError::io(format!("cannot talk to the {:?} peer", self.library), e))?;
        Ok(rx)
    }

    /// Builds errors that carry the helper's output, for futures that outlive `&self`.
    fn failure_context(&self) -> impl Fn(&str) -> KitError + Send + 'static {
        let (library, log) = (self.library, self.log.clone());
        move |what| peer_error(library, &log, what)
    }

    fn failed(&self, what: &str) -> KitError {
        peer_error(self.library, &self.log, what)
    }
}

fn peer_error(library: PeerLibrary, log: &Path, what: &str) -> KitError {
    KitError::new(
        KitErrorKind::Command,
        format!("the {library:?} peer {what}; {}", log_tail(log, 30)),
    )
}

impl Drop for LockPeer {
    fn drop(&mut self) {
        let mut child = locked(&self.child);
        // A paused peer must be able to die.
        send_signal(child.id(), libc::SIGCONT);
        let _ = child.kill();
        let _ = child.wait();
        unregister_pid(child.id());
    }
}

/// Hands each line the peer writes to the request it answers (`<id> <answer>`); `ready
/// <session>` answers the start. Ends when the peer's stdout closes, which fails every
/// request still waiting.
fn route_replies(stdout: impl BufRead, pending: &Pending, log: &Path) {
    for line in stdout.lines() {
        let Ok(line) = line else { break };
        let (id, answer) = line.split_once(' ').unwrap_or((&line, ""));
        match locked(pending).remove(id) {
            Some(reply) => {
                let _ = reply.send(answer.to_owned());
            }
            None => {
                // Not an answer (a `fatal` line, say): kept with the peer's stderr.
                if let Ok(mut f) = fs::OpenOptions::new().append(true).open(log) {
                    let _ = writeln!(f, "stdout: {line}");
                }
            }
        }
    }
    locked(pending).clear();
}

/// The compiled Curator helper: `javac` once per test process, into a temp dir of the kit's.
async fn curator_classes() -> KitResult<PathBuf> {
    static CLASSES: OnceCell<Result<(Workdir, PathBuf), KitError>> = OnceCell::const_new();
    let compiled = CLASSES
        .get_or_init(|| async {
            let javac = find_binary("javac", "default-jdk-headless")?;
            if !Path::new(CURATOR_JAR).exists() {
                return Err(KitError::missing(CURATOR_JAR, "libcurator-recipes-java"));
            }
            let dir = Workdir::new("curator-peer")?;
            let source = dir.path().join("CuratorPeer.java");
            fs::write(&source, CURATOR_SOURCE)
                .map_err(|e| KitError::io("cannot write the Curator helper", e))?;
            let mut cmd = Command::new(javac);
            cmd.arg("-d")
                .arg(dir.path())
                .args(["-cp", CURATOR_JAR])
                .arg(&source);
            run_command("javac CuratorPeer.java", cmd).await?;
            let path = dir.path().to_path_buf();
            Ok((dir, path))
        })
        .await;
    compiled
        .as_ref()
        .map(|(_, path)| path.clone())
        .map_err(Clone::clone)
}

/// `{cache}/kazoo-venv`, a virtualenv with [`KAZOO_REQUIREMENT`]: made once, in a directory of
/// its own that is renamed into place when complete, so that test processes running side by
/// side never use a half-made one.
async fn kazoo_venv(cache: &Path) -> KitResult<PathBuf> {
    static VENV: OnceCell<Result<PathBuf, KitError>> = OnceCell::const_new();
    VENV.get_or_init(|| make_kazoo_venv(cache.to_path_buf()))
        .await
        .clone()
}

async fn make_kazoo_venv(cache: PathBuf) -> KitResult<PathBuf> {
    let venv = cache.join("kazoo-venv");
    let marker = format!("kazoo-venv/{KAZOO_REQUIREMENT}");
    if cache.join(&marker).exists() {
        return Ok(venv);
    }
    let python = find_binary("python3", "python3")?;
    fs::create_dir_all(&cache)
        .map_err(|e| KitError::io(format!("cannot create {}", cache.display()), e))?;
    let building = cache.join(format!("kazoo-venv.{}", std::process::id()));
    let _ = fs::remove_dir_all(&building);
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "venv"]).arg(&building);
    run_command("python3 -m venv", cmd).await.map_err(|e| {
        KitError::new(
            KitErrorKind::MissingBinary,
            format!(
                "{e}: install python3's venv module with `apt-get install python3-venv` or run \
                 scripts/install-deps"
            ),
        )
    })?;
    let mut cmd = Command::new(building.join("bin/python"));
    cmd.args(["-m", "pip", "install", "--disable-pip-version-check", "-q"])
        .arg(KAZOO_REQUIREMENT);
    run_command(
        &format!("pip install {KAZOO_REQUIREMENT} (needs PyPI)"),
        cmd,
    )
    .await?;
    fs::write(building.join(KAZOO_REQUIREMENT), "")
        .map_err(|e| KitError::io("cannot mark the kazoo virtualenv complete", e))?;
    // An older venv (another kazoo) makes way; a complete one another process renamed into
    // place first wins.
    if venv.exists() && !cache.join(&marker).exists() {
        let _ = fs::remove_dir_all(&venv);
    }
    if fs::rename(&building, &venv).is_err() {
        let _ = fs::remove_dir_all(&building);
    }
    if cache.join(&marker).exists() {
        Ok(venv)
    } else {
        Err(KitError::new(
            KitErrorKind::Io,
            format!("cannot put the kazoo virtualenv at {}", venv.display()),
        ))
    }
}
