//! With credentials, the ACL check of every existing node dlock uses as a parent: the base node
//! (at each new session) and the node that holds a lock's or a semaphore's contender nodes
//! (once per node). Another identity that may do more than read such a node could delete a
//! holder's node (DELETE), queue nodes of its own, which in dlock's layout can fake a holder's
//! release mark (CREATE), change a semaphore's recorded count (WRITE), or grant itself any of
//! these (ADMIN); so such a node is refused with [`Error::AccessDenied`], naming it and its ACL.
//! See the crate README, "Access control".
//!
//! A checked node is remembered by its path and `czxid`, so that a node deleted and made again
//! (an empty CONTAINER goes, another client makes it anew) is checked again: every listing that
//! decides a grant carries the parent's stat, and a `czxid` not remembered means one more read.
//!
//! This module judges an ACL and remembers the verdicts; the reads are made in `session.rs` (the
//! base node) and by `ZkLock::check_parent` in `recipe.rs`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use lockcore::{Error, Result};
use zookeeper_client as zk;

use crate::BACKEND;
use crate::config::ZkConfig;

/// How many checked parents a client remembers. When full it forgets them all; each is then
/// checked again on its next use (for a lock, with a read sent along with the create).
const REMEMBERED: usize = 4096;

/// What another identity may be granted on a parent.
const OTHERS_MAY: zk::Permission = zk::Permission::READ;

/// The identity of this client's credentials, and the parents found safe for it.
pub(crate) struct ParentAcls {
    /// The user name, for messages.
    user: String,
    /// `user:base64(sha1(user:password))`, the id the server records for these credentials.
    digest_id: String,
    /// Parent path → the `czxid` of the node whose ACL was found safe.
    checked: Mutex<HashMap<String, i64>>,
}

impl ParentAcls {
    /// `None` without credentials: every node is then world-open, and nothing is checked.
    pub(crate) fn of(config: &ZkConfig) -> Option<ParentAcls> {
        let creds = config.credentials.as_ref()?;
        Some(ParentAcls {
            user: creds.user.clone(),
            digest_id: creds.digest_id(),
            checked: Mutex::new(HashMap::new()),
        })
    }

    fn checked(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.checked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `path` was checked before (as some node; see [`Self::is_safe`] for which).
    pub(crate) fn knows(&self, path: &str) -> bool {
        self.checked().contains_key(path)
    }

    /// Whether the node at `path` with `czxid` was found safe.
    pub(crate) fn is_safe(&self, path: &str, czxid: i64) -> bool {
        self.checked().get(path) == Some(&czxid)
    }

    /// Records the node at `path` with `czxid` as found safe.
    pub(crate) fn remember(&self, path: &str, czxid: i64) {
        let mut checked = self.checked();
        if checked.len() >= REMEMBERED && !checked.contains_key(path) {
            checked.clear();
        }
        checked.insert(path.to_owned(), czxid);
    }

    fn is_ours(&self, acl: &zk::Acl) -> bool {
        acl.scheme() == "digest" && acl.id() == self.digest_id
    }

    /// Refuses `acls` of the node at `path` if an entry not ours grants more than READ.
    ///
    /// # Errors
    /// [`Error::AccessDenied`] naming the path, the ACL and what to do.
    pub(crate) fn check(
        &self,
        operation: &'static str,
        path: &str,
        acls: &[zk::Acl],
    ) -> Result<()> {
        let others = |a: &&zk::Acl| !self.is_ours(a) && !OTHERS_MAY.has(a.permission());
        if !acls.iter().any(|a| others(&a)) {
            return Ok(());
        }
        let shown: Vec<String> = acls.iter().map(|a| self.show(a)).collect();
        // Without ADMIN on a node the server shows digest ids as `user:x`.
        let hidden_id = format!("{}:x", self.user);
        let hidden = acls
            .iter()
            .filter(others)
            .any(|a| a.scheme() == "digest" && a.id() == hidden_id);
        let user = &self.user;
        let mut reason = format!(
            "{path} has ACL {}, which lets identities other than these credentials (digest user \
             {user}) do more than read it: they could delete a holder's node, or queue nodes \
             of their own, or change the ACL. With credentials dlock uses only nodes on which \
             every other identity may at most READ. If no lock uses it, delete the node and \
             dlock makes it again creator-only; else limit it to these credentials (zkCli: \
             addauth digest {user}:PASSWORD, then setAcl {path} auth::cdrwa, or \
             auth::cdrwa,world:anyone:r to let others read). Curator and kazoo make world-open \
             nodes unless given an ACL: run them with these credentials and a creator-only ACL",
            shown.join(",")
        );
        if hidden {
            reason.push_str(&format!(
                ". (The server hides digest ids from a client without ADMIN on the node, so \
                 dlock cannot tell an entry for {user} from one for another password)"
            ));
        }
        Err(Error::access_denied(BACKEND, operation, reason))
    }

    /// `scheme:id:perms` as zkCli writes it, with a digest id's hash hidden (it is derived
    /// from a password).
    fn show(&self, acl: &zk::Acl) -> String {
        let id = match acl.scheme() {
            "digest" => {
                let user = acl.id().split_once(':').map_or(acl.id(), |(u, _)| u);
                let mark = if self.is_ours(acl) {
                    " (these credentials)"
                } else {
                    ""
                };
                format!("{user}:***{mark}")
            }
            _ => acl.id().to_owned(),
        };
        format!("{}:{id}:{}", acl.scheme(), perms(acl.permission()))
    }
}

/// Permissions in zkCli's letters (`cdrwa`).
fn perms(p: zk::Permission) -> String {
    [
        (zk::Permission::CREATE, 'c'),
        (zk::Permission::DELETE, 'd'),
        (zk::Permission::READ, 'r'),
        (zk::Permission::WRITE, 'w'),
        (zk::Permission::ADMIN, 'a'),
    ]
    .into_iter()
    .filter(|(bit, _)| p.has(*bit))
    .map(|(_, letter)| letter)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acls() -> ParentAcls {
        ParentAcls::of(&ZkConfig::parse("zk://alice:s3cret@h/app").unwrap()).unwrap()
    }

    fn acl(perms: zk::Permission, scheme: &str, id: &str) -> zk::Acl {
        zk::Acl::new(perms, zk::AuthId::new(scheme, id))
    }

    const ALICE: &str = "alice:uLxpHc/uhT86OXPoSjJTp1M8CJY=";

    #[test]
    fn only_read_for_others_is_safe() {
        let a = acls();
        let ok = |list: &[zk::Acl]| a.check("acquire", "/p", list).is_ok();
        use zk::Permission as P;
        assert!(ok(&[acl(P::ALL, "digest", ALICE)]));
        assert!(ok(&[
            acl(P::ALL, "digest", ALICE),
            acl(P::READ, "world", "anyone")
        ]));
        assert!(ok(&[acl(P::READ, "ip", "10.0.0.1")]));
        for other in [
            acl(P::ALL, "world", "anyone"),
            acl(P::DELETE, "world", "anyone"),
            acl(P::CREATE, "ip", "127.0.0.1"),
            acl(P::ADMIN, "digest", "mallory:abc="),
            acl(P::WRITE | P::READ, "sasl", "bob"),
            // Same user, another password; and a digest id the server hid.
            acl(P::DELETE, "digest", "alice:abc="),
            acl(P::ALL, "digest", "alice:x"),
        ] {
            assert!(
                !ok(&[acl(P::ALL, "digest", ALICE), other.clone()]),
                "{other:?}"
            );
        }
    }

    #[test]
    fn refusal_names_path_and_acl_without_hashes() {
        use zk::Permission as P;
        let e = acls()
            .check(
                "acquire",
                "/app/orders",
                &[
                    acl(P::ALL, "world", "anyone"),
                    acl(P::ALL, "digest", ALICE),
                    acl(P::READ | P::DELETE, "digest", "eve:abc="),
                ],
            )
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::AccessDenied { .. }), "{text}");
        assert!(text.contains("/app/orders has ACL world:anyone:cdrwa,digest:alice:*** (these credentials):cdrwa,digest:eve:***:dr"), "{text}");
        assert!(text.contains("setAcl /app/orders auth::cdrwa"), "{text}");
        assert!(!text.contains("uLxp") && !text.contains("abc="), "{text}");
        let hidden = acls()
            .check("acquire", "/p", &[acl(P::ALL, "digest", "alice:x")])
            .unwrap_err()
            .to_string();
        assert!(hidden.contains("hides digest ids"), "{hidden}");
        let other_password = acls()
            .check("acquire", "/p", &[acl(P::ALL, "digest", "alice:abc=")])
            .unwrap_err()
            .to_string();
        assert!(!other_password.contains("hides"), "{other_password}");
    }
}
