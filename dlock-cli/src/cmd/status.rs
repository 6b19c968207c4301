//! `dlock status`: who holds a lock, and the permits of the semaphore of the same name where the
//! store has semaphores.

use dlock::{LockName, redact};
use serde::Serialize;

use clap::Args;

use crate::store::StoreArg;
use crate::{exit, store};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) store: StoreArg,

    /// Lock name.
    #[arg(value_name = "NAME")]
    pub(crate) name: String,

    /// Print JSON instead of a sentence.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The `--json` output (stable field names).
#[derive(Serialize)]
struct StatusJson<'a> {
    url: String,
    backend: &'static str,
    name: &'a str,
    /// `held`, `free` or `never_used`.
    state: &'static str,
    holder: Option<String>,
    token: Option<u64>,
    remaining_ms: Option<u64>,
    waiters: Option<usize>,
    /// `ttl` (a lease ends at its ttl unless renewed) or `session` (a lock ends with the
    /// holder's client session: when it releases, or its session times out after it dies).
    expiry: &'static str,
    /// For `session` expiry: the session timeout this client was granted (the holder's may
    /// differ: each client asks for its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    session_timeout_ms: Option<u64>,
    /// What each part of the store sees (Redlock: one line per node); absent when not split.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    details: Vec<String>,
    /// The semaphore of the same name, where the store has semaphores and has seen it.
    #[serde(skip_serializing_if = "Option::is_none")]
    semaphore: Option<SemaphoreJson>,
}

/// A semaphore in the `--json` output.
#[derive(Serialize)]
struct SemaphoreJson {
    /// The count recorded while it is in use.
    permits: Option<u32>,
    holders: Vec<PermitJson>,
    waiters: Option<usize>,
}

/// One permit holder in the `--json` output.
#[derive(Serialize)]
struct PermitJson {
    holder: String,
    token: u64,
    remaining_ms: Option<u64>,
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Entry point; returns the process exit code.
pub async fn main(args: StatusArgs) -> u8 {
    let name = match LockName::new(&args.name) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("dlock: {e}");
            return exit::USAGE;
        }
    };
    let url = match store::resolve(args.store.url) {
        Ok(u) => u,
        Err(code) => return code,
    };
    let backend = match dlock::connect(&url).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("dlock: cannot connect to {}: {e}", redact(&url));
            return exit::for_error(&e);
        }
    };
    let info = match backend.inspect(&name).await {
        Ok(info) => info,
        Err(e) => {
            eprintln!(
                "dlock: cannot inspect lock {:?} at {}: {e}",
                name.as_str(),
                redact(&url)
            );
            return exit::for_error(&e);
        }
    };
    let capabilities = backend.capabilities();
    let semaphore = if capabilities.native.semaphore {
        match backend.inspect_semaphore(&name).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "dlock: cannot inspect semaphore {:?} at {}: {e}",
                    name.as_str(),
                    redact(&url)
                );
                return exit::for_error(&e);
            }
        }
    } else {
        None
    };
    let expiry = match capabilities.expiry {
        dlock::Expiry::Session => "session",
        _ => "ttl",
    };
    let session_timeout = capabilities.session_timeout;
    let state = match &info {
        None => "never_used",
        Some(i) if i.is_held() => "held",
        Some(_) => "free",
    };
    if args.json {
        let out = StatusJson {
            url: redact(&url),
            backend: capabilities.backend,
            name: name.as_str(),
            state,
            holder: info.as_ref().and_then(|i| i.holder.clone()),
            token: info.as_ref().and_then(|i| i.token).map(|t| t.0),
            remaining_ms: info.as_ref().and_then(|i| i.remaining).map(millis),
            waiters: info.as_ref().and_then(|i| i.waiters),
            expiry,
            session_timeout_ms: session_timeout.map(millis),
            details: info.as_ref().map(|i| i.details.clone()).unwrap_or_default(),
            semaphore: semaphore.as_ref().map(|s| SemaphoreJson {
                permits: s.permits,
                holders: s
                    .holders
                    .iter()
                    .map(|h| PermitJson {
                        holder: h.owner.clone(),
                        token: h.token.0,
                        remaining_ms: h.remaining.map(millis),
                    })
                    .collect(),
                waiters: s.waiters,
            }),
        };
        if let Err(code) = exit::print_json(&out) {
            return code;
        }
        return exit::OK;
    }
    let line = match &info {
        None => "never used".to_owned(),
        Some(i) if i.is_held() => {
            let mut parts = vec![format!("held by {}", i.holder.as_deref().unwrap_or("?"))];
            if let Some(t) = i.token {
                parts.push(format!("token {t}"));
            }
            if let Some(left) = i.remaining {
                parts.push(format!("{:.1}s left", left.as_secs_f64()));
            }
            if let Some(w) = i.waiters.filter(|&w| w > 0) {
                parts.push(format!("{w} waiting"));
            }
            parts.join(", ")
        }
        Some(i) => match i.token {
            Some(t) => format!("free (last token {t})"),
            None => "free".to_owned(),
        },
    };
    println!("{}: {line}", name.as_str());
    for detail in info.iter().flat_map(|i| &i.details) {
        println!("  {detail}");
    }
    if let Some(s) = &semaphore {
        let count = s.permits.map(|p| format!(" of {p}")).unwrap_or_default();
        let waiting = match s.waiters {
            Some(w) if w > 0 => format!(", {w} waiting"),
            _ => String::new(),
        };
        println!(
            "semaphore {}: {} permit(s){count} held{waiting}",
            name.as_str(),
            s.holders.len()
        );
        for h in &s.holders {
            let left = h
                .remaining
                .map(|d| format!(", {:.1}s left", d.as_secs_f64()))
                .unwrap_or_default();
            println!("  held by {} (token {}{left})", h.owner, h.token);
        }
    }
    if expiry == "session" && matches!(state, "held") {
        let timeout = session_timeout
            .map(|d| format!(" (this client's session timeout: {:.1}s)", d.as_secs_f64()))
            .unwrap_or_default();
        println!(
            "  expiry by session: the lock ends when its holder releases it, or when the \
             holder's session times out after the holder dies{timeout}"
        );
    }
    exit::OK
}
