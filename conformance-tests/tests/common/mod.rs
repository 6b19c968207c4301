//! The in-memory reference target, shared by the test binaries that run it.

use std::sync::Arc;

use conformance_tests::{Expect, Target};
use lockcore::{DistributedLock, MemoryLock};

/// The `memory` target: it has no server to break, so every fault scenario that needs one is
/// declared not applicable; the ones that need only a store (a client paused past its ttl) run.
pub fn memory() -> Target {
    Target::new("memory", "conformance", |url| async move {
        Ok(Arc::new(MemoryLock::new(&url)) as Arc<dyn DistributedLock>)
    })
    .fault("client_paused_past_ttl", Expect::Safe)
    .fault("sem_client_paused_past_ttl", Expect::Safe)
    .fault("rw_reader_paused_past_ttl", Expect::Safe)
    .fault(
        "holder_process_killed",
        Expect::NotApplicable("in-process store: another process cannot share it"),
    )
    .without_server("in-process store: there is no server to break")
}
