//! `dlock run`: hold a lock while a command runs.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{
    AcquireOptions, DistributedLock, LockGuard, LockName, LostReason, PermitGuard, ReadGuard,
    ReadWriteExt, Released, SemaphoreExt, Wait, redact,
};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use std::ffi::OsString;

use clap::Args;

use crate::args::{parse_duration, parse_permits, parse_ttl, parse_wait};
use crate::store::StoreArg;
use crate::{exit, store, sys};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) store: StoreArg,

    /// Lock name (any UTF-8 up to 1024 bytes without NUL; case-sensitive).
    #[arg(long, value_name = "NAME")]
    pub(crate) name: String,

    /// Lease ttl, 10ms ..= 7d; renewed at ttl/3 while the command runs [default: the URL's ttl
    /// option, else 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
    pub(crate) ttl: Option<Duration>,

    /// How long to wait for a lock held by someone else: 0, a duration (10s, 500ms) or forever.
    #[arg(long, value_name = "0|DURATION|forever", default_value = "forever", value_parser = parse_wait)]
    pub(crate) wait: Wait,

    /// Take one of N permits of the semaphore NAME instead of the lock: at most N commands run
    /// at once. The semaphore is apart from the lock of the same name; every holder must give
    /// the same N while any holds or waits. DLOCK_FENCING_TOKEN is the permit's own token.
    #[arg(long, value_name = "N", value_parser = parse_permits, conflicts_with = "shared")]
    pub(crate) permits: Option<u32>,

    /// Take the read (shared) side of the read-write lock NAME: readers run together, while a
    /// plain `dlock run` on NAME (the write side) runs alone; a reader that arrives after a
    /// queued writer waits for it.
    #[arg(long)]
    pub(crate) shared: bool,

    /// After SIGTERM, how long the command has before SIGKILL. When the lease cannot be renewed,
    /// dlock sends SIGTERM so that SIGKILL still lands before the lease ends: the grace is then
    /// at most a third of the ttl (less a tenth of it, at most 100 ms, for the kill), and the
    /// SIGTERM goes out that long before the end. A lock lost outright (taken by another owner,
    /// or dlock frozen past its lease) gets the command SIGKILL at once. Both reach the
    /// processes the command started too.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub(crate) grace: Duration,

    /// The command and its arguments (put them after `--`; a flag before `--` that dlock does
    /// not know is an error, not the command).
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true)]
    pub(crate) command: Vec<OsString>,
}

/// SIGINT, SIGTERM and SIGHUP as one stream. Once created, these no longer kill dlock: every
/// path handles them and releases the lock.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received (cancel safe).
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGKILL => "SIGKILL",
        _ => "signal",
    }
}

fn show(d: Duration) -> String {
    // Whole milliseconds are enough for people.
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
    .to_string()
}

fn display_command(args: &RunArgs) -> String {
    args.command
        .first()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Entry point; returns the process exit code.
pub async fn main(args: RunArgs) -> u8 {
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dlock: cannot install signal handlers: {e}");
            return exit::SOFTWARE;
        }
    };
    let name = match LockName::new(&args.name) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("dlock: {e}");
            return exit::USAGE;
        }
    };
    let url = match store::resolve(args.store.url.clone()) {
        Ok(u) => u,
        Err(code) => return code,
    };
    if let Err(code) = check_primitive(&url, &args) {
        return code;
    }

    // Connect and acquire; a signal while waiting ends dlock without running anything (the
    // acquire future is dropped, which leaves no lock or queue entry behind).
    let setup = acquire(&url, &name, &args);
    let guard = tokio::select! {
        r = setup => match r {
            Ok(guard) => guard,
            Err(code) => return code,
        },
        sig = signals.recv() => {
            eprintln!("dlock: got {} while waiting for {}; nothing was run", signal_name(sig), what(&args));
            return exit::for_signal(sig);
        }
    };
    let token = guard.fencing_token();
    tracing::info!(lock = %name, token = token.0, "lock acquired; starting the command");

    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("DLOCK_FENCING_TOKEN", token.0.to_string())
        .env("DLOCK_LOCK_NAME", name.as_str());
    sys::die_with_dlock(&mut command);
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            eprintln!("dlock: cannot run `{}`: {e}", display_command(&args));
            release(guard, &what(&args), false).await;
            return code;
        }
    };

    let outcome = supervise(child, &guard, &mut signals, &args).await;
    let released_ok = release(guard, &what(&args), outcome.lost.is_some()).await;

    if let Some(reason) = outcome.lost {
        tracing::debug!(%reason, "exiting after losing the lock");
        return exit::LOST;
    }
    if !released_ok {
        eprintln!(
            "dlock: {} was no longer held when `{}` finished; it may have run without the access it asked for",
            what(&args),
            display_command(&args)
        );
        return exit::LOST;
    }
    // Once the command ran, its own status is dlock's, whatever signal came: a Ctrl-C at the
    // terminal reaches dlock and the command at once, so "who saw it first" must not decide.
    if let Some(sig) = outcome.signal {
        tracing::debug!(
            signal = signal_name(sig),
            "interrupted; exiting with the command's status"
        );
    }
    match outcome.status {
        Some(status) => status_code(status),
        None => exit::SOFTWARE,
    }
}

/// What `args` asks to hold, for messages.
fn what(args: &RunArgs) -> String {
    match (args.permits, args.shared) {
        (Some(n), _) => format!("a permit of semaphore {:?} ({n} permits)", args.name),
        (None, true) => format!("a read (shared) hold on lock {:?}", args.name),
        (None, false) => format!("lock {:?}", args.name),
    }
}

/// Refuses `--permits` or `--shared` on a store that has no semaphores or read-write locks,
/// from the URL alone (before any I/O).
fn check_primitive(url: &str, args: &RunArgs) -> Result<(), u8> {
    if args.permits.is_none() && !args.shared {
        return Ok(());
    }
    let native = dlock::native_primitives(url).map_err(|e| {
        eprintln!("dlock: {e}");
        exit::for_error(&e)
    })?;
    let (flag, supported, what) = if args.permits.is_some() {
        ("--permits", native.semaphore, "semaphores")
    } else {
        ("--shared", native.read_write, "read-write locks")
    };
    if supported {
        return Ok(());
    }
    let scheme = dlock::scheme_of(url).unwrap_or_default();
    // The schemes that do, read the same way (a scheme whose URL needs more, dual://, is left
    // out).
    let has = |n: dlock::NativePrimitives| {
        if args.permits.is_some() {
            n.semaphore
        } else {
            n.read_write
        }
    };
    let others: Vec<&str> = dlock::schemes()
        .into_iter()
        .filter(|s| dlock::native_primitives(&format!("{s}://localhost/x")).is_ok_and(has))
        .collect();
    eprintln!(
        "dlock: {flag}: the {scheme}:// store has no {what}; these have them: {}",
        others.join(", ")
    );
    Err(exit::USAGE)
}

/// Connects and acquires, printing the reason and returning the exit code on failure.
async fn acquire(url: &str, name: &LockName, args: &RunArgs) -> Result<LockGuard, u8> {
    // `--ttl` is also the connection's default ttl: on a session store (ZooKeeper) the session
    // timeout follows it unless the URL sets `session_timeout`, so that one process holding one
    // lock loses it about a ttl after it dies, as on every other store.
    let mut config = dlock::LockConfig::new(url);
    if let Some(ttl) = args.ttl {
        config = config.ttl(ttl);
    }
    let backend = match dlock::connect_config(&config).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("dlock: cannot connect to {}: {e}", redact(url));
            return Err(exit::for_error(&e));
        }
    };
    let capabilities = backend.capabilities();
    if let (Some(session), Some(ttl)) = (capabilities.session_timeout, args.ttl)
        && session.abs_diff(ttl) > Duration::from_millis(1)
    {
        eprintln!(
            "dlock: note: {} gave this client a session timeout of {} for --ttl {} (the URL's \
             session_timeout, or the server's minimum/maximum session timeout, decides): if \
             dlock dies, the lock is freed about {} later",
            capabilities.backend,
            show(session),
            show(ttl),
            show(session)
        );
    }
    let mut opts = AcquireOptions::new().wait(args.wait);
    if let Some(ttl) = args.ttl {
        opts = opts.ttl(ttl);
    }
    // A timeout is "busy" (exit 75), as for the lock.
    let in_time = |r: dlock::Result<LockGuard>| match r {
        Ok(guard) => Ok(Some(guard)),
        Err(dlock::Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    };
    let acquired = match (args.permits, args.shared) {
        (Some(n), _) => match backend.semaphore(name.as_str(), n) {
            Ok(semaphore) => in_time(semaphore.acquire(&opts).await.map(PermitGuard::into_inner)),
            Err(e) => Err(e),
        },
        (None, true) => in_time(
            backend
                .read_lock(name.as_str(), &opts)
                .await
                .map(ReadGuard::into_inner),
        ),
        (None, false) => dlock::backend_support::acquire(&backend, name, &opts).await,
    };
    match acquired {
        Ok(Some(guard)) => Ok(guard),
        Ok(None) => {
            let busy = match args.permits {
                Some(_) => busy_permits_message(&backend, name, args).await,
                None => busy_message(&backend, name, args.wait).await,
            };
            eprintln!("{busy}");
            Err(exit::TEMPFAIL)
        }
        Err(e) => {
            eprintln!(
                "dlock: cannot acquire {} at {}: {e}",
                what(args),
                redact(url)
            );
            Err(exit::for_error(&e))
        }
    }
}

/// One line saying every permit is taken, with the holders' tokens when the store can tell
/// quickly.
async fn busy_permits_message(
    backend: &Arc<dyn DistributedLock>,
    name: &LockName,
    args: &RunArgs,
) -> String {
    let inspect = backend.inspect_semaphore(name);
    let holders = match tokio::time::timeout(Duration::from_secs(2), inspect).await {
        Ok(Ok(Some(info))) if !info.holders.is_empty() => {
            let tokens: Vec<String> = info.holders.iter().map(|h| h.token.to_string()).collect();
            format!(" (held with tokens {})", tokens.join(", "))
        }
        _ => String::new(),
    };
    format!(
        "dlock: every permit of semaphore {:?} is taken{holders}; {}",
        name.as_str(),
        waited(args.wait)
    )
}

/// How the wait ended, for "busy" messages.
fn waited(wait: Wait) -> String {
    match wait {
        Wait::No => "did not wait (--wait 0)".to_owned(),
        Wait::For(d) => format!("not acquired within {}", show(d)),
        Wait::Forever => "gave up".to_owned(),
    }
}

/// One line saying the lock is busy, with the holder's token and time left when the store can
/// tell quickly.
async fn busy_message(backend: &Arc<dyn DistributedLock>, name: &LockName, wait: Wait) -> String {
    let waited = waited(wait);
    let holder = match tokio::time::timeout(Duration::from_secs(2), backend.inspect(name)).await {
        Ok(Ok(Some(info))) if info.is_held() => {
            let mut parts = Vec::new();
            if let Some(token) = info.token {
                parts.push(format!("token {token}"));
            }
            if let Some(left) = info.remaining {
                parts.push(format!("{:.1}s left", left.as_secs_f64()));
            }
            if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join(", "))
            }
        }
        _ => String::new(),
    };
    format!(
        "dlock: lock {:?} is held by another owner{holder}; {waited}",
        name.as_str()
    )
}

struct Outcome {
    /// The command's exit status (`None` only if waiting for it failed).
    status: Option<ExitStatus>,
    /// Set when the lock was lost while the command ran.
    lost: Option<LostReason>,
    /// The first terminating signal dlock received.
    signal: Option<i32>,
}

/// How long before the lease's end the command must be dead: SIGKILL goes out then at the
/// latest. A tenth of the ttl, at most 100 ms.
fn kill_margin(ttl: Duration) -> Duration {
    (ttl / 10).min(Duration::from_millis(100))
}

/// How long a command gets between SIGTERM and SIGKILL when the lock cannot be kept: `grace`,
/// cut so that the SIGTERM goes out no earlier than a third of the ttl before the lease's end
/// (while renewals succeed, more than that is always left, so it never fires then) and the
/// SIGKILL before the end.
fn lease_grace(grace: Duration, ttl: Duration) -> Duration {
    grace.min((ttl / 3).saturating_sub(kill_margin(ttl)))
}

/// Waits for the child while watching the lease and dlock's signals.
///
/// When renewals fail, the command gets SIGTERM once [`lease_grace`] and [`kill_margin`] are
/// all that is left of the lease, and SIGKILL [`kill_margin`] before its end; a lock that is
/// lost outright (taken, or dlock itself was frozen past the lease) kills it at once. Both go to
/// the processes the command started as well ([`sys::signal_tree`], [`sys::kill_tree`]).
async fn supervise(
    mut child: Child,
    guard: &LockGuard,
    signals: &mut Signals,
    args: &RunArgs,
) -> Outcome {
    let watch = guard.watch();
    let ttl = watch.lease().ttl();
    let (kill_margin, grace) = (kill_margin(ttl), lease_grace(args.grace, ttl));
    let lost = watch.lost();
    let ending = watch.expiring(grace + kill_margin);
    let end = watch.expiring(kill_margin);
    tokio::pin!(lost, ending, end);
    let mut outcome = Outcome {
        status: None,
        lost: None,
        signal: None,
    };
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let pid = child.id();
    let program = display_command(args);
    let left = || show(watch.deadline().saturating_duration_since(Instant::now()));
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                match status {
                    Ok(s) => outcome.status = Some(s),
                    Err(e) => eprintln!("dlock: waiting for `{program}` failed: {e}"),
                }
                return outcome;
            }
            reason = &mut lost, if !killed => {
                outcome.lost.get_or_insert(reason);
                eprintln!(
                    "dlock: lost {} while `{program}` was running: {reason}; sending it SIGKILL",
                    what(args)
                );
                kill(&child);
                killed = true;
            }
            reason = &mut end, if !killed => {
                outcome.lost.get_or_insert(reason);
                eprintln!(
                    "dlock: {} ends in {} ({reason}) and `{program}` is still running; sending it SIGKILL",
                    what(args),
                    left()
                );
                kill(&child);
                killed = true;
            }
            reason = &mut ending, if outcome.lost.is_none() => {
                outcome.lost = Some(reason);
                eprintln!(
                    "dlock: cannot keep {} ({reason}); it ends in {}: sending `{program}` SIGTERM (SIGKILL in {})",
                    what(args),
                    left(),
                    show(grace)
                );
                terminate(&child, libc::SIGTERM, true);
                let at = Instant::now() + grace;
                kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
            }
            sig = signals.recv() => {
                outcome.signal.get_or_insert(sig);
                if sig == libc::SIGINT && sys::in_terminal_foreground() {
                    tracing::info!("SIGINT from the terminal already reached the command; not forwarding");
                } else {
                    tracing::info!(signal = signal_name(sig), ?pid, "forwarding to the command");
                    terminate(&child, sig, false);
                }
                kill_at.get_or_insert(Instant::now() + args.grace);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or(far).into()), if kill_at.is_some() && !killed => {
                eprintln!("dlock: `{program}` did not exit after SIGTERM; sending SIGKILL");
                kill(&child);
                killed = true;
                kill_at = None;
            }
        }
    }
}

/// Sends `signal` to the child unless it has already been reaped; with `tree`, to the processes
/// it started too.
fn terminate(child: &Child, signal: i32, tree: bool) {
    let Some(pid) = child.id() else {
        return;
    };
    let sent = match tree {
        true => sys::signal_tree(pid, signal),
        false => sys::send_signal(pid, signal),
    };
    if let Err(e) = sent {
        tracing::warn!(pid, signal = signal_name(signal), error = %e, "cannot signal the command");
    }
}

/// Kills the child and the processes it started, unless it has already been reaped.
fn kill(child: &Child) {
    if let Some(pid) = child.id()
        && let Err(e) = sys::kill_tree(pid)
    {
        tracing::warn!(pid, error = %e, "SIGKILL failed");
    }
}

/// Releases the lock; `false` when the store says it was no longer ours (and we had not
/// noticed). Errors are printed: the lease then ends at its ttl.
async fn release(guard: LockGuard, what: &str, known_lost: bool) -> bool {
    match guard.release().await {
        Ok(Released::Released) => {
            tracing::info!("released {what}");
            true
        }
        Ok(Released::NotHeld) => known_lost,
        Err(e) => {
            eprintln!(
                "dlock: warning: releasing {what} failed ({e}); it ends when its lease runs out"
            );
            true
        }
    }
}

/// The command's exit code, or 128 + signal when it was killed by one.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(255),
        (None, Some(sig)) => exit::for_signal(sig),
        (None, None) => exit::SOFTWARE,
    }
}
