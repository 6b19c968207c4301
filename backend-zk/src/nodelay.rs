//! `TCP_NODELAY` on the ZooKeeper client's sockets.
//!
//! An attempt sends its `create` and the `getChildren` that decides it back to back, and waits
//! for both replies in one round trip (see `ZkLock::create_request`). zookeeper-client 0.11
//! leaves Nagle's algorithm on and offers no way to turn it off, so whenever its writer sent
//! the `create` on its own, the kernel held the `getChildren` back until the server
//! acknowledged the `create`, which it does with the `create`'s reply: two round trips after
//! all. Without the option an uncontended acquire+release ran at about two thirds the rate of a
//! bare `create` and `delete` (one request in flight at a time, which Nagle never delays); with
//! it, at the same rate.
//!
//! The client's socket is not reachable through its API, so on Linux this module finds it among
//! the process's open descriptors (`/proc/self/fd`): every TCP socket whose peer is one of the
//! ensemble's addresses gets the option. Setting it on a socket of another ZooKeeper client of
//! the same servers in this process is harmless (it only sends small writes sooner). A session
//! that reconnects opens a new socket, so [`keep`] sets the option again on every
//! (re)connection. Elsewhere, and if anything fails, the client keeps Nagle's algorithm: slower
//! on the uncontended path, never wrong.
#![allow(unsafe_code)]

use std::net::SocketAddr;

use zookeeper_client as zk;

/// Resolves the ensemble's `host:port` entries (those that resolve).
pub(crate) async fn servers(hosts: &[String]) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    for host in hosts {
        if let Ok(found) = tokio::net::lookup_host(host.as_str()).await {
            addrs.extend(found);
        }
    }
    addrs
}

/// Sets `TCP_NODELAY` on the client's socket now and after every reconnection, until the
/// session ends (a task of its own, holding only a state watcher).
pub(crate) fn keep(client: &zk::Client, servers: Vec<SocketAddr>) {
    if servers.is_empty() {
        return;
    }
    apply(&servers);
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            match states.changed().await {
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    apply(&servers);
                }
                state if state.is_terminated() => return,
                _ => {}
            }
        }
    });
}

/// Sets `TCP_NODELAY` on every TCP socket of this process connected to one of `servers`; how
/// many it set.
#[cfg(target_os = "linux")]
pub(crate) fn apply(servers: &[SocketAddr]) -> usize {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut set = 0;
    for entry in fds.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if socket && peer(fd).is_some_and(|p| servers.contains(&p)) && set_nodelay(fd) {
            set += 1;
        }
    }
    set
}

/// Elsewhere the client keeps Nagle's algorithm (see the module docs).
#[cfg(not(target_os = "linux"))]
pub(crate) fn apply(_servers: &[SocketAddr]) -> usize {
    0
}

/// The peer of socket `fd`, if it is a connected IPv4 or IPv6 one.
///
/// The descriptor may have been closed, or even reused, since it was listed: the calls then
/// fail or describe the new socket, and touch no memory but the locals passed to them.
#[cfg(target_os = "linux")]
fn peer(fd: libc::c_int) -> Option<SocketAddr> {
    // SAFETY: `sockaddr_storage` is plain data, valid when zeroed.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of_val(&addr)).ok()?;
    // SAFETY: `addr` and `len` are valid for writes and `len` is `addr`'s size; the kernel
    // writes at most that many bytes.
    let got = unsafe { libc::getpeername(fd, (&raw mut addr).cast(), &raw mut len) };
    if got != 0 {
        return None;
    }
    match libc::c_int::from(addr.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says `addr` holds a `sockaddr_in`, which fits in it.
            let v4: libc::sockaddr_in = unsafe { *(&raw const addr).cast() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(v4.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says `addr` holds a `sockaddr_in6`, which fits in it.
            let v6: libc::sockaddr_in6 = unsafe { *(&raw const addr).cast() };
            let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(v6.sin6_port))))
        }
        _ => None,
    }
}

/// Sets `TCP_NODELAY` on socket `fd`; whether it took.
#[cfg(target_os = "linux")]
fn set_nodelay(fd: libc::c_int) -> bool {
    let on: libc::c_int = 1;
    let len = libc::socklen_t::try_from(std::mem::size_of_val(&on)).unwrap_or(4);
    // SAFETY: `on` is a valid `c_int` for reads, and `len` is its size.
    let set = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&raw const on).cast(),
            len,
        )
    };
    set == 0
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A socket connected to one of the servers gets the option; one connected elsewhere
    /// keeps Nagle's algorithm.
    #[test]
    fn sets_nodelay_only_on_sockets_to_the_servers() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let other = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let to_server = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let to_other = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        assert!(!to_server.nodelay().unwrap() && !to_other.nodelay().unwrap());
        let set = apply(&[server.local_addr().unwrap()]);
        assert!(set >= 1, "no socket was set");
        assert!(
            to_server.nodelay().unwrap(),
            "the server's socket keeps Nagle"
        );
        assert!(
            !to_other.nodelay().unwrap(),
            "another peer's socket was changed"
        );
    }
}
