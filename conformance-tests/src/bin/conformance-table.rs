//! Prints the case × backend table from the reports every conformance test binary saved under
//! `<dir>/dlock-conformance/` (default `target/tmp`) and compares its not-applicable cells with
//! the pinned ones (`conformance-tests/not-applicable.txt`); exits 1 when a case failed, a cell
//! differs from the pins, or no report was found.
//!
//! ```text
//! conformance-table [--complete] [--pins FILE] [DIR]   the table, judged against the pins
//! conformance-table --write-pins [--complete] [DIR]    rewrite the pins from the reports
//! ```
//!
//! Without `--complete` only the targets and cells that reported are judged (one test binary,
//! or a filtered run); with it the reports must be the whole suite's: every pinned target and
//! cell must have reported. `--write-pins` keeps the pins of cells the run did not report,
//! unless `--complete` says the run was the whole suite.

use std::path::PathBuf;
use std::process::ExitCode;

use conformance_tests::pins::{self, Pins, Scope};
use conformance_tests::table;

struct Args {
    dir: PathBuf,
    pins: PathBuf,
    scope: Scope,
    write: bool,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        dir: PathBuf::from("target/tmp"),
        pins: pins::default_path(),
        scope: Scope::Reported,
        write: false,
    };
    let mut dir = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--complete" => out.scope = Scope::Complete,
            "--write-pins" => out.write = true,
            "--pins" => out.pins = it.next().ok_or("--pins needs a file")?.into(),
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            _ if dir.is_some() => return Err(format!("one report directory, not also {arg}")),
            _ => dir = Some(PathBuf::from(arg)),
        }
    }
    if let Some(dir) = dir {
        out.dir = dir;
    }
    Ok(out)
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("conformance-table: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let args = args()?;
    let reports = table::load(&args.dir)?;
    if reports.is_empty() {
        return Err(format!(
            "no reports under {}/dlock-conformance",
            args.dir.display()
        ));
    }
    let text = match std::fs::read_to_string(&args.pins) {
        // The first --write-pins makes the file.
        Err(e) if args.write && e.kind() == std::io::ErrorKind::NotFound => String::new(),
        read => read.map_err(|e| format!("cannot read {}: {e}", args.pins.display()))?,
    };
    let old = Pins::parse(&text).map_err(|e| format!("{}: {e}", args.pins.display()))?;
    if args.write {
        let new = old.updated(&reports, args.scope)?;
        std::fs::write(&args.pins, new.render())
            .map_err(|e| format!("cannot write {}: {e}", args.pins.display()))?;
        let changes = old.diff(&new);
        for line in &changes {
            println!("{line}");
        }
        // A target whose test binary did not run (or crashed before saving its reports) loses
        // its pins under --complete: say so, beside the `-` lines.
        for gone in old.targets().difference(&new.targets()) {
            println!("note: {gone} had pinned cells but no report in this run: its pins are gone");
        }
        println!(
            "{}: {} pinned cell(s), {} line(s) changed",
            args.pins.display(),
            new.len(),
            changes.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", table::matrix(&reports));
    let (_, failed, _) = table::counts(&reports);
    let mismatches = pins::compare(&reports, &old, args.scope);
    if !mismatches.is_empty() {
        println!();
        for m in &mismatches {
            println!("PIN  {m}");
        }
        println!("{}", pins::rewrite_hint(args.scope));
    }
    Ok(if failed == 0 && mismatches.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
