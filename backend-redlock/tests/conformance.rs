//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against
//! Redlock over 3 and over 5 independent masters, started by the test kit and shared by every
//! case of this test binary (fault scenarios start private servers). Every client has its own
//! connections and subscribers. This is where Redlock declares, once, how it fares in every
//! fault scenario.

use std::process::ExitCode;

use conformance_tests::kit::RedisSet;
use conformance_tests::{Expect, Persistence, Spawned, Target};

/// Redis started with every write fsynced to its AOF before it is acknowledged.
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// Redlock over `n` kit masters. A fault scenario breaks every node at once (the kit's
/// `RedisSet` control); faults of single nodes are Redlock's own, in `tests/faults.rs`.
fn redlock(n: usize) -> Target {
    let connect = |url: String| async move { backend_redlock::connect(&url).await };
    Target::lazy(
        &format!("redlock{n}"),
        move || async move {
            RedisSet::shared(n)
                .await
                .expect("kit redis-servers")
                .redlock_url()
        },
        connect,
    )
    .spawn_with(move |persistence| async move {
        let args = match persistence {
            Persistence::Durable => DURABLE,
            Persistence::None => &[],
        };
        let set = RedisSet::start(n, args).await?;
        Ok(Spawned {
            url: set.redlock_url(),
            server: Box::new(set),
            keep: None,
        })
    })
    .fault("server_killed_and_restarted", Expect::Safe)
    .fault(
        "server_killed_and_restarted_without_persistence",
        Expect::DocumentedUnsafe(
            "every node keeps its fence counter in memory only: when all of them restart empty, \
             the counters start again at 1 and the next token is below the old holder's \
             (capabilities say Conditional unless every node runs appendfsync always)",
        ),
    )
    .fault("server_paused_past_ttl", Expect::Safe)
    .fault(
        "holder_replies_blackholed_past_ttl",
        Expect::NotApplicable(
            "the proxy sits in front of one node, a minority: the holder keeps its majority; \
             Redlock's node blackhole tests are in tests/faults.rs",
        ),
    )
    .fault(
        "holder_requests_blackholed_past_ttl",
        Expect::NotApplicable(
            "the proxy sits in front of one node, a minority: the holder keeps its majority; \
             Redlock's node blackhole tests are in tests/faults.rs",
        ),
    )
    .fault("store_connections_killed", Expect::Safe)
    .fault("holder_process_killed", Expect::Safe)
    .fault("client_paused_past_ttl", Expect::Safe)
}

fn main() -> ExitCode {
    conformance_tests::harness::main(vec![redlock(3), redlock(5)], env!("CARGO_TARGET_TMPDIR"))
}
