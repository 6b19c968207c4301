//! What the library said about each lock while the suite ran, for the message of a case that
//! fails: every event of lockcore's (trace and up) and of the backends' (debug and up) that names
//! a lock (`lock = ...`), with the time it was logged. A keep-alive case that loses its lock
//! then shows each renewal sent (and how late the renewer was to send it), how long each took,
//! what it answered, and when the lease ran out, so a failure on a loaded machine explains
//! itself.
//!
//! [`install`] sets a global `tracing` subscriber that records nothing else (a process that has
//! one already keeps it, and records nothing here). Each lock keeps its last [`PER_LOCK`]
//! lines.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// How many lines each lock keeps (the last ones).
pub const PER_LOCK: usize = 200;

/// How many locks are remembered before the record starts again (a long run names many).
const LOCKS: usize = 50_000;

struct Record {
    started: Instant,
    lines: Mutex<HashMap<String, VecDeque<(Duration, String)>>>,
}

fn record() -> &'static Record {
    static RECORD: OnceLock<Record> = OnceLock::new();
    RECORD.get_or_init(|| Record {
        started: Instant::now(),
        lines: Mutex::default(),
    })
}

/// Records the events this module is about from now on, if no global subscriber is set.
pub fn install() {
    let subscriber = tracing_subscriber::registry().with(Timeline);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The lines recorded for the locks whose names start with `prefix`, oldest first, each with
/// the lock's name after its prefix; `None` when there are none.
pub fn of(prefix: &str) -> Option<String> {
    let lines = record()
        .lines
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut found: Vec<(Duration, &str, &str)> = lines
        .iter()
        .filter(|(lock, _)| lock.starts_with(prefix))
        .flat_map(|(lock, l)| {
            let short = &lock[prefix.len()..];
            l.iter().map(move |(at, line)| (*at, short, line.as_str()))
        })
        .collect();
    if found.is_empty() {
        return None;
    }
    found.sort_by_key(|(at, _, _)| *at);
    let mut out = String::new();
    for (at, lock, line) in found {
        let _ = writeln!(out, "  {:>9.3}s [{lock}] {line}", at.as_secs_f64());
    }
    Some(out)
}

/// Whether events at `metadata` are recorded.
fn wanted(metadata: &Metadata<'_>) -> bool {
    let target = metadata.target();
    metadata.is_event()
        && (target.starts_with("lockcore")
            || (target.starts_with("backend_") && *metadata.level() <= Level::DEBUG))
}

struct Timeline;

impl<S: Subscriber> Layer<S> for Timeline {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if wanted(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        wanted(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(lock) = fields.lock else {
            return;
        };
        let record = record();
        let at = record.started.elapsed();
        let meta = event.metadata();
        let line = format!(
            "{} {}: {}{}",
            meta.level(),
            meta.target(),
            fields.message,
            fields.rest
        );
        let mut lines = record.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() >= LOCKS && !lines.contains_key(&lock) {
            lines.clear();
        }
        let mine = lines.entry(lock).or_default();
        if mine.len() == PER_LOCK {
            mine.pop_front();
        }
        mine.push_back((at, line));
    }
}

/// An event's message, its `lock` field, and the other fields as ` key=value`.
#[derive(Default)]
struct Fields {
    message: String,
    lock: Option<String>,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "lock" => self.lock = Some(format!("{value:?}")),
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events that name a lock are recorded under it with their fields; others are not.
    #[test]
    fn events_naming_a_lock_are_recorded_under_it() {
        let subscriber = tracing_subscriber::registry().with(Timeline);
        tracing::subscriber::with_default(subscriber, || {
            tracing::trace!(target: "lockcore::renewer", lock = "t/x/1/a", left_ms = 5u64, "renewal sent");
            tracing::warn!(target: "backend_sql", lock = %"t/x/1/b", "refused");
            tracing::trace!(target: "backend_sql", lock = "t/x/1/b", "too fine");
            tracing::trace!(target: "lockcore::renewer", "no lock");
            tracing::trace!(target: "lockcore::renewer", lock = "t/y/1/a", "another case");
        });
        let text = of("t/x/1/").expect("lines");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].ends_with("[a] TRACE lockcore::renewer: renewal sent left_ms=5"),
            "{text}"
        );
        assert!(
            lines[1].ends_with("[b] WARN backend_sql: refused"),
            "{text}"
        );
        assert!(of("t/z/").is_none());
    }
}
