//! Test kit: real servers as child processes and a fault-injecting TCP proxy.
//!
//! Every server ([`Postgres`], [`MariaDb`], [`Redis`], [`ZooKeeper`], [`ZkEnsemble`]) is a child
//! process of the test process, on a free loopback port, with its data in a temp dir. Each has a
//! `start()` for a private instance (fault tests kill, pause and restart it) and most have a
//! `shared()` for one instance per test process that many tests use side by side.
//!
//! Shutdown: servers are forked by one long-lived kit thread with `PR_SET_PDEATHSIG(SIGKILL)`, so
//! the kernel kills them when the test process dies, however it dies; an `atexit` hook kills every
//! registered server (with the processes it started) and removes the temp dirs of the shared
//! ones; and a private instance is killed, reaped and its temp dir removed when it is dropped,
//! including when its test panics.
//!
//! A missing server binary is an error whose message names the Debian package to install (and
//! `scripts/install-deps` installs them all); tests should fail on it, never skip.
//!
//! The kit never touches the machine's own PostgreSQL, MariaDB or Redis: it only uses ports it
//! picked outside the default ones and the kernel's ephemeral range, and passes `--no-defaults`
//! (or a config of its own) so no system config file is read.
//!
//! Who can reach the servers: they listen on 127.0.0.1, where every local user can connect, so
//! PostgreSQL, MariaDB and Redis let in only the holder of a password generated for the test
//! process ([`password`], 128 random bits): PostgreSQL's superuser `postgres` (`scram-sha-256`
//! for every connection), MariaDB's `root` (no account without a password), Redis's default
//! user (`requirepass`). The URLs the kit hands out carry it (`Redis::url_via` for a proxy in
//! front); the kit's own `psql` and `mariadb` calls get it in their environment, never on a
//! command line, which other users can read in `/proc`. It is written only to 0600 files in
//! the servers' temp dirs, which are 0700 (the data, sockets and logs in them too). When the
//! tests run as root, PostgreSQL and MariaDB run as their system accounts (`postgres`,
//! `mysql`), never as root. ZooKeeper has no password of its own: while a kit ZooKeeper runs,
//! any local user can connect to it (tests that need access control set digest ACLs on their
//! nodes).
//!
//! Free ports are reserved against this user's other test processes with a lock file in a
//! folder only this user can reach (`$XDG_RUNTIME_DIR/dlock-kit`, else
//! `<temp dir>/dlock-kit-ports-<uid>`, made 0700); one that exists but is another user's or
//! open to others is not used.
//!
//! [`Proxy`] is a TCP proxy for one link that injects [`Fault`]s into live connections.
//!
//! [`LockPeer`] runs another library's ZooKeeper lock client (Apache Curator, kazoo) as a child
//! process a test drives, for backend-zk's interoperability tests.
//!
//! ```no_run
//! # async fn demo() -> conformance_tests::kit::KitResult<()> {
//! use conformance_tests::kit::{Fault, Postgres, Proxy, Redis};
//!
//! // Many tests share one PostgreSQL; each takes a database of its own.
//! let url = Postgres::shared().await?.fresh_database("my_case").await?;
//!
//! // A fault test starts a private server, puts a proxy in front and breaks things.
//! let redis = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).await?;
//! let proxy = Proxy::start(redis.addr()).await?; // the client connects to proxy.addr()
//! proxy.set(Fault::BlackholeReplies); // requests arrive, replies vanish
//! proxy.set(Fault::PassThrough);
//! redis.kill9();
//! redis.restart().await?; // same port, same AOF
//! # let _ = url;
//! # Ok(())
//! # }
//! ```

mod control;
mod error;
mod host;
mod mariadb;
mod peer;
mod postgres;
mod process;
mod proxy;
mod redis;
mod redis_cluster;
mod redis_tls;
mod server;
mod tls;
mod zookeeper;

pub use control::{ServerControl, ZkAndRedis};
pub use error::{KitError, KitErrorKind, KitResult};
pub use host::password;
pub use mariadb::MariaDb;
pub use peer::{KAZOO_REQUIREMENT, LockPeer, PeerHold, PeerLibrary, PeerLock};
pub use postgres::Postgres;
pub use process::is_alive;
pub use proxy::{Fault, Proxy};
pub use redis::{Redis, RedisReply, RedisSet, read_redis_reply, redis_command, redis_encode};
pub use redis_cluster::RedisCluster;
pub use redis_tls::RedisTls;
pub use server::Server;
pub use tls::{CertAndKey, TlsFiles};
pub use zookeeper::{ZkEnsemble, ZkNode, ZooKeeper, zk_four_letter};

use std::collections::HashSet;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

/// A free TCP port on 127.0.0.1.
///
/// Ports come from below the kernel's ephemeral range (so an outgoing connection cannot take a
/// killed server's port before its restart), are never handed out twice in one process, are
/// reserved against this user's other test processes using the kit (a byte-range lock the
/// kernel drops when this process exits), and were bindable a moment ago. A program outside the kit may
/// still take one first: servers retry on another port when a first start fails.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let (low, _) = ephemeral_range();
    let lo: u16 = 10_000;
    let hi: u16 = low.saturating_sub(1).max(lo + 1000);
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let handed = handed.get_or_insert_with(HashSet::new);
    let candidates = std::iter::repeat_with(|| rand::random_range(lo..=hi)).take(10_000);
    if let Some(port) = pick_port(candidates, handed, host::reserve_port) {
        return port;
    }
    // Hardly reachable: fall back to a kernel-chosen port.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("cannot bind 127.0.0.1:0");
    let port = listener.local_addr().expect("local_addr").port();
    handed.insert(port);
    port
}

/// The first of `candidates` not in `handed`, that `reserve` grants, and that can be bound on
/// 127.0.0.1 right now; it is added to `handed`.
fn pick_port(
    candidates: impl IntoIterator<Item = u16>,
    handed: &mut HashSet<u16>,
    mut reserve: impl FnMut(u16) -> bool,
) -> Option<u16> {
    for port in candidates {
        // A port reserved here stays reserved even when the bind check fails: harmless.
        if handed.contains(&port) || !reserve(port) {
            continue;
        }
        if TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok() {
            handed.insert(port);
            return Some(port);
        }
    }
    None
}

fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// `127.0.0.1:port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

/// Runs `attempt` on up to three fresh ports, moving on when the server exits early (another
/// process took the port between [`free_port`] and the server's bind).
pub(crate) async fn first_boot<F, Fut>(port: &AtomicU16, mut attempt: F) -> KitResult<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KitResult<()>>,
{
    const ATTEMPTS: usize = 3;
    for i in 0..ATTEMPTS {
        port.store(free_port(), Ordering::SeqCst);
        match attempt().await {
            Err(e) if e.kind() == KitErrorKind::ServerExited && i + 1 < ATTEMPTS => {
                tracing::warn!("dlock kit: start failed, trying another port: {e}");
            }
            result => return result,
        }
    }
    unreachable!("the last attempt always returns")
}

/// `{prefix}_{n}` with n unique in this process.
pub(crate) fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Database names the kit creates: ASCII letters, digits, `_`, `-`; no quoting surprises in SQL
/// or URLs.
pub(crate) fn valid_database_name(name: &str, max: usize) -> KitResult<()> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(KitError::new(
            KitErrorKind::InvalidArgument,
            format!("database name {name:?} must be 1..={max} ASCII letters, digits, `_` or `-`"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks `free_port` relies on, made deterministic: a port this process listens on,
    /// one already handed out and one another kit process reserved are all skipped.
    #[test]
    fn pick_port_skips_bound_handed_out_and_reserved_ports() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let bound = taken.local_addr().unwrap().port();
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let free = probe.local_addr().unwrap().port();
        drop(probe);
        let mut handed = HashSet::new();
        assert_eq!(
            pick_port([bound, free], &mut handed, |_| true),
            Some(free),
            "a port something listens on was handed out"
        );
        assert!(handed.contains(&free));
        assert_eq!(
            pick_port([free, bound], &mut handed, |_| true),
            None,
            "a port was handed out twice, or a bound one at all"
        );
        let mut fresh = HashSet::new();
        assert_eq!(
            pick_port([free], &mut fresh, |p| p != free),
            None,
            "a port reserved by another process was handed out"
        );
    }
}
