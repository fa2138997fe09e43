//! IP-level partitions, as Jepsen makes them with iptables: each process in a network namespace
//! of its own with its own address, cut off by packet-filter rules rather than by a proxy, so
//! that links the bench does not carry (a service talking to its database directly) can be cut
//! too. The fault proxy stays for latency, bandwidth, resets and half-open links.
//!
//! A lab is a hub namespace holding a bridge, one namespace per node joined to it by a veth
//! pair, and one veth pair from the bench's own namespace to the hub (the bench's address
//! `10.213.N.254`; node `i` is `10.213.N.(i+1)`). A cut from node `a` to node `b` is an
//! nftables rule in `b`'s namespace that drops what comes from `a` (or, when `b` is the bench,
//! in `a`'s that drops what goes to it): the bench's own namespace and the host's rules are
//! never touched. Every rule counts the packets it drops, and each cut is probed where it is
//! made: a TCP connection attempt across it must time out (across a healed link it is answered,
//! if only by a refusal). Dropping the lab deletes its namespaces, and with them every
//! interface and rule; an interrupted run deletes them too ([`crate::clean_up_on_interrupt`]).
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); [`NetLab::check`] says what is missing.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::ProcessError;

/// The nftables table the bench's rules live in, in each node's namespace.
const TABLE: &str = "bench";
/// How long a probe across a link waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// A port nothing listens on: a probe to it is answered by a refusal when the link is whole.
const PROBE_PORT: u16 = 9;

/// Where a process runs in a lab: its namespace and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InNetns {
    /// The network namespace (`ip netns exec NAME …`).
    pub netns: String,
    /// Its address.
    pub addr: Ipv4Addr,
}

/// One side of a cut: a node of the lab, or the bench itself (its clients).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The bench's own namespace.
    Bench,
    /// Node `i` (in the order the lab was made with).
    Node(usize),
}

/// A lab of network namespaces (see the module documentation).
#[derive(Debug)]
pub struct NetLab {
    hub: String,
    nodes: Vec<(String, InNetns)>,
    /// `10.213.N`.
    subnet: [u8; 3],
    /// The bench's end of its link to the hub.
    bench_link: String,
}

/// Labs made by this process so far (names and subnets).
static LABS: AtomicU32 = AtomicU32::new(0);

impl NetLab {
    /// What this machine lacks for a lab, named; `Ok` when it has it all.
    ///
    /// # Errors
    /// [`ProcessError::NetLabMissing`] naming what is missing.
    pub fn check() -> Result<(), ProcessError> {
        let missing = |what: &str| ProcessError::NetLabMissing { what: what.into() };
        if !nix::unistd::Uid::effective().is_root() {
            return Err(missing("root (network namespaces and nftables rules)"));
        }
        for (program, package) in [("ip", "iproute2"), ("nft", "nftables")] {
            if hostprobe::on_path(program).is_none() {
                return Err(missing(&format!(
                    "`{program}` on PATH (Debian: apt-get install {package})"
                )));
            }
        }
        Ok(())
    }

    /// Makes a lab with one namespace per name in `names`.
    ///
    /// # Errors
    /// [`NetLab::check`]'s; a namespace, link or rule could not be made (what was made is
    /// deleted again).
    pub fn create(names: &[&str]) -> Result<Self, ProcessError> {
        Self::check()?;
        assert!(names.len() < 250, "a lab's /24 holds at most 249 nodes");
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:x}{n:x}", std::process::id() & 0xff_ffff);
        let third = free_subnet(n)?;
        let subnet = [10, 213, third];
        let mut lab = Self {
            hub: format!("bench-{id}-hub"),
            nodes: Vec::new(),
            subnet,
            bench_link: format!("bn{id}"),
        };
        // From here a failure drops `lab`, which deletes what was made.
        crate::own_netns(&lab.hub, true);
        ip(&["netns", "add", &lab.hub])?;
        ip_in(&lab.hub, &["link", "add", "br0", "type", "bridge"])?;
        ip_in(&lab.hub, &["link", "set", "br0", "up"])?;
        ip(&[
            "link",
            "add",
            &lab.bench_link,
            "type",
            "veth",
            "peer",
            "name",
            "bench",
            "netns",
            &lab.hub,
        ])?;
        ip_in(&lab.hub, &["link", "set", "bench", "master", "br0", "up"])?;
        let bench = format!("{}/24", lab.bench_addr());
        ip(&["addr", "add", &bench, "dev", &lab.bench_link])?;
        ip(&["link", "set", &lab.bench_link, "up"])?;
        for (i, name) in names.iter().enumerate() {
            lab.add_node(i, name, &id)?;
        }
        Ok(lab)
    }

    fn add_node(&mut self, i: usize, name: &str, id: &str) -> Result<(), ProcessError> {
        let netns = format!("bench-{id}-{i}");
        crate::own_netns(&netns, true);
        ip(&["netns", "add", &netns])?;
        let port = format!("n{i}");
        ip(&[
            "link", "add", "eth0", "netns", &netns, "type", "veth", "peer", "name", &port, "netns",
            &self.hub,
        ])?;
        ip_in(&self.hub, &["link", "set", &port, "master", "br0", "up"])?;
        let addr = Ipv4Addr::new(
            self.subnet[0],
            self.subnet[1],
            self.subnet[2],
            u8::try_from(i + 1).expect("at most 249 nodes"),
        );
        ip_in(
            &netns,
            &["addr", "add", &format!("{addr}/24"), "dev", "eth0"],
        )?;
        ip_in(&netns, &["link", "set", "eth0", "up"])?;
        ip_in(&netns, &["link", "set", "lo", "up"])?;
        nft_in(
            &netns,
            &format!(
                "add table inet {TABLE}\n\
                 add chain inet {TABLE} input {{ type filter hook input priority 0; }}\n\
                 add chain inet {TABLE} output {{ type filter hook output priority 0; }}"
            ),
        )?;
        self.nodes.push((name.to_owned(), InNetns { netns, addr }));
        Ok(())
    }

    /// The bench's own address in the lab.
    #[must_use]
    pub const fn bench_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], 254)
    }

    /// Node `i`: its namespace and address.
    #[must_use]
    pub fn node(&self, i: usize) -> &InNetns {
        &self.nodes[i].1
    }

    /// The nodes' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|(name, _)| name.as_str())
    }

    fn addr_of(&self, end: End) -> Ipv4Addr {
        match end {
            End::Bench => self.bench_addr(),
            End::Node(i) => self.nodes[i].1.addr,
        }
    }

    /// Cuts what `from` sends to `to` (one way; [`NetLab::partition`] for both); whether a probe
    /// across the cut timed out (the cut is in place).
    ///
    /// # Errors
    /// The rule could not be added.
    pub fn cut(&self, from: End, to: End) -> Result<bool, ProcessError> {
        self.drop_from(from, to)?;
        Ok(!self.answers(from, to))
    }

    /// The rule of [`NetLab::cut`], not probed (a flapping link switches faster than a probe
    /// can time out).
    ///
    /// # Errors
    /// The rule could not be added.
    pub fn drop_from(&self, from: End, to: End) -> Result<(), ProcessError> {
        assert_ne!(from, to, "a cut joins two ends");
        match (from, to) {
            (_, End::Node(j)) => {
                let rule = format!(
                    "add rule inet {TABLE} input ip saddr {} counter drop",
                    self.addr_of(from)
                );
                nft_in(&self.nodes[j].1.netns, &rule)?;
            }
            (End::Node(i), End::Bench) => {
                let rule = format!(
                    "add rule inet {TABLE} output ip daddr {} counter drop",
                    self.bench_addr()
                );
                nft_in(&self.nodes[i].1.netns, &rule)?;
            }
            (End::Bench, End::Bench) => unreachable!("asserted above"),
        }
        Ok(())
    }

    /// Cuts both ways between every end of `a` and every end of `b`; whether every probe across
    /// timed out.
    ///
    /// # Errors
    /// A rule could not be added.
    pub fn partition(&self, a: &[End], b: &[End]) -> Result<bool, ProcessError> {
        let mut in_place = true;
        for &x in a {
            for &y in b {
                in_place &= self.cut(x, y)?;
                in_place &= self.cut(y, x)?;
            }
        }
        Ok(in_place)
    }

    /// Removes every cut; whether every link answers again (each probed from the bench to
    /// every node, and between every two nodes).
    ///
    /// # Errors
    /// The rules could not be flushed.
    pub fn heal(&self) -> Result<bool, ProcessError> {
        self.flush()?;
        let ends: Vec<End> = std::iter::once(End::Bench)
            .chain((0..self.nodes.len()).map(End::Node))
            .collect();
        Ok(ends.iter().all(|&a| {
            ends.iter()
                .filter(|&&b| b != a && b != End::Bench)
                .all(|&b| self.answers(a, b))
        }))
    }

    /// Removes every cut, not probed (see [`NetLab::drop_from`]).
    ///
    /// # Errors
    /// The rules could not be flushed.
    pub fn flush(&self) -> Result<(), ProcessError> {
        for (_, node) in &self.nodes {
            nft_in(
                &node.netns,
                &format!("flush chain inet {TABLE} input\nflush chain inet {TABLE} output"),
            )?;
        }
        Ok(())
    }

    /// Packets the rules in force have dropped (the counters restart with each cut).
    #[must_use]
    pub fn dropped_packets(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|(_, n)| nft_output(&n.netns, &format!("list table inet {TABLE}")).ok())
            .map(|rules| count_packets(&rules))
            .sum()
    }

    /// Whether a TCP connection attempt from `from` to `to` is answered (accepted or refused)
    /// within [`PROBE_TIMEOUT`], rather than lost.
    fn answers(&self, from: End, to: End) -> bool {
        let target = SocketAddr::from((self.addr_of(to), PROBE_PORT));
        let attempt = move || match TcpStream::connect_timeout(&target, PROBE_TIMEOUT) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        };
        match from {
            End::Bench => attempt(),
            End::Node(i) => in_netns(&self.nodes[i].1.netns, attempt).unwrap_or(false),
        }
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        // A namespace's interfaces and rules go with it; the bench's link goes with its peer in
        // the hub.
        for (_, node) in &self.nodes {
            let _ = ip(&["netns", "del", &node.netns]);
            crate::own_netns(&node.netns, false);
        }
        let _ = ip(&["netns", "del", &self.hub]);
        crate::own_netns(&self.hub, false);
        let _ = ip(&["link", "del", &self.bench_link]);
    }
}

/// Runs `f` on a thread that has entered the network namespace `netns`.
fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ProcessError> {
    let path = format!("/run/netns/{netns}");
    let file = std::fs::File::open(&path).map_err(crate::io(format!("open {path}")))?;
    let thread = std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map(|()| f())
            .map_err(|e| e.to_string())
    });
    let joined = thread.join().map_err(|_| ProcessError::Command {
        what: format!("probe from {netns}"),
        detail: "the probing thread panicked".into(),
    })?;
    joined.map_err(|detail| ProcessError::Command {
        what: format!("enter {netns}"),
        detail,
    })
}

/// The third byte of a `10.213.x.0/24` no interface of this machine uses, starting from `n`.
fn free_subnet(n: u32) -> Result<u8, ProcessError> {
    let taken = command_output(Command::new("ip").args(["-o", "-4", "addr", "show"]))?;
    let start = (std::process::id() + n) % 250;
    (0..250)
        .map(|k| u8::try_from((start + k) % 250 + 1).expect("below 251"))
        .find(|x| !taken.contains(&format!("10.213.{x}.")))
        .ok_or_else(|| ProcessError::Command {
            what: "pick a subnet".into(),
            detail: "every 10.213.x.0/24 is in use on this machine".into(),
        })
}

/// The sum of `packets N` in an nftables listing.
fn count_packets(listing: &str) -> u64 {
    let words: Vec<&str> = listing.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "packets")
        .filter_map(|w| w[1].parse::<u64>().ok())
        .sum()
}

fn ip(args: &[&str]) -> Result<(), ProcessError> {
    command_output(Command::new("ip").args(args)).map(|_| ())
}

fn ip_in(netns: &str, args: &[&str]) -> Result<(), ProcessError> {
    command_output(Command::new("ip").args(["-n", netns]).args(args)).map(|_| ())
}

fn nft_in(netns: &str, script: &str) -> Result<(), ProcessError> {
    nft_output(netns, script).map(|_| ())
}

/// Runs the nftables `script` (one command a line) in `netns`; what it printed.
fn nft_output(netns: &str, script: &str) -> Result<String, ProcessError> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, "nft", "-f", "-"]);
    run(&mut cmd, Some(script))
}

fn command_output(cmd: &mut Command) -> Result<String, ProcessError> {
    run(cmd, None)
}

/// Runs `cmd` (with `input` on its standard input); what it printed, or why it failed.
fn run(cmd: &mut Command, input: Option<&str>) -> Result<String, ProcessError> {
    use std::io::Write;
    let shown = match input {
        Some(script) => format!("{cmd:?} <<< {script:?}"),
        None => format!("{cmd:?}"),
    };
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(crate::io(format!("run {shown}")))?;
    if let (Some(script), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(script.as_bytes())
            .map_err(crate::io(format!("write to {shown}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(crate::io(format!("run {shown}")))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(ProcessError::Command {
        what: shown,
        detail: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

#[cfg(test)]
mod tests;
