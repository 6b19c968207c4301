//! The fault-injecting proxy: pass-through, latency, blackholes, reset and down.

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::kit::{Fault, Proxy, Redis, RedisReply, read_redis_reply, redis_encode};
use conformance_tests::within;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

use crate::support::{authenticated, bulk, redis_pongs, refuses};

/// An echo server on the test's runtime.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Writes `msg` and reads the echo back (10 s timeout).
async fn echo(stream: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    let exchange = async {
        stream.write_all(msg).await?;
        let mut buf = vec![0; msg.len()];
        stream.read_exact(&mut buf).await?;
        Ok(buf)
    };
    timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

async fn wait_connections(proxy: &Proxy, n: usize) {
    let what = format!("the proxy counting {n} connections");
    within(Duration::from_secs(10), &what, async {
        while proxy.connections() != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn proxy_passes_through_and_counts_connections() {
    let upstream = echo_server().await;
    let proxy = Proxy::start(upstream).await.unwrap();
    assert_eq!(proxy.addr().port(), proxy.port());
    assert_eq!(proxy.fault(), Fault::PassThrough);
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut a, b"hello").await.unwrap(), b"hello");
    assert_eq!(echo(&mut b, b"world").await.unwrap(), b"world");
    let big = vec![7u8; 1 << 20];
    assert_eq!(
        echo(&mut a, &big).await.unwrap(),
        big,
        "large payloads pass intact"
    );
    wait_connections(&proxy, 2).await;
    drop(a);
    wait_connections(&proxy, 1).await;
    drop(b);
    wait_connections(&proxy, 0).await;
}

#[tokio::test]
async fn proxy_latency_delays_each_direction() {
    let upstream = echo_server().await;
    let proxy = Proxy::start(upstream).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut conn, b"warm").await.unwrap(), b"warm");

    let delay = Duration::from_millis(300);
    proxy.set(Fault::Latency(delay));
    let started = Instant::now();
    assert_eq!(echo(&mut conn, b"slow").await.unwrap(), b"slow");
    assert!(
        started.elapsed() >= 2 * delay,
        "a round trip through Latency({delay:?}) took only {:?}",
        started.elapsed()
    );
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    let started = Instant::now();
    assert_eq!(echo(&mut fresh, b"new").await.unwrap(), b"new");
    assert!(
        started.elapsed() >= 2 * delay,
        "new connections are delayed too"
    );

    proxy.set(Fault::PassThrough);
    assert_eq!(echo(&mut conn, b"fast").await.unwrap(), b"fast");
}

#[tokio::test]
async fn proxy_blackholes_replies_but_forwards_requests() {
    let redis = Redis::start().await.expect("redis starts");
    let proxy = Proxy::start(redis.addr()).await.unwrap();
    let mut conn = authenticated(proxy.addr()).await.unwrap();
    conn.get_mut()
        .write_all(&redis_encode(&["PING"]))
        .await
        .unwrap();
    assert_eq!(
        read_redis_reply(&mut conn).await.unwrap(),
        RedisReply::Status("PONG".into())
    );

    proxy.set(Fault::BlackholeReplies);
    conn.get_mut()
        .write_all(&redis_encode(&["SET", "through", "blackhole"]))
        .await
        .unwrap();
    assert!(
        timeout(Duration::from_secs(1), read_redis_reply(&mut conn))
            .await
            .is_err(),
        "no reply comes back through a reply blackhole"
    );
    within(
        Duration::from_secs(10),
        "the blackholed request reaching the server",
        async {
            while redis.command(&["GET", "through"]).await.unwrap() != bulk("blackhole") {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert_eq!(proxy.connections(), 1, "the connection stays open");

    // Requests blackholed: the SET never arrives, so after PassThrough the first reply on a
    // fresh connection is the PONG, and the key is unset.
    proxy.set(Fault::PassThrough);
    let mut conn2 = authenticated(proxy.addr()).await.unwrap();
    proxy.set(Fault::BlackholeRequests);
    conn2
        .get_mut()
        .write_all(&redis_encode(&["SET", "dropped", "x"]))
        .await
        .unwrap();
    assert!(
        timeout(Duration::from_secs(1), read_redis_reply(&mut conn2))
            .await
            .is_err()
    );
    proxy.set(Fault::PassThrough);
    conn2
        .get_mut()
        .write_all(&redis_encode(&["PING"]))
        .await
        .unwrap();
    assert_eq!(
        timeout(Duration::from_secs(10), read_redis_reply(&mut conn2))
            .await
            .unwrap()
            .unwrap(),
        RedisReply::Status("PONG".into())
    );
    assert_eq!(
        redis.command(&["GET", "dropped"]).await.unwrap(),
        RedisReply::Bulk(None),
        "a blackholed request never reaches the server"
    );
    assert!(redis_pongs(proxy.addr(), Duration::from_secs(10)).await);
}

#[tokio::test]
async fn proxy_silences_only_the_connections_open_when_asked() {
    let upstream = echo_server().await;
    let proxy = Proxy::start(upstream).await.unwrap();
    let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut old, b"before").await.unwrap(), b"before");
    wait_connections(&proxy, 1).await;

    proxy.blackhole_existing_replies();
    assert!(
        echo(&mut old, b"lost").await.is_err(),
        "a reply came back on a silenced connection"
    );
    let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        echo(&mut new, b"fresh").await.unwrap(),
        b"fresh",
        "a connection opened afterwards is silenced too"
    );
    assert_eq!(proxy.fault(), Fault::PassThrough);
    assert_eq!(proxy.connections(), 2, "the silenced connection stays open");
}

#[tokio::test]
async fn proxy_reset_breaks_existing_and_new_connections() {
    let upstream = echo_server().await;
    let proxy = Proxy::start(upstream).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut conn, b"before").await.unwrap(), b"before");
    wait_connections(&proxy, 1).await;

    proxy.set(Fault::Reset);
    assert_eq!(
        proxy.connections(),
        0,
        "Reset closes existing connections before set returns"
    );
    let err = echo(&mut conn, b"after")
        .await
        .expect_err("an existing connection is reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");

    // The reset may reach the client while it connects or on its first read.
    let fresh = async {
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        let mut buf = [0u8; 1];
        stream.read(&mut buf).await
    };
    let outcome = timeout(Duration::from_secs(10), fresh)
        .await
        .expect("a new connection is reset, not left hanging");
    assert_eq!(
        outcome.expect_err("a new connection is reset").kind(),
        std::io::ErrorKind::ConnectionReset
    );

    proxy.set(Fault::PassThrough);
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut again, b"again").await.unwrap(), b"again");
}

#[tokio::test]
async fn proxy_down_refuses_new_connections_and_comes_back_on_the_same_port() {
    let upstream = echo_server().await;
    let proxy = Proxy::start(upstream).await.unwrap();
    let port = proxy.port();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut conn, b"before").await.unwrap(), b"before");

    proxy.set(Fault::Down);
    assert_eq!(proxy.connections(), 0);
    assert!(
        echo(&mut conn, b"after").await.is_err(),
        "an existing connection is closed"
    );
    assert!(refuses(proxy.addr()).await, "new connections are refused");

    proxy.set(Fault::PassThrough);
    assert_eq!(proxy.port(), port);
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(echo(&mut again, b"back").await.unwrap(), b"back");
}
