//! Tests of the test kit itself: every server starts, answers, dies on kill -9, comes back on the
//! same port, freezes on pause and thaws on resume; the proxy injects each fault.
//!
//! Timeouts here only turn a hang into a failure; nothing asserts an upper bound on time.

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::kit::{
    Fault, KitError, KitErrorKind, MariaDb, Postgres, Proxy, Redis, RedisReply, ServerControl,
    ZkEnsemble, ZooKeeper, free_port, password, read_redis_reply, redis_command, redis_encode,
    zk_four_letter,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

/// How long a paused server gets to (not) answer.
const PAUSED_PROBE: Duration = Duration::from_millis(1500);

/// Whether a TCP connection to `addr` is refused.
async fn refuses(addr: SocketAddr) -> bool {
    matches!(
        timeout(Duration::from_secs(5), TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Sends PostgreSQL's SSLRequest and reads the one-byte answer ('N' or 'S').
async fn pg_answers(addr: SocketAddr, within: Duration) -> bool {
    let probe = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        std::io::Result::Ok(b[0] == b'N' || b[0] == b'S')
    };
    matches!(timeout(within, probe).await, Ok(Ok(true)))
}

/// Reads MariaDB's handshake greeting (protocol version 10), which it sends on connect.
async fn mariadb_answers(addr: SocketAddr, within: Duration) -> bool {
    let probe = async {
        let mut s = TcpStream::connect(addr).await?;
        let mut header = [0u8; 5];
        s.read_exact(&mut header).await?;
        std::io::Result::Ok(header[4] == 10)
    };
    matches!(timeout(within, probe).await, Ok(Ok(true)))
}

#[test]
fn free_ports_are_distinct_and_below_the_ephemeral_range() {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let ephemeral_low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
    // Whether each port was bindable when handed out is checked deterministically by the kit's
    // `pick_port` unit test. Binding here would race every other process on the machine (a
    // clean-clone CI run once lost one of 50 ports that way), which `free_port` does not
    // promise to win: servers retry on a fresh port instead.
    let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
    let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "no port is handed out twice");
    for port in ports {
        assert!(port < ephemeral_low, "{port} is below the ephemeral range");
        assert!(![5432, 3306, 6379, 2181].contains(&port));
    }
}

#[tokio::test]
async fn postgres_starts_answers_and_survives_kill9_restart_with_its_data() {
    let pg = Postgres::start().await.expect("postgres starts");
    assert_eq!(
        pg.url(),
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/postgres",
            password(),
            pg.port()
        )
    );
    assert_eq!(pg.addr().port(), pg.port());
    assert_ne!(pg.port(), 5432, "never the system server's port");
    assert_eq!(
        pg.query("postgres", "SELECT 40 + 2").await.unwrap().trim(),
        "42"
    );
    pg.query(
        "postgres",
        "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)",
    )
    .await
    .unwrap();

    pg.kill9();
    assert!(
        refuses(pg.addr()).await,
        "a killed postgres refuses connections"
    );

    let port = pg.port();
    pg.restart().await.expect("postgres restarts after kill -9");
    assert_eq!(pg.port(), port, "restart keeps the port");
    assert_eq!(
        pg.query("postgres", "SELECT v FROM kept")
            .await
            .unwrap()
            .trim(),
        "7",
        "committed rows survive kill -9 and restart"
    );

    // restart() of a running server kills it first.
    pg.restart().await.expect("postgres restarts while running");
    assert!(pg_answers(pg.addr(), Duration::from_secs(10)).await);
}

#[tokio::test]
async fn postgres_pause_freezes_and_resume_thaws() {
    let pg = Postgres::start().await.expect("postgres starts");
    assert!(pg_answers(pg.addr(), Duration::from_secs(10)).await);
    pg.pause();
    assert!(
        !pg_answers(pg.addr(), PAUSED_PROBE).await,
        "a paused postgres does not answer"
    );
    pg.resume();
    assert!(
        pg_answers(pg.addr(), Duration::from_secs(10)).await,
        "a resumed postgres answers"
    );
    assert_eq!(pg.query("postgres", "SELECT 1").await.unwrap().trim(), "1");
}

#[tokio::test]
async fn postgres_shared_is_one_server_and_databases_isolate_tests() {
    let a = Postgres::shared().await.expect("shared postgres");
    let b = Postgres::shared().await.expect("shared postgres");
    assert!(std::ptr::eq(a, b), "shared() returns one instance");
    let url = a.create_database("kit_iso").await.unwrap();
    assert_eq!(
        url,
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/kit_iso",
            password(),
            a.port()
        )
    );
    assert_eq!(
        a.create_database("kit_iso").await.unwrap(),
        url,
        "idempotent"
    );
    a.query("kit_iso", "CREATE TABLE only_here (v int)")
        .await
        .unwrap();
    assert!(
        a.query("postgres", "SELECT * FROM only_here")
            .await
            .is_err()
    );
    let fresh = a.fresh_database("kit").await.unwrap();
    assert!(fresh.starts_with(&format!(
        "postgres://postgres:{}@127.0.0.1:{}/kit_",
        password(),
        a.port()
    )));
    assert!(a.create_database("bad name; drop").await.is_err());
}

#[tokio::test]
async fn mariadb_starts_answers_and_survives_kill9_restart_with_its_data() {
    let db = MariaDb::start().await.expect("mariadb starts");
    assert_eq!(
        db.url(),
        format!("mysql://root:{}@127.0.0.1:{}/test", password(), db.port())
    );
    assert_ne!(db.port(), 3306, "never the system server's port");
    assert_eq!(
        db.query("test", "SELECT 40 + 2").await.unwrap().trim(),
        "42"
    );
    db.query(
        "test",
        "CREATE TABLE kept (v int) ENGINE=InnoDB; INSERT INTO kept VALUES (7)",
    )
    .await
    .unwrap();
    // Real grant tables: tests can create users.
    db.query(
        "test",
        &format!(
            "CREATE USER 'kit'@'127.0.0.1' IDENTIFIED BY '{}'; \
             GRANT ALL ON test.* TO 'kit'@'127.0.0.1'",
            password()
        ),
    )
    .await
    .unwrap();

    db.kill9();
    assert!(
        refuses(db.addr()).await,
        "a killed mariadb refuses connections"
    );

    let port = db.port();
    db.restart().await.expect("mariadb restarts after kill -9");
    assert_eq!(db.port(), port, "restart keeps the port");
    assert_eq!(
        db.query("test", "SELECT v FROM kept").await.unwrap().trim(),
        "7",
        "committed rows survive kill -9 and restart"
    );
}

#[tokio::test]
async fn mariadb_pause_freezes_and_resume_thaws() {
    let db = MariaDb::start().await.expect("mariadb starts");
    assert!(mariadb_answers(db.addr(), Duration::from_secs(10)).await);
    db.pause();
    assert!(
        !mariadb_answers(db.addr(), PAUSED_PROBE).await,
        "a paused mariadb does not answer"
    );
    db.resume();
    assert!(
        mariadb_answers(db.addr(), Duration::from_secs(10)).await,
        "a resumed mariadb answers"
    );
}

#[tokio::test]
async fn mariadb_shared_is_one_server_and_databases_isolate_tests() {
    let a = MariaDb::shared().await.expect("shared mariadb");
    let b = MariaDb::shared().await.expect("shared mariadb");
    assert!(std::ptr::eq(a, b), "shared() returns one instance");
    let url = a.create_database("kit_iso").await.unwrap();
    assert_eq!(
        url,
        format!("mysql://root:{}@127.0.0.1:{}/kit_iso", password(), a.port())
    );
    assert_eq!(
        a.create_database("kit_iso").await.unwrap(),
        url,
        "idempotent"
    );
    a.query("kit_iso", "CREATE TABLE only_here (v int)")
        .await
        .unwrap();
    assert!(a.query("test", "SELECT * FROM only_here").await.is_err());
    assert!(a.create_database("bad`name").await.is_err());
}

// ---------------------------------------------------------------------------------------------
// Redis

fn bulk(text: &str) -> RedisReply {
    RedisReply::Bulk(Some(text.as_bytes().to_vec()))
}

/// Sends one command on `conn` and reads its reply.
async fn exchange(conn: &mut BufReader<TcpStream>, args: &[&str]) -> std::io::Result<RedisReply> {
    conn.get_mut().write_all(&redis_encode(args)).await?;
    read_redis_reply(conn).await
}

/// A connection to the Redis server at `addr` (or a proxy in front of it), authenticated with
/// `password`.
async fn authenticated_with(
    addr: SocketAddr,
    password: &str,
) -> std::io::Result<BufReader<TcpStream>> {
    let mut conn = BufReader::new(TcpStream::connect(addr).await?);
    match exchange(&mut conn, &["AUTH", password]).await? {
        RedisReply::Status(ok) if ok == "OK" => Ok(conn),
        other => Err(std::io::Error::other(format!("AUTH: {other:?}"))),
    }
}

/// A connection authenticated with the kit's password.
async fn authenticated(addr: SocketAddr) -> std::io::Result<BufReader<TcpStream>> {
    authenticated_with(addr, password()).await
}

/// PING on a fresh authenticated connection, answered within `within`.
async fn redis_pongs(addr: SocketAddr, within: Duration) -> bool {
    let ping = async { exchange(&mut authenticated(addr).await?, &["PING"]).await };
    matches!(timeout(within, ping).await, Ok(Ok(RedisReply::Status(s))) if s == "PONG")
}

#[tokio::test]
async fn redis_without_persistence_loses_keys_on_kill9_and_restarts_on_the_same_port() {
    let redis = Redis::start().await.expect("redis starts");
    assert_eq!(
        redis.url(),
        format!("redis://:{}@127.0.0.1:{}", password(), redis.port())
    );
    assert_ne!(redis.port(), 6379, "never the system server's port");
    assert_eq!(
        redis.command(&["PING"]).await.unwrap(),
        RedisReply::Status("PONG".into())
    );
    assert_eq!(
        redis.command(&["SET", "k", "v"]).await.unwrap(),
        RedisReply::Status("OK".into())
    );
    assert_eq!(redis.command(&["GET", "k"]).await.unwrap(), bulk("v"));

    redis.kill9();
    assert!(
        refuses(redis.addr()).await,
        "a killed redis refuses connections"
    );

    let port = redis.port();
    redis.restart().await.expect("redis restarts");
    assert_eq!(redis.port(), port, "restart keeps the port");
    assert_eq!(
        redis.command(&["GET", "k"]).await.unwrap(),
        RedisReply::Bulk(None),
        "without persistence the key is gone"
    );
}

#[tokio::test]
async fn redis_with_aof_always_keeps_keys_across_kill9() {
    let redis = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .expect("redis with AOF starts");
    assert_eq!(
        redis.command(&["SET", "durable", "yes"]).await.unwrap(),
        RedisReply::Status("OK".into())
    );
    redis.kill9();
    assert!(refuses(redis.addr()).await);
    redis
        .restart()
        .await
        .expect("redis restarts and loads its AOF");
    assert_eq!(
        redis.command(&["GET", "durable"]).await.unwrap(),
        bulk("yes"),
        "a key SET before kill -9 survives with appendfsync always"
    );
}

#[tokio::test]
async fn redis_pause_freezes_and_resume_thaws() {
    let redis = Redis::start().await.expect("redis starts");
    let mut conn = authenticated(redis.addr()).await.unwrap();
    redis.pause();
    assert!(
        !redis_pongs(redis.addr(), PAUSED_PROBE).await,
        "a paused redis does not answer PING"
    );
    conn.get_mut()
        .write_all(&redis_encode(&["PING"]))
        .await
        .unwrap();
    assert!(
        timeout(PAUSED_PROBE, read_redis_reply(&mut conn))
            .await
            .is_err(),
        "no reply on an open connection while paused"
    );
    redis.resume();
    assert!(redis_pongs(redis.addr(), Duration::from_secs(10)).await);
    assert_eq!(
        timeout(Duration::from_secs(10), read_redis_reply(&mut conn))
            .await
            .expect("the pending PING is answered after resume")
            .unwrap(),
        RedisReply::Status("PONG".into())
    );
}

#[tokio::test]
async fn redis_shared_is_one_server() {
    let a = Redis::shared().await.expect("shared redis");
    let b = Redis::shared().await.expect("shared redis");
    assert!(std::ptr::eq(a, b));
    assert!(redis_pongs(a.addr(), Duration::from_secs(10)).await);
}

// ---------------------------------------------------------------------------------------------
// Proxy

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
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.connections() != n {
        assert!(
            Instant::now() < deadline,
            "proxy has {} connections, expected {n}",
            proxy.connections()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let direct = redis.command(&["GET", "through"]).await.unwrap();
        if direct == bulk("blackhole") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the request never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

// ---------------------------------------------------------------------------------------------
// ZooKeeper

async fn zk_imok(addr: SocketAddr, within: Duration) -> bool {
    matches!(zk_four_letter(addr, "ruok", within).await, Ok(a) if a == "imok")
}

#[tokio::test]
async fn zookeeper_standalone_starts_dies_restarts_pauses_and_resumes() {
    let zk = ZooKeeper::start().await.expect("zookeeper starts");
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{}", zk.port()));
    assert_eq!(zk.url(), format!("zk://127.0.0.1:{}", zk.port()));
    assert_ne!(zk.port(), 2181);
    assert!(zk_imok(zk.addr(), Duration::from_secs(10)).await);
    assert_eq!(zk.node().mode().await.as_deref(), Some("standalone"));
    let mntr = zk_four_letter(zk.addr(), "mntr", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(mntr.contains("zk_server_state\tstandalone"), "{mntr}");

    zk.kill9();
    assert!(
        refuses(zk.addr()).await,
        "a killed zookeeper refuses connections"
    );
    let port = zk.port();
    zk.restart().await.expect("zookeeper restarts");
    assert_eq!(zk.port(), port, "restart keeps the port");
    assert_eq!(zk.node().mode().await.as_deref(), Some("standalone"));

    zk.pause();
    assert!(
        !zk_imok(zk.addr(), PAUSED_PROBE).await,
        "a paused zookeeper does not answer ruok"
    );
    zk.resume();
    assert!(zk_imok(zk.addr(), Duration::from_secs(10)).await);
}

#[tokio::test]
async fn zookeeper_shared_is_one_server() {
    let a = ZooKeeper::shared().await.expect("shared zookeeper");
    let b = ZooKeeper::shared().await.expect("shared zookeeper");
    assert!(std::ptr::eq(a, b));
    assert!(zk_imok(a.addr(), Duration::from_secs(10)).await);
}

#[tokio::test]
async fn zookeeper_ensemble_elects_a_leader_and_survives_losing_it() {
    let ensemble = ZkEnsemble::start(3).await.expect("3-node ensemble starts");
    assert_eq!(ensemble.len(), 3);
    let expected: Vec<String> = (0..3)
        .map(|i| format!("127.0.0.1:{}", ensemble.node(i).port()))
        .collect();
    assert_eq!(ensemble.connect_string(), expected.join(","));

    let mut modes = Vec::new();
    for node in ensemble.nodes() {
        modes.push(node.mode().await.expect("every node serves"));
    }
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );
    let leader = ensemble.leader().await.expect("a leader");

    ensemble.node(leader).kill9();
    assert!(refuses(ensemble.node(leader).addr()).await);
    // A follower that loses its leader drops its client connections while it re-elects, so
    // a single ruok may be cut off: poll.
    for (i, node) in ensemble.nodes().iter().enumerate() {
        if i != leader {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !zk_imok(node.addr(), Duration::from_secs(2)).await {
                assert!(Instant::now() < deadline, "node {i} still answers ruok");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let new_leader = ensemble
        .wait_for_quorum()
        .await
        .expect("the two survivors elect a leader");
    assert_ne!(new_leader, leader);

    ensemble
        .node(leader)
        .restart()
        .await
        .expect("the old leader restarts");
    let mode = ensemble.node(leader).mode().await;
    assert!(
        matches!(mode.as_deref(), Some("follower" | "leader")),
        "the restarted node rejoins: {mode:?}"
    );
    assert_eq!(ensemble.wait_for_quorum().await.unwrap(), new_leader);
}

// ---- ServerControl: one handle over every kind ----

/// A session that sleeps on the server is ended by `kill_client_connections` (through the
/// trait object), and the server still answers afterwards.
async fn sleeping_session_is_ended(
    server: &dyn ServerControl,
    sleeper: impl std::future::Future<Output = conformance_tests::kit::KitResult<String>>
    + Send
    + 'static,
    answers: impl std::future::Future<Output = bool>,
) {
    let sleeper = tokio::spawn(async move { sleeper.await.map(|_| ()) });
    let mut killed = 0;
    // The session may not have connected yet: kill until it is ended (a hang guard bounds it).
    let ended = timeout(Duration::from_secs(30), async {
        loop {
            killed += server
                .kill_client_connections()
                .await
                .expect("kill_client_connections");
            if sleeper.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "{}: the sleeping session was never ended",
        server.label()
    );
    assert!(killed >= 1, "{}: no connection counted", server.label());
    assert!(answers.await, "{} stopped answering", server.label());
}

#[tokio::test]
async fn postgres_kill_client_connections_ends_sessions_not_the_server() {
    // A private server: killing the shared one's connections would end other tests' sessions.
    let pg = std::sync::Arc::new(Postgres::start().await.expect("postgres"));
    let sleeper = {
        let pg = pg.clone();
        async move { pg.query("postgres", "SELECT pg_sleep(600)").await }
    };
    sleeping_session_is_ended(
        &*pg,
        sleeper,
        pg_answers(pg.addr(), Duration::from_secs(10)),
    )
    .await;
    assert_eq!(
        pg.query("postgres", "SELECT 1")
            .await
            .expect("query")
            .trim(),
        "1"
    );
}

#[tokio::test]
async fn mariadb_kill_client_connections_ends_sessions_not_the_server() {
    // A private server: killing the shared one's connections would end other tests' sessions.
    let db = std::sync::Arc::new(MariaDb::start().await.expect("mariadb"));
    let sleeper = {
        let db = db.clone();
        async move { db.query("mysql", "SELECT SLEEP(600)").await }
    };
    sleeping_session_is_ended(
        &*db,
        sleeper,
        mariadb_answers(db.addr(), Duration::from_secs(10)),
    )
    .await;
    assert_eq!(
        db.query("mysql", "SELECT 1").await.expect("query").trim(),
        "1"
    );
}

#[tokio::test]
async fn redis_kill_client_connections_ends_sessions_not_the_server() {
    let redis = Redis::start().await.expect("redis");
    let addr = redis.addr();
    let sleeper = async move {
        let io = |e: std::io::Error| KitError::new(KitErrorKind::Io, e.to_string());
        let mut s = authenticated(addr).await.map_err(io)?;
        // BLPOP on a key nobody pushes: the connection waits until it is killed.
        s.get_mut()
            .write_all(&redis_encode(&["BLPOP", "never", "0"]))
            .await
            .map_err(io)?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.unwrap_or(0);
        Ok(format!("read {n} bytes"))
    };
    sleeping_session_is_ended(&redis, sleeper, redis_pongs(addr, Duration::from_secs(10))).await;
}

#[tokio::test]
async fn server_control_restarts_through_the_trait_object() {
    let redis = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .expect("redis with AOF");
    let server: &dyn ServerControl = &redis;
    assert_eq!(server.label(), "redis-server");
    assert_eq!(server.addr(), redis.addr());
    redis.command(&["SET", "k", "v"]).await.expect("SET");
    server.kill9();
    assert!(
        refuses(server.addr()).await,
        "still answering after kill -9"
    );
    server.restart().await.expect("restart");
    assert_eq!(
        redis.command(&["GET", "k"]).await.expect("GET"),
        bulk("v"),
        "the AOF did not bring the key back"
    );
    let zk = ZooKeeper::shared().await.expect("zookeeper");
    let zk: &dyn ServerControl = zk;
    assert!(
        zk.kill_client_connections().await.is_err(),
        "ZooKeeper has no server-side connection kill; it must say so"
    );
}

// ---------------------------------------------------------------------------------------------
// Who can connect: only the holder of the run's password.

/// `scheme://user:password@host:port/database` split into its parts (the kit's URLs, which
/// need no percent-decoding: the password is hex).
struct UrlParts {
    user: String,
    password: String,
    host: String,
    port: String,
    database: String,
}

fn parts_of(url: &str) -> UrlParts {
    let rest = url.split_once("://").expect("a scheme").1;
    let (userinfo, rest) = rest.split_once('@').expect("credentials in the URL");
    let (user, password) = userinfo.split_once(':').expect("a password in the URL");
    let (hostport, database) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = hostport.split_once(':').expect("a port");
    UrlParts {
        user: user.to_owned(),
        password: password.to_owned(),
        host: host.to_owned(),
        port: port.to_owned(),
        database: database.to_owned(),
    }
}

/// Runs a command line client and returns its stdout, or its stderr when it fails.
async fn client_output(mut cmd: tokio::process::Command) -> Result<String, String> {
    let out = timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the client finishes")
        .expect("the client runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `psql` with the parts of `url` but the password, which is `password` (none: no password at
/// all), in its environment as the kit itself passes it.
async fn psql(url: &str, password: Option<&str>, sql: &str) -> Result<String, String> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/psql"))
        .filter(|p| p.exists())
        .max()
        .unwrap_or_else(|| "psql".into());
    let p = parts_of(url);
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["-X", "-w", "-A", "-t", "-h", &p.host, "-p", &p.port])
        .args(["-U", &p.user, "-d", &p.database, "-c", sql])
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", "/nonexistent")
        .env("PGCONNECT_TIMEOUT", "10");
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    client_output(cmd).await
}

/// The `mariadb` client over TCP with the parts of `url` but the password, which is `password`
/// (none: no password at all), in its environment as the kit itself passes it.
async fn mariadb(url: &str, password: Option<&str>, sql: &str) -> Result<String, String> {
    let p = parts_of(url);
    let bin = ["/usr/bin/mariadb", "/usr/bin/mysql"]
        .into_iter()
        .find(|b| std::path::Path::new(b).exists())
        .unwrap_or("mariadb");
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--no-defaults",
        "--protocol=tcp",
        "-h",
        &p.host,
        "-P",
        &p.port,
    ])
    .args(["-u", &p.user, "-D", &p.database, "-N", "-B", "-e", sql])
    .args(["--connect-timeout=10"])
    .env_remove("MYSQL_PWD");
    if let Some(password) = password {
        cmd.env("MYSQL_PWD", password);
    }
    client_output(cmd).await
}

/// Mode bits of a server's temp dir: nobody but its owner may enter.
fn assert_private(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", dir.display());
}

/// `select_1` (a client running `SELECT 1` with the password it is given) is refused without a
/// password and with a wrong one, with errors that hold every text of `refusals[0]` and
/// `refusals[1]`; with the password of `url`, the kit's, it gets `1`.
async fn only_the_urls_password_gets_in<F, Fut>(url: &str, select_1: F, refusals: [&[&str]; 2])
where
    F: Fn(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let right = parts_of(url).password;
    assert_eq!(right, password());
    for (password, says) in [None, Some("wrong")].into_iter().zip(refusals) {
        let Err(err) = select_1(password.map(str::to_owned)).await else {
            panic!("let in with the password {password:?}");
        };
        assert!(says.iter().all(|s| err.contains(s)), "{err}");
    }
    assert_eq!(select_1(Some(right)).await.as_deref(), Ok("1"));
}

/// Another local user reaches the server's port but not its socket dir: without the run's
/// password (none, or a wrong one) PostgreSQL refuses them; the kit's URL gets in.
#[tokio::test]
async fn postgres_refuses_connections_without_the_runs_password() {
    let pg = Postgres::shared().await.expect("shared postgres");
    let url = &pg.url();
    only_the_urls_password_gets_in(
        url,
        |password| async move { psql(url, password.as_deref(), "SELECT 1").await },
        [
            &["no password supplied"],
            &["password authentication failed for user \"postgres\""],
        ],
    )
    .await;
    // Stored as a SCRAM secret of one iteration: logins stay cheap.
    let stored = pg
        .query(
            "postgres",
            "SELECT split_part(rolpassword, ':', 1) FROM pg_authid WHERE rolname = 'postgres'",
        )
        .await
        .unwrap();
    assert_eq!(stored.trim(), "SCRAM-SHA-256$1");
    assert_private(pg.dir());
}

/// Without the run's password MariaDB refuses root; no account logs in without a password;
/// `INTO OUTFILE` writes only into the server's own dir, never as root.
#[tokio::test]
async fn mariadb_refuses_connections_without_the_runs_password() {
    use std::os::unix::fs::MetadataExt as _;
    let db = MariaDb::shared().await.expect("shared mariadb");
    let url = &db.url();
    only_the_urls_password_gets_in(
        url,
        |password| async move { mariadb(url, password.as_deref(), "SELECT 1").await },
        [
            &["Access denied for user 'root'", "using password: NO"],
            &["Access denied for user 'root'", "using password: YES"],
        ],
    )
    .await;
    let open = db
        .query(
            "mysql",
            "SELECT CONCAT(User, '@', Host) FROM mysql.global_priv \
             WHERE IFNULL(JSON_EXTRACT(Priv, '$.account_locked'), 'false') <> 'true' \
             AND IFNULL(JSON_EXTRACT(Priv, '$.is_role'), 'false') <> 'true' \
             AND (IFNULL(JSON_VALUE(Priv, '$.authentication_string'), '') = '' \
             OR User = '' OR Priv LIKE '%unix_socket%')",
        )
        .await
        .unwrap();
    assert_eq!(open.trim(), "", "accounts without a password");

    let err = db
        .query(
            "test",
            "SELECT 1 INTO OUTFILE '/tmp/dlock-kit-outfile-test'",
        )
        .await
        .expect_err("a file outside the server's dir");
    assert!(err.to_string().contains("secure-file-priv"), "{err}");
    // The shared server is this process's own, and only this test writes there.
    let out = db.dir().join("files/out.txt");
    db.query(
        "test",
        &format!("SELECT 1 INTO OUTFILE '{}'", out.display()),
    )
    .await
    .expect("a file in the server's own dir");
    let mine = tempfile::tempfile().unwrap().metadata().unwrap().uid();
    let owner = std::fs::metadata(&out).unwrap().uid();
    assert!(
        mine != 0 || owner != 0,
        "a server started by root wrote a root-owned file"
    );
    assert_private(db.dir());
}

/// Without the run's password Redis answers only NOAUTH or WRONGPASS; the password in the
/// kit's URL works, also through a proxy; no command line shows it.
#[tokio::test]
async fn redis_refuses_connections_without_the_runs_password() {
    let redis = Redis::start().await.expect("redis starts");
    assert_eq!(
        redis_command(redis.addr(), &["PING"]).await.unwrap(),
        RedisReply::Error("NOAUTH Authentication required.".into())
    );
    let mut conn = BufReader::new(TcpStream::connect(redis.addr()).await.unwrap());
    match exchange(&mut conn, &["AUTH", "wrong"]).await.unwrap() {
        RedisReply::Error(e) => assert!(e.starts_with("WRONGPASS"), "{e}"),
        other => panic!("a wrong password is refused: {other:?}"),
    }
    match exchange(&mut conn, &["GET", "k"]).await.unwrap() {
        RedisReply::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("still not authenticated: {other:?}"),
    }

    let proxy = Proxy::start(redis.addr()).await.unwrap();
    let via = redis.url_via(proxy.addr());
    assert_eq!(via, format!("redis://:{}@{}", password(), proxy.addr()));
    for url in [redis.url(), via] {
        let rest = url.strip_prefix("redis://:").unwrap();
        let (pw, addr) = rest.split_once('@').unwrap();
        let addr: SocketAddr = addr.parse().unwrap();
        let mut conn = authenticated_with(addr, pw)
            .await
            .expect("the URL's password");
        assert_eq!(
            exchange(&mut conn, &["PING"]).await.unwrap(),
            RedisReply::Status("PONG".into()),
            "{addr}"
        );
    }
    assert_eq!(
        redis.command(&["PING"]).await.unwrap(),
        RedisReply::Status("PONG".into())
    );
    assert!(!format!("{redis:?}").contains(password()), "{redis:?}");

    // Any local user can read every process's command line.
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(password()),
                "{} shows the password on its command line",
                entry.path().display()
            );
        }
    }
    assert_private(redis.dir());
}
