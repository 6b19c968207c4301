//! A private MariaDB server: `mariadb-install-db` + `mariadbd`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::error::{KitError, KitResult};
use super::host::{RunAs, find_any_binary, password, probe_command, run_command, write_private};
use super::server::{Launch, Server, server_lifecycle};
use super::tls::TlsFiles;
use super::{unique_name, valid_database_name};

const SERVER_PACKAGE: &str = "mariadb-server";
const CLIENT_PACKAGE: &str = "mariadb-client";

/// A MariaDB server of the kit's own: a fresh data dir in a 0700 temp dir, on a free port of
/// 127.0.0.1, the socket in that dir; `root` (every host of it) has the kit's password
/// ([`MariaDb::password`]), which [`MariaDb::url`] carries, and no account logs in without a
/// password (real grant tables, so tests can create users); a `test` database; `--no-defaults`
/// so no system config is read; `LOAD DATA` and `INTO OUTFILE` only in the temp dir.
///
/// Runs as the `mysql` OS user when the tests run as root, through `setpriv` (as PostgreSQL
/// does), so that what the server writes is never root's.
///
/// Server defaults follow Debian's packaged config (`utf8mb4`, `utf8mb4_general_ci`), so
/// behaviour matches a typical installation; `innodb_flush_log_at_trx_commit=2` (a killed
/// process loses nothing the OS already has).
#[derive(Debug)]
pub struct MariaDb {
    server: Server,
    mariadbd: PathBuf,
    client: PathBuf,
    admin: PathBuf,
    run_as: RunAs,
    tls: Option<TlsFiles>,
}

impl MariaDb {
    /// Starts a private server (for fault tests: kill it, pause it, restart it).
    ///
    /// # Errors
    /// A missing binary (naming the package), a failed `mariadb-install-db`, or a server that
    /// does not answer within 60 s (with the server's log tail).
    pub async fn start() -> KitResult<MariaDb> {
        Self::start_inner(None).await
    }

    /// Starts a private server that also accepts TLS, with a server certificate for
    /// `127.0.0.1` and `localhost` signed by a fresh CA ([`MariaDb::tls`]), which it also trusts
    /// for client certificates (`REQUIRE X509` accounts). Plain connections are still accepted
    /// unless an account says `REQUIRE SSL`.
    ///
    /// # Errors
    /// As [`MariaDb::start`], and [`TlsFiles::generate`] failing.
    pub async fn start_tls() -> KitResult<MariaDb> {
        let files = TlsFiles::generate().await?;
        Self::start_inner(Some(files)).await
    }

    async fn start_inner(tls: Option<TlsFiles>) -> KitResult<MariaDb> {
        let mariadbd = find_any_binary(&["mariadbd", "mysqld"], SERVER_PACKAGE)?;
        let install = find_any_binary(&["mariadb-install-db", "mysql_install_db"], SERVER_PACKAGE)?;
        let client = find_any_binary(&["mariadb", "mysql"], CLIENT_PACKAGE)?;
        let admin = find_any_binary(&["mariadb-admin", "mysqladmin"], CLIENT_PACKAGE)?;
        let run_as = RunAs::server_account("mysql", SERVER_PACKAGE)?;
        let server =
            Server::for_account("mariadb", "mariadbd", "mariadb.log", &run_as, tls.as_ref())?;
        let dir = server.dir();
        let files = dir.join("files");
        std::fs::create_dir(&files)
            .map_err(|e| KitError::io("cannot create the server's file dir", e))?;
        run_as.give(&files)?;
        // The bootstrap makes root password-less on localhost, 127.0.0.1, ::1 and the host's
        // name (and `mariadb.sys`, locked); before the server first listens, every root gets
        // the kit's password. The file holding it is the server account's alone.
        let init = dir.join("root-password.sql");
        write_private(
            &init,
            &format!(
                "UPDATE mysql.global_priv SET priv = JSON_SET(priv, \
                 '$.plugin', 'mysql_native_password', \
                 '$.authentication_string', PASSWORD('{}')) WHERE User = 'root';\n",
                password()
            ),
            &run_as,
        )?;
        let db = MariaDb {
            server,
            mariadbd,
            client,
            admin,
            run_as,
            tls,
        };
        let mut cmd = db.run_as.command(&install);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", db.data_dir().display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg("--skip-name-resolve")
            .arg(format!("--extra-file={}", init.display()))
            // Concurrent bootstraps sharing /tmp trip over each other's temp tables.
            .env("TMPDIR", db.dir())
            .current_dir(db.dir());
        let installed = run_command("mariadb-install-db", cmd).await;
        let _ = std::fs::remove_file(&init);
        installed?;
        db.server.first_boot(&db).await?;
        db.query("mysql", "CREATE DATABASE IF NOT EXISTS `test`")
            .await?;
        Ok(db)
    }

    /// The server shared by every test of this test process, started on first use.
    ///
    /// Use [`MariaDb::create_database`] to isolate tests on it; never kill or pause it.
    ///
    /// # Errors
    /// As [`MariaDb::start`]; a failed start is remembered and returned to every caller.
    pub async fn shared() -> KitResult<&'static MariaDb> {
        static SHARED: OnceCell<Result<MariaDb, KitError>> = OnceCell::const_new();
        SHARED
            .get_or_init(Self::start)
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `mysql://root:{password}@127.0.0.1:{port}/test`.
    pub fn url(&self) -> String {
        self.database_url("test")
    }

    /// The password of `root` (the kit's [`super::password`]).
    pub fn password(&self) -> &'static str {
        password()
    }

    /// The URL of database `name` on this server, as root with its password.
    pub fn database_url(&self, name: &str) -> String {
        format!(
            "mysql://root:{}@127.0.0.1:{}/{name}",
            self.password(),
            self.port()
        )
    }

    /// The CA that signed the server's certificate, for a server from [`MariaDb::start_tls`].
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(TlsFiles::ca_cert)
    }

    /// The certificates of a server from [`MariaDb::start_tls`] (to issue client certificates).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    server_lifecycle!("server");

    /// Creates database `name` if it does not exist and returns its URL.
    ///
    /// Names are limited to ASCII letters, digits, `_` and `-` (up to 64 bytes).
    ///
    /// # Errors
    /// An invalid name, or the `mariadb` client failing.
    pub async fn create_database(&self, name: &str) -> KitResult<String> {
        valid_database_name(name, 64)?;
        self.query("mysql", &format!("CREATE DATABASE IF NOT EXISTS `{name}`"))
            .await?;
        Ok(self.database_url(name))
    }

    /// Creates a database with a name unique in this test process (`{prefix}_{n}`) and returns
    /// its URL.
    ///
    /// # Errors
    /// As [`MariaDb::create_database`].
    pub async fn fresh_database(&self, prefix: &str) -> KitResult<String> {
        self.create_database(&unique_name(prefix)).await
    }

    /// Runs `sql` with the `mariadb` client as root over TCP in `database` (the password in
    /// the client's environment, which other users cannot read); returns the tab-separated rows
    /// without column names.
    ///
    /// # Errors
    /// The client failing (its stderr is in the message).
    pub async fn query(&self, database: &str, sql: &str) -> KitResult<String> {
        let mut cmd = Command::new(&self.client);
        cmd.args(["--no-defaults", "--protocol=tcp", "-h", "127.0.0.1"])
            .arg(format!("-P{}", self.port()))
            .args([
                "-uroot",
                "--connect-timeout=10",
                "-N",
                "-B",
                "-D",
                database,
                "-e",
                sql,
            ])
            .env("MYSQL_PWD", self.password());
        run_command("mariadb", cmd).await
    }

    fn data_dir(&self) -> PathBuf {
        self.dir().join("data")
    }
}

impl Launch for MariaDb {
    fn command(&self, server: &Server) -> KitResult<Command> {
        let dir = server.dir();
        let mut cmd = self.run_as.command(&self.mariadbd);
        // --no-defaults must come first.
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
            .arg(format!("--tmpdir={}", dir.display()))
            .arg(format!(
                "--secure-file-priv={}",
                dir.join("files").display()
            ))
            .arg(format!("--port={}", server.port()))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .args([
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
            ])
            .args([
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-buffer-pool-size=64M",
            ])
            .args(["--max-connections=500", "--skip-log-bin"])
            .current_dir(dir);
        if self.tls.is_some() {
            cmd.arg(format!("--ssl-cert={}", dir.join("server.crt").display()))
                .arg(format!("--ssl-key={}", dir.join("server.key").display()))
                .arg(format!("--ssl-ca={}", dir.join("ca.crt").display()));
        }
        Ok(cmd)
    }

    async fn ready(&self, server: &Server) -> bool {
        let mut cmd = Command::new(&self.admin);
        cmd.args(["--no-defaults", "--protocol=tcp", "-h", "127.0.0.1"])
            .arg(format!("-P{}", server.port()))
            .args(["-uroot", "--connect-timeout=2", "ping"])
            .env("MYSQL_PWD", self.password());
        probe_command(cmd, Duration::from_secs(5)).await
    }
}
