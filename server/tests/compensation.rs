//! Compensation on the real server: a real `sut-server` in this process, a real HTTP client, a
//! real SQLite journal. The participants run in the server's process, so a participant that
//! fails or never answers is made by losing the coordinator's messages to it
//! (`ServerConfig::participant_faults`). The coordinator's own compensation schedule (the same
//! code the simulator and the models drive) must bring the draw to its end.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sut::lottery::wheel::WheelConfig;
use sut::lottery::{CoordinatorConfig, Participant, Phase};
use sut_server::lottery::{LoseMessages, ParticipantFaults};
use sut_server::{Server, start};

mod common;
use common::Api;

/// Short timings, so that a test sees several compensation rounds in well under a second:
/// 2 attempts of 10/20 ms, the first round 30 ms after the park, then 20, 40, 80 ms apart.
fn fast_coordinator(retries_max: u32) -> CoordinatorConfig {
    CoordinatorConfig {
        reply_timeout_ms: 10,
        backoff_ms_max: 20,
        attempts_max: 2,
        park_delay_ms: 30,
        compensation_retries_max: retries_max,
        wheel: WheelConfig {
            backoff_base_ms: 20,
            backoff_cap_ms: 80,
            ..WheelConfig::default()
        },
        ..CoordinatorConfig::default()
    }
}

async fn server(db: &Path, retries_max: u32, lose: LoseMessages) -> Server {
    let mut cfg = common::config(db);
    cfg.coordinator = fast_coordinator(retries_max);
    cfg.participant_faults = ParticipantFaults { rules: vec![lose] };
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    start(cfg, listen).await.unwrap()
}

/// What these tests ask of the server besides plain requests.
trait CompensationApi {
    async fn metrics(&self) -> String;
    async fn winning_draw(&self) -> (StatusCode, Value);
    async fn follow(&self, draw: &str) -> (Value, Vec<String>);
}

impl CompensationApi for Api {
    async fn metrics(&self) -> String {
        let (status, body) = self.get("/metrics").await;
        assert_eq!(status, StatusCode::OK);
        body.as_str().unwrap().to_owned()
    }

    /// One user with a balance and one activity with stock, then a winning draw.
    async fn winning_draw(&self) -> (StatusCode, Value) {
        let (status, _) = self
            .post("/admin/accounts", &json!({"user": 1, "balance_minor": 100}))
            .await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, _) = self
            .post("/admin/stock", &json!({"activity": 1, "units": 1}))
            .await;
        assert_eq!(status, StatusCode::OK);
        self.draw(&json!({"user": 1, "activity": 1, "price_minor": 10, "won": true}))
            .await
    }

    /// Polls `GET /lottery/draws/{draw}` (as the operator) until its status is no longer
    /// `pending` or `in_progress` (at most 10 s); returns the last answer and the statuses seen.
    async fn follow(&self, draw: &str) -> (Value, Vec<String>) {
        let started = Instant::now();
        let mut seen = Vec::new();
        loop {
            let (status, body) = self.get(&format!("/lottery/draws/{draw}")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let now = body["status"].as_str().unwrap().to_owned();
            if seen.last() != Some(&now) {
                seen.push(now.clone());
            }
            if now != "pending" && now != "in_progress" {
                return (body, seen);
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "still {now} after 10 s: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensation_redelivers_a_failing_confirm_until_the_draw_is_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    // The inventory loses its first 5 Confirms: the draw parks after 2 attempts, then the
    // compensation rounds (2 attempts each) get it through on the third round.
    let lose = LoseMessages {
        branch: Participant::Inventory,
        phase: Phase::Confirm,
        times: Some(5),
    };
    let s = server(&dir.path().join("ids.db"), 8, lose).await;
    let api = Api::new(s.addr);
    let (status, answer) = api.winning_draw().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["outcome"], "pending");
    let draw = answer["draw"].as_str().unwrap().to_owned();
    assert!(
        answer.get("xid").is_none(),
        "a client never sees an xid: {answer}"
    );

    let (end, seen) = api.follow(&draw).await;
    assert_eq!(end["status"], "confirmed", "{end}");
    assert_eq!(end["verdict"], "confirm");
    assert_eq!(seen.first().map(String::as_str), Some("pending"));

    let (_, ledger) = api.get("/ledger").await;
    assert_eq!(ledger["safe"], true, "{ledger}");
    assert_eq!(ledger["open_draws"], 0, "{ledger}");
    assert_eq!(ledger["stock"][0]["issued"], 1, "{ledger}");
    let metrics = api.metrics().await;
    assert_eq!(metric(&metrics, "sut_lottery_draws_parked_total"), 1);
    assert_eq!(metric(&metrics, "sut_lottery_draws_dead_lettered_total"), 0);
    assert_eq!(metric(&metrics, "sut_lottery_dead_letters"), 0);
    let (_, letters) = api.get("/admin/dead-letters").await;
    assert_eq!(letters, json!([]));
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensation_dead_letters_a_participant_that_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    let lose = LoseMessages {
        branch: Participant::Wallet,
        phase: Phase::Confirm,
        times: None,
    };
    let s = server(&dir.path().join("ids.db"), 2, lose).await;
    let api = Api::new(s.addr);
    let (status, answer) = api.winning_draw().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let draw = answer["draw"].as_str().unwrap().to_owned();

    let (end, _) = api.follow(&draw).await;
    assert_eq!(end["status"], "dead_lettered", "{end}");
    assert_eq!(end["verdict"], "confirm");
    let (status, letters) = api.get("/admin/dead-letters").await;
    assert_eq!(status, StatusCode::OK);
    // The operator's view names the xid too (what the retry route takes).
    let xid = letters[0]["xid"].as_u64().expect("xid");
    assert_eq!(
        letters,
        json!([{"xid": xid, "draw": draw, "user": 1, "activity": 1, "price_minor": 10, "won": true, "verdict": "confirm"}])
    );
    let metrics = api.metrics().await;
    assert_eq!(metric(&metrics, "sut_lottery_draws_parked_total"), 1);
    assert_eq!(metric(&metrics, "sut_lottery_draws_dead_lettered_total"), 1);
    assert_eq!(metric(&metrics, "sut_lottery_dead_letters"), 1);
    // The draw is still open in the log: a restart would resume it.
    let (_, ledger) = api.get("/ledger").await;
    assert_eq!(ledger["open_draws"], 1, "{ledger}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retry_delivers_a_dead_letter_once_the_participant_answers_again() {
    let dir = tempfile::tempdir().unwrap();
    // No compensation retry: 2 attempts of the Confirm, then one round of 2 attempts, all
    // lost, dead-letter the draw; the fifth Confirm gets through.
    let lose = LoseMessages {
        branch: Participant::Wallet,
        phase: Phase::Confirm,
        times: Some(4),
    };
    let s = server(&dir.path().join("ids.db"), 0, lose).await;
    let api = Api::new(s.addr);
    let (status, body) = api.post("/admin/dead-letters/7/retry", &json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "an unknown draw: {body}");
    assert_eq!(body["field"], "xid");
    let (status, body) = api.post("/admin/dead-letters/x/retry", &json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let (status, answer) = api.winning_draw().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let draw = answer["draw"].as_str().unwrap().to_owned();
    let (end, _) = api.follow(&draw).await;
    assert_eq!(end["status"], "dead_lettered", "{end}");
    let (_, letters) = api.get("/admin/dead-letters").await;
    let xid = letters[0]["xid"].as_u64().expect("xid");

    let path = format!("/admin/dead-letters/{xid}/retry");
    let (status, body) = api.post(&path, &json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "pending", "{body}");
    assert_eq!(body["draw"], draw.as_str(), "{body}");
    let (end, _) = api.follow(&draw).await;
    assert_eq!(end["status"], "confirmed", "{end}");
    let (_, letters) = api.get("/admin/dead-letters").await;
    assert_eq!(letters, json!([]));
    let (status, body) = api.post(&path, &json!({})).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "no longer dead-lettered: {body}"
    );
    let metrics = api.metrics().await;
    assert_eq!(
        metric(&metrics, "sut_lottery_dead_letters_retried_total"),
        1
    );
    assert_eq!(metric(&metrics, "sut_lottery_dead_letters"), 0);
    let (_, ledger) = api.get("/ledger").await;
    assert_eq!(ledger["open_draws"], 0, "{ledger}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_draw_is_404_and_a_bad_handle_400() {
    let dir = tempfile::tempdir().unwrap();
    let lose = LoseMessages {
        branch: Participant::Wallet,
        phase: Phase::Cancel,
        times: Some(0),
    };
    let s = server(&dir.path().join("ids.db"), 2, lose).await;
    let api = Api::new(s.addr);
    let (status, body) = api.get("/lottery/draws/0000000000424242").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["field"], "draw");
    for bad in ["nope", "424242", "00000000004242420"] {
        let (status, body) = api.get(&format!("/lottery/draws/{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["field"], "draw");
    }
    // A draw that needs no compensation is answered 200 and reads confirmed afterwards.
    let (status, answer) = api.winning_draw().await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let draw = answer["draw"].as_str().unwrap().to_owned();
    let (end, seen) = api.follow(&draw).await;
    assert_eq!(end["status"], "confirmed");
    assert_eq!(seen, ["confirmed"]);
    s.shutdown().await.unwrap();
}
