//! A TCP proxy for one link that injects faults into live and new connections.
//!
//! The proxy runs on the kit's own tokio runtime (one worker thread for the whole process), not
//! on the test's: it keeps working while the test's runtime is blocked in a synchronous call,
//! and [`Proxy::set`] can wait until a fault has really been applied (existing connections reset
//! or closed, the listener closed) before it returns.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc as std_mpsc};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::error::{KitError, KitResult};
use super::{free_port, loopback};

/// A fault the proxy applies to both existing and new connections from the moment
/// [`Proxy::set`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Bytes flow unchanged.
    #[default]
    PassThrough,
    /// Every chunk of bytes is delivered this much later, in each direction (throughput is
    /// not limited; order is kept).
    Latency(Duration),
    /// Client-to-server bytes are still forwarded; server-to-client bytes are read and silently
    /// dropped (the server is never blocked). Like a network that loses every reply: a write
    /// reaches the server but the client never hears back. Dropped bytes are gone for good, so
    /// a connection that lived through a blackhole is out of sync afterwards.
    BlackholeReplies,
    /// Client-to-server bytes are read and dropped; server-to-client bytes still flow.
    BlackholeRequests,
    /// Existing connections are reset (RST, `SO_LINGER` 0) on both sides; new ones are accepted
    /// and reset at once.
    Reset,
    /// The listener is closed (new connections are refused) and existing connections are closed
    /// on both sides. Leaving `Down` listens on the same port again.
    Down,
}

impl Fault {
    fn drops(self, direction: Direction) -> bool {
        matches!(
            (self, direction),
            (Fault::BlackholeReplies, Direction::Reply)
                | (Fault::BlackholeRequests, Direction::Request)
        )
    }

    fn latency(self) -> Duration {
        match self {
            Fault::Latency(d) => d,
            _ => Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    /// Client to server.
    Request,
    /// Server to client.
    Reply,
}

enum Control {
    Set(Fault, std_mpsc::Sender<()>),
    SilenceExisting(std_mpsc::Sender<()>),
    Shutdown(std_mpsc::Sender<()>),
}

/// A fault-injecting TCP proxy in front of one upstream address, listening on a free loopback
/// port. Point the client at [`Proxy::addr`] instead of the server. Dropping it closes the
/// listener and every connection.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    upstream: SocketAddr,
    control: mpsc::UnboundedSender<Control>,
    connections: Arc<AtomicUsize>,
    fault: Mutex<Fault>,
}

fn kit_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dlock-kit-proxy")
            .enable_all()
            .build()
            .expect("dlock kit: cannot build the proxy runtime")
    })
}

fn bind(port: u16) -> std::io::Result<std::net::TcpListener> {
    // std sets SO_REUSEADDR on Unix, so closed connections in TIME_WAIT do not block a re-bind.
    let listener = std::net::TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

impl Proxy {
    /// Starts a proxy to `upstream` in [`Fault::PassThrough`].
    ///
    /// # Errors
    /// No free port could be bound.
    pub async fn start(upstream: SocketAddr) -> KitResult<Proxy> {
        let mut last_err = None;
        let mut bound = None;
        for _ in 0..10 {
            let port = free_port();
            match bind(port) {
                Ok(listener) => {
                    bound = Some((port, listener));
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let Some((port, listener)) = bound else {
            return Err(KitError::io(
                "proxy: cannot bind a free port",
                last_err.unwrap_or_else(|| std::io::Error::other("no port")),
            ));
        };
        let (control, control_rx) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        kit_runtime().spawn(run_proxy(
            listener,
            port,
            upstream,
            control_rx,
            Arc::clone(&connections),
        ));
        Ok(Proxy {
            port,
            upstream,
            control,
            connections,
            fault: Mutex::new(Fault::PassThrough),
        })
    }

    /// Where clients connect: `127.0.0.1:{port}`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The listening port (kept across [`Fault::Down`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server behind the proxy.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Switches to `fault` for existing and new connections. Returns once it is in force:
    /// after `Reset` or `Down` every connection that existed is already reset or closed, and
    /// after `Down` new connections are refused.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
        let (ack, acked) = std_mpsc::channel();
        if self.control.send(Control::Set(fault, ack)).is_ok() {
            // The proxy runs on the kit's runtime, so blocking this thread cannot stall it.
            let _ = acked.recv_timeout(Duration::from_secs(10));
        }
    }

    /// From now on drops, for good, the server-to-client bytes of every connection open now, as
    /// [`Fault::BlackholeReplies`] does; connections opened later pass through (under whatever
    /// [`Fault`] is set). This is a link that died silently under a client that can open new
    /// ones: a firewall or NAT dropping an idle connection, say.
    pub fn blackhole_existing_replies(&self) {
        let (ack, acked) = std_mpsc::channel();
        if self.control.send(Control::SilenceExisting(ack)).is_ok() {
            let _ = acked.recv_timeout(Duration::from_secs(10));
        }
    }

    /// The number of client connections currently open through the proxy.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let (ack, acked) = std_mpsc::channel();
        if self.control.send(Control::Shutdown(ack)).is_ok() {
            let _ = acked.recv_timeout(Duration::from_secs(10));
        }
    }
}

/// Counts an open client connection for as long as it lives.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(count))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept(listener: &Option<TcpListener>) -> std::io::Result<TcpStream> {
    match listener {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// Waits until every connection task ended (they end by themselves on `Reset` and `Down`).
async fn drain(tasks: &mut JoinSet<()>) {
    let all = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(5), all)
        .await
        .is_err()
    {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

async fn run_proxy(
    listener: std::net::TcpListener,
    port: u16,
    upstream: SocketAddr,
    mut control: mpsc::UnboundedReceiver<Control>,
    connections: Arc<AtomicUsize>,
) {
    let (faults, _) = watch::channel(Fault::PassThrough);
    let mut listener = match TcpListener::from_std(listener) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!("dlock kit proxy :{port}: cannot listen: {e}");
            None
        }
    };
    let mut tasks = JoinSet::new();
    // Connections are numbered as accepted; replies of those numbered below `silenced` are
    // dropped (`Proxy::blackhole_existing_replies`).
    let mut accepted_count = 0u64;
    let silenced = Arc::new(AtomicU64::new(0));
    loop {
        tokio::select! {
            command = control.recv() => match command {
                Some(Control::SilenceExisting(ack)) => {
                    silenced.store(accepted_count, Ordering::SeqCst);
                    let _ = ack.send(());
                }
                Some(Control::Set(fault, ack)) => {
                    faults.send_replace(fault);
                    match fault {
                        Fault::Down => {
                            listener = None;
                            drain(&mut tasks).await;
                        }
                        Fault::Reset => drain(&mut tasks).await,
                        _ => {
                            if listener.is_none() {
                                listener = relisten(port).await;
                            }
                        }
                    }
                    let _ = ack.send(());
                }
                Some(Control::Shutdown(ack)) => {
                    faults.send_replace(Fault::Down);
                    drop(listener.take());
                    drain(&mut tasks).await;
                    let _ = ack.send(());
                    return;
                }
                None => {
                    faults.send_replace(Fault::Down);
                    drain(&mut tasks).await;
                    return;
                }
            },
            accepted = accept(&listener) => match accepted {
                Ok(client) => {
                    let fault = *faults.borrow();
                    match fault {
                        Fault::Reset => {
                            let _ = client.set_zero_linger();
                            drop(client);
                        }
                        Fault::Down => drop(client),
                        _ => {
                            let counted = Counted::new(&connections);
                            let silent = Silenced {
                                id: accepted_count,
                                below: Arc::clone(&silenced),
                            };
                            accepted_count += 1;
                            tasks.spawn(connection(
                                client,
                                upstream,
                                faults.subscribe(),
                                silent,
                                counted,
                            ));
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!("dlock kit proxy :{port}: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

async fn relisten(port: u16) -> Option<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match bind(port).and_then(TcpListener::from_std) {
            Ok(listener) => return Some(listener),
            Err(e) if Instant::now() >= deadline => {
                tracing::error!("dlock kit proxy: cannot listen on port {port} again: {e}");
                return None;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    Reset,
    Close,
}

/// Resolves when the fault asks existing connections to go away.
async fn killed(faults: &mut watch::Receiver<Fault>) -> Kill {
    loop {
        match *faults.borrow_and_update() {
            Fault::Reset => return Kill::Reset,
            Fault::Down => return Kill::Close,
            _ => {}
        }
        if faults.changed().await.is_err() {
            return Kill::Close;
        }
    }
}

/// Whether a connection's replies are silenced (see `Proxy::blackhole_existing_replies`).
#[derive(Clone)]
struct Silenced {
    id: u64,
    below: Arc<AtomicU64>,
}

impl Silenced {
    fn drops(&self, direction: Direction) -> bool {
        matches!(direction, Direction::Reply) && self.id < self.below.load(Ordering::SeqCst)
    }
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut faults: watch::Receiver<Fault>,
    silenced: Silenced,
    _counted: Counted,
) {
    let _ = client.set_nodelay(true);
    let mut server = tokio::select! {
        connected = TcpStream::connect(upstream) => match connected {
            Ok(server) => server,
            Err(e) => {
                tracing::debug!("dlock kit proxy: upstream {upstream}: {e}");
                // The client sees the same as with a dead server: reset.
                let _ = client.set_zero_linger();
                return;
            }
        },
        kill = killed(&mut faults) => {
            if kill == Kill::Reset {
                let _ = client.set_zero_linger();
            }
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let requests = pump(
            client_read,
            server_write,
            faults.clone(),
            silenced.clone(),
            Direction::Request,
        );
        let replies = pump(
            server_read,
            client_write,
            faults.clone(),
            silenced,
            Direction::Reply,
        );
        tokio::select! {
            // A broken side (reset, error) breaks the other side too.
            done = async { tokio::try_join!(requests, replies) } => done.is_err(),
            kill = killed(&mut faults) => kill == Kill::Reset,
        }
    };
    if reset {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// Copies `from` to `to` chunk by chunk, applying the fault in force when a chunk is read
/// (blackhole, latency) and again when it is due (blackhole); propagates EOF as a half-close.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    faults: watch::Receiver<Fault>,
    silenced: Silenced,
    direction: Direction,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (queue, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(256);
    let read_side = async {
        let queue = queue;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            let fault = *faults.borrow();
            if fault.drops(direction) || silenced.drops(direction) {
                continue;
            }
            let at = Instant::now() + fault.latency();
            if queue.send((at, buf[..n].to_vec())).await.is_err() {
                return Ok(());
            }
        }
    };
    let write_side = async {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if faults.borrow().drops(direction) || silenced.drops(direction) {
                continue;
            }
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read_side, write_side).map(|_| ())
}
