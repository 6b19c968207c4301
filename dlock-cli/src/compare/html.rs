//! `report.html`: one self-contained page (styles inline, charts as inline SVG, no script and
//! nothing fetched), readable from disk.

use std::fmt::Write as _;

use super::chart::{self, escape};
use super::model::{BackendReport, CompareReport};
use super::view::{self, BENCH_HEADS, Cell, SHEET_ROWS, bench_cells, case_rows, scenario_rows};

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
        escape(&view::table(report))
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
    let skipped = view::not_applicable(report);
    if !skipped.is_empty() {
        out.push_str("<h2>Not applicable, and why</h2><ul>");
        for line in skipped {
            let (backend, why) = line.split_once(": ").unwrap_or(("", &line));
            let _ = write!(out, "<li><b>{}</b>: {}</li>", escape(backend), escape(why));
        }
        out.push_str("</ul>");
    }
    let problems = view::problems(report);
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
