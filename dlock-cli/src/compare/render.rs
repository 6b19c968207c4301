//! The report's outputs: the table printed at the end of a run, `report.md`, and the files of
//! `--out` (`report.json`, `report.md`, `report.html`), all drawn from one [`CompareReport`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::html;
use super::model::{BackendReport, CompareReport};
use super::view::{self, BENCH_HEADS, Cell, SHEET_ROWS, bench_cells, case_rows, scenario_rows};

pub use super::view::table;

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
    for (label, cell) in SHEET_ROWS {
        let cells: Vec<String> = report.backends.iter().map(cell).collect();
        md_row(
            &mut out,
            std::iter::once(*label).chain(cells.iter().map(String::as_str)),
        );
    }
    let _ = writeln!(out, "\n## Conformance cases\n");
    grid(&mut out, report, case_rows(report));
    let _ = writeln!(out, "\n## Fault scenarios\n");
    grid(&mut out, report, scenario_rows(report));
    let _ = writeln!(out, "\n## Benchmark\n");
    md_row(&mut out, std::iter::once("backend").chain(BENCH_HEADS));
    md_row(&mut out, (0..12).map(|_| "---"));
    for b in &report.backends {
        let cells = bench_cells(b);
        md_row(
            &mut out,
            std::iter::once(b.name.as_str()).chain(cells.iter().map(String::as_str)),
        );
    }
    let skipped = view::not_applicable(report);
    if !skipped.is_empty() {
        let _ = writeln!(out, "\n## Not applicable, and why\n");
        for line in skipped {
            let _ = writeln!(out, "- {line}");
        }
    }
    let notes: Vec<String> = view::problems(report)
        .into_iter()
        .map(|p| format!("- {p}"))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n## Problems\n\n{}", notes.join("\n"));
    }
    out
}

/// A grid of verdict labels: one row per entry, one column per backend.
fn grid(out: &mut String, report: &CompareReport, rows: Vec<(String, Vec<Cell>)>) {
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
        assert_eq!(report.outcome(), crate::compare::RunOutcome::Unmeasured);
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

    #[test]
    fn a_not_applicable_entry_is_listed_with_its_reason_beside_the_pinned_one() {
        use conformance_tests::{Outcome, Report};
        let mut b = BackendReport::unavailable("zk", "spawned", String::new());
        b.unavailable = None;
        b.cases.push(Report {
            target: "zk".into(),
            case: "ttl_expiry_frees_lock".into(),
            kind: "case".into(),
            outcome: Outcome::NotApplicable {
                reason: "needs ttl expiry".into(),
            },
            seconds: 0.0,
        });
        b.pinned_as = Some("zookeeper".into());
        b.pin_notes.insert(
            "ttl_expiry_frees_lock".into(),
            "needs ttl expiry (pinned for zookeeper)".into(),
        );
        let md = markdown(&report(vec![b]));
        assert!(
            md.contains("- zk: needs ttl expiry (pinned for zookeeper): ttl_expiry_frees_lock"),
            "{md}"
        );
    }
}
