//! Prints the case × backend table from the reports every conformance test binary saved under
//! `<dir>/dlock-conformance/` (default `target/tmp`); exits 1 when a case failed or no report
//! was found.

use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/tmp".to_owned());
    match conformance_tests::table::load(std::path::Path::new(&dir)) {
        Ok(reports) if !reports.is_empty() => {
            print!("{}", conformance_tests::table::matrix(&reports));
            let (_, failed, _) = conformance_tests::table::counts(&reports);
            if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Ok(_) => {
            eprintln!("conformance-table: no reports under {dir}/dlock-conformance");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("conformance-table: {e}");
            ExitCode::FAILURE
        }
    }
}
