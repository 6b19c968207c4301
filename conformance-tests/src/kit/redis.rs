//! A private `redis-server`, plus a tiny RESP client for tests that poke at it directly.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;

use super::error::{KitError, KitErrorKind, KitResult};
use super::host::{RunAs, find_binary, password, write_private};
use super::server::{Launch, Server, server_lifecycle};

/// A `redis-server` of the kit's own on a free port of 127.0.0.1, `dir` = its 0700 temp dir.
///
/// The default user needs the kit's password ([`Redis::password`], also `masterauth`), which
/// [`Redis::url`] carries and [`Redis::command`] sends; the server reads it from a 0600 config
/// file in its temp dir, never from its command line.
///
/// By default nothing is persisted (`--save "" --appendonly no`); [`Redis::start_with`] appends
/// arguments (later ones win), e.g. `["--appendonly", "yes", "--appendfsync", "always"]`, and
/// [`Redis::restart`] reuses them, so an AOF survives a kill -9 when enabled.
pub struct Redis {
    server: Server,
    binary: PathBuf,
    extra_args: Vec<String>,
    password: String,
}

/// Without the password: a handle shows up in panic messages.
impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut hide = false;
        let args: Vec<&str> = self
            .extra_args
            .iter()
            .map(|arg| {
                let shown = if hide { "***" } else { arg.as_str() };
                hide = matches!(arg.as_str(), "--requirepass" | "--masterauth");
                shown
            })
            .collect();
        f.debug_struct("Redis")
            .field("server", &self.server)
            .field("binary", &self.binary)
            .field("extra_args", &args)
            .finish_non_exhaustive()
    }
}

/// The config file with the server's password, first on its command line.
const AUTH_CONFIG: &str = "auth.conf";

impl Redis {
    /// Starts a private server without persistence.
    ///
    /// # Errors
    /// `redis-server` missing (naming the package), or not answering PING within 60 s.
    pub async fn start() -> KitResult<Redis> {
        Self::start_with(&[]).await
    }

    /// Starts a private server with `extra_args` after the kit's defaults (they override them).
    /// A `--requirepass` among them replaces the kit's password (in the URL and for
    /// [`Redis::command`] too); it is then on the server's command line, which other users can
    /// read, so it suits a test that needs a password of its own only.
    ///
    /// # Errors
    /// As [`Redis::start`].
    pub async fn start_with(extra_args: &[&str]) -> KitResult<Redis> {
        let password = extra_args
            .windows(2)
            .rev()
            .find(|pair| pair[0] == "--requirepass")
            .map_or(password(), |pair| pair[1]);
        let redis = Redis {
            binary: find_binary("redis-server", "redis-server")?,
            server: Server::new("redis", "redis-server", "redis.log", 0)?,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            password: password.to_owned(),
        };
        // Quoted for the config file: the kit's password is hex, a test's may not be.
        let quoted = format!("{:?}", redis.password);
        write_private(
            &redis.dir().join(AUTH_CONFIG),
            &format!("requirepass {quoted}\nmasterauth {quoted}\n"),
            &RunAs::Me,
        )?;
        redis.server.first_boot(&redis).await?;
        Ok(redis)
    }

    /// The server shared by every test of this test process, started on first use (no
    /// persistence). Tests on it should use their own key prefixes; never kill or pause it.
    ///
    /// # Errors
    /// As [`Redis::start`]; a failed start is remembered and returned to every caller.
    pub async fn shared() -> KitResult<&'static Redis> {
        static SHARED: OnceCell<Result<Redis, KitError>> = OnceCell::const_new();
        SHARED
            .get_or_init(Self::start)
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `redis://:{password}@127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        self.url_via(self.addr())
    }

    /// The URL of this server reached at `addr` (a [`super::Proxy`] in front of it):
    /// `redis://:{password}@{addr}`.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        format!(
            "redis://:{}@{addr}",
            lockcore::percent_encode(&self.password)
        )
    }

    /// The default user's password: the kit's [`super::password`], unless `--requirepass` was
    /// among the arguments.
    pub fn password(&self) -> &str {
        &self.password
    }

    server_lifecycle!("server");

    /// Sends `AUTH` with the server's password and one command on a new connection and returns
    /// the command's reply, or the `AUTH` error reply when the password was refused (10 s
    /// timeout).
    ///
    /// # Errors
    /// Connection or protocol errors; an error *reply* is `Ok(RedisReply::Error(..))`.
    pub async fn command(&self, args: &[&str]) -> KitResult<RedisReply> {
        redis_command_as(self.addr(), Some(&self.password), args, COMMAND_WITHIN).await
    }

    /// How many times the server ran `command` (lower case, a subcommand as `script|load`)
    /// since it started or since `CONFIG RESETSTAT`, from `INFO commandstats`; commands a
    /// script ran count too. 0 when it never ran.
    ///
    /// # Errors
    /// Connection or protocol errors, or an `INFO` reply that is not a bulk string.
    pub async fn calls(&self, command: &str) -> KitResult<u64> {
        let bad = |what: String| KitError::new(KitErrorKind::Command, what);
        let RedisReply::Bulk(Some(info)) = self.command(&["INFO", "commandstats"]).await? else {
            return Err(bad("INFO commandstats: not a bulk string".into()));
        };
        let info = String::from_utf8_lossy(&info);
        let prefix = format!("cmdstat_{command}:calls=");
        let Some(rest) = info.lines().find_map(|line| line.strip_prefix(&prefix)) else {
            return Ok(0);
        };
        let calls = rest.split(',').next().unwrap_or_default();
        calls
            .parse()
            .map_err(|e| bad(format!("{prefix}{calls}: {e}")))
    }
}

/// Several independent Redis servers (Redlock's masters), controlled together: as a
/// [`super::ServerControl`] a kill, pause, resume or restart reaches every one of them.
#[derive(Debug)]
pub struct RedisSet {
    nodes: Vec<Redis>,
}

impl RedisSet {
    /// Starts `n` servers, each with `extra_args` (see [`Redis::start_with`]).
    ///
    /// # Errors
    /// As [`Redis::start_with`]; servers already started are killed.
    pub async fn start(n: usize, extra_args: &[&str]) -> KitResult<RedisSet> {
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            nodes.push(Redis::start_with(extra_args).await?);
        }
        Ok(RedisSet { nodes })
    }

    /// A set shared by every test of this test binary (started on first use), one per size.
    ///
    /// # Errors
    /// As [`RedisSet::start`]; later calls see the same error.
    pub async fn shared(n: usize) -> KitResult<&'static RedisSet> {
        type Cell = &'static OnceCell<KitResult<RedisSet>>;
        static SHARED: std::sync::Mutex<Vec<(usize, Cell)>> = std::sync::Mutex::new(Vec::new());
        let cell = {
            let mut cells = SHARED.lock().unwrap_or_else(|p| p.into_inner());
            match cells.iter().find(|(size, _)| *size == n) {
                Some((_, cell)) => *cell,
                None => {
                    let cell: Cell = Box::leak(Box::new(OnceCell::new()));
                    cells.push((n, cell));
                    cell
                }
            }
        };
        cell.get_or_init(|| Self::start(n, &[]))
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The servers.
    pub fn nodes(&self) -> &[Redis] {
        &self.nodes
    }

    /// Breaks the set up into its servers (each still killed when dropped).
    pub fn into_nodes(self) -> Vec<Redis> {
        self.nodes
    }

    /// `redlock://:{password}@127.0.0.1:p1,127.0.0.1:p2,...` (the servers share one password).
    pub fn redlock_url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        let password = self.nodes.first().map_or(password(), Redis::password);
        format!(
            "redlock://:{}@{}",
            lockcore::percent_encode(password),
            hosts.join(",")
        )
    }
}

impl Launch for Redis {
    fn command(&self, server: &Server) -> KitResult<Command> {
        let mut cmd = Command::new(&self.binary);
        // A config file must come first.
        cmd.arg(server.dir().join(AUTH_CONFIG))
            .arg("--port")
            .arg(server.port().to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(server.dir())
            .args([
                "--daemonize",
                "no",
                "--logfile",
                "",
                "--protected-mode",
                "yes",
            ])
            .args(&self.extra_args)
            .current_dir(server.dir());
        Ok(cmd)
    }

    async fn ready(&self, server: &Server) -> bool {
        // A server that requires a password answers NOAUTH once it is up.
        match redis_command_as(server.addr(), None, &["PING"], Duration::from_secs(2)).await {
            Ok(RedisReply::Status(s)) => s == "PONG",
            Ok(RedisReply::Error(e)) => e.starts_with("NOAUTH"),
            _ => false,
        }
    }
}

/// A reply in the Redis protocol (RESP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisReply {
    /// `+OK`.
    Status(String),
    /// `-ERR ...` (also `-LOADING ...` while an AOF loads).
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nabc` or the nil bulk string (`None`).
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...` or the nil array (`None`).
    Array(Option<Vec<RedisReply>>),
}

impl RedisReply {
    /// The text of a bulk string or status reply.
    pub fn as_text(&self) -> Option<String> {
        match self {
            RedisReply::Status(s) => Some(s.clone()),
            RedisReply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub fn redis_encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one RESP2 reply.
///
/// # Errors
/// I/O errors, EOF, or a malformed reply.
pub async fn read_redis_reply<R: AsyncBufRead + Unpin + Send>(
    reader: &mut R,
) -> std::io::Result<RedisReply> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed RESP reply");
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    Ok(match kind {
        "+" => RedisReply::Status(rest.to_string()),
        "-" => RedisReply::Error(rest.to_string()),
        ":" => RedisReply::Integer(rest.parse().map_err(|_| bad())?),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                RedisReply::Bulk(None)
            } else {
                let mut buf = vec![0; len as usize + 2];
                reader.read_exact(&mut buf).await?;
                buf.truncate(len as usize);
                RedisReply::Bulk(Some(buf))
            }
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                RedisReply::Array(None)
            } else {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(Box::pin(read_redis_reply(reader)).await?);
                }
                RedisReply::Array(Some(items))
            }
        }
        _ => return Err(bad()),
    })
}

/// How long [`redis_command`] and [`Redis::command`] wait for a reply.
const COMMAND_WITHIN: Duration = Duration::from_secs(10);

/// Sends one command to a Redis server on a new connection, without authenticating (10 s
/// timeout): a kit server answers `NOAUTH`; [`Redis::command`] authenticates.
///
/// # Errors
/// Connection or protocol errors, or no reply within 10 s.
pub async fn redis_command(addr: SocketAddr, args: &[&str]) -> KitResult<RedisReply> {
    redis_command_as(addr, None, args, COMMAND_WITHIN).await
}

/// One command on a new connection, after `AUTH password` when given; the `AUTH` error reply
/// when it was refused. Messages name the command, never its arguments.
async fn redis_command_as(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[&str],
    within: Duration,
) -> KitResult<RedisReply> {
    let exchange = async {
        let mut stream = BufReader::new(TcpStream::connect(addr).await?);
        if let Some(password) = password {
            stream.write_all(&redis_encode(&["AUTH", password])).await?;
            let auth = read_redis_reply(&mut stream).await?;
            if matches!(auth, RedisReply::Error(_)) {
                return Ok(auth);
            }
        }
        stream.write_all(&redis_encode(args)).await?;
        read_redis_reply(&mut stream).await
    };
    match tokio::time::timeout(within, exchange).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(e)) => Err(KitError::io(format!("redis {addr} {:?}", args.first()), e)),
        Err(_) => Err(KitError::new(
            KitErrorKind::Io,
            format!(
                "redis {addr} {:?}: no reply within {within:?}",
                args.first()
            ),
        )),
    }
}
