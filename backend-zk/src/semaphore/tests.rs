use super::*;

#[test]
fn permit_nodes_parse_in_each_layout() {
    let o = OwnerId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    let dlock = format!("{DLOCK_PERMIT}{o}-0000000012");
    let p = parse_permit(Layout::Dlock, &dlock).unwrap();
    assert_eq!((p.owner, p.seq), (Some(o), Some(12)));
    let curator = format!("{}{CURATOR_LEASE}0000000003", names::curator_protected(o));
    let p = parse_permit(Layout::Curator, &curator).unwrap();
    assert_eq!((p.owner, p.seq), (Some(o), Some(3)));
    // Curator without protection: a lease, of no known owner.
    let p = parse_permit(Layout::Curator, "lease-0000000004").unwrap();
    assert_eq!((p.owner, p.seq), (None, Some(4)));
    let p = parse_permit(Layout::Kazoo, &o.to_string()).unwrap();
    assert_eq!((p.owner, p.seq), (Some(o), None));
    for (layout, junk) in [
        (Layout::Dlock, "write-0123-0000000001"),
        (Layout::Curator, "_c_x-lock-0000000001"),
        (
            Layout::Kazoo,
            "0123456789abcdef0011223344556677__lock__0000000001",
        ),
        (Layout::Kazoo, "lock"),
    ] {
        assert_eq!(parse_permit(layout, junk), None, "{junk}");
    }
    assert_eq!(recorded(b"3"), Some(3));
    assert_eq!(recorded(b""), None);
}
