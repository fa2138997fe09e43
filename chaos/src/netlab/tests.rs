use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::*;

/// A listener on port 7000 of node `i`, answering every connection (until the test ends).
fn listen_in(lab: &NetLab, i: usize) -> SocketAddr {
    let addr = SocketAddr::from((lab.node(i).addr, 7000));
    let listener = in_netns(&lab.node(i).netns, move || TcpListener::bind(addr))
        .expect("enter the namespace")
        .expect("bind in the namespace");
    std::thread::spawn(move || for _ in listener.incoming() {});
    addr
}

fn connects(to: SocketAddr) -> bool {
    TcpStream::connect_timeout(&to, Duration::from_millis(500)).is_ok()
}

#[test]
#[cfg_attr(not(has_nft), ignore = "needs root, ip and nft")]
fn a_cut_drops_the_link_it_names_and_only_that_one_and_heals() {
    let lab = NetLab::create(&["server", "database"]).expect("a lab");
    let server = listen_in(&lab, 0);
    let database = listen_in(&lab, 1);
    assert!(
        connects(server) && connects(database),
        "whole before any cut"
    );
    // The bench cut off the server, one way: the server's database stays reachable.
    assert!(
        lab.cut(End::Bench, End::Node(0)).expect("a rule"),
        "probed in place"
    );
    assert!(!connects(server), "the cut link drops");
    assert!(connects(database), "the other link is untouched");
    assert!(
        lab.dropped_packets() > 0,
        "the rule counted what it dropped"
    );
    assert!(lab.heal().expect("flushed"), "every link answers again");
    assert!(connects(server));
    assert_eq!(lab.dropped_packets(), 0, "the counters go with the rules");
    // The server and its database apart, both ways; the bench still reaches both.
    assert!(
        lab.partition(&[End::Node(0)], &[End::Node(1)])
            .expect("rules")
    );
    let from_server = in_netns(&lab.node(0).netns, move || connects(database)).expect("probe");
    assert!(!from_server, "the server cannot reach its database");
    assert!(
        connects(server) && connects(database),
        "the bench reaches both"
    );
    assert!(lab.heal().expect("flushed"));
    let from_server = in_netns(&lab.node(0).netns, move || connects(database)).expect("probe");
    assert!(from_server, "healed");
}

#[test]
#[cfg_attr(not(has_nft), ignore = "needs root, ip and nft")]
fn a_lab_leaves_no_namespace_and_no_link_behind() {
    let names = {
        let lab = NetLab::create(&["a", "b"]).expect("a lab");
        let mut names: Vec<String> = (0..2).map(|i| lab.node(i).netns.clone()).collect();
        names.push(lab.hub.clone());
        names.push(lab.bench_link.clone());
        names
    };
    let netns = command_output(Command::new("ip").args(["netns", "list"])).expect("ip netns");
    let links = command_output(Command::new("ip").args(["-o", "link", "show"])).expect("ip link");
    for name in &names {
        assert!(!netns.contains(name.as_str()), "{name} left: {netns}");
        assert!(
            !links.contains(&format!(" {name}@")),
            "{name} left: {links}"
        );
    }
}

#[test]
fn the_dropped_packets_are_read_from_the_listing() {
    let listing = "table inet bench {\n chain input {\n  ip saddr 10.213.4.254 counter \
                   packets 2 bytes 120 drop\n  ip saddr 10.213.4.2 counter packets 5 bytes 300 \
                   drop\n }\n}";
    assert_eq!(count_packets(listing), 7);
    assert_eq!(count_packets("table inet bench {\n}"), 0);
}
