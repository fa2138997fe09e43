//! Who holds the server's connections, and who gives way when it is full.
//!
//! Every open connection has a place in the [`Book`]: the process holds at most
//! `connections_max` and one peer address at most `per_peer_max`. A connection with no request
//! in flight (an idle keep-alive connection, or a new one whose head has not arrived) is
//! *idle*: it holds a place and gives nothing back. When a new connection finds no place, an
//! idle one gives way, so that clients that hold connections cannot lock out a peer that needs
//! one:
//!
//! - its own address at `per_peer_max`: that address's connection idle the longest closes;
//! - the process full: an idle connection of the address range (IPv4 /24, IPv6 /64) that holds
//!   the most, from its address that holds the most, the one idle the longest — but only from a
//!   range (or, within the newcomer's own range, an address) that holds more than the
//!   newcomer's, so that places move from larger holders to smaller ones and never between two
//!   that hold as many (a thousand addresses holding one each give way to an address holding
//!   none); failing that, the newcomer's own address's connection idle the longest.
//!
//! Only a connection idle for at least `idle_grace` gives way: a client that has just connected,
//! or just been answered, has that long to send its (next) request, so that newcomers replace
//! holders rather than each other.
//!
//! A connection with a request in flight never gives way (its request is answered; a body that
//! does not arrive is cut off by the body timeout). A connection told to give way closes at
//! once when it is idle, or after answering the request it has just begun. Its place is the
//! newcomer's from that moment; at most [`CLOSING_MAX`] may be closing at once, beyond which a
//! new connection is refused as when nobody can give way.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::ids::lock;

/// Connections told to give way that have not closed yet, at most.
pub const CLOSING_MAX: usize = 1_024;

/// The limits a [`Book`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Connections open at once.
    pub connections_max: usize,
    /// Connections open at once from one peer address.
    pub per_peer_max: usize,
    /// Whether idle connections give way to new ones (`false`: a new connection that finds no
    /// place is refused, the planted weakness `no_eviction`).
    pub evict_idle: bool,
    /// How long a connection must have been idle to give way.
    pub idle_grace: Duration,
}

/// Why a new connection got no place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The process held `connections_max` and no idle connection could give way.
    Full,
    /// Its address held `per_peer_max`, none of them idle.
    Peer,
}

/// The connections open now.
#[derive(Debug)]
pub struct Book {
    caps: Caps,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Places taken (a leaked place stays taken).
    open: usize,
    /// Connections told to give way, not yet closed.
    closing: usize,
    next_id: u64,
    peers: HashMap<IpAddr, Peer>,
    conns: HashMap<u64, Entry>,
}

#[derive(Debug, Default)]
struct Peer {
    /// Places its connections hold.
    open: usize,
    /// Its idle connections, by the instant they became idle.
    idle: BTreeSet<(Instant, u64)>,
}

#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    /// Since when it is idle (`None`: a request in flight).
    idle_since: Option<Instant>,
    /// Told to give way: its place is already someone else's.
    evicted: bool,
    give_way: Arc<Notify>,
}

/// One connection's place; given back when dropped (or kept for good, [`Place::release`]).
#[derive(Debug)]
pub struct Place {
    book: Arc<Book>,
    id: u64,
    /// Requests of it in flight now.
    in_flight: AtomicUsize,
    /// Notified when it must give way.
    pub give_way: Arc<Notify>,
    /// Kept taken when dropped (the planted weakness `conn_slot_leak`).
    leak: bool,
    /// Whether an idle connection was told to give way for it.
    pub made_room: bool,
}

/// The range an address is judged with: its IPv4 /24 or IPv6 /64.
fn range_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            IpAddr::from([a, b, c, 0])
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0])
        }
    }
}

impl Book {
    /// An empty book with these caps (each at least 1).
    #[must_use]
    pub fn new(caps: Caps) -> Arc<Self> {
        Arc::new(Self {
            caps: Caps {
                connections_max: caps.connections_max.max(1),
                per_peer_max: caps.per_peer_max.max(1),
                ..caps
            },
            inner: Mutex::new(Inner::default()),
        })
    }

    /// A place for a new connection from `ip`, idle from `now`; the connection that gives way
    /// for it (if one does) is told so.
    ///
    /// # Errors
    /// Nobody can give way: [`Refused`] says which cap was met.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<Place, Refused> {
        let mut inner = lock(&self.inner);
        let own = inner.peers.get(&ip).map_or(0, |p| p.open);
        let full = if own >= self.caps.per_peer_max {
            Some(Refused::Peer)
        } else if inner.open >= self.caps.connections_max {
            Some(Refused::Full)
        } else {
            None
        };
        let made_room = full.is_some();
        if let Some(why) = full {
            if !self.caps.evict_idle || inner.closing >= CLOSING_MAX {
                return Err(why);
            }
            // Idle since this instant or earlier: long enough to give way.
            let before = now.checked_sub(self.caps.idle_grace).unwrap_or(now);
            let victim = match why {
                Refused::Peer => inner.oldest_idle_of(ip, before),
                Refused::Full => inner.victim_for(ip, before),
            };
            inner.evict(victim.ok_or(why)?);
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.open += 1;
        let peer = inner.peers.entry(ip).or_default();
        peer.open += 1;
        peer.idle.insert((now, id));
        let give_way = Arc::new(Notify::new());
        inner.conns.insert(
            id,
            Entry {
                ip,
                idle_since: Some(now),
                evicted: false,
                give_way: Arc::clone(&give_way),
            },
        );
        debug_assert!(inner.open <= self.caps.connections_max);
        Ok(Place {
            book: Arc::clone(self),
            id,
            in_flight: AtomicUsize::new(0),
            give_way,
            leak: false,
            made_room,
        })
    }

    /// Connections told to give way that have not closed yet.
    #[must_use]
    pub fn closing(&self) -> usize {
        lock(&self.inner).closing
    }

    /// Places taken now.
    #[must_use]
    pub fn open(&self) -> usize {
        lock(&self.inner).open
    }
}

impl Inner {
    /// `ip`'s connection idle the longest, if idle since `before` or earlier.
    fn oldest_idle_of(&self, ip: IpAddr, before: Instant) -> Option<u64> {
        self.peers
            .get(&ip)
            .and_then(|p| p.idle.first())
            .filter(|&&(since, _)| since <= before)
            .map(|&(_, id)| id)
    }

    /// The connection that gives way to a newcomer from `ip` when the process is full, among
    /// those idle since `before` or earlier.
    fn victim_for(&self, ip: IpAddr, before: Instant) -> Option<u64> {
        let mut ranges: HashMap<IpAddr, usize> = HashMap::new();
        for (peer_ip, peer) in &self.peers {
            *ranges.entry(range_of(*peer_ip)).or_default() += peer.open;
        }
        let own_range = range_of(ip);
        let own_range_open = ranges.get(&own_range).copied().unwrap_or(0);
        let own_open = self.peers.get(&ip).map_or(0, |p| p.open);
        self.peers
            .iter()
            .filter(|(peer_ip, peer)| {
                let range = range_of(**peer_ip);
                peer.idle.first().is_some_and(|&(since, _)| since <= before)
                    && if range == own_range {
                        peer.open > own_open
                    } else {
                        ranges[&range] > own_range_open
                    }
            })
            .max_by_key(|(peer_ip, peer)| (ranges[&range_of(**peer_ip)], peer.open, **peer_ip))
            .and_then(|(peer_ip, _)| self.oldest_idle_of(*peer_ip, before))
            .or_else(|| self.oldest_idle_of(ip, before))
    }

    /// Tells connection `id` (idle) to give way; its place is free from now.
    fn evict(&mut self, id: u64) {
        let entry = self
            .conns
            .get_mut(&id)
            .expect("an idle connection is in the book");
        debug_assert!(!entry.evicted, "a connection gives way once");
        entry.evicted = true;
        let (ip, since) = (entry.ip, entry.idle_since.take());
        entry.give_way.notify_one();
        let peer = self.peers.get_mut(&ip).expect("its peer is in the book");
        if let Some(since) = since {
            peer.idle.remove(&(since, id));
        }
        peer.open -= 1;
        if peer.open == 0 {
            // No entry outlives its address's last place: addresses are many (an IPv6 /64
            // alone), the book's memory is not theirs to grow.
            debug_assert!(peer.idle.is_empty());
            self.peers.remove(&ip);
        }
        self.open -= 1;
        self.closing += 1;
    }

    fn set_idle(&mut self, id: u64, now: Option<Instant>) {
        let Some(entry) = self.conns.get_mut(&id) else {
            return;
        };
        if entry.evicted {
            return;
        }
        let was = std::mem::replace(&mut entry.idle_since, now);
        let peer = self
            .peers
            .get_mut(&entry.ip)
            .expect("its peer is in the book");
        if let Some(was) = was {
            peer.idle.remove(&(was, id));
        }
        if let Some(now) = now {
            peer.idle.insert((now, id));
        }
    }
}

impl Place {
    /// A request of this connection began: it is no longer idle.
    pub fn request_began(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        lock(&self.book.inner).set_idle(self.id, None);
    }

    /// A request of this connection ended: idle from `now` once none is in flight.
    pub fn request_ended(&self, now: Instant) {
        if self.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            lock(&self.book.inner).set_idle(self.id, Some(now));
        }
    }

    /// Whether a request of it is in flight now.
    #[must_use]
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }

    /// Gives the place back as the connection closes; with `leak` (the planted weakness
    /// `conn_slot_leak`, TEST ONLY) its place stays taken for good unless it had already given
    /// way.
    pub fn release(mut self, leak: bool) {
        self.leak = leak;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut inner = lock(&self.book.inner);
        let Some(entry) = inner.conns.remove(&self.id) else {
            return;
        };
        if entry.evicted {
            inner.closing -= 1;
            return;
        }
        let peer = inner
            .peers
            .get_mut(&entry.ip)
            .expect("its peer is in the book");
        if let Some(since) = entry.idle_since {
            peer.idle.remove(&(since, self.id));
        }
        if self.leak {
            return;
        }
        peer.open -= 1;
        if peer.open == 0 {
            inner.peers.remove(&entry.ip);
        }
        inner.open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn book(connections_max: usize, per_peer_max: usize) -> Arc<Book> {
        Book::new(Caps {
            connections_max,
            per_peer_max,
            evict_idle: true,
            idle_grace: Duration::ZERO,
        })
    }

    /// `n` idle connections from `from`, idle from `t0 + k ms` for the k-th.
    fn hold(book: &Arc<Book>, from: &str, n: usize, t0: Instant) -> Vec<Place> {
        (0..n)
            .map(|k| {
                book.admit(ip(from), t0 + Duration::from_millis(k as u64))
                    .expect("admitted")
            })
            .collect()
    }

    fn told(place: &Place) -> bool {
        lock(&place.book.inner)
            .conns
            .get(&place.id)
            .is_some_and(|e| e.evicted)
    }

    #[test]
    fn a_full_server_takes_the_place_of_the_largest_holders_oldest_idle_connection() {
        let b = book(10, 10);
        let t0 = Instant::now();
        let big = hold(&b, "10.0.0.1", 6, t0);
        let small = hold(&b, "10.0.1.1", 4, t0);
        let newcomer = b
            .admit(ip("192.168.0.1"), t0 + Duration::from_secs(1))
            .expect("a newcomer gets a place");
        assert!(told(&big[0]), "the largest holder's oldest idle gives way");
        assert!(big[1..].iter().chain(&small).all(|p| !told(p)));
        assert_eq!((b.open(), b.closing()), (10, 1));
        // The evicted connection closes: its place was already the newcomer's.
        let mut big = big.into_iter();
        big.next().unwrap().release(false);
        assert_eq!((b.open(), b.closing()), (10, 0));
        newcomer.release(false);
        assert_eq!(b.open(), 9);
    }

    #[test]
    fn a_connection_with_a_request_in_flight_never_gives_way() {
        let b = book(4, 4);
        let t0 = Instant::now();
        let busy = hold(&b, "10.0.0.1", 4, t0);
        for p in &busy {
            p.request_began();
        }
        assert_eq!(b.admit(ip("10.0.2.1"), t0).unwrap_err(), Refused::Full);
        // One answers and is idle again: it gives way.
        busy[2].request_ended(t0 + Duration::from_millis(5));
        assert!(b.admit(ip("10.0.2.1"), t0 + Duration::from_secs(1)).is_ok());
        assert!(told(&busy[2]));
    }

    #[test]
    fn an_address_at_its_cap_replaces_its_own_oldest_idle_connection() {
        let b = book(100, 3);
        let t0 = Instant::now();
        let mine = hold(&b, "10.0.0.1", 3, t0);
        mine[0].request_began();
        let late = t0 + Duration::from_secs(1);
        let _new = b.admit(ip("10.0.0.1"), late).expect("own idle gives way");
        assert!(!told(&mine[0]) && told(&mine[1]) && !told(&mine[2]));
        // Every remaining one in flight: refused, naming the address's cap.
        mine[2].request_began();
        _new.request_began();
        assert_eq!(b.admit(ip("10.0.0.1"), late).unwrap_err(), Refused::Peer);
    }

    #[test]
    fn places_move_from_the_largest_range_and_never_back_and_forth() {
        let b = book(8, 8);
        let t0 = Instant::now();
        // One range of many addresses (two each) against one proxy address with four.
        let many: Vec<Place> = (1..=2)
            .flat_map(|k| hold(&b, &format!("10.0.0.{k}"), 2, t0))
            .collect();
        let proxy = hold(&b, "172.16.0.1", 4, t0);
        let _ = b
            .admit(ip("192.168.0.1"), t0 + Duration::from_secs(1))
            .expect("admitted");
        // 10.0.0.0/24 and 172.16.0.0/24 hold 4 each: the tie goes to the larger address.
        assert_eq!(proxy.iter().filter(|p| told(p)).count(), 1);
        assert_eq!(many.iter().filter(|p| told(p)).count(), 0);
        // Two equal holders in one range: neither takes the other's place.
        let b = book(2, 2);
        let a = hold(&b, "10.0.0.1", 1, t0);
        let c = hold(&b, "10.0.0.2", 1, t0);
        let d = b
            .admit(ip("10.0.0.2"), t0 + Duration::from_secs(1))
            .expect("own");
        assert!(!told(&a[0]) && told(&c[0]));
        drop(d);
    }

    #[test]
    fn a_connection_gives_way_only_after_its_grace() {
        let b = Book::new(Caps {
            connections_max: 2,
            per_peer_max: 2,
            evict_idle: true,
            idle_grace: Duration::from_secs(1),
        });
        let t0 = Instant::now();
        let held = hold(&b, "10.0.0.1", 2, t0);
        // Just connected (or just answered): not yet.
        let soon = t0 + Duration::from_millis(500);
        assert_eq!(b.admit(ip("10.0.0.1"), soon).unwrap_err(), Refused::Peer);
        assert_eq!(b.admit(ip("10.0.9.1"), soon).unwrap_err(), Refused::Full);
        held[0].request_began();
        held[0].request_ended(t0 + Duration::from_millis(900));
        // A second on: the one idle since t0 gives way, not the one answered at 900 ms.
        let later = t0 + Duration::from_millis(1_100);
        let _new = b.admit(ip("10.0.9.1"), later).expect("admitted");
        assert!(!told(&held[0]) && told(&held[1]));
    }

    #[test]
    fn addresses_holding_one_each_give_way_and_leave_no_entry() {
        let b = book(3, 3);
        let t0 = Instant::now();
        // Three addresses in three ranges hold one place each: a fourth, holding none, gets
        // the place idle the longest, and so on; no entry outlives its address's last place.
        let mut held: Vec<Place> = (0..3u8)
            .flat_map(|k| hold(&b, &format!("10.0.{k}.1"), 1, t0))
            .collect();
        for k in 0..50u64 {
            let at = t0 + Duration::from_secs(1 + k);
            let p = b
                .admit(ip(&format!("10.1.{k}.1")), at)
                .expect("a newcomer holding none gets a place");
            assert!(p.made_room, "the server was full");
            held.push(p);
            held.retain(|p| !told(p));
        }
        assert_eq!(held.len(), 3);
        assert_eq!(
            lock(&b.inner).peers.len(),
            3,
            "one entry per address holding a place"
        );
    }

    #[test]
    fn without_eviction_a_full_server_refuses() {
        let b = Book::new(Caps {
            connections_max: 2,
            per_peer_max: 2,
            evict_idle: false,
            idle_grace: Duration::ZERO,
        });
        let t0 = Instant::now();
        let _held = hold(&b, "10.0.0.1", 2, t0);
        assert_eq!(b.admit(ip("10.0.0.1"), t0).unwrap_err(), Refused::Peer);
        assert_eq!(b.admit(ip("10.0.0.2"), t0).unwrap_err(), Refused::Full);
    }

    fn third_refused_when_the_leaked_fill_the_cap(b: &Arc<Book>, t0: Instant) {
        let last = b.admit(ip("10.0.0.1"), t0).expect("one place left");
        last.release(true);
        // Every place leaked: nothing is idle, nothing can give way.
        assert_eq!(b.admit(ip("10.0.0.1"), t0).unwrap_err(), Refused::Peer);
    }

    #[test]
    fn a_leaked_place_stays_taken_and_nobody_can_take_it() {
        let b = book(2, 2);
        let t0 = Instant::now();
        let mut held = hold(&b, "10.0.0.1", 2, t0).into_iter();
        held.next().unwrap().release(true);
        assert_eq!(b.open(), 2);
        let second = held.next().unwrap();
        // The one left is idle: a newcomer of the same address takes its place, not the leaked.
        let third = b
            .admit(ip("10.0.0.1"), t0 + Duration::from_secs(1))
            .expect("admitted");
        assert!(told(&second));
        drop((second, third));
        assert_eq!(
            (b.open(), b.closing()),
            (1, 0),
            "the leaked place stays taken"
        );
        third_refused_when_the_leaked_fill_the_cap(&b, t0);
    }
}
