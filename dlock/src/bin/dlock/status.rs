//! `dlock status`: who holds a lock.

use dlock::{LockName, redact};
use serde::Serialize;

use crate::{StatusArgs, exit, store};

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
    /// What each part of the store sees (Redlock: one line per node); absent when not split.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    details: Vec<String>,
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
    let state = match &info {
        None => "never_used",
        Some(i) if i.is_held() => "held",
        Some(_) => "free",
    };
    if args.json {
        let out = StatusJson {
            url: redact(&url),
            backend: backend.capabilities().backend,
            name: name.as_str(),
            state,
            holder: info.as_ref().and_then(|i| i.holder.clone()),
            token: info.as_ref().and_then(|i| i.token).map(|t| t.0),
            remaining_ms: info
                .as_ref()
                .and_then(|i| i.remaining)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            waiters: info.as_ref().and_then(|i| i.waiters),
            details: info.as_ref().map(|i| i.details.clone()).unwrap_or_default(),
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
    exit::OK
}
