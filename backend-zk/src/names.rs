//! Lock names to znode names, and lock-node names to (kind, owner, sequence).

use lockcore::{LockName, OwnerId};
use sha2::{Digest, Sha256};

/// Escaped names longer than this are shortened to a readable head plus a hash.
const MAX_NODE_NAME: usize = 200;
/// How much of the escaped name a hashed node name keeps.
const HASHED_HEAD: usize = 120;

/// The znode name of a lock's parent: [`LockName::escaped`] (only `[A-Za-z0-9_%-]`, so `/`,
/// `.`, `..`, control characters and case stay distinct and path-safe), prefixed with `n-` so
/// that no name can be `zookeeper` or start like a reserved node. An escaped name longer than
/// 200 bytes becomes its first 120 bytes, `~`, and the SHA-256 of the full name in hex: `~`
/// never appears in an escaped name, so hashed and plain node names cannot collide.
pub(crate) fn node_name(name: &LockName) -> String {
    let mut out = String::from("n-");
    name.escape_into(&mut out);
    if out.len() <= MAX_NODE_NAME {
        return out;
    }
    let digest = Sha256::digest(name.as_str().as_bytes());
    out.truncate(HASHED_HEAD);
    out.push('~');
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// What a child of a lock's parent is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// An exclusive (mutex or write) request.
    Exclusive,
    /// A shared (read) request.
    Shared,
}

impl NodeKind {
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            NodeKind::Exclusive => "write-",
            NodeKind::Shared => "read-",
        }
    }
}

/// A parsed child of a lock's parent: `write-{owner}-{seq}` (a mutex or write request) or
/// `read-{owner}-{seq}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Child {
    pub(crate) node: String,
    pub(crate) kind: NodeKind,
    pub(crate) owner: OwnerId,
    pub(crate) seq: i64,
}

/// The name prefix a request's node is created with (the server appends the sequence).
pub(crate) fn request_prefix(kind: NodeKind, owner: OwnerId) -> String {
    format!("{}{owner}-", kind.prefix())
}

/// Parses a child's name; `None` for anything this crate did not create.
pub(crate) fn parse_child(node: &str) -> Option<Child> {
    let (kind, rest) = if let Some(r) = node.strip_prefix("write-") {
        (NodeKind::Exclusive, r)
    } else {
        (NodeKind::Shared, node.strip_prefix("read-")?)
    };
    let (owner, seq) = rest.split_once('-')?;
    Some(Child {
        node: node.to_owned(),
        kind,
        owner: OwnerId::parse(owner)?,
        seq: seq.parse().ok().filter(|s: &i64| *s >= 0)?,
    })
}

/// The children this crate made, in queue (sequence) order.
pub(crate) fn queue(children: &[String]) -> Vec<Child> {
    let mut q: Vec<Child> = children.iter().filter_map(|c| parse_child(c)).collect();
    q.sort_by_key(|c| c.seq);
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_safe_and_distinct() {
        let long_a = "x".repeat(1024);
        let long_b = format!("{}y", "x".repeat(1023));
        let names = [
            ".",
            "..",
            "/",
            "zookeeper",
            "a/b",
            "a%2Fb",
            "A",
            "a",
            "a b",
            "\u{1}",
            &long_a,
            &long_b,
        ];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            let node = node_name(&LockName::new(n).unwrap());
            assert!(node.len() <= MAX_NODE_NAME + 1 + 64, "{node}");
            assert!(node.starts_with("n-"));
            assert!(
                node.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"%_-~".contains(&b)),
                "{node}"
            );
            assert!(seen.insert(node.clone()), "collision on {node}");
        }
    }

    #[test]
    fn children_parse_and_sort() {
        let o = OwnerId(7);
        let a = format!("{}0000000012", request_prefix(NodeKind::Exclusive, o));
        let b = format!("{}0000000003", request_prefix(NodeKind::Shared, o));
        let q = queue(&[a.clone(), "junk".into(), b.clone(), "write-zz-1".into()]);
        assert_eq!(q.len(), 2);
        assert_eq!(
            (q[0].node.as_str(), q[0].kind, q[0].seq),
            (b.as_str(), NodeKind::Shared, 3)
        );
        assert_eq!(
            (q[1].node.as_str(), q[1].owner, q[1].seq),
            (a.as_str(), o, 12)
        );
    }
}
