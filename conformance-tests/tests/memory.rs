//! The in-memory reference backend runs the whole suite.

use std::sync::Arc;

use lockcore::{DistributedLock, MemoryLock};

async fn make_memory() -> Arc<dyn DistributedLock> {
    Arc::new(MemoryLock::new("conformance"))
}

conformance_tests::suite!(memory, make_memory, [ttl, fifo]);
