//! Free ports: distinct, and away from the default and ephemeral ones.

use conformance_tests::kit::free_port;

#[test]
fn free_ports_are_distinct_and_below_the_ephemeral_range() {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let ephemeral_low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
    // Whether each port was bindable when handed out is checked deterministically by the kit's
    // `pick_port` unit test. Binding here would race every other process on the machine (a
    // clean-clone CI run once lost one of 50 ports that way), which `free_port` does not
    // promise to win: servers retry on a fresh port instead.
    let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
    let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "no port is handed out twice");
    for port in ports {
        assert!(port < ephemeral_low, "{port} is below the ephemeral range");
        assert!(![5432, 3306, 6379, 2181].contains(&port));
    }
}
