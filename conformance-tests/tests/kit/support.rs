//! What the kit's tests of several servers share: probes that a server answers, and Redis
//! connections.

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::kit::{RedisReply, ServerControl, password, read_redis_reply, redis_encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// How long a paused server gets to (not) answer.
pub(crate) const PAUSED_PROBE: Duration = Duration::from_millis(1500);

/// Whether a TCP connection to `addr` is refused.
pub(crate) async fn refuses(addr: SocketAddr) -> bool {
    matches!(
        timeout(Duration::from_secs(5), TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Kills `server` with SIGKILL, checks that it refuses connections, restarts it and checks that
/// it came back on the same port.
pub(crate) async fn kill9_and_restart(server: &dyn ServerControl) {
    let label = server.label().to_owned();
    server.kill9();
    assert!(
        refuses(server.addr()).await,
        "a killed {label} refuses connections"
    );
    let port = server.addr().port();
    if let Err(e) = server.restart().await {
        panic!("{label} restarts after kill -9: {e}");
    }
    assert_eq!(server.addr().port(), port, "restart keeps the port");
}

/// Pauses `server` and checks that `answers`, a probe of its protocol, gets no answer; then
/// resumes it and checks that it answers again.
pub(crate) async fn pause_then_resume<F, Fut>(server: &dyn ServerControl, answers: F)
where
    F: Fn(SocketAddr, Duration) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let label = server.label().to_owned();
    server.pause();
    assert!(
        !answers(server.addr(), PAUSED_PROBE).await,
        "a paused {label} does not answer"
    );
    server.resume();
    assert!(
        answers(server.addr(), Duration::from_secs(10)).await,
        "a resumed {label} answers"
    );
}

/// Sends PostgreSQL's SSLRequest and reads the one-byte answer ('N' or 'S').
pub(crate) async fn pg_answers(addr: SocketAddr, within: Duration) -> bool {
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
pub(crate) async fn mariadb_answers(addr: SocketAddr, within: Duration) -> bool {
    let probe = async {
        let mut s = TcpStream::connect(addr).await?;
        let mut header = [0u8; 5];
        s.read_exact(&mut header).await?;
        std::io::Result::Ok(header[4] == 10)
    };
    matches!(timeout(within, probe).await, Ok(Ok(true)))
}

pub(crate) fn bulk(text: &str) -> RedisReply {
    RedisReply::Bulk(Some(text.as_bytes().to_vec()))
}

/// Sends one command on `conn` and reads its reply.
pub(crate) async fn exchange(
    conn: &mut BufReader<TcpStream>,
    args: &[&str],
) -> std::io::Result<RedisReply> {
    conn.get_mut().write_all(&redis_encode(args)).await?;
    read_redis_reply(conn).await
}

/// A connection to the Redis server at `addr` (or a proxy in front of it), authenticated with
/// `password`.
pub(crate) async fn authenticated_with(
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
pub(crate) async fn authenticated(addr: SocketAddr) -> std::io::Result<BufReader<TcpStream>> {
    authenticated_with(addr, password()).await
}

/// PING on a fresh authenticated connection, answered within `within`.
pub(crate) async fn redis_pongs(addr: SocketAddr, within: Duration) -> bool {
    let ping = async { exchange(&mut authenticated(addr).await?, &["PING"]).await };
    matches!(timeout(within, ping).await, Ok(Ok(RedisReply::Status(s))) if s == "PONG")
}
