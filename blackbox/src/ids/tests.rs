use super::*;

fn done(server: usize, invoke_ms: u64, complete_ms: u64, ids: &[i64]) -> Completed {
    Completed {
        process: 0,
        server,
        invoke_ns: invoke_ms * 1_000_000,
        complete_ns: complete_ms * 1_000_000,
        ids: ids.to_vec(),
    }
}

fn verdict(r: Option<InvariantResult>) -> Judgement {
    r.expect("an order was promised").verdict
}

#[test]
fn leaf_answers_follow_leafs_conventions() {
    let leaf = Target::Leaf { snowflake: false };
    assert_eq!(leaf.parse_answer(200, "1001\n"), Ok(vec![1001]));
    let off = leaf.parse_answer(200, "0").expect_err("0 is Leaf's error");
    assert!(off.contains("0 or less"), "{off}");
    assert!(leaf.parse_answer(200, "-2").is_err());
    let e = leaf
        .parse_answer(500, r#"{"status":500,"error":"Internal Server Error"}"#)
        .expect_err("HTTP 500");
    assert!(e.starts_with("HTTP 500"), "{e}");
    assert!(
        leaf.parse_answer(200, "1,2").is_err(),
        "Leaf answers one ID"
    );
    assert_eq!(
        leaf.request_url("http://h:8080/", "orders"),
        "http://h:8080/api/segment/get/orders"
    );
    assert_eq!(
        Target::Leaf { snowflake: true }.request_url("http://h:8080", "k"),
        "http://h:8080/api/snowflake/get/k"
    );
}

#[test]
fn tinyid_errors_come_as_200() {
    let tinyid = Target::Tinyid {
        token: "t0".into(),
        batch: 3,
    };
    assert_eq!(tinyid.parse_answer(200, "4,5,6"), Ok(vec![4, 5, 6]));
    assert_eq!(tinyid.parse_answer(200, "3"), Ok(vec![3]));
    let empty = tinyid.parse_answer(200, "").expect_err("empty body");
    assert!(empty.contains("empty body"), "{empty}");
    let coded = tinyid
        .parse_answer(200, r#"{"data":null,"code":500,"message":"token error"}"#)
        .expect_err("code 500");
    assert!(coded.contains("token error"), "{coded}");
    assert_eq!(
        tinyid.parse_answer(200, r#"{"data":[7,8],"code":200,"message":""}"#),
        Ok(vec![7, 8])
    );
    assert_eq!(
        tinyid.request_url("http://h:9999", "test"),
        "http://h:9999/tinyid/id/nextIdSimple?bizType=test&token=t0&batchSize=3"
    );
}

#[test]
fn a_generic_http_answer_is_read_plain_or_at_a_json_pointer() {
    let plain = Target::Http { pointer: None };
    assert_eq!(plain.parse_answer(200, " 42 "), Ok(vec![42]));
    assert_eq!(plain.parse_answer(201, "1,2"), Ok(vec![1, 2]));
    assert!(
        plain.parse_answer(503, "42").is_err(),
        "a non-2xx status is an error"
    );
    assert!(plain.parse_answer(200, "forty-two").is_err());
    let json = Target::Http {
        pointer: Some("/data/id".into()),
    };
    assert_eq!(json.parse_answer(200, r#"{"data":{"id":9}}"#), Ok(vec![9]));
    assert_eq!(
        json.parse_answer(200, r#"{"data":{"id":"10"}}"#),
        Ok(vec![10])
    );
    assert_eq!(
        json.parse_answer(200, r#"{"data":{"id":[1,2]}}"#),
        Ok(vec![1, 2])
    );
    let missing = json.parse_answer(200, r#"{"data":{}}"#).expect_err("no id");
    assert!(missing.contains("/data/id"), "{missing}");
    assert_eq!(
        plain.request_url("http://h/ids/{key}/next", "orders"),
        "http://h/ids/orders/next"
    );
}

#[test]
fn monotonic_fires_on_an_id_below_one_answered_before_it_was_asked() {
    // Server 0 answers 10 at 5 ms; a request asked at 6 ms gets 7 from it.
    let bad = [done(0, 0, 5, &[10]), done(0, 6, 8, &[7])];
    assert_eq!(
        verdict(ids_monotonic(&bad, Monotonic::Server)),
        Judgement::Violated
    );
    let r = ids_monotonic(&bad, Monotonic::Server).expect("promised");
    let first = r.first_offending_event.expect("named");
    assert!(first.contains("ID 7") && first.contains("ID 10"), "{first}");
    // Overlapping requests may complete in either order: no promise is broken.
    let overlapping = [done(0, 0, 9, &[10]), done(0, 1, 5, &[7])];
    assert_eq!(
        verdict(ids_monotonic(&overlapping, Monotonic::Server)),
        Judgement::Held
    );
    // Two servers with their own segments: monotonic per server, not over both.
    let two = [
        done(0, 0, 1, &[1000]),
        done(1, 2, 3, &[2000]),
        done(0, 4, 5, &[1001]),
    ];
    assert_eq!(
        verdict(ids_monotonic(&two, Monotonic::Server)),
        Judgement::Held
    );
    assert_eq!(
        verdict(ids_monotonic(&two, Monotonic::Global)),
        Judgement::Violated
    );
    assert!(ids_monotonic(&two, Monotonic::None).is_none());
    // A batch whose IDs do not rise.
    let batch = [done(0, 0, 1, &[5, 4])];
    assert_eq!(
        verdict(ids_monotonic(&batch, Monotonic::Server)),
        Judgement::Violated
    );
    // An equal ID is not above.
    let equal = [done(0, 0, 1, &[3]), done(0, 2, 3, &[3])];
    assert_eq!(
        verdict(ids_monotonic(&equal, Monotonic::Global)),
        Judgement::Violated
    );
}

fn options(target: Target) -> BlackBoxOptions {
    BlackBoxOptions {
        target,
        urls: vec!["http://127.0.0.1:8080".into()],
        key: "orders".into(),
        clients: 2,
        ramp: None,
        db_delay: None,
        rate: None,
        duration: Duration::from_secs(1),
        monotonic: Monotonic::None,
        commands: Vec::new(),
        nemesis: None,
        slow_clients: None,
        db: None,
        netns: false,
    }
}

fn usage(opts: &BlackBoxOptions) -> String {
    match validate(opts) {
        Err(BlackBoxError::Usage(m)) => m,
        other => panic!("expected a usage error, got {other:?}"),
    }
}

#[test]
fn bad_options_are_refused_naming_what() {
    let leaf = Target::Leaf { snowflake: false };
    assert!(validate(&options(leaf.clone())).is_ok());
    let mut o = options(leaf.clone());
    o.commands = vec!["a".into(), "b".into()];
    assert!(usage(&o).contains("one command per URL"));
    let mut o = options(leaf.clone());
    o.nemesis = Some(BlackBoxNemesis {
        faults: vec![BlackBoxFault::Kill],
        every: Duration::from_secs(1),
        down_for: Duration::from_millis(100),
        clock_step_ms: 1_000,
        cut: CutShape::Both,
    });
    assert!(
        usage(&o).contains("--server-cmd"),
        "kill needs the commands"
    );
    let mut o = options(Target::Postgres);
    o.urls = vec!["postgres://u@127.0.0.1:5432/db".into()];
    o.key = "ids'); DROP TABLE x; --".into();
    assert!(usage(&o).contains("sequence name"));
    o.key = "public.ids".into();
    assert!(validate(&o).is_ok());
    let mut o = options(leaf);
    o.urls = vec!["not a url".into()];
    assert!(usage(&o).contains("--url not a url"));
    let mut o = options(Target::Http { pointer: None });
    assert!(usage(&o).contains("put {key}"), "a key with nowhere to go");
    o.key = String::new();
    assert!(validate(&o).is_ok(), "a URL without a key");
    o.urls = vec!["http://127.0.0.1:8080/ids/{key}".into()];
    assert!(usage(&o).contains("give the --key"));
    assert!(BlackBoxFault::parse("flood").is_err());
    assert!(Monotonic::parse("sometimes").is_err());
}

#[test]
fn a_proxied_url_keeps_its_template() {
    assert_eq!(
        via("http://localhost:8080/ids/{key}?x=1", 4000).expect("routable"),
        "http://127.0.0.1:4000/ids/{key}?x=1"
    );
    assert_eq!(
        via("redis://127.0.0.1:6379/", 4001).expect("routable"),
        "redis://127.0.0.1:4001/"
    );
}

#[test]
fn a_fault_not_seen_in_place_fails_coverage() {
    let n = BlackBoxNemesis {
        faults: vec![BlackBoxFault::Clock],
        every: Duration::from_secs(1),
        down_for: Duration::from_millis(100),
        clock_step_ms: 1_000,
        cut: CutShape::Both,
    };
    let quiet = History::default();
    let all_seen = FaultCount {
        injected: 2,
        seen: 2,
        windows: Vec::new(),
        unseen: Vec::new(),
    };
    assert_eq!(
        faults_took_effect(&n, &all_seen, &quiet).verdict,
        Judgement::Held
    );
    let one_missed = FaultCount {
        injected: 2,
        seen: 1,
        windows: Vec::new(),
        unseen: vec!["clock_bump on server-1 at 2.0 s".into()],
    };
    let missed = faults_took_effect(&n, &one_missed, &quiet);
    assert_eq!(missed.verdict, Judgement::Violated);
    assert!(
        missed
            .detail
            .is_some_and(|d| d.contains("(not: clock_bump on server-1 at 2.0 s)")),
        "the fault not seen is named"
    );
    // A kill that disturbed no request proves nothing.
    let kill = BlackBoxNemesis {
        faults: vec![BlackBoxFault::Kill],
        ..n
    };
    assert_eq!(
        faults_took_effect(&kill, &all_seen, &quiet).verdict,
        Judgement::Violated
    );
}

#[test]
fn a_delay_that_held_back_nothing_fails_and_one_that_did_holds() {
    let none = db_delayed(4, 0);
    assert_eq!(none.verdict, Judgement::Violated);
    assert!(
        none.first_offending_event
            .is_some_and(|e| e.contains("no byte of the database link was delayed"))
    );
    let some = db_delayed(4, 37);
    assert_eq!(some.verdict, Judgement::Held);
    assert!(some.detail.is_some_and(|d| d.contains("37 chunks delayed")));
}

#[test]
fn a_database_delay_needs_the_benchs_own_database_link() {
    let leaf = Target::Leaf { snowflake: false };
    let mut o = options(leaf);
    o.db_delay = Some(Duration::from_millis(20));
    assert!(usage(&o).contains("--delay-db-ms: the bench slows the link to a database it starts"));
    o.commands = vec!["exec leaf --db {db_url}".into()];
    o.db = Some(DbOptions {
        command: "exec db --port {dbport}".into(),
        ..DbOptions::default()
    });
    assert!(validate(&o).is_ok(), "{:?}", validate(&o));
    o.nemesis = Some(BlackBoxNemesis {
        faults: vec![BlackBoxFault::Db(DbFault::Partition)],
        every: Duration::from_secs(1),
        down_for: Duration::from_millis(100),
        clock_step_ms: 1_000,
        cut: CutShape::Both,
    });
    assert!(usage(&o).contains("both shape the database link"));
    o.nemesis = None;
    o.db_delay = Some(Duration::ZERO);
    assert!(usage(&o).contains("at least 1"));
}
