//! The in-memory reference backend runs the whole suite (the target: `common::memory`).

mod common;

use std::process::ExitCode;

fn main() -> ExitCode {
    conformance_tests::harness::main(vec![common::memory()], env!("CARGO_TARGET_TMPDIR"))
}
