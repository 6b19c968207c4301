//! Child-process plumbing shared by every server: the long-lived spawner thread, the registry
//! the `atexit` hook reaps (the temp dirs of `host` included), signals to a whole process tree,
//! and readiness polling.
//!
//! Why a spawner thread: `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
//! and every `#[tokio::test]` runs on its own short-lived thread. So every server is forked by one
//! thread that lives as long as the test process; when the process dies (even by SIGKILL) the
//! kernel SIGKILLs the servers. The `atexit` hook covers normal exits of the process (and kills the
//! servers' own children too), and `Drop` covers servers that go out of scope or whose test panics.
#![allow(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, OpenOptions};
use std::future::Future;
use std::io::{self, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, mpsc};
use std::time::{Duration, Instant};

use super::error::{KitError, KitErrorKind, KitResult};

/// How long a server may take to answer after it was started (the JVM and crash recovery included).
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a one-shot helper command (initdb, psql, ...) may run.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Registry of live children and temp dirs, reaped by the atexit hook.

struct Registry {
    pids: BTreeSet<u32>,
    dirs: BTreeSet<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: BTreeSet::new(),
    dirs: BTreeSet::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn install_atexit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `kit_atexit` is an `extern "C" fn()` with static lifetime that never unwinds
        // (its body runs under `catch_unwind`); registering it has no other precondition.
        let rc = unsafe { libc::atexit(kit_atexit) };
        if rc != 0 {
            tracing::warn!("dlock kit: atexit registration failed; servers rely on PDEATHSIG");
        }
    });
}

extern "C" fn kit_atexit() {
    let _ = std::panic::catch_unwind(reap_everything);
}

/// Kills every registered server (and its process tree), reaps them, removes registered dirs.
fn reap_everything() {
    // Another thread may hold the lock at exit; never deadlock the exit path.
    let mut guard = None;
    for _ in 0..50 {
        match REGISTRY.try_lock() {
            Ok(g) => {
                guard = Some(g);
                break;
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                guard = Some(p.into_inner());
                break;
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(Duration::from_millis(10))
            }
        }
    }
    let Some(mut reg) = guard else { return };
    let pids: Vec<u32> = std::mem::take(&mut reg.pids).into_iter().collect();
    let dirs: Vec<PathBuf> = std::mem::take(&mut reg.dirs).into_iter().collect();
    drop(reg);
    let mut trees = Vec::new();
    for &pid in &pids {
        send_signal(pid, libc::SIGSTOP);
        let tree = process_tree(pid);
        for &p in &tree {
            send_signal(p, libc::SIGKILL);
        }
        trees.push(tree);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    for &pid in &pids {
        loop {
            let mut status = 0;
            // SAFETY: waitpid on a pid we spawned; `status` is a valid out-pointer.
            let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
            if rc != 0 || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    wait_gone(trees.iter().flatten().copied(), deadline);
    for dir in dirs {
        let _ = fs::remove_dir_all(&dir);
    }
}

/// Spawns `cmd` (with the stdio it set) from the kit's long-lived thread with
/// `PR_SET_PDEATHSIG(SIGKILL)`, registered for the `atexit` reaping: for helper processes a
/// test talks to over pipes (see `peer.rs`); the caller kills and reaps it, then calls
/// [`unregister_pid`].
pub(crate) fn spawn_registered(cmd: Command) -> io::Result<Child> {
    let child = spawn_child(cmd)?;
    register_pid(child.id());
    Ok(child)
}

fn register_pid(pid: u32) {
    registry().pids.insert(pid);
}

pub(crate) fn unregister_pid(pid: u32) {
    registry().pids.remove(&pid);
}

/// Records a temp dir for the `atexit` hook to delete (see `super::host::Workdir`).
pub(super) fn register_dir(dir: &Path) {
    install_atexit();
    registry().dirs.insert(dir.to_path_buf());
}

/// Forgets a temp dir its owner deleted.
pub(super) fn unregister_dir(dir: &Path) {
    registry().dirs.remove(dir);
}

// ---------------------------------------------------------------------------------------------
// The spawner thread.

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        install_atexit();
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("dlock-kit-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop (and thread) lasts for the process.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(spawn_with_pdeathsig(&mut cmd));
                }
            })
            .expect("dlock kit: cannot start the spawner thread");
        tx
    })
}

fn spawn_with_pdeathsig(cmd: &mut Command) -> io::Result<Child> {
    set_pdeathsig(cmd);
    cmd.spawn()
}

/// Makes the child get SIGKILL when the thread that spawns it exits (for one-shot helpers,
/// the thread awaiting them; for servers, the kit thread).
pub(super) fn set_pdeathsig(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec. It only calls prctl and getppid,
    // which are async-signal-safe, and builds errors without allocating.
    unsafe {
        cmd.pre_exec(move || {
            let sig = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0 as libc::c_ulong, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The test process may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Spawns `cmd` from the kit's long-lived thread with `PR_SET_PDEATHSIG(SIGKILL)`.
fn spawn_child(cmd: Command) -> io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    spawner()
        .send((cmd, tx))
        .map_err(|_| io::Error::other("dlock kit spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("dlock kit spawner thread dropped the request"))?
}

// ---------------------------------------------------------------------------------------------
// Process trees and signals.

/// The pid's parent and state letter from /proc, or None when it no longer exists.
fn stat_of(pid: u32) -> Option<(u32, char)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may contain spaces and parens, so split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Whether the pid runs (zombies count as gone: their resources are released), read from
/// Linux's `/proc`.
pub fn is_alive(pid: u32) -> bool {
    matches!(stat_of(pid), Some((_, state)) if state != 'Z' && state != 'X')
}

/// `root` followed by all its live descendants (parents before children).
pub(crate) fn process_tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((ppid, _)) = stat_of(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        if let Some(kids) = children.get(&tree[i]) {
            for &kid in kids {
                if !tree.contains(&kid) {
                    tree.push(kid);
                }
            }
        }
        i += 1;
    }
    tree
}

pub(crate) fn send_signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; a stale pid yields ESRCH, ignored.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

fn wait_gone(pids: impl Iterator<Item = u32>, deadline: Instant) {
    let pids: Vec<u32> = pids.collect();
    while pids.iter().any(|&p| is_alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether this process runs as root (servers then drop privileges or use `--user=root`).
pub(crate) fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------------------------
// One server process.

/// A server's child process: spawned by the kit thread, logged to a file, killed on drop.
#[derive(Debug)]
pub(crate) struct Proc {
    label: String,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

impl Proc {
    pub(crate) fn new(label: impl Into<String>, log: PathBuf) -> Self {
        Self {
            label: label.into(),
            log,
            child: Mutex::new(None),
        }
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Spawns `cmd` (kills a previous run first) with stdout and stderr appended to the log.
    pub(crate) fn spawn(&self, mut cmd: Command) -> KitResult<()> {
        self.kill9();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| KitError::io(format!("cannot open {}", self.log.display()), e))?;
        let _ = writeln!(log, "==== dlock kit: starting {cmd:?}");
        let err = log
            .try_clone()
            .map_err(|e| KitError::io("cannot duplicate the log file", e))?;
        cmd.stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            // Own process group: a terminal's Ctrl-C reaches the test process, whose death then
            // kills the servers via PDEATHSIG, instead of making them shut down noisily first.
            .process_group(0);
        let program = cmd.get_program().to_string_lossy().into_owned();
        let mut guard = self.child();
        let child = spawn_child(cmd)
            .map_err(|e| KitError::io(format!("cannot start {} ({program})", self.label), e))?;
        register_pid(child.id());
        *guard = Some(child);
        Ok(())
    }

    /// The running child's pid.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child().as_ref().map(Child::id)
    }

    /// Sends `sig` to the server and every process it started (SIGSTOP/SIGCONT/SIGKILL).
    pub(crate) fn signal_tree(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            if sig == libc::SIGSTOP {
                // A stopped root forks no new child between listing the tree and signalling it.
                send_signal(pid, libc::SIGSTOP);
            }
            for p in process_tree(pid) {
                send_signal(p, sig);
            }
        }
    }

    /// SIGKILLs the server and its process tree, reaps it, and waits (bounded) until every
    /// process of the tree is gone, so a restart on the same data dir and port can succeed.
    pub(crate) fn kill9(&self) {
        let Some(mut child) = self.child().take() else {
            return;
        };
        // Stop the root first so that the tree cannot grow while it is listed and killed.
        send_signal(child.id(), libc::SIGSTOP);
        let tree = process_tree(child.id());
        for &p in &tree {
            send_signal(p, libc::SIGKILL);
        }
        let _ = child.wait();
        unregister_pid(child.id());
        wait_gone(
            tree.into_iter().skip(1),
            Instant::now() + Duration::from_secs(5),
        );
    }

    /// Whether the child was started and has not exited; reaps it and returns its status if it
    /// exited.
    pub(crate) fn exited(&self) -> Option<ExitStatus> {
        let mut guard = self.child();
        let child = guard.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                unregister_pid(child.id());
                *guard = None;
                Some(status)
            }
            _ => None,
        }
    }

    /// The last lines of the server's log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        log_tail(&self.log, 40)
    }

    /// The label (e.g. "postgres").
    pub(crate) fn label(&self) -> &str {
        &self.label
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The last `lines` lines of a file (at most 8 KiB), or a note that it cannot be read.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(8192);
            let text = String::from_utf8_lossy(&bytes[start..]);
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            format!(
                "last lines of {}:\n{}",
                path.display(),
                all[from..].join("\n")
            )
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

// ---------------------------------------------------------------------------------------------
// Start-up: spawn, poll readiness, retry.

/// Spawns the server with `spawn` and polls `ready` until it answers.
///
/// With `retry_on_exit` (restarts on a fixed port and data dir) an early exit is retried until
/// the deadline: the old port may linger, or the old process tree may still hold a lock file.
/// Without it, an early exit fails at once with [`KitErrorKind::ServerExited`] (the caller may
/// then try another port).
pub(crate) async fn boot<S, R, Fut>(
    proc: &Proc,
    port: u16,
    retry_on_exit: bool,
    spawn: S,
    mut ready: R,
) -> KitResult<()>
where
    S: Fn() -> KitResult<()>,
    R: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let started = Instant::now();
    'spawn: loop {
        spawn()?;
        loop {
            if let Some(status) = proc.exited() {
                if retry_on_exit && Instant::now() + Duration::from_millis(300) < deadline {
                    tracing::debug!(
                        "{} on port {port} exited ({status}); retrying",
                        proc.label()
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue 'spawn;
                }
                return Err(KitError::new(
                    KitErrorKind::ServerExited,
                    format!(
                        "{} on 127.0.0.1:{port} exited ({status}) before it answered; {}",
                        proc.label(),
                        proc.log_tail()
                    ),
                ));
            }
            if ready().await {
                tracing::debug!(
                    "{} ready on 127.0.0.1:{port} after {:?}",
                    proc.label(),
                    started.elapsed()
                );
                return Ok(());
            }
            if Instant::now() >= deadline {
                let msg = format!(
                    "{} on 127.0.0.1:{port} did not answer within {}s; {}",
                    proc.label(),
                    STARTUP_TIMEOUT.as_secs(),
                    proc.log_tail()
                );
                proc.kill9();
                return Err(KitError::new(KitErrorKind::NotReady, msg));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_tree_lists_the_root_first() {
        let tree = process_tree(std::process::id());
        assert_eq!(tree.first(), Some(&std::process::id()));
        assert!(is_alive(std::process::id()));
    }
}
