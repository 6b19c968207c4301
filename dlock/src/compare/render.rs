//! The report's views: the table printed at the end of a run, `report.md`, and the files of
//! `--out` (`report.json`, `report.md`, `report.html`), all drawn from one [`CompareReport`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use conformance_tests::Outcome;

use super::html;
use super::model::{BackendReport, CompareReport, Verdict, floor_of};

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
        row.resize(13, dash());
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
    let floor = u.and_then(floor_of);
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
                Outcome::NotApplicable { reason } => Some((c.case.as_str(), reason.as_str())),
                _ => None,
            })
            .chain(b.scenarios.iter().filter_map(|s| match s.verdict {
                Verdict::NotApplicable | Verdict::NeedsSpawn => Some((
                    s.scenario.as_str(),
                    s.message.as_deref().or(s.declared.as_deref()).unwrap_or(""),
                )),
                _ => None,
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

/// `report.md`: the run's facts, the summary table, the capability sheets, the case and
/// scenario grids, and the benchmark figures.
pub fn markdown(report: &CompareReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# dlock compare\n");
    let _ = writeln!(
        out,
        "dlock {}, started {}, on {}; {}{:.0} s in all.\n",
        report.dlock_version,
        report.started,
        report.machine,
        if report.quick { "`--quick`, " } else { "" },
        report.seconds
    );
    let _ = writeln!(out, "## Summary\n");
    let _ = writeln!(out, "```text\n{}```\n", table(report));
    let names: Vec<&str> = report.backends.iter().map(|b| b.name.as_str()).collect();
    let _ = writeln!(out, "## Capabilities\n");
    md_row(&mut out, std::iter::once("").chain(names.iter().copied()));
    md_row(&mut out, (0..=names.len()).map(|_| "---"));
    for (label, cell) in html::SHEET_ROWS {
        let cells: Vec<String> = report.backends.iter().map(cell).collect();
        md_row(
            &mut out,
            std::iter::once(*label).chain(cells.iter().map(String::as_str)),
        );
    }
    let _ = writeln!(out, "\n## Conformance cases\n");
    grid(&mut out, report, html::case_rows(report));
    let _ = writeln!(out, "\n## Fault scenarios\n");
    grid(&mut out, report, html::scenario_rows(report));
    let _ = writeln!(out, "\n## Benchmark\n");
    md_row(
        &mut out,
        std::iter::once("backend").chain(html::BENCH_HEADS),
    );
    md_row(&mut out, (0..12).map(|_| "---"));
    for b in &report.backends {
        let cells = html::bench_cells(b);
        md_row(
            &mut out,
            std::iter::once(b.name.as_str()).chain(cells.iter().map(String::as_str)),
        );
    }
    let skipped = not_applicable(report);
    if !skipped.is_empty() {
        let _ = writeln!(out, "\n## Not applicable, and why\n");
        for line in skipped {
            let _ = writeln!(out, "- {line}");
        }
    }
    let notes: Vec<String> = problems(report)
        .into_iter()
        .map(|p| format!("- {p}"))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n## Problems\n\n{}", notes.join("\n"));
    }
    out
}

/// A grid of verdict labels: one row per entry, one column per backend.
fn grid(out: &mut String, report: &CompareReport, rows: Vec<(String, Vec<html::Cell>)>) {
    md_row(
        out,
        std::iter::once("").chain(report.backends.iter().map(|b| b.name.as_str())),
    );
    md_row(out, (0..=report.backends.len()).map(|_| "---"));
    for (name, cells) in rows {
        md_row(
            out,
            std::iter::once(name.as_str()).chain(cells.iter().map(|c| c.label)),
        );
    }
}

fn md_row<'a>(out: &mut String, cells: impl Iterator<Item = &'a str>) {
    let cells: Vec<String> = cells.map(|c| c.replace('|', "\\|")).collect();
    let _ = writeln!(out, "| {} |", cells.join(" | "));
}

/// Writes `report.json`, `report.md` and `report.html` into `dir` (created if missing) and
/// returns their paths.
///
/// # Errors
/// The directory or a file cannot be written.
pub fn write(report: &CompareReport, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    let files = [
        ("report.json", json),
        ("report.md", markdown(report)),
        ("report.html", html::page(report)),
    ];
    let mut paths = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        paths.push(path);
    }
    Ok(paths)
}

/// The main chart alone (uncontended throughput against the floor), for a README.
pub fn main_chart(report: &CompareReport) -> String {
    let rows: Vec<&BackendReport> = report.backends.iter().collect();
    super::chart::throughput(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(backends: Vec<BackendReport>) -> CompareReport {
        CompareReport {
            dlock_version: "0.1.0".into(),
            started: "2026-11-26T00:00:00Z".into(),
            machine: "2 cores, linux x86_64".into(),
            quick: true,
            seconds: 1.0,
            backends,
        }
    }

    #[test]
    fn a_backend_that_could_not_start_is_one_line_and_the_others_keep_their_rows() {
        let missing = BackendReport::unavailable(
            "zk",
            "spawned",
            "cannot start zk: zookeeper.jar not found: install it with `apt-get install \
             zookeeper` or run scripts/install-deps"
                .into(),
        );
        let mut ran = BackendReport::unavailable("sqlite", "spawned", String::new());
        ran.unavailable = None;
        let report = report(vec![ran, missing]);
        assert!(!report.ok(), "an unmeasured backend is not a clean run");
        let table = table(&report);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("sqlite"), "{table}");
        assert!(lines[2].starts_with("zk") && lines[2].contains("unavailable"));
        let why: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains("not measured"))
            .collect();
        assert_eq!(why.len(), 1, "{table}");
        assert!(why[0].contains("apt-get install zookeeper"), "{table}");
        let md = markdown(&report);
        assert!(md.contains("- zk: not measured: cannot start zk"), "{md}");
        // Its grid cells say why rather than vanish.
        assert!(md.contains("| basic_exclusivity | - | - |"), "{md}");
    }
}
