//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against a
//! standalone ZooKeeper server and a 3-node ensemble, both started by the test kit and shared
//! by every case of this test binary (fault scenarios start private servers), and on the
//! standalone server again in Curator's and kazoo's layouts (`layout=curator|kazoo`). Every
//! client has its own session. This is where each declares, once, how it fares in every fault
//! scenario.

use std::process::ExitCode;

use conformance_tests::kit::{KitError, KitErrorKind, ZkEnsemble, ZooKeeper};
use conformance_tests::{Expect, Persistence, Spawned, Target};
use tokio::sync::OnceCell;

const TTL_SCENARIO: Expect = Expect::NotApplicable(
    "ZooKeeper locks end with the session (Expiry::Session), not at a server-side ttl; the \
     session-expiry versions of this scenario are in backend-zk/tests/faults.rs",
);

const ALWAYS_DURABLE: Expect = Expect::NotApplicable(
    "ZooKeeper logs every write before acknowledging it and recovers znodes and sessions from \
     its data dir; there is no setting without persistence to test",
);

const NO_SERVER_KILL: Expect = Expect::NotApplicable(
    "ZooKeeper cannot end client connections from the server side; links are cut with the \
     kit's proxy in backend-zk/tests/faults.rs instead",
);

/// The declarations shared by both targets.
fn declare(target: Target) -> Target {
    target
        .fault("server_killed_and_restarted", Expect::Safe)
        .fault(
            "server_killed_and_restarted_without_persistence",
            ALWAYS_DURABLE,
        )
        .fault("server_paused_past_ttl", TTL_SCENARIO)
        .fault("holder_replies_blackholed_past_ttl", TTL_SCENARIO)
        .fault("holder_requests_blackholed_past_ttl", TTL_SCENARIO)
        .fault("store_connections_killed", NO_SERVER_KILL)
        .fault("holder_process_killed", TTL_SCENARIO)
        .fault("client_paused_past_ttl", TTL_SCENARIO)
        // Permits are ephemeral nodes; their tokens (czxids) survive the restart with the data.
        .fault("sem_server_killed_and_restarted", Expect::Safe)
        .fault("sem_holder_blackholed_past_ttl", TTL_SCENARIO)
        .fault("rw_reader_server_killed_and_restarted", Expect::Safe)
}

/// A target on the kit's standalone server: `label`, in the chroot `/{chroot}`, with the URL
/// options `options` (`""`, or `layout=...`) on every URL, fault scenarios' included.
fn standalone(label: &str, chroot: &'static str, options: &'static str) -> Target {
    let connect = |url: String| async move { backend_zk::connect(&url).await };
    let query = move |first: char| {
        if options.is_empty() {
            String::new()
        } else {
            format!("{first}{options}")
        }
    };
    Target::lazy(
        label,
        move || async move {
            let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
            format!("{}/{chroot}{}", zk.url(), query('?'))
        },
        connect,
    )
    .spawn_with(move |persistence| async move {
        if persistence == Persistence::None {
            return Err(KitError::new(
                KitErrorKind::InvalidArgument,
                "ZooKeeper always persists acknowledged writes",
            ));
        }
        let zk = ZooKeeper::start().await?;
        Ok(Spawned {
            url: format!("{}/faults?session_timeout=4s{}", zk.url(), query('&')),
            server: Box::new(zk),
            keep: None,
        })
    })
}

fn main() -> ExitCode {
    let connect = |url: String| async move { backend_zk::connect(&url).await };
    let ensemble = Target::lazy(
        "zookeeper_ensemble",
        || async {
            static ENSEMBLE: OnceCell<ZkEnsemble> = OnceCell::const_new();
            let e = ENSEMBLE
                .get_or_init(|| async { ZkEnsemble::start(3).await.expect("kit ensemble") })
                .await;
            format!("{}/conformance", e.url())
        },
        connect,
    )
    .fault("server_killed_and_restarted", NO_SINGLE_SERVER)
    .fault(
        "server_killed_and_restarted_without_persistence",
        ALWAYS_DURABLE,
    )
    .fault("server_paused_past_ttl", TTL_SCENARIO)
    .fault("holder_replies_blackholed_past_ttl", TTL_SCENARIO)
    .fault("holder_requests_blackholed_past_ttl", TTL_SCENARIO)
    .fault("store_connections_killed", NO_SERVER_KILL)
    .fault("holder_process_killed", TTL_SCENARIO)
    .fault("client_paused_past_ttl", TTL_SCENARIO)
    .fault("sem_server_killed_and_restarted", NO_SINGLE_SERVER)
    .fault("rw_reader_server_killed_and_restarted", NO_SINGLE_SERVER)
    .fault("sem_holder_blackholed_past_ttl", TTL_SCENARIO);
    conformance_tests::harness::main(
        vec![
            declare(standalone("zookeeper", "conformance", "")),
            ensemble,
            declare(standalone(
                "zookeeper_curator",
                "conformance-curator",
                "layout=curator",
            )),
            declare(standalone(
                "zookeeper_kazoo",
                "conformance-kazoo",
                "layout=kazoo",
            )),
        ],
        env!("CARGO_TARGET_TMPDIR"),
    )
}

const NO_SINGLE_SERVER: Expect = Expect::NotApplicable(
    "an ensemble survives one member's kill -9 without a restart; the leader kill -9 scenario \
     is ensemble_leader_killed_no_two_holders in backend-zk/tests/faults.rs",
);
