//! `dlock run`: hold a lock while a command runs.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{
    AcquireOptions, DistributedLock, LockGuard, LockName, LostReason, Released, Wait, redact,
};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{RunArgs, exit, store, sys};

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

    // Connect and acquire; a signal while waiting ends dlock without running anything (the
    // acquire future is dropped, which leaves no lock or queue entry behind).
    let setup = acquire(&url, &name, &args);
    let guard = tokio::select! {
        r = setup => match r {
            Ok(guard) => guard,
            Err(code) => return code,
        },
        sig = signals.recv() => {
            eprintln!("dlock: got {} while waiting for lock {:?}; nothing was run", signal_name(sig), name.as_str());
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
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            eprintln!("dlock: cannot run `{}`: {e}", display_command(&args));
            release(guard, &name, false).await;
            return code;
        }
    };

    let outcome = supervise(child, &guard, &mut signals, &args).await;
    let released_ok = release(guard, &name, outcome.lost.is_some()).await;

    if let Some(reason) = outcome.lost {
        tracing::debug!(%reason, "exiting after losing the lock");
        return exit::LOST;
    }
    if !released_ok {
        eprintln!(
            "dlock: lock {:?} was no longer held when `{}` finished; it may have run without exclusive access",
            name.as_str(),
            display_command(&args)
        );
        return exit::LOST;
    }
    if let Some(sig) = outcome.signal {
        return exit::for_signal(sig);
    }
    match outcome.status {
        Some(status) => status_code(status),
        None => exit::SOFTWARE,
    }
}

/// Connects and acquires, printing the reason and returning the exit code on failure.
async fn acquire(url: &str, name: &LockName, args: &RunArgs) -> Result<LockGuard, u8> {
    let backend = match dlock::connect(url).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("dlock: cannot connect to {}: {e}", redact(url));
            return Err(exit::for_error(&e));
        }
    };
    let mut opts = AcquireOptions::new().wait(args.wait);
    if let Some(ttl) = args.ttl {
        opts = opts.ttl(ttl);
    }
    match dlock::acquire(&backend, name, &opts).await {
        Ok(Some(guard)) => Ok(guard),
        Ok(None) => {
            eprintln!("{}", busy_message(&backend, name, args.wait).await);
            Err(exit::TEMPFAIL)
        }
        Err(e) => {
            eprintln!(
                "dlock: cannot acquire lock {:?} at {}: {e}",
                name.as_str(),
                redact(url)
            );
            Err(exit::for_error(&e))
        }
    }
}

/// One line saying the lock is busy, with the holder's token and time left when the store can
/// tell quickly.
async fn busy_message(backend: &Arc<dyn DistributedLock>, name: &LockName, wait: Wait) -> String {
    let waited = match wait {
        Wait::No => "did not wait (--wait 0)".to_owned(),
        Wait::For(d) => format!("not acquired within {}", show(d)),
        Wait::Forever => "gave up".to_owned(),
    };
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

/// Waits for the child while watching the lease and dlock's signals.
async fn supervise(
    mut child: Child,
    guard: &LockGuard,
    signals: &mut Signals,
    args: &RunArgs,
) -> Outcome {
    let watch = guard.watch();
    let lost = watch.lost();
    tokio::pin!(lost);
    let mut outcome = Outcome {
        status: None,
        lost: None,
        signal: None,
    };
    let mut kill_at: Option<Instant> = None;
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let pid = child.id();
    let program = display_command(args);
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
            reason = &mut lost, if outcome.lost.is_none() => {
                outcome.lost = Some(reason);
                eprintln!(
                    "dlock: lost lock {:?} while `{program}` was running: {reason}; sending it SIGTERM (SIGKILL after {})",
                    args.name,
                    show(args.grace)
                );
                terminate(&child, libc::SIGTERM);
                kill_at.get_or_insert(Instant::now() + args.grace);
            }
            sig = signals.recv() => {
                outcome.signal.get_or_insert(sig);
                if sig == libc::SIGINT && sys::in_terminal_foreground() {
                    tracing::info!("SIGINT from the terminal already reached the command; not forwarding");
                } else {
                    tracing::info!(signal = signal_name(sig), ?pid, "forwarding to the command");
                    terminate(&child, sig);
                }
                kill_at.get_or_insert(Instant::now() + args.grace);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or(far).into()), if kill_at.is_some() => {
                eprintln!("dlock: `{program}` did not exit within {} of SIGTERM; sending SIGKILL", show(args.grace));
                if let Err(e) = child.start_kill() {
                    tracing::warn!(error = %e, "SIGKILL failed");
                }
                kill_at = None;
            }
        }
    }
}

/// Sends `signal` to the child unless it has already been reaped.
fn terminate(child: &Child, signal: i32) {
    if let Some(pid) = child.id()
        && let Err(e) = sys::send_signal(pid, signal)
    {
        tracing::warn!(pid, signal = signal_name(signal), error = %e, "cannot signal the command");
    }
}

/// Releases the lock; `false` when the store says it was no longer ours (and we had not
/// noticed). Errors are printed: the lease then ends at its ttl.
async fn release(guard: LockGuard, name: &LockName, known_lost: bool) -> bool {
    match guard.release().await {
        Ok(Released::Released) => {
            tracing::info!(lock = %name, "lock released");
            true
        }
        Ok(Released::NotHeld) => known_lost,
        Err(e) => {
            eprintln!(
                "dlock: warning: releasing lock {:?} failed ({e}); it ends when its lease runs out",
                name.as_str()
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
