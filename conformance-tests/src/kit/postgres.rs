//! A private PostgreSQL server: `initdb` + `postgres` as the `postgres` OS user.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::error::{KitError, KitErrorKind, KitResult};
use super::host::{RunAs, find_binary, password, probe_command, run_command, write_private};
use super::server::{Launch, Server, server_lifecycle};
use super::tls::TlsFiles;
use super::{unique_name, valid_database_name};

const PACKAGE: &str = "postgresql";

/// A PostgreSQL server of the kit's own: a fresh cluster in a 0700 temp dir, on a free port of
/// 127.0.0.1, its socket in that dir; every connection authenticates with a password
/// (`scram-sha-256`), and the superuser `postgres` has the kit's ([`Postgres::password`]), which
/// [`Postgres::url`] carries; `fsync=off` (a killed process loses nothing the OS already has,
/// which is all a kill -9 test needs), set in `postgresql.conf` so that a benchmark can turn it
/// back on with `ALTER SYSTEM` and a reload.
///
/// Started as the `postgres` OS user when the tests run as root (initdb refuses root), through
/// `setpriv`, which execs without forking, so the child is the postmaster itself and it still
/// gets the parent-death signal. Killed, with all its backends, when dropped or when the test
/// process exits.
#[derive(Debug)]
pub struct Postgres {
    server: Server,
    bindir: PathBuf,
    run_as: RunAs,
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
        let run_as = RunAs::server_account("postgres", PACKAGE)?;
        let server = Server::for_account(
            "postgres",
            "postgres",
            "postgres.log",
            &run_as,
            tls.as_ref(),
        )?;
        let dir = server.dir();
        // The superuser's password reaches initdb in a file only the server's account reads.
        let pwfile = dir.join("superuser.pw");
        write_private(&pwfile, &scram_secret(password()), &run_as)?;
        let pg = Postgres {
            server,
            bindir,
            run_as,
            tls,
        };
        let mut initdb = pg.run_as.command(&pg.bindir.join("initdb"));
        initdb
            .arg("-D")
            .arg(pg.data_dir())
            .args(["-U", "postgres", "-A", "scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args([
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
                "--no-instructions",
            ])
            .current_dir(pg.dir());
        let initialised = run_command("initdb", initdb).await;
        let _ = std::fs::remove_file(&pwfile);
        initialised?;
        let conf = pg.data_dir().join("postgresql.conf");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut f| f.write_all(b"fsync = off\nfull_page_writes = off\n"))
            .map_err(|e| {
                KitError::new(
                    KitErrorKind::Io,
                    format!("cannot write {}: {e}", conf.display()),
                )
            })?;
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

    /// `postgres://postgres:{password}@127.0.0.1:{port}/postgres`.
    pub fn url(&self) -> String {
        self.database_url("postgres")
    }

    /// The password of the superuser `postgres` (the kit's [`super::password`]).
    pub fn password(&self) -> &'static str {
        password()
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

    /// The URL of database `name` on this server, as the superuser with its password.
    pub fn database_url(&self, name: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{name}",
            self.password(),
            self.port()
        )
    }

    /// Runs `sql` with `psql` as the superuser in `database` (the password in psql's
    /// environment, which other users cannot read); returns the unaligned, tuples-only output.
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
        .env("PGPASSWORD", self.password())
        .env("PGCONNECT_TIMEOUT", "10");
        run_command("psql", psql).await
    }

    fn data_dir(&self) -> PathBuf {
        self.dir().join("data")
    }
}

impl Launch for Postgres {
    fn command(&self, server: &Server) -> KitResult<Command> {
        let dir = server.dir();
        let mut cmd = self.run_as.command(&self.bindir.join("postgres"));
        cmd.arg("-D")
            .arg(dir.join("data"))
            .arg("-k")
            .arg(dir)
            .args(["-c", "unix_socket_permissions=0700"])
            .arg("-p")
            .arg(server.port().to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
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

/// PostgreSQL's stored form of `password` for `scram-sha-256` (RFC 5802 and 7677), with one
/// iteration instead of the default 4096: each login then costs the client one HMAC, not 4096
/// (75 ms a connection in an unoptimised test build, enough to miss a fault test's short
/// timeouts). Iterations only slow the guessing of a weak password; the kit's is 128 random
/// bits. Given to initdb as the password, it is stored as it is.
fn scram_secret(password: &str) -> String {
    use sha2::{Digest as _, Sha256};
    let salt: [u8; 16] = rand::random();
    let salted = hmac_sha256(
        password.as_bytes(),
        &[&salt[..], &1u32.to_be_bytes()].concat(),
    );
    let stored_key = Sha256::digest(hmac_sha256(&salted, b"Client Key"));
    let server_key = hmac_sha256(&salted, b"Server Key");
    format!(
        "SCRAM-SHA-256$1:{}${}:{}",
        base64(&salt),
        base64(&stored_key),
        base64(&server_key)
    )
}

/// HMAC-SHA-256 (RFC 2104) for keys of up to one block (64 bytes).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    assert!(key.len() <= 64, "an HMAC key longer than a block");
    let pad = |byte: u8| -> Vec<u8> {
        let mut block = [byte; 64];
        block.iter_mut().zip(key).for_each(|(b, k)| *b ^= k);
        block.to_vec()
    };
    let inner = Sha256::digest([pad(0x36), message.to_vec()].concat());
    Sha256::digest([pad(0x5c), inner.to_vec()].concat()).into()
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_and_base64_match_their_rfc_vectors() {
        // RFC 4231, test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // RFC 4648, section 10.
        for (plain, encoded) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v")] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
