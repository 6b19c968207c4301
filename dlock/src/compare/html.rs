//! `report.html`: one self-contained page (styles inline, charts as inline SVG, no script and
//! nothing fetched), readable from disk.

use std::fmt::Write as _;

use conformance_tests::{Outcome, registry};

use super::chart::{self, escape};
use super::model::{BackendReport, CompareReport, Verdict, floor_of};
use super::render;

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
                title: reason.clone(),
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
        let title = [s.declared.as_deref(), s.message.as_deref()]
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
pub(super) const BENCH_HEADS: [&str; 11] = [
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
];

/// A backend's benchmark cells: pairs/s, floor pairs/s, × floor, p50, p99, contended/s,
/// limit/s, handoff p50, handoff p99, wait p99, per-client min/max.
pub(super) fn bench_cells(b: &BackendReport) -> Vec<String> {
    let dash = || "-".to_owned();
    let n = |v: f64| format!("{v:.0}");
    let u = b.bench.uncontended.as_ref();
    let floor = u.and_then(floor_of);
    let c = b.bench.contended.as_ref();
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
    ]
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;max-width:1200px;color:#222}\
table{border-collapse:collapse;margin:8px 0 20px}\
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left;vertical-align:top}\
th{background:#f3f3f3}td.ok{background:#d8f0d8}td.bad{background:#f6c6c6;font-weight:bold}\
td.doc{background:#fbe7b5}td.na{background:#eee;color:#777}\
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}\
figure{margin:0 0 18px}.legend span{display:inline-block;padding:1px 6px;margin-right:6px}";

/// The whole page.
pub(super) fn page(report: &CompareReport) -> String {
    let rows: Vec<&BackendReport> = report.backends.iter().collect();
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>dlock compare</title><style>{STYLE}</style></head><body>"
    );
    let _ = write!(
        out,
        "<h1>dlock compare</h1><p>dlock {}, started {}, on {}; {}{:.0} s in all. Verdict: <b>{}</b>.</p>",
        escape(&report.dlock_version),
        escape(&report.started),
        escape(&report.machine),
        if report.quick {
            "<code>--quick</code>, "
        } else {
            ""
        },
        report.seconds,
        if report.ok() {
            "every case passed, no violation"
        } else {
            "problems found (see below)"
        }
    );
    let _ = write!(
        out,
        "<h2>Summary</h2><pre>{}</pre>",
        escape(&render::table(report))
    );
    out.push_str("<h2>Charts</h2>");
    for svg in [
        chart::throughput(&rows),
        chart::latency(&rows),
        chart::contended(&rows),
        chart::fairness(&rows),
    ] {
        let _ = write!(out, "<figure>{svg}</figure>");
    }
    out.push_str("<h2>Capabilities</h2><table><tr><th></th>");
    for b in &report.backends {
        let _ = write!(out, "<th>{}</th>", escape(&b.name));
    }
    out.push_str("</tr>");
    for (label, cell) in SHEET_ROWS {
        let _ = write!(out, "<tr><th>{}</th>", escape(label));
        for b in &report.backends {
            let _ = write!(out, "<td>{}</td>", escape(&cell(b)));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out.push_str(
        "<h2>Conformance cases</h2><p class=\"legend\"><span class=\"ok\" style=\"background:#d8f0d8\">pass</span><span style=\"background:#f6c6c6\">FAIL</span><span style=\"background:#eee\">n/a</span> (hover a cell for the message or reason)</p>",
    );
    grid(&mut out, report, case_rows(report));
    out.push_str(
        "<h2>Fault scenarios</h2><p class=\"legend\"><span style=\"background:#d8f0d8\">safe</span><span style=\"background:#fbe7b5\">documented unsafe, observed as documented</span><span style=\"background:#f6c6c6\">VIOLATION (a bug)</span><span style=\"background:#eee\">n/a or needs --spawn</span></p>",
    );
    grid(&mut out, report, scenario_rows(report));
    out.push_str("<h2>Benchmark</h2><table><tr><th>backend</th>");
    for h in BENCH_HEADS {
        let _ = write!(out, "<th>{h}</th>");
    }
    out.push_str("</tr>");
    for b in &report.backends {
        let _ = write!(out, "<tr><th>{}</th>", escape(&b.name));
        for c in bench_cells(b) {
            let _ = write!(out, "<td>{}</td>", escape(&c));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    let skipped = render::not_applicable(report);
    if !skipped.is_empty() {
        out.push_str("<h2>Not applicable, and why</h2><ul>");
        for line in skipped {
            let _ = write!(out, "<li>{}</li>", escape(&line));
        }
        out.push_str("</ul>");
    }
    let problems = render::problems(report);
    if !problems.is_empty() {
        out.push_str("<h2>Problems</h2><ul>");
        for p in problems {
            let _ = write!(out, "<li>{}</li>", escape(&p));
        }
        out.push_str("</ul>");
    }
    out.push_str("</body></html>\n");
    out
}

fn grid(out: &mut String, report: &CompareReport, rows: Vec<(String, Vec<Cell>)>) {
    out.push_str("<table><tr><th></th>");
    for b in &report.backends {
        let _ = write!(out, "<th>{}</th>", escape(&b.name));
    }
    out.push_str("</tr>");
    for (name, cells) in rows {
        let _ = write!(out, "<tr><th>{}</th>", escape(&name));
        for c in cells {
            let _ = write!(
                out,
                "<td class=\"{}\" title=\"{}\">{}</td>",
                c.class,
                escape(&c.title),
                c.label
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}
