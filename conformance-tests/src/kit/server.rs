//! [`Server`]: the one lifecycle every kit server shares (its child process, port, temp dir,
//! kill -9, pause, resume, restart, first boot on a free port), and [`Launch`], the two things a
//! kind of server says for itself: how to start it and how to tell that it answers.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};

use super::error::KitResult;
use super::host::{RunAs, Workdir};
use super::process::{Proc, boot};
use super::tls::TlsFiles;
use super::{first_boot, loopback};

/// What a kind of server (Redis, PostgreSQL, ...) tells [`Server`].
pub(crate) trait Launch: Sync {
    /// The command that runs the server on `server.port()`, with its files in `server.dir()`.
    fn command(&self, server: &Server) -> KitResult<Command>;

    /// Whether the server answers (polled after each start until it does).
    fn ready<'a>(&'a self, server: &'a Server) -> impl Future<Output = bool> + Send + 'a;

    /// Runs after a kill -9 and before the restart (e.g. a stale pid file to remove).
    fn before_restart(&self, _server: &Server) {}
}

/// One server process of the kit's own: the child, its loopback port (the same across
/// restarts), its temp dir, and a lock that keeps restarts from overlapping. Killed, reaped and
/// its dir removed when dropped.
#[derive(Debug)]
pub struct Server {
    proc: Proc,
    port: AtomicU16,
    lifecycle: tokio::sync::Mutex<()>,
    dir: Workdir,
}

impl Server {
    /// A server not yet started: a temp dir named after `kind`, the child's output going to
    /// `<dir>/<log>`, shown in messages as `label`. `port` 0 picks a free port at first boot.
    pub(crate) fn new(
        kind: &str,
        label: impl Into<String>,
        log: &str,
        port: u16,
    ) -> KitResult<Self> {
        let dir = Workdir::new(kind)?;
        Ok(Server {
            proc: Proc::new(label, dir.path().join(log)),
            port: AtomicU16::new(port),
            lifecycle: tokio::sync::Mutex::new(()),
            dir,
        })
    }

    /// As [`Server::new`] on a free port, for a server that runs as `run_as`: its temp dir is
    /// handed to that account, with `tls`'s server certificate, key and CA in it (see
    /// [`TlsFiles::install_server_files`]).
    pub(crate) fn for_account(
        kind: &str,
        label: impl Into<String>,
        log: &str,
        run_as: &RunAs,
        tls: Option<&TlsFiles>,
    ) -> KitResult<Self> {
        let server = Self::new(kind, label, log, 0)?;
        run_as.give(server.dir())?;
        if let Some(files) = tls {
            files.install_server_files(server.dir(), run_as)?;
        }
        Ok(server)
    }

    /// The TCP port (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// `127.0.0.1:{port}`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port())
    }

    /// The server's temp dir (data, config, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILLs the server and every process it started (a crash); connections fail at once.
    pub fn kill9(&self) {
        self.proc.kill9();
    }

    /// SIGSTOPs the server and its processes: connections hang, nothing is refused.
    pub fn pause(&self) {
        self.proc.signal_tree(libc::SIGSTOP);
    }

    /// SIGCONTs what [`Server::pause`] stopped.
    pub fn resume(&self) {
        self.proc.signal_tree(libc::SIGCONT);
    }

    /// The first start: on a free port (or the one given to [`Server::new`]), trying up to
    /// three ports when another process takes one first.
    pub(crate) async fn first_boot(&self, launch: &impl Launch) -> KitResult<()> {
        if self.port() != 0 {
            return self.boot(launch, false).await;
        }
        first_boot(&self.port, || self.boot(launch, false)).await
    }

    /// Kills the server if it runs and starts it again on the same port and data, waiting
    /// until it answers.
    pub(crate) async fn restart(&self, launch: &impl Launch) -> KitResult<()> {
        let _lifecycle = self.lifecycle.lock().await;
        self.proc.kill9();
        launch.before_restart(self);
        self.boot(launch, true).await
    }

    /// Starts the process once without waiting for it (an ensemble starts every member before
    /// any can answer).
    pub(crate) fn spawn(&self, launch: &impl Launch) -> KitResult<()> {
        self.proc.spawn(launch.command(self)?)
    }

    /// The exit status, if the process has exited (reaping it).
    pub(crate) fn exited(&self) -> Option<std::process::ExitStatus> {
        self.proc.exited()
    }

    /// The last lines of the server's log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        self.proc.log_tail()
    }

    async fn boot(&self, launch: &impl Launch, retry_on_exit: bool) -> KitResult<()> {
        boot(
            &self.proc,
            self.port(),
            retry_on_exit,
            || self.proc.spawn(launch.command(self)?),
            || launch.ready(self),
        )
        .await
    }
}

/// The lifecycle methods of a kind that keeps its [`Server`] in a field named `server` and
/// implements [`Launch`]: `port`, `addr`, `dir`, `kill9`, `pause`, `resume`, `restart`.
macro_rules! server_lifecycle {
    ($what:literal) => {
        #[doc = concat!("The TCP port of the ", $what, " (the same across restarts).")]
        pub fn port(&self) -> u16 {
            self.server.port()
        }

        /// `127.0.0.1:{port}`.
        pub fn addr(&self) -> std::net::SocketAddr {
            self.server.addr()
        }

        #[doc = concat!("The ", $what, "'s temp dir (data, config, log).")]
        pub fn dir(&self) -> &std::path::Path {
            self.server.dir()
        }

        #[doc = concat!("SIGKILLs the ", $what, " and every process it started; connections fail at once.")]
        pub fn kill9(&self) {
            self.server.kill9();
        }

        #[doc = concat!("SIGSTOPs the ", $what, ": connections hang, nothing is refused.")]
        pub fn pause(&self) {
            self.server.pause();
        }

        #[doc = concat!("SIGCONTs the ", $what, " after `pause`.")]
        pub fn resume(&self) {
            self.server.resume();
        }

        #[doc = concat!("Starts the ", $what, " again on the same port and data (killing it first if it runs) and waits until it answers.")]
        ///
        /// # Errors
        /// A server that does not answer within the kit's 60 s start-up timeout.
        pub async fn restart(&self) -> $crate::kit::KitResult<()> {
            self.server.restart(self).await
        }
    };
}

pub(crate) use server_lifecycle;
