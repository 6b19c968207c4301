//! A private PostgreSQL server: `initdb` + `postgres` as the `postgres` OS user.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::error::{KitError, KitErrorKind, KitResult};
use super::host::{find_binary, probe_command, run_command, system_user};
use super::process::running_as_root;
use super::server::{Launch, Server, server_lifecycle};
use super::tls::TlsFiles;
use super::{unique_name, valid_database_name};

const PACKAGE: &str = "postgresql";

/// A PostgreSQL server of the kit's own: a fresh cluster in a temp dir, trust auth on
/// 127.0.0.1, on a free port; socket in the temp dir; `fsync=off` (a killed process loses
/// nothing the OS already has, which is all a kill -9 test needs).
///
/// Started as the `postgres` OS user when the tests run as root (initdb refuses root), through
/// `setpriv`, which execs without forking, so the child is the postmaster itself and it still
/// gets the parent-death signal. Killed, with all its backends, when dropped or when the test
/// process exits.
#[derive(Debug)]
pub struct Postgres {
    server: Server,
    bindir: PathBuf,
    setpriv: Option<PathBuf>,
    tls: Option<TlsFiles>,
}

impl Postgres {
    /// Starts a private server (for fault tests: kill it, pause it, restart it).
    ///
    /// # Errors
    /// A missing binary (naming the package), a failed `initdb`, or a server that does not
    /// answer `pg_isready` within 60 s (with the server's log tail).
    pub async fn start() -> KitResult<Postgres> {
        Self::start_inner(None).await
    }

    /// Starts a private server that also accepts TLS (`ssl=on`), with a server certificate for
    /// `127.0.0.1` and `localhost` signed by a fresh CA ([`Postgres::ca_cert`]), which it also
    /// trusts for client certificates (`ssl_ca_file`, for `cert` rules: see
    /// [`Postgres::prepend_hba`]). Plain connections are still accepted, so `sslmode` decides.
    ///
    /// # Errors
    /// As [`Postgres::start`], and [`TlsFiles::generate`] failing.
    pub async fn start_tls() -> KitResult<Postgres> {
        let files = TlsFiles::generate().await?;
        Self::start_inner(Some(files)).await
    }

    async fn start_inner(tls: Option<TlsFiles>) -> KitResult<Postgres> {
        let bindir = bindir()?;
        for tool in ["initdb", "postgres", "pg_isready", "psql"] {
            if !bindir.join(tool).exists() {
                return Err(KitError::missing(tool, PACKAGE));
            }
        }
        let setpriv = if running_as_root() {
            Some(find_binary("setpriv", "util-linux")?)
        } else {
            None
        };
        let server = Server::new("postgres", "postgres", "postgres.log", 0)?;
        let dir = server.dir();
        let owner = if running_as_root() {
            let (uid, gid) = system_user("postgres").ok_or_else(|| {
                KitError::new(
                    KitErrorKind::MissingBinary,
                    "system user `postgres` not found: install it with `apt-get install postgresql` or run scripts/install-deps",
                )
            })?;
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| KitError::io("cannot chown the postgres temp dir", e))?;
            Some((uid, gid))
        } else {
            None
        };
        if let Some(files) = &tls {
            // The server reads these as the `postgres` user, and refuses a key that others can
            // read.
            for (from, to) in [
                (files.server_cert(), "server.crt"),
                (files.server_key(), "server.key"),
                (files.ca_cert(), "ca.crt"),
            ] {
                let to = dir.join(to);
                std::fs::copy(&from, &to)
                    .map_err(|e| KitError::io("cannot copy the server certificate", e))?;
                std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .map_err(|e| KitError::io("cannot restrict the server key", e))?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid))
                        .map_err(|e| KitError::io("cannot chown the server certificate", e))?;
                }
            }
        }
        let pg = Postgres {
            server,
            bindir,
            setpriv,
            tls,
        };
        let mut initdb = pg.as_postgres(&pg.bindir.join("initdb"));
        initdb
            .arg("-D")
            .arg(pg.data_dir())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"])
            .args(["--no-sync", "--no-instructions"])
            .current_dir(pg.dir());
        run_command("initdb", initdb).await?;
        pg.server.first_boot(&pg).await?;
        Ok(pg)
    }

    /// The server shared by every test of this test process, started on first use.
    ///
    /// Use [`Postgres::create_database`] to isolate tests on it; never kill or pause it.
    ///
    /// # Errors
    /// As [`Postgres::start`]; a failed start is remembered and returned to every caller.
    pub async fn shared() -> KitResult<&'static Postgres> {
        static SHARED: OnceCell<Result<Postgres, KitError>> = OnceCell::const_new();
        SHARED
            .get_or_init(Self::start)
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `postgres://postgres@127.0.0.1:{port}/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port())
    }

    /// The CA that signed the server's certificate, for a server from [`Postgres::start_tls`].
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(TlsFiles::ca_cert)
    }

    /// The certificates of a server from [`Postgres::start_tls`] (to issue client certificates).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Puts `lines` at the top of `pg_hba.conf` (the first matching rule wins) and reloads the
    /// configuration.
    ///
    /// # Errors
    /// The file not writable, or the reload failing.
    pub async fn prepend_hba(&self, lines: &str) -> KitResult<()> {
        let path = self.data_dir().join("pg_hba.conf");
        let old = std::fs::read_to_string(&path)
            .map_err(|e| KitError::io("cannot read pg_hba.conf", e))?;
        std::fs::write(&path, format!("{}\n{old}", lines.trim_end()))
            .map_err(|e| KitError::io("cannot write pg_hba.conf", e))?;
        let reloaded = self.query("postgres", "SELECT pg_reload_conf()").await?;
        if reloaded.trim() != "t" {
            return Err(KitError::new(
                KitErrorKind::Command,
                format!("pg_reload_conf() returned {reloaded:?}"),
            ));
        }
        Ok(())
    }

    server_lifecycle!("server");

    /// Creates database `name` if it does not exist and returns its URL.
    ///
    /// Names are limited to ASCII letters, digits, `_` and `-` (up to 63 bytes).
    ///
    /// # Errors
    /// An invalid name, or `psql` failing.
    pub async fn create_database(&self, name: &str) -> KitResult<String> {
        valid_database_name(name, 63)?;
        let sql = format!("CREATE DATABASE \"{name}\"");
        match self.query("postgres", &sql).await {
            Ok(_) => {}
            Err(e) if e.message().contains("already exists") => {}
            Err(e) => return Err(e),
        }
        Ok(self.database_url(name))
    }

    /// Creates a database with a name unique in this test process (`{prefix}_{n}`) and returns
    /// its URL.
    ///
    /// # Errors
    /// As [`Postgres::create_database`].
    pub async fn fresh_database(&self, prefix: &str) -> KitResult<String> {
        self.create_database(&unique_name(prefix)).await
    }

    /// The URL of database `name` on this server.
    pub fn database_url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port())
    }

    /// Runs `sql` with `psql` in `database`; returns the unaligned, tuples-only output.
    ///
    /// # Errors
    /// `psql` failing (its stderr is in the message).
    pub async fn query(&self, database: &str, sql: &str) -> KitResult<String> {
        let mut psql = Command::new(self.bindir.join("psql"));
        psql.args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
        ])
        .arg("-p")
        .arg(self.port().to_string())
        .args(["-U", "postgres", "-d", database, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "10");
        run_command("psql", psql).await
    }

    fn data_dir(&self) -> PathBuf {
        self.dir().join("data")
    }

    fn as_postgres(&self, program: &Path) -> Command {
        match &self.setpriv {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
                    // Changing credentials clears the parent-death signal set in pre_exec.
                    .arg("--pdeathsig=SIGKILL");
                cmd.arg("--").arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }
}

impl Launch for Postgres {
    fn command(&self, server: &Server) -> KitResult<Command> {
        let dir = server.dir();
        let mut cmd = self.as_postgres(&self.bindir.join("postgres"));
        cmd.arg("-D")
            .arg(dir.join("data"))
            .arg("-k")
            .arg(dir)
            .arg("-p")
            .arg(server.port().to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=300", "-c", "shared_buffers=32MB"])
            .current_dir(dir);
        if self.tls.is_some() {
            let file = |name: &str| dir.join(name).display().to_string();
            cmd.args(["-c", "ssl=on"])
                .arg("-c")
                .arg(format!("ssl_cert_file={}", file("server.crt")))
                .arg("-c")
                .arg(format!("ssl_key_file={}", file("server.key")))
                .arg("-c")
                .arg(format!("ssl_ca_file={}", file("ca.crt")));
        }
        Ok(cmd)
    }

    async fn ready(&self, server: &Server) -> bool {
        let mut cmd = Command::new(self.bindir.join("pg_isready"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-t",
            "2",
        ])
        .arg("-p")
        .arg(server.port().to_string());
        probe_command(cmd, Duration::from_secs(5)).await
    }

    /// Our postmaster and its backends are dead and reaped; a stale lock file could otherwise
    /// name a pid that was reused meanwhile.
    fn before_restart(&self, server: &Server) {
        let _ = std::fs::remove_file(server.dir().join("data/postmaster.pid"));
    }
}

/// The PostgreSQL bin dir: the newest `/usr/lib/postgresql/*/bin`, else `postgres` on PATH.
fn bindir() -> KitResult<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("postgres").exists() && bin.join("initdb").exists()).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let postgres = find_binary("postgres", PACKAGE)?;
    let real = std::fs::canonicalize(&postgres).unwrap_or(postgres);
    real.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| KitError::missing("postgres", PACKAGE))
}
