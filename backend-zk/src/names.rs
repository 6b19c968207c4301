//! Where a lock's nodes live and what they are called, in each [`Layout`]: lock names to
//! znode paths, and lock-node names to (kind, owner, sequence).

use lockcore::{Error, LockName, OwnerId, Result};
use sha2::{Digest, Sha256};

/// How a client lays its locks out in ZooKeeper (the URL's `layout=` option).
///
/// In dlock's own layout every name gets a node of its own under `{chroot}/{prefix}` (escaped,
/// so any [`LockName`] works) and its contenders are dlock's alone. In Curator's and kazoo's,
/// the name *is* the lock's path under the chroot, and the contender nodes are named as those
/// libraries name theirs, so that dlock and their clients queue for one lock together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `{chroot}/{prefix}/n-{escaped name}/write-{owner}-{seq}` (and `read-`).
    #[default]
    Dlock,
    /// Apache Curator's: `{chroot}/{name}/_c_{uuid}-lock-{seq}` (`InterProcessMutex`), and
    /// `_c_{uuid}-__WRIT__{seq}` / `_c_{uuid}-__READ__{seq}` (`InterProcessReadWriteLock`).
    Curator,
    /// kazoo's: `{chroot}/{name}/{uuid}__lock__{seq}` (`Lock`, `WriteLock`) and
    /// `{uuid}__rlock__{seq}` (`ReadLock`).
    Kazoo,
}

impl Layout {
    /// Parses the `layout=` option's value.
    pub fn parse(text: &str) -> Option<Layout> {
        match text {
            "dlock" => Some(Layout::Dlock),
            "curator" => Some(Layout::Curator),
            "kazoo" => Some(Layout::Kazoo),
            _ => None,
        }
    }

    /// The option value that selects this layout.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Dlock => "dlock",
            Layout::Curator => "curator",
            Layout::Kazoo => "kazoo",
        }
    }

    /// Whether lock names are znode paths under the chroot (Curator's and kazoo's layouts),
    /// rather than escaped into a node of their own.
    pub fn names_are_paths(self) -> bool {
        self != Layout::Dlock
    }
}

/// What an acquisition asks for. The two exclusive kinds differ only in Curator's layout, where
/// `InterProcessMutex` and `InterProcessReadWriteLock`'s writer name their nodes differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// A plain exclusive lock (`lock`, `try_lock`).
    Mutex,
    /// The write side of a read-write lock.
    Write,
    /// The read side of a read-write lock.
    Read,
}

impl Request {
    /// The kind of node the request creates.
    pub(crate) fn kind(self) -> NodeKind {
        match self {
            Request::Mutex | Request::Write => NodeKind::Exclusive,
            Request::Read => NodeKind::Shared,
        }
    }
}

/// The znode that holds `name`'s contenders: `{base}/n-{escaped}` in dlock's layout (`base` is
/// `{chroot}/{prefix}`), `{base}/{name}` in the others (`base` is the chroot).
///
/// # Errors
/// [`Error::InvalidName`], in the path layouts, for a name that is no znode path (see
/// [`check_path_name`]).
pub(crate) fn lock_path(layout: Layout, base: &str, name: &LockName) -> Result<String> {
    if layout.names_are_paths() {
        check_path_name(name, base.is_empty())?;
        Ok(format!("{base}/{}", name.as_str()))
    } else {
        Ok(format!("{base}/{}", node_name(name)))
    }
}

/// Checks that `name` is a znode path relative to the chroot, as ZooKeeper's own
/// `PathUtils.validatePath` has it: segments separated by single `/`, none empty (so no leading
/// or trailing `/`), `.` or `..`, and no character ZooKeeper refuses (controls, U+E000..U+F8FF,
/// U+FFF0..U+FFFF, and everything beyond U+FFFF, which Java holds as surrogates, also
/// refused). Without a chroot the first segment may not be `zookeeper`, the server's own.
fn check_path_name(name: &LockName, no_chroot: bool) -> Result<()> {
    let invalid = |why: String| Error::InvalidName {
        reason: format!(
            "{why}: with layout=curator or layout=kazoo a lock name is a znode path under the \
             chroot, like `orders` or `app/orders`"
        ),
    };
    for (i, segment) in name.as_str().split('/').enumerate() {
        match segment {
            "" => {
                return Err(invalid(
                    "the name has an empty segment (a leading, trailing or doubled `/`)".into(),
                ));
            }
            "." | ".." => return Err(invalid(format!("the name has a `{segment}` segment"))),
            "zookeeper" if i == 0 && no_chroot => {
                return Err(invalid("`/zookeeper` is the server's own node".into()));
            }
            _ => {}
        }
        if let Some(c) = segment
            .chars()
            .find(|&c| c.is_control() || ('\u{E000}'..='\u{F8FF}').contains(&c) || c >= '\u{FFF0}')
        {
            return Err(invalid(format!(
                "the name contains {c:?}, which ZooKeeper refuses in a path"
            )));
        }
    }
    Ok(())
}

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

/// A parsed contender node in a lock's parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Child {
    pub(crate) node: String,
    pub(crate) kind: NodeKind,
    /// The acquisition's owner id, read from the node's name: dlock's own nodes always carry
    /// one; another library's node carries its client's random id (Curator's protection UUID,
    /// kazoo's hex UUID), read as an owner id too, or none (Curator without protection).
    pub(crate) owner: Option<OwnerId>,
    pub(crate) seq: i64,
}

/// The name a request's node is created with, before the sequence the server appends.
///
/// In Curator's and kazoo's layouts the owner id stands where those libraries put the random
/// id that lets a client find its node again after a lost reply: Curator's protection UUID
/// (`_c_{8-4-4-4-12 hex}-`) and kazoo's `uuid4().hex`. A `lock` is Curator's
/// `InterProcessMutex` node (`lock-`), a write lock `InterProcessReadWriteLock`'s (`__WRIT__`);
/// kazoo's `Lock` and `WriteLock` share `__lock__`.
pub(crate) fn request_prefix(layout: Layout, request: Request, owner: OwnerId) -> String {
    match layout {
        Layout::Dlock => match request.kind() {
            NodeKind::Exclusive => format!("write-{owner}-"),
            NodeKind::Shared => format!("read-{owner}-"),
        },
        Layout::Curator => {
            let name = match request {
                Request::Mutex => CURATOR_MUTEX,
                Request::Write => CURATOR_WRITE,
                Request::Read => CURATOR_READ,
            };
            format!("{}{name}", curator_protected(owner))
        }
        Layout::Kazoo => match request.kind() {
            NodeKind::Exclusive => format!("{owner}{KAZOO_WRITE}"),
            NodeKind::Shared => format!("{owner}{KAZOO_READ}"),
        },
    }
}

/// The head Curator's protected mode (`CreateBuilder.withProtection`) puts before a node's
/// name, with `owner` standing for its UUID: `_c_{8-4-4-4-12 hex}-`.
pub(crate) fn curator_protected(owner: OwnerId) -> String {
    let hex = owner.to_string();
    format!(
        "{CURATOR_PROTECTED}{}-{}-{}-{}-{}-",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Curator's protected-mode prefix (`CreateBuilder.withProtection`).
const CURATOR_PROTECTED: &str = "_c_";
/// `InterProcessMutex`'s lock name: Curator sorts its nodes by the text after the last one.
const CURATOR_MUTEX: &str = "lock-";
/// `InterProcessReadWriteLock`'s writer and reader lock names.
const CURATOR_WRITE: &str = "__WRIT__";
const CURATOR_READ: &str = "__READ__";
/// kazoo's `Lock._NODE_NAME` (also `WriteLock`'s) and `ReadLock`'s.
const KAZOO_WRITE: &str = "__lock__";
const KAZOO_READ: &str = "__rlock__";

/// Every contender node name Curator's and kazoo's lock recipes create: the lock name before
/// the sequence, the kind of request it stands for, and how to read the client's id before it.
#[allow(clippy::type_complexity)]
const LIBRARY_NODES: [(&str, NodeKind, fn(&str) -> Option<OwnerId>); 5] = [
    (CURATOR_MUTEX, NodeKind::Exclusive, curator_owner),
    (CURATOR_WRITE, NodeKind::Exclusive, curator_owner),
    (CURATOR_READ, NodeKind::Shared, curator_owner),
    (KAZOO_WRITE, NodeKind::Exclusive, OwnerId::parse),
    (KAZOO_READ, NodeKind::Shared, OwnerId::parse),
];

/// Parses a child's name; `None` for anything that is no contender node of `layout`.
///
/// In the path layouts every node Curator's or kazoo's lock recipes make counts, whichever of
/// the two layouts this client uses: a dlock client then never holds beside a client of either
/// library, though those two libraries do not see each other's nodes.
pub(crate) fn parse_child(layout: Layout, node: &str) -> Option<Child> {
    if layout.names_are_paths() {
        return parse_library_child(node);
    }
    let (kind, rest) = if let Some(r) = node.strip_prefix("write-") {
        (NodeKind::Exclusive, r)
    } else {
        (NodeKind::Shared, node.strip_prefix("read-")?)
    };
    let (owner, seq) = rest.split_once('-')?;
    Some(Child {
        node: node.to_owned(),
        kind,
        owner: Some(OwnerId::parse(owner)?),
        seq: seq.parse().ok().filter(|s: &i64| *s >= 0)?,
    })
}

/// A Curator or kazoo contender: a lock name from [`LIBRARY_NODES`] right before the ten-digit
/// sequence the server appended (both libraries order their contenders by that sequence:
/// Curator by the text after the lock name, kazoo by the digits its pattern matches).
fn parse_library_child(node: &str) -> Option<Child> {
    let split = node.len().checked_sub(10)?;
    let (stem, digits) = (node.get(..split)?, &node[split..]);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (name, kind, owner) = LIBRARY_NODES
        .iter()
        .find(|(name, _, _)| stem.ends_with(name))?;
    Some(Child {
        node: node.to_owned(),
        kind: *kind,
        owner: owner(&stem[..stem.len() - name.len()]),
        seq: digits.parse().ok()?,
    })
}

/// The owner id in a Curator protected node's head, `_c_{8-4-4-4-12 hex}-`.
pub(crate) fn curator_owner(head: &str) -> Option<OwnerId> {
    let uuid = head.strip_prefix(CURATOR_PROTECTED)?.strip_suffix('-')?;
    let dashes = [8, 13, 18, 23];
    if uuid.len() != 36 || dashes.iter().any(|&i| uuid.as_bytes()[i] != b'-') {
        return None;
    }
    OwnerId::parse(&uuid.replace('-', "").to_ascii_lowercase())
}

/// The contender nodes among `children`, in queue (sequence) order.
pub(crate) fn queue(layout: Layout, children: &[String]) -> Vec<Child> {
    let mut q: Vec<Child> = children
        .iter()
        .filter_map(|c| parse_child(layout, c))
        .collect();
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
        let a = format!(
            "{}0000000012",
            request_prefix(Layout::Dlock, Request::Mutex, o)
        );
        let b = format!(
            "{}0000000003",
            request_prefix(Layout::Dlock, Request::Read, o)
        );
        let q = queue(
            Layout::Dlock,
            &[a.clone(), "junk".into(), b.clone(), "write-zz-1".into()],
        );
        assert_eq!(q.len(), 2);
        assert_eq!(
            (q[0].node.as_str(), q[0].kind, q[0].seq),
            (b.as_str(), NodeKind::Shared, 3)
        );
        assert_eq!(
            (q[1].node.as_str(), q[1].owner, q[1].seq),
            (a.as_str(), Some(o), 12)
        );
    }

    /// The node names Curator 5.4 and kazoo 2.11 create (as their sources build them), and
    /// dlock's own in those layouts, all parse with their kind, id and sequence; dlock's
    /// layout sees none of them.
    #[test]
    fn library_nodes_parse_in_the_path_layouts() {
        let o = OwnerId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let uuid = "01234567-89ab-cdef-0011-223344556677";
        let hex = "0123456789abcdef0011223344556677";
        let cases = [
            (format!("_c_{uuid}-lock-0000000004"), NodeKind::Exclusive),
            (format!("_c_{uuid}-__WRIT__0000000002"), NodeKind::Exclusive),
            (format!("_c_{uuid}-__READ__0000000007"), NodeKind::Shared),
            (format!("{hex}__lock__0000000001"), NodeKind::Exclusive),
            (format!("{hex}__rlock__0000000009"), NodeKind::Shared),
        ];
        for (node, kind) in &cases {
            for layout in [Layout::Curator, Layout::Kazoo] {
                let c = parse_child(layout, node).unwrap_or_else(|| panic!("{node}"));
                assert_eq!((c.kind, c.owner), (*kind, Some(o)), "{node}");
            }
            assert_eq!(parse_child(Layout::Dlock, node), None, "{node}");
        }
        let q = queue(
            Layout::Kazoo,
            &cases.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        );
        assert_eq!(q.iter().map(|c| c.seq).collect::<Vec<_>>(), [1, 2, 4, 7, 9]);
        // Curator without protection has no id; foreign or malformed names are not contenders.
        let bare = parse_child(Layout::Curator, "lock-0000000003").unwrap();
        assert_eq!((bare.owner, bare.seq), (None, 3));
        for junk in [
            "lock-000000003",
            "lock-00000000x3",
            "write-0123-0000000003",
            "0000000003",
            "__lock__",
            "x__lock__-000000003",
        ] {
            assert_eq!(parse_child(Layout::Curator, junk), None, "{junk}");
        }
        // What dlock creates is what it parses back.
        for layout in [Layout::Curator, Layout::Kazoo] {
            for request in [Request::Mutex, Request::Write, Request::Read] {
                let node = format!("{}0000000042", request_prefix(layout, request, o));
                let c = parse_child(layout, &node).unwrap_or_else(|| panic!("{node}"));
                assert_eq!((c.kind, c.owner, c.seq), (request.kind(), Some(o), 42));
            }
        }
        assert_eq!(
            request_prefix(Layout::Curator, Request::Mutex, o),
            format!("_c_{uuid}-lock-")
        );
        assert_eq!(
            request_prefix(Layout::Curator, Request::Write, o),
            format!("_c_{uuid}-__WRIT__")
        );
        assert_eq!(
            request_prefix(Layout::Kazoo, Request::Read, o),
            format!("{hex}__rlock__")
        );
    }

    #[test]
    fn path_names_are_checked_before_use() {
        let path =
            |base: &str, n: &str| lock_path(Layout::Curator, base, &LockName::new(n).unwrap());
        assert_eq!(path("/app", "orders").unwrap(), "/app/orders");
        assert_eq!(path("/app", "a/b").unwrap(), "/app/a/b");
        assert_eq!(path("", "zoo/keeper").unwrap(), "/zoo/keeper");
        assert_eq!(path("/app", "zookeeper").unwrap(), "/app/zookeeper");
        assert_eq!(path("/app", "ü \u{2713}").unwrap(), "/app/ü \u{2713}");
        for bad in [
            "/orders",
            "orders/",
            "a//b",
            ".",
            "..",
            "a/./b",
            "a/../b",
            "a\u{1}b",
            "a\u{7f}",
            "a\u{e000}",
            "a\u{fff0}",
            "lock \u{1f512}",
        ] {
            assert!(
                matches!(path("/app", bad), Err(Error::InvalidName { .. })),
                "{bad:?} was accepted"
            );
        }
        assert!(matches!(
            path("", "zookeeper/x"),
            Err(Error::InvalidName { .. })
        ));
        // dlock's own layout escapes any name.
        assert_eq!(
            lock_path(Layout::Dlock, "/app/dlock", &LockName::new("a//b").unwrap()).unwrap(),
            "/app/dlock/n-a%2F%2Fb"
        );
    }
}
