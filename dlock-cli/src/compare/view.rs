//! What every view of a [`CompareReport`] shows, written once: the summary table, the problems
//! and the reasons entries did not run, the capability sheet's rows, the verdict grids' cells
//! and the benchmark's columns. `report.md` ([`super::render`]) and `report.html`
//! ([`super::html`]) lay these out each in their own markup.

use std::fmt::Write as _;

use conformance_tests::{Outcome, registry};

use super::model::{BackendReport, CompareReport, Verdict, min_token_of};

/// One row per backend: what its cases, scenarios and benchmark came to.
pub fn table(report: &CompareReport) -> String {
    let header = [
        "backend",
        "fencing",
        "expiry",
        "fair",
        "wake-up",
        "cases",
        "scenarios",
        "pairs/s",
        "×floor",
        "p99 µs",
        "contended/s",
        "of limit",
        "min/max",
        "sem 4",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for b in &report.backends {
        rows.push(summary(b));
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    for b in &report.backends {
        if let Some(why) = &b.unavailable {
            let _ = writeln!(out, "{}: not measured: {why}", b.name);
        }
        for failed in failures(b) {
            let _ = writeln!(out, "{}: {failed}", b.name);
        }
    }
    out
}

/// The cells of one backend's summary row.
fn summary(b: &BackendReport) -> Vec<String> {
    let dash = || "-".to_owned();
    let Some(sheet) = &b.sheet else {
        let mut row = vec![b.name.clone(), "unavailable".to_owned()];
        row.resize(14, dash());
        return row;
    };
    let (passed, failed, na) = b.case_counts();
    let cases = if failed > 0 {
        format!("{passed} ok {failed} FAIL {na} n/a")
    } else {
        format!("{passed} ok {na} n/a")
    };
    let scenarios = {
        let mut parts = vec![format!("{} safe", b.scenario_count(Verdict::Safe))];
        for (v, word) in [
            (Verdict::DocumentedUnsafe, "documented"),
            (Verdict::Violation, "VIOLATION"),
            (Verdict::NotApplicable, "n/a"),
            (Verdict::NeedsSpawn, "need spawn"),
        ] {
            let n = b.scenario_count(v);
            if n > 0 {
                parts.push(format!("{n} {word}"));
            }
        }
        parts.join(" ")
    };
    let u = b.bench.uncontended.as_ref();
    let c = b.bench.contended.as_ref();
    let floor = u.and_then(min_token_of);
    vec![
        b.name.clone(),
        sheet.fencing.clone(),
        sheet.expiry.clone(),
        sheet.fairness.clone(),
        sheet.wake_up.clone(),
        cases,
        scenarios,
        u.map_or_else(dash, |u| format!("{:.0}", u.pairs_per_sec)),
        floor.map_or_else(dash, |f| format!("{:.2}", f.ratio)),
        u.map_or_else(dash, |u| format!("{:.0}", u.latency.p99_us)),
        c.map_or_else(dash, |c| format!("{:.0}", c.acquisitions_per_sec)),
        c.and_then(|c| c.of_limit)
            .map_or_else(dash, |f| format!("{f:.2}")),
        c.map_or_else(dash, |c| format!("{:.2}", c.fairness)),
        b.bench
            .semaphore
            .as_ref()
            .map_or_else(dash, |s| format!("{:.2}", s.mean_holders)),
    ]
}

/// What went wrong on a backend: failed cases and violated scenarios, one line each.
pub(super) fn failures(b: &BackendReport) -> Vec<String> {
    let mut out = Vec::new();
    for case in &b.cases {
        if let Outcome::Failed { message } = &case.outcome {
            out.push(format!(
                "case {} FAILED: {}",
                case.case,
                first_line(message)
            ));
        }
    }
    for s in &b.scenarios {
        if s.verdict == Verdict::Violation {
            out.push(format!(
                "scenario {} VIOLATION: {}",
                s.scenario,
                first_line(s.message.as_deref().unwrap_or(""))
            ));
        }
    }
    if !b.left_held.is_empty() {
        out.push(format!("left held: {}", b.left_held.join(", ")));
    }
    if let Some(e) = &b.bench.error {
        out.push(format!("bench: {e}"));
    }
    out
}

/// Why entries did not run, one line per backend and reason, naming the entries:
/// `zk: needs ttl expiry: ttl_expiry_frees_lock, lost_fires_expired`.
pub(super) fn not_applicable(report: &CompareReport) -> Vec<String> {
    let mut out = Vec::new();
    for b in &report.backends {
        // Reasons in the order they first appear, each with its entries.
        let mut reasons: Vec<(String, Vec<&str>)> = Vec::new();
        let skipped = b
            .cases
            .iter()
            .filter_map(|c| match &c.outcome {
                Outcome::NotApplicable { reason } => {
                    Some((c.case.as_str(), pin_note(b, &c.case).unwrap_or(reason)))
                }
                _ => None,
            })
            .chain(b.scenarios.iter().filter_map(|s| {
                match s.verdict {
                    Verdict::NotApplicable | Verdict::NeedsSpawn => Some((
                        s.scenario.as_str(),
                        pin_note(b, &s.scenario)
                            .or(s.message.as_deref())
                            .or(s.declared.as_deref())
                            .unwrap_or(""),
                    )),
                    _ => None,
                }
            }));
        for (entry, reason) in skipped {
            match reasons.iter_mut().find(|(r, _)| r == reason) {
                Some((_, entries)) => entries.push(entry),
                None => reasons.push((reason.to_owned(), vec![entry])),
            }
        }
        for (reason, entries) in reasons {
            out.push(format!("{}: {reason}: {}", b.name, entries.join(", ")));
        }
    }
    out
}

/// A not-applicable entry's reason beside the pinned one, where the run made that note.
fn pin_note<'a>(b: &'a BackendReport, entry: &str) -> Option<&'a str> {
    b.pin_notes.get(entry).map(String::as_str)
}

/// Every problem of the run, one line each, naming its backend.
pub(super) fn problems(report: &CompareReport) -> Vec<String> {
    report
        .backends
        .iter()
        .flat_map(|b| {
            let mut lines: Vec<String> = failures(b)
                .into_iter()
                .map(|f| format!("{}: {f}", b.name))
                .collect();
            if let Some(why) = &b.unavailable {
                lines.push(format!("{}: not measured: {why}", b.name));
            }
            lines
        })
        .collect()
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// A capability sheet row: its label and how a backend's cell reads.
type SheetRow = (&'static str, fn(&BackendReport) -> String);

/// The capability sheet's rows, shared by the HTML and Markdown views.
pub(super) const SHEET_ROWS: &[SheetRow] = &[
    ("source", |b| b.source.clone()),
    ("fencing", |b| {
        sheet(b, |s| match &s.fencing_assumption {
            Some(a) => format!("{} ({a})", s.fencing),
            None => s.fencing.clone(),
        })
    }),
    ("expiry", |b| {
        sheet(b, |s| match s.session_timeout_ms {
            Some(ms) => format!("{} (timeout {ms} ms)", s.expiry),
            None => s.expiry.clone(),
        })
    }),
    ("fairness", |b| sheet(b, |s| s.fairness.clone())),
    ("wake-up", |b| sheet(b, |s| s.wake_up.clone())),
    ("read-write locks", |b| sheet(b, |s| yes(s.read_write))),
    ("semaphores", |b| sheet(b, |s| yes(s.semaphore))),
    ("shared across processes", |b| {
        sheet(b, |s| yes(s.shared_across_processes))
    }),
];

fn sheet(b: &BackendReport, f: impl Fn(&super::Sheet) -> String) -> String {
    b.sheet.as_ref().map_or_else(|| "-".to_owned(), f)
}

fn yes(v: bool) -> String {
    if v { "yes" } else { "no" }.to_owned()
}

/// One cell of a verdict grid.
pub(super) struct Cell {
    /// The short word shown.
    pub label: &'static str,
    /// Its CSS class (its colour).
    pub class: &'static str,
    /// The detail a hover shows: the message or reason.
    pub title: String,
}

/// The case grid: one row per registry case, one cell per backend.
pub(super) fn case_rows(report: &CompareReport) -> Vec<(String, Vec<Cell>)> {
    rows(report, conformance_tests::Kind::Case, |b, name| {
        let Some(r) = b.cases.iter().find(|c| c.case == name) else {
            return missing(b);
        };
        match &r.outcome {
            Outcome::Passed => Cell {
                label: "pass",
                class: "ok",
                title: format!("{:.2} s", r.seconds),
            },
            Outcome::Failed { message } => Cell {
                label: "FAIL",
                class: "bad",
                title: message.clone(),
            },
            Outcome::NotApplicable { reason } => Cell {
                label: "n/a",
                class: "na",
                title: pin_note(b, name).unwrap_or(reason).to_owned(),
            },
        }
    })
}

/// The scenario grid: one row per registry fault scenario, one cell per backend.
pub(super) fn scenario_rows(report: &CompareReport) -> Vec<(String, Vec<Cell>)> {
    rows(report, conformance_tests::Kind::Fault, |b, name| {
        let Some(s) = b.scenarios.iter().find(|s| s.scenario == name) else {
            return missing(b);
        };
        let class = match s.verdict {
            Verdict::Safe => "ok",
            Verdict::DocumentedUnsafe => "doc",
            Verdict::Violation => "bad",
            Verdict::NotApplicable | Verdict::NeedsSpawn => "na",
        };
        let message = match s.verdict {
            Verdict::NotApplicable | Verdict::NeedsSpawn => {
                pin_note(b, name).or(s.message.as_deref())
            }
            _ => s.message.as_deref(),
        };
        let title = [s.declared.as_deref(), message]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" — ");
        Cell {
            label: s.verdict.label(),
            class,
            title,
        }
    })
}

fn missing(b: &BackendReport) -> Cell {
    Cell {
        label: "-",
        class: "na",
        title: b
            .unavailable
            .clone()
            .unwrap_or_else(|| "not run".to_owned()),
    }
}

fn rows(
    report: &CompareReport,
    kind: conformance_tests::Kind,
    cell: impl Fn(&BackendReport, &str) -> Cell,
) -> Vec<(String, Vec<Cell>)> {
    registry()
        .iter()
        .filter(|c| c.kind == kind)
        .map(|c| {
            let cells = report.backends.iter().map(|b| cell(b, c.name)).collect();
            (c.name.to_owned(), cells)
        })
        .collect()
}

/// The benchmark table's column heads after the backend's name, one per [`bench_cells`] cell.
pub(super) const BENCH_HEADS: [&str; 13] = [
    "pairs/s",
    "floor pairs/s",
    "× floor",
    "p50 µs",
    "p99 µs",
    "contended/s",
    "limit/s",
    "handoff p50 µs",
    "handoff p99 µs",
    "wait p99 µs",
    "per client min/max",
    "semaphore: holders of 4",
    "semaphore: wait p99 µs",
];

/// A backend's benchmark cells: pairs/s, floor pairs/s, × floor, p50, p99, contended/s,
/// limit/s, handoff p50, handoff p99, wait p99, per-client min/max, and the semaphore's mean
/// holders of 4 and waiter wait p99.
pub(super) fn bench_cells(b: &BackendReport) -> Vec<String> {
    let dash = || "-".to_owned();
    let n = |v: f64| format!("{v:.0}");
    let u = b.bench.uncontended.as_ref();
    let floor = u.and_then(min_token_of);
    let c = b.bench.contended.as_ref();
    let sem = b.bench.semaphore.as_ref();
    vec![
        u.map_or_else(dash, |u| n(u.pairs_per_sec)),
        floor.map_or_else(dash, |f| n(f.pairs_per_sec)),
        floor.map_or_else(dash, |f| format!("{:.2}", f.ratio)),
        u.map_or_else(dash, |u| n(u.latency.p50_us)),
        u.map_or_else(dash, |u| n(u.latency.p99_us)),
        c.map_or_else(dash, |c| n(c.acquisitions_per_sec)),
        c.and_then(|c| c.limit_per_sec).map_or_else(dash, n),
        c.map_or_else(dash, |c| n(c.handoff.p50_us)),
        c.map_or_else(dash, |c| n(c.handoff.p99_us)),
        c.map_or_else(dash, |c| n(c.wait.p99_us)),
        c.map_or_else(dash, |c| {
            format!("{}/{}", c.per_client_min, c.per_client_max)
        }),
        sem.map_or_else(dash, |s| format!("{:.2}", s.mean_holders)),
        sem.map_or_else(dash, |s| n(s.wait.p99_us)),
    ]
}
