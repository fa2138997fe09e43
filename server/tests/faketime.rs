//! `sut-server` on a clock of its own (libfaketime, `chaos::FakeClock`): a wall clock stepped
//! back 30 s makes the Snowflake generator refuse with 503 "clock moved backwards" rather than
//! issue an ID that could repeat one; stepped forward an hour, it issues IDs stamped an hour
//! ahead. Ignored (and reported so) where libfaketime is not installed; `.ci/run` installs it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chaos::{FakeClock, Service, ServiceSpec};
use serde_json::Value;

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[test]
#[cfg_attr(not(has_faketime), ignore = "libfaketime not installed")]
fn a_server_on_a_stepped_clock_refuses_backwards_and_stamps_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = FakeClock::new().unwrap();
    let mut env = clock.env();
    env.push((
        "SUT_ADMIN_TOKEN".into(),
        "faketime-test-secret-0123456789".into(),
    ));
    let server = Service::start(ServiceSpec {
        name: "ids".into(),
        program: env!("CARGO_BIN_EXE_sut-server").into(),
        args: vec!["--db".into(), dir.path().join("db").display().to_string()],
        env,
        log: dir.path().join("server.log"),
    })
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let get = |path: &str| {
        runtime.block_on(async {
            let r = client
                .get(format!("{}{path}", server.url()))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    let (status, body) = get("/snowflake");
    assert_eq!(status, 200, "{body}");
    let decoded_ms = |id: u64| {
        get(&format!("/snowflake/decode/{id}")).1["time_ms"]
            .as_i64()
            .unwrap()
    };
    let first = body["id"].as_u64().unwrap();
    assert!((decoded_ms(first) - now_ms()).abs() < 5_000);

    clock.jump_ms(-30_000).unwrap();
    let (status, body) = get("/snowflake");
    assert_eq!(status, 503, "{body}");
    assert!(body.to_string().contains("clock moved backwards"), "{body}");

    clock.set_offset_ms(3_600_000).unwrap();
    let (status, body) = get("/snowflake");
    assert_eq!(status, 200, "{body}");
    let ahead = body["id"].as_u64().unwrap();
    assert!(ahead > first);
    let skew_ms = decoded_ms(ahead) - now_ms();
    assert!(
        (3_595_000..3_605_000).contains(&skew_ms),
        "stamped {skew_ms} ms ahead"
    );
}
