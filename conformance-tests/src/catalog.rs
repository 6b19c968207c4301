//! How each backend the kit can start fares in every fault scenario, and how a scenario starts
//! a private server of it: declared once here, read by the backend crates'
//! `tests/conformance.rs` and by `dlock compare --spawn`, so that the report a user reads and
//! the project's own tests hold the same declarations.
//!
//! [`declare`] adds both to a [`Target`] of the backend [`SpawnName`] names; the target's label,
//! its store and how it connects stay the caller's.

use crate::kit::{
    KitError, KitErrorKind, MariaDb, Postgres, Redis, RedisCluster, RedisSet, ZkAndRedis,
    ZkEnsemble, ZooKeeper,
};
use crate::spawn::SpawnName;
use crate::{Expect, Persistence, Spawned, Target};

/// Redis started with every write fsynced to its AOF before it is acknowledged.
const DURABLE_REDIS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

const SQL_ALWAYS_DURABLE: Expect = Expect::NotApplicable(
    "committed rows survive a crash on every SQL server (the kit's servers too: `fsync=off` \
     loses nothing a kill -9 can take); there is no setting without persistence to test",
);

/// A scenario of a server-side ttl, on ZooKeeper, whose locks end with the session instead:
/// names the test (`file test`) that runs its session-expiry version.
macro_rules! zk_session {
    ($test:literal) => {
        Expect::NotApplicable(concat!(
            "ZooKeeper locks end with the session (Expiry::Session), not at a server-side ttl; \
             the session-expiry version is ",
            $test
        ))
    };
}

/// As [`zk_session`], for `dual` over ZooKeeper then Redis: the lock ends with the first
/// store's session.
macro_rules! dual_session {
    ($test:literal) => {
        Expect::NotApplicable(concat!(
            "the first store is ZooKeeper, whose locks end with the session (Expiry::Session), \
             not at a server-side ttl; the session-expiry version is ",
            $test
        ))
    };
}

const ZK_ALWAYS_DURABLE: Expect = Expect::NotApplicable(
    "ZooKeeper logs every write before acknowledging it and recovers znodes and sessions from \
     its data dir; there is no setting without persistence to test",
);

const ZK_NO_SERVER_KILL: Expect = Expect::NotApplicable(
    "ZooKeeper cannot end client connections from the server side; the holder's link is reset \
     with the kit's proxy instead: backend-zk/tests/session_faults.rs \
     holder_link_reset_within_session_timeout_keeps_the_holder",
);

const CLUSTER_ANNOUNCED_ADDRESSES: Expect = Expect::NotApplicable(
    "a cluster client follows the addresses the masters announce (CLUSTER SLOTS, MOVED), the \
     same to every client: a proxy in front of the seed nodes is bypassed, and one the masters \
     announce (cluster-announce-port) would cut every client off, not the holder alone",
);

/// The declarations of a backend on one server of its own (PostgreSQL, MariaDB, Redis, Tair),
/// safe in every scenario but, perhaps, a restart without persistence.
fn one_server(without_persistence: Expect) -> Vec<(&'static str, Expect)> {
    vec![
        ("server_killed_and_restarted", Expect::Safe),
        (
            "server_killed_and_restarted_without_persistence",
            without_persistence,
        ),
        ("server_paused_past_ttl", Expect::Safe),
        ("holder_replies_blackholed_past_ttl", Expect::Safe),
        ("holder_requests_blackholed_past_ttl", Expect::Safe),
        ("store_connections_killed", Expect::Safe),
        ("holder_process_killed", Expect::Safe),
        ("client_paused_past_ttl", Expect::Safe),
        // Permits are kept like locks: the AOF holds each grant with its absolute expiry and
        // the semaphore's counter, and a permit's expiry runs on the server's clock.
        ("sem_server_killed_and_restarted", Expect::Safe),
        ("sem_holder_blackholed_past_ttl", Expect::Safe),
        ("sem_client_paused_past_ttl", Expect::Safe),
        ("rw_reader_paused_past_ttl", Expect::Safe),
        ("rw_reader_server_killed_and_restarted", Expect::Safe),
        ("rw_reader_blackholed_past_ttl", Expect::Safe),
    ]
}

/// The declarations of ZooKeeper: a standalone server (every layout), or an ensemble whose
/// members a scenario breaks all at once.
fn zookeeper() -> Vec<(&'static str, Expect)> {
    vec![
        ("server_killed_and_restarted", Expect::Safe),
        (
            "server_killed_and_restarted_without_persistence",
            ZK_ALWAYS_DURABLE,
        ),
        (
            "server_paused_past_ttl",
            zk_session!("backend-zk/tests/session_faults.rs server_paused_past_session_timeout"),
        ),
        (
            "holder_replies_blackholed_past_ttl",
            zk_session!(
                "backend-zk/tests/session_faults.rs holder_replies_blackholed_past_session_timeout"
            ),
        ),
        (
            "holder_requests_blackholed_past_ttl",
            zk_session!(
                "backend-zk/tests/faults/sessions.rs holder_blackholed_past_session_timeout"
            ),
        ),
        ("store_connections_killed", ZK_NO_SERVER_KILL),
        (
            "holder_process_killed",
            zk_session!(
                "backend-zk/tests/session_faults.rs holder_process_killed_past_session_timeout"
            ),
        ),
        (
            "client_paused_past_ttl",
            zk_session!("backend-zk/tests/session_faults.rs client_paused_past_session_timeout"),
        ),
        // Permits are ephemeral nodes; their tokens (czxids) survive the restart with the data.
        ("sem_server_killed_and_restarted", Expect::Safe),
        (
            "sem_holder_blackholed_past_ttl",
            zk_session!(
                "backend-zk/tests/faults/semaphores.rs \
                 silent_permit_holder_returns_its_permit_with_its_session"
            ),
        ),
        ("rw_reader_server_killed_and_restarted", Expect::Safe),
    ]
}

/// How `name` fares in each fault scenario, as its tests and `dlock compare` declare it.
/// Scenarios missing here are covered by [`without_server`] where the backend has no server
/// of its own to break.
fn declarations(name: SpawnName) -> Vec<(&'static str, Expect)> {
    match name {
        SpawnName::Sqlite => vec![
            ("client_paused_past_ttl", Expect::Safe),
            ("sem_client_paused_past_ttl", Expect::Safe),
            ("rw_reader_paused_past_ttl", Expect::Safe),
            ("holder_process_killed", Expect::Safe),
        ],
        SpawnName::Postgres | SpawnName::Mariadb => one_server(SQL_ALWAYS_DURABLE),
        SpawnName::Redis => one_server(Expect::DocumentedUnsafe(
            "the fence counter lives in the server's memory: restarted without AOF, it starts \
             again at 1, so the next holder's token is below the old holder's (the client \
             declares Fencing::Conditional unless the server runs appendfsync always)",
        )),
        SpawnName::Tair => one_server(Expect::DocumentedUnsafe(
            "the version (the fencing token) lives in the server's memory: restarted without \
             AOF, it starts again at 1 (capabilities say Conditional unless the server runs \
             appendfsync always)",
        )),
        // A server scenario breaks every master at once (this cluster has no replicas, so no
        // failover); one master's kill -9 is cluster_master_kill9_resets_the_fence in
        // backend-redis/tests/faults.rs, and a failover to a replica is
        // cluster_failover_after_replication_keeps_the_lock (safe) and
        // cluster_failover_before_replication_loses_the_lock_and_its_token (documented unsafe).
        SpawnName::RedisCluster => vec![
            ("server_killed_and_restarted", Expect::Safe),
            (
                "server_killed_and_restarted_without_persistence",
                Expect::DocumentedUnsafe(
                    "each master keeps the fence counters of its slots in memory: restarted \
                     without AOF, they start again at 1, so the next holder's token is below \
                     the old holder's (the client declares Fencing::Conditional unless every \
                     master runs appendfsync always)",
                ),
            ),
            ("server_paused_past_ttl", Expect::Safe),
            (
                "holder_replies_blackholed_past_ttl",
                CLUSTER_ANNOUNCED_ADDRESSES,
            ),
            (
                "holder_requests_blackholed_past_ttl",
                CLUSTER_ANNOUNCED_ADDRESSES,
            ),
            ("store_connections_killed", Expect::Safe),
            ("holder_process_killed", Expect::Safe),
            ("client_paused_past_ttl", Expect::Safe),
            ("sem_server_killed_and_restarted", Expect::Safe),
            (
                "sem_holder_blackholed_past_ttl",
                CLUSTER_ANNOUNCED_ADDRESSES,
            ),
            ("sem_client_paused_past_ttl", Expect::Safe),
            ("rw_reader_paused_past_ttl", Expect::Safe),
            ("rw_reader_server_killed_and_restarted", Expect::Safe),
            ("rw_reader_blackholed_past_ttl", CLUSTER_ANNOUNCED_ADDRESSES),
        ],
        SpawnName::Redlock3 | SpawnName::Redlock5 => vec![
            ("server_killed_and_restarted", Expect::Safe),
            (
                "server_killed_and_restarted_without_persistence",
                Expect::DocumentedUnsafe(
                    "every node keeps its fence counter in memory only: when all of them \
                     restart empty, the counters start again at 1 and the next token is below \
                     the old holder's (capabilities say Conditional unless every node runs \
                     appendfsync always)",
                ),
            ),
            ("server_paused_past_ttl", Expect::Safe),
            // A proxy in front of every node: the holder is cut off from all of them at once.
            ("holder_replies_blackholed_past_ttl", Expect::Safe),
            ("holder_requests_blackholed_past_ttl", Expect::Safe),
            ("store_connections_killed", Expect::Safe),
            ("holder_process_killed", Expect::Safe),
            ("client_paused_past_ttl", Expect::Safe),
        ],
        SpawnName::Zk | SpawnName::ZkEnsemble => zookeeper(),
        SpawnName::Dual => vec![
            ("server_killed_and_restarted", Expect::Safe),
            // Redis restarts empty, its counter back at 0, but a dual token is at least the
            // first store's czxid, which ZooKeeper keeps: the next token is still above the old
            // holder's.
            (
                "server_killed_and_restarted_without_persistence",
                Expect::Safe,
            ),
            (
                "server_paused_past_ttl",
                dual_session!(
                    "backend-zk/tests/session_faults.rs server_paused_past_session_timeout \
                     (ZooKeeper alone)"
                ),
            ),
            (
                "holder_replies_blackholed_past_ttl",
                dual_session!("backend-dual/tests/faults.rs first_side_connection_lost_fires_lost"),
            ),
            (
                "holder_requests_blackholed_past_ttl",
                dual_session!(
                    "backend-zk/tests/faults/sessions.rs holder_blackholed_past_session_timeout \
                     (ZooKeeper alone)"
                ),
            ),
            (
                "holder_process_killed",
                dual_session!(
                    "backend-zk/tests/session_faults.rs holder_process_killed_past_session_timeout \
                     (ZooKeeper alone)"
                ),
            ),
            (
                "client_paused_past_ttl",
                dual_session!(
                    "backend-zk/tests/session_faults.rs client_paused_past_session_timeout \
                     (ZooKeeper alone)"
                ),
            ),
            // Both stores have semaphores: a permit is held on both, its token at least
            // ZooKeeper's czxid, which survives the restart.
            ("sem_server_killed_and_restarted", Expect::Safe),
            ("rw_reader_server_killed_and_restarted", Expect::Safe),
            (
                "sem_holder_blackholed_past_ttl",
                dual_session!(
                    "backend-zk/tests/faults/semaphores.rs \
                     silent_permit_holder_returns_its_permit_with_its_session (ZooKeeper alone)"
                ),
            ),
            (
                "store_connections_killed",
                Expect::NotApplicable(
                    "ZooKeeper cannot end client connections from the server side; dual's lost \
                     connections are cut with the kit's proxy instead: \
                     backend-dual/tests/faults.rs first_side_connection_lost_fires_lost and \
                     second_side_connection_lost_fires_lost",
                ),
            ),
        ],
    }
}

/// Why the server scenarios cannot run on `name`, where it has no server a scenario may
/// start and break.
fn without_server(name: SpawnName) -> Option<&'static str> {
    match name {
        SpawnName::Sqlite => Some("embedded store: there is no server to kill, pause or cut off"),
        _ => None,
    }
}

/// Adds to `target` (a store of the backend `name`) how that backend fares in every fault
/// scenario, and the way a scenario starts a private server of it.
pub fn declare(name: SpawnName, target: Target) -> Target {
    declare_with_options(name, target, "")
}

/// As [`declare`], with URL query options (`layout=curator`) added to the URL of every server a
/// scenario starts, so that a scenario runs the same variant of the backend as the cases.
pub fn declare_with_options(name: SpawnName, target: Target, options: &'static str) -> Target {
    let mut target = match name {
        SpawnName::Postgres => target.spawn_with(|persistence| async move {
            durable_only(persistence, "SQL servers always persist committed rows")?;
            let pg = Postgres::start().await?;
            let url = pg.fresh_database("faults").await?;
            Ok(Spawned {
                server: Box::new(pg),
                url,
                keep: None,
            })
        }),
        SpawnName::Mariadb => target.spawn_with(|persistence| async move {
            durable_only(persistence, "SQL servers always persist committed rows")?;
            let db = MariaDb::start().await?;
            let url = db.fresh_database("faults").await?;
            Ok(Spawned {
                server: Box::new(db),
                url,
                keep: None,
            })
        }),
        SpawnName::Redis | SpawnName::Tair => target.spawn_with(move |persistence| async move {
            let redis = Redis::start_with(redis_args(persistence)).await?;
            let url = if name == SpawnName::Tair {
                redis.url().replacen("redis://", "tair://", 1)
            } else {
                redis.url()
            };
            Ok(Spawned {
                url,
                server: Box::new(redis),
                keep: None,
            })
        }),
        SpawnName::Redlock3 | SpawnName::Redlock5 => {
            let n = if name == SpawnName::Redlock3 { 3 } else { 5 };
            // A scenario breaks every node at once (the kit's `RedisSet` control); faults of
            // single nodes are Redlock's own, in backend-redlock/tests/faults.rs.
            target.spawn_with(move |persistence| async move {
                let set = RedisSet::start(n, redis_args(persistence)).await?;
                Ok(Spawned {
                    url: set.redlock_url(),
                    server: Box::new(set),
                    keep: None,
                })
            })
        }
        SpawnName::Zk => target.spawn_with(move |persistence| async move {
            durable_only(persistence, "ZooKeeper always persists acknowledged writes")?;
            let zk = ZooKeeper::start().await?;
            Ok(Spawned {
                url: format!(
                    "{}/faults?session_timeout=4s{}{options}",
                    zk.url(),
                    if options.is_empty() { "" } else { "&" }
                ),
                server: Box::new(zk),
                keep: None,
            })
        }),
        // A scenario breaks every member at once (the kit's `ZkEnsemble` control); the kill of
        // one member is ZooKeeper's own scenario, in backend-zk/tests/faults/fencing.rs.
        SpawnName::ZkEnsemble => target.spawn_with(move |persistence| async move {
            durable_only(persistence, "ZooKeeper always persists acknowledged writes")?;
            let ensemble = ZkEnsemble::start(3).await?;
            Ok(Spawned {
                url: format!(
                    "{}/faults?session_timeout=4s{}{options}",
                    ensemble.url(),
                    if options.is_empty() { "" } else { "&" }
                ),
                server: Box::new(ensemble),
                keep: None,
            })
        }),
        SpawnName::Dual => target.spawn_with(|persistence| async move {
            let zk = ZooKeeper::start().await?;
            let redis = Redis::start_with(redis_args(persistence)).await?;
            Ok(Spawned {
                url: crate::spawn::dual_url(
                    &format!("{}/faults?session_timeout=4s", zk.url()),
                    &redis.url(),
                ),
                server: Box::new(ZkAndRedis { zk, redis }),
                keep: None,
            })
        }),
        SpawnName::RedisCluster => target.spawn_with(|persistence| async move {
            let cluster = RedisCluster::start_with(3, redis_args(persistence)).await?;
            Ok(Spawned {
                url: cluster.url(),
                server: Box::new(cluster),
                keep: None,
            })
        }),
        SpawnName::Sqlite => target,
    };
    for (scenario, expect) in declarations(name) {
        target = target.fault(scenario, expect);
    }
    match without_server(name) {
        Some(reason) => target.without_server(reason),
        None => target,
    }
}

fn redis_args(persistence: Persistence) -> &'static [&'static str] {
    match persistence {
        Persistence::Durable => DURABLE_REDIS,
        Persistence::None => &[],
    }
}

fn durable_only(persistence: Persistence, why: &'static str) -> Result<(), KitError> {
    match persistence {
        Persistence::Durable => Ok(()),
        Persistence::None => Err(KitError::new(KitErrorKind::InvalidArgument, why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Kind, registry};

    /// A reason that sends the reader to another test file names the tests too
    /// (`backend-zk/tests/faults/sessions.rs holder_blackholed_past_session_timeout`), and each of
    /// them exists: every snake_case word of the reason is a `fn` of a file it names.
    #[test]
    fn reasons_name_tests_that_exist() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut reasons: Vec<&str> = SpawnName::ALL
            .iter()
            .filter_map(|n| without_server(*n))
            .collect();
        for name in SpawnName::ALL {
            for (_, expect) in declarations(*name) {
                if let Expect::NotApplicable(r) | Expect::DocumentedUnsafe(r) = expect {
                    reasons.push(r);
                }
            }
        }
        for reason in reasons {
            let words: Vec<&str> = reason
                .split_whitespace()
                .map(|w| w.trim_matches(|c: char| ",;:()`".contains(c)))
                .collect();
            let files: Vec<String> = words
                .iter()
                .filter(|w| w.ends_with(".rs"))
                .map(|f| {
                    std::fs::read_to_string(root.join(f))
                        .unwrap_or_else(|e| panic!("{f}, named in {reason:?}: {e}"))
                })
                .collect();
            let tests: Vec<&&str> = words
                .iter()
                .filter(|w| {
                    w.contains('_')
                        && w.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
                .collect();
            assert!(
                tests.len() >= files.len(),
                "{reason:?} names a test file but not a test in it"
            );
            for test in tests {
                let def = format!("fn {test}(");
                assert!(
                    files.iter().any(|f| f.contains(&def)),
                    "{reason:?} names {test}, which no file it names defines"
                );
            }
        }
    }

    /// A scenario declared twice would keep only its last declaration, silently; one the
    /// registry lacks would panic in `Target::fault` only when a target is built.
    #[test]
    fn declarations_name_each_registry_scenario_at_most_once() {
        for name in SpawnName::ALL {
            let mut seen = std::collections::BTreeSet::new();
            for (scenario, _) in declarations(*name) {
                assert!(seen.insert(scenario), "{name}: {scenario} twice");
                assert!(
                    registry()
                        .iter()
                        .any(|c| c.kind == Kind::Fault && c.name == scenario),
                    "{name}: {scenario} is no fault scenario"
                );
            }
        }
    }
}
