//! The black-box `redis` and `postgres` targets against real servers the test starts but the
//! bench does not own (as a user's running Redis or PostgreSQL): one counter, so IDs must rise
//! over every request that completed before another began, also across a partition of the
//! clients' link (the only fault the bench can inject into a server it did not start).

use std::time::Duration;

use blackbox::ids::{
    BlackBoxFault, BlackBoxNemesis, BlackBoxOptions, CutShape, Monotonic, Target, run,
};
use reports::model::Judgement;

fn options(target: Target, url: String, key: &str) -> BlackBoxOptions {
    BlackBoxOptions {
        slow_clients: None,
        db: None,
        netns: false,
        target,
        urls: vec![url],
        key: key.into(),
        clients: 4,
        ramp: None,
        db_delay: None,
        rate: None,
        duration: Duration::from_millis(3_000),
        monotonic: Monotonic::Global,
        commands: Vec::new(),
        nemesis: Some(BlackBoxNemesis {
            faults: vec![BlackBoxFault::Partition],
            every: Duration::from_millis(700),
            down_for: Duration::from_millis(300),
            clock_step_ms: 0,
            cut: CutShape::Both,
        }),
    }
}

fn assert_passed(run: &blackbox::ids::BlackBoxRun) {
    for check in run.checks() {
        assert_eq!(check.verdict, Judgement::Held, "{check:?}");
    }
    assert!(run.ids > 100, "{} IDs", run.ids);
    assert!(run.faults >= 2, "{} faults", run.faults);
    let proxy = run.proxy.expect("partition runs go through proxies");
    assert!(proxy.held_bytes > 0, "{proxy:?}");
}

#[test]
#[cfg_attr(not(has_redis), ignore = "redis-server not installed")]
fn redis_incr_as_a_black_box_rises_over_every_server_under_partitions() {
    let redis = chaos::Redis::start(chaos::RedisPersistence::AofAlways).expect("redis");
    let run = run(&options(Target::Redis, redis.url(), "user:ids")).expect("runs");
    assert_passed(&run);
    // Judged over every answer as one counter (the unit tests show it firing).
    let checked = run.monotonic.as_ref().expect("promised").detail.clone();
    assert!(checked.is_some_and(|d| d.contains("over every server")));
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn a_postgres_sequence_as_a_black_box_rises_under_partitions_and_a_missing_one_is_named() {
    let pg = chaos::Postgres::start().expect("postgres");
    pg.create_database("shop").expect("createdb");
    let url = pg.url_for("shop");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let conn = tokio::spawn(conn);
        client
            .batch_execute("CREATE SEQUENCE order_ids")
            .await
            .expect("create sequence");
        drop(client);
        let _ = conn.await;
    });
    let run = run(&options(Target::Postgres, url.clone(), "order_ids")).expect("runs");
    assert_passed(&run);
    let missing = blackbox::ids::run(&options(Target::Postgres, url, "no_such_seq"))
        .expect_err("no such sequence");
    let text = missing.to_string();
    assert!(
        text.contains("no_such_seq") && text.contains("no ID before"),
        "{text}"
    );
}
