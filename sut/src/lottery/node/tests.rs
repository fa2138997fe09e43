use super::*;
use crate::UserId;
use crate::lottery::{
    ActivityId, DrawOutcome, DrawStatus, Handled, LotteryStore, MemoryStore, ParticipantConfig,
    Registry, Terms,
};

const PRICE_MINOR: u64 = 10;

/// In-process participants over one memory store each (as `sut-server --role all`), with a log
/// that is durable at once or at the next commit, and a switch that loses every Confirm.
struct InProcess {
    stores: BTreeMap<Participant, MemoryStore>,
    registry: Registry,
    log: Vec<LogEntry>,
    written: Written,
    lose_confirms: bool,
    sent: Vec<(Host, Participant)>,
    told: Vec<(Xid, String, Option<u32>)>,
}

impl InProcess {
    fn new(written: Written) -> Self {
        let mut stores: BTreeMap<Participant, MemoryStore> = Participant::ALL
            .into_iter()
            .map(|p| (p, MemoryStore::default()))
            .collect();
        let wallet = stores.get_mut(&Participant::Wallet).unwrap();
        wallet.open_account(UserId(1), 100).unwrap();
        let inventory = stores.get_mut(&Participant::Inventory).unwrap();
        inventory.add_stock(ActivityId(1), 1).unwrap();
        Self {
            stores,
            registry: Registry::from_entries([(
                ActivityId(1),
                Terms::always_open(PRICE_MINOR, 100),
            )])
            .unwrap(),
            log: Vec::new(),
            written,
            lose_confirms: false,
            sent: Vec::new(),
            told: Vec::new(),
        }
    }
}

impl CoordinatorIo<u32> for InProcess {
    fn write_log(&mut self, entry: &LogEntry) -> Written {
        if self.written != Written::Refused {
            self.log.push(*entry);
        }
        self.written
    }

    fn send(
        &mut self,
        host: Host,
        branch: Participant,
        msg: ParticipantMsg,
    ) -> Option<ParticipantReply> {
        self.sent.push((host, branch));
        if self.lose_confirms && msg.phase == crate::lottery::Phase::Confirm {
            return None;
        }
        let store = self.stores.get_mut(&branch).unwrap();
        match branch.handle(store, &ParticipantConfig::default(), &self.registry, &msg) {
            Handled::Reply(r) => Some(r),
            Handled::Resume(_) => unreachable!("the correct path is one step"),
        }
    }

    fn outcome(&mut self, event: &DrawEvent, answer: ClientAnswer<'_>, client: Option<u32>) {
        let said = match answer {
            ClientAnswer::Confirmed { .. } => "confirmed",
            ClientAnswer::Pending => "pending",
            ClientAnswer::DeadLettered => "dead_lettered",
            ClientAnswer::Cancelled(_) => "cancelled",
        };
        self.told.push((event.draw.xid, said.to_owned(), client));
    }
}

fn draw(xid: u64, won: bool) -> DrawArgs {
    DrawArgs {
        xid: Xid(xid),
        user: UserId(1),
        activity: ActivityId(1),
        price_minor: PRICE_MINOR,
        won,
    }
}

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        park_delay_ms: 100,
        ..CoordinatorConfig::default()
    }
}

fn at(ms: u64) -> Now {
    Now::both(ms)
}

#[test]
fn a_draw_with_in_process_participants_is_answered_confirmed_in_one_drive() {
    let mut node = CoordinatorNode::new(config(), Some(16)).unwrap();
    let mut io = InProcess::new(Written::Durable);
    node.start_draw(draw(1, true), Some(7), at(0)).unwrap();
    assert_eq!(node.waiting(), 1);
    node.drive(&mut io, at(0));
    assert_eq!(io.told, vec![(Xid(1), "confirmed".to_owned(), Some(7))]);
    assert_eq!(node.waiting(), 0, "the client was released");
    assert_eq!(node.status(Xid(1)).unwrap().status, DrawStatus::Confirmed);
    assert_eq!(io.log.len(), 3, "begin, verdict, finished");
    // Every branch went to its host: the wallet host has two, the inventory one.
    for (host, branch) in &io.sent {
        assert_eq!(*host, branch.host());
        assert!(host.hosts(*branch));
    }
    assert!(io.sent.iter().any(|(h, _)| *h == Host::Inventory));
    node.check_invariants().unwrap();
}

#[test]
fn nothing_is_sent_until_the_begin_entry_is_acknowledged() {
    let mut node = CoordinatorNode::new(config(), Some(16)).unwrap();
    let mut io = InProcess::new(Written::Later);
    node.start_draw(draw(1, false), Some(1), at(0)).unwrap();
    node.drive(&mut io, at(0));
    assert!(io.sent.is_empty(), "sent before the log was durable");
    assert_eq!(io.log.len(), 1);
    let begin = io.log[0];
    node.handle_log_written(&begin, at(1));
    node.drive(&mut io, at(1));
    assert!(!io.sent.is_empty());
    assert!(io.told.is_empty(), "no verdict is durable yet");
}

#[test]
fn a_refused_log_write_is_never_acknowledged_and_the_timeouts_decide() {
    let mut node = CoordinatorNode::new(config(), Some(16)).unwrap();
    let mut io = InProcess::new(Written::Refused);
    node.start_draw(draw(1, false), Some(1), at(0)).unwrap();
    node.drive(&mut io, at(0));
    assert!(io.sent.is_empty());
    assert!(!node.handle_due(at(0)), "nothing due at once");
    assert_eq!(node.coordinator().inflight(), 1);
}

#[test]
fn a_parked_draw_releases_its_client_with_pending_and_polls_follow_it_to_the_end() {
    let mut node = CoordinatorNode::new(config(), Some(16)).unwrap();
    let mut io = InProcess::new(Written::Durable);
    io.lose_confirms = true;
    node.start_draw(draw(1, true), Some(9), at(0)).unwrap();
    node.drive(&mut io, at(0));
    while io.told.is_empty() {
        let now_ms = node.poll_timeout().expect("a reply timeout is armed");
        assert!(node.handle_due(at(now_ms)));
        node.drive(&mut io, at(now_ms));
    }
    assert_eq!(io.told, vec![(Xid(1), "pending".to_owned(), Some(9))]);
    assert_eq!(node.status(Xid(1)).unwrap().status, DrawStatus::Pending);
    io.lose_confirms = false;
    while io.told.len() < 2 {
        let now_ms = node
            .poll_timeout()
            .expect("a compensation round is scheduled");
        node.handle_due(at(now_ms));
        node.drive(&mut io, at(now_ms));
    }
    assert_eq!(
        io.told[1],
        (Xid(1), "confirmed".to_owned(), None),
        "its client was answered already"
    );
    let polled = node.status(Xid(1)).unwrap();
    assert_eq!(polled.status, DrawStatus::Confirmed);
    assert!(matches!(
        polled.outcome,
        Some(DrawOutcome::Confirmed { won: true })
    ));
    node.check_invariants().unwrap();
}

#[test]
fn a_refused_start_gives_the_client_back() {
    let mut node = CoordinatorNode::new(config(), Some(16)).unwrap();
    node.start_draw(draw(1, false), Some(1), at(0)).unwrap();
    let (client, err) = node.start_draw(draw(1, false), Some(2), at(0)).unwrap_err();
    assert_eq!(client, Some(2));
    assert!(matches!(err, CoordinatorError::DuplicateXid { .. }));
    assert_eq!(node.waiting(), 1);
}

#[test]
fn a_node_without_statuses_answers_no_poll_and_a_recovered_one_no_old_client() {
    let mut node: CoordinatorNode<u32> = CoordinatorNode::new(config(), None).unwrap();
    let mut io = InProcess::new(Written::Durable);
    node.start_draw(draw(1, false), None, at(0)).unwrap();
    node.drive(&mut io, at(0));
    assert_eq!(io.told, vec![(Xid(1), "confirmed".to_owned(), None)]);
    assert!(node.status(Xid(1)).is_none());
    let mut log = CoordLog::default();
    for entry in &io.log {
        log.append(entry).unwrap();
    }
    let recovered: CoordinatorNode<u32> =
        CoordinatorNode::recover(config(), &log, at(5), Some(4)).unwrap();
    assert_eq!(recovered.waiting(), 0);
    assert_eq!(
        recovered.coordinator().inflight(),
        0,
        "a finished draw stays finished"
    );
}

#[test]
fn the_invariants_fire_on_a_client_waiting_for_a_draw_nobody_runs() {
    let mut node: CoordinatorNode<u32> = CoordinatorNode::new(config(), Some(4)).unwrap();
    node.waiting.insert(Xid(42), 1);
    let err = node.check_invariants().unwrap_err();
    assert!(err.contains("1 clients wait"), "{err}");
}

#[test]
fn every_branch_has_exactly_one_host() {
    for branch in Participant::ALL {
        let hosts: Vec<Host> = Host::ALL.into_iter().filter(|h| h.hosts(branch)).collect();
        assert_eq!(hosts, vec![branch.host()]);
    }
    assert_eq!(
        Host::Wallet.branches().collect::<Vec<_>>(),
        vec![Participant::Wallet, Participant::Participation]
    );
    assert_eq!(Host::Inventory.name(), "inventory");
}
