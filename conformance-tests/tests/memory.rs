//! The in-memory reference backend runs the whole suite. It has no server to break, so every
//! fault scenario that needs one is declared not applicable; the ones that need only a store
//! (a client paused past its ttl) run.

use std::process::ExitCode;
use std::sync::Arc;

use conformance_tests::{Expect, Target};
use lockcore::{DistributedLock, MemoryLock};

fn main() -> ExitCode {
    let memory = Target::new("memory", "conformance", |url| async move {
        Ok(Arc::new(MemoryLock::new(&url)) as Arc<dyn DistributedLock>)
    })
    .fault("client_paused_past_ttl", Expect::Safe)
    .fault("sem_client_paused_past_ttl", Expect::Safe)
    .fault("rw_reader_paused_past_ttl", Expect::Safe)
    .fault(
        "holder_process_killed",
        Expect::NotApplicable("in-process store: another process cannot share it"),
    )
    .without_server("in-process store: there is no server to break");
    conformance_tests::harness::main(vec![memory], env!("CARGO_TARGET_TMPDIR"))
}
