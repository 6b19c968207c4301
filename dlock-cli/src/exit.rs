//! Exit codes (sysexits.h where one fits) and the text that documents them.

use dlock::Error;

/// Success, or the command's own exit code.
pub const OK: u8 = 0;
/// `dlock bench` saw two clients hold the lock at once.
pub const VIOLATION: u8 = 1;
/// Usage error: bad flags or arguments, an invalid lock name, ttl or wait (EX_USAGE).
pub const USAGE: u8 = 64;
/// The lock store could not be reached or failed (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// An internal error (EX_SOFTWARE).
pub const SOFTWARE: u8 = 70;
/// An output file could not be written (EX_CANTCREAT).
pub const CANNOT_CREATE: u8 = 73;
/// The lock was not acquired within `--wait` (EX_TEMPFAIL).
pub const TEMPFAIL: u8 = 75;
/// The lock was lost while the command ran (`bench --mode hold`: a lease was lost or not
/// acquired).
pub const LOST: u8 = 76;
/// The store refused the credentials: a password is missing or wrong, or an ACL forbids what
/// the lock needs (EX_NOPERM).
pub const NOPERM: u8 = 77;
/// Bad URL or configuration: unknown scheme, bad option, no default store (EX_CONFIG).
pub const CONFIG: u8 = 78;
/// The command was found but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;

/// The exit code for a library error.
pub fn for_error(e: &Error) -> u8 {
    match e {
        // What the user asked for cannot be done as asked: a flag, a name, an option, or an
        // operation this backend does not offer.
        Error::InvalidName { .. } | Error::InvalidArgument { .. } | Error::Unsupported { .. } => {
            USAGE
        }
        Error::InvalidConfig { .. } | Error::UnsupportedScheme { .. } => CONFIG,
        Error::AccessDenied { .. } => NOPERM,
        Error::Timeout { .. } => TEMPFAIL,
        Error::LockLost { .. } => LOST,
        Error::Backend { .. } | Error::QuorumNotReached { .. } => UNAVAILABLE,
        _ => SOFTWARE,
    }
}

/// Prints `value` as pretty JSON on stdout; `Err(SOFTWARE)` (after saying why on stderr) if it
/// does not encode.
pub fn print_json(value: &impl serde::Serialize) -> Result<(), u8> {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            println!("{text}");
            Ok(())
        }
        Err(e) => {
            eprintln!("dlock: cannot encode JSON: {e}");
            Err(SOFTWARE)
        }
    }
}

/// `128 + signal`, as shells report a death by signal.
pub fn for_signal(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(255)
}

/// Shown after `dlock --help`.
pub const ALL: &str = "\
Exit codes:
  0        success (run: the command's own exit code is passed through, 0..=255)
  1        bench: a mutual-exclusion violation was seen (two clients held the lock at once);
           check: a case failed, or a lock of the run was left held;
           migrate check: a name is held by different owners on the two stores (SPLIT);
           soak: an anomaly was found (overlap, token order, refused valid write, lease
           lost unreported, lock left held, or a nemesis that did too little)
  64       usage error: bad or unknown flags or arguments, invalid lock name, --ttl or
           --wait, or an operation the store does not support
  69       the lock store is unreachable or failed
  70       internal error
  73       soak: the report could not be written
  75       run: the lock was not acquired within --wait (held by another owner)
  76       run: the lock was lost while the command ran (the command got SIGTERM, then
           SIGKILL after --grace), or it was found gone when releasing;
           bench --mode hold: a lease was lost while held, or not acquired
  77       the store refused the credentials: missing or wrong password, or an ACL that
           forbids what the lock needs
  78       bad URL or configuration: empty URL, unknown scheme, bad option or option value,
           no usable default store
  126      run: the command could not be executed
  127      run: the command was not found
  128+N    run: the command was killed by signal N
  129/130/143  run: dlock got SIGHUP/SIGINT/SIGTERM while waiting for the lock (nothing was
           run); once the command runs, such a signal is passed on to it (a Ctrl-C at the
           terminal reaches it directly) and dlock exits with the command's own status

Logging: warnings only by default, on stderr; -v info, -vv debug, -vvv trace; without -v,
RUST_LOG (e.g. RUST_LOG=dlock=debug) is used when set. URLs are always shown with passwords
replaced by ***.";
