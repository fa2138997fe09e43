//! The `sut-server` binary itself: it prints its address first, serves, and on SIGTERM shuts
//! down gracefully (exit 0) so that a restart on the same database carries on.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The admin secret the binary is started with (through the environment).
const ADMIN: &str = "binary-test-admin-secret";

fn spawn(db: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sut-server"))
        .args(["--db", db.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .env("SUT_ADMIN_TOKEN", ADMIN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line was {line:?}"))
        .to_owned();
    (child, addr)
}

fn terminate(mut child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit after SIGTERM: {status:?}");
            return;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn ids(client: &reqwest::Client, addr: &str, n: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for _ in 0..n {
        let v: serde_json::Value = client
            .get(format!("http://{addr}/id/orders"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        out.push(v["id"].as_u64().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_prints_its_address_and_stops_gracefully_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ids.db");
    let client = reqwest::Client::new();

    let (child, addr) = spawn(&db);
    let tag = || {
        client
            .post(format!("http://{addr}/admin/tags"))
            .header("content-type", "application/json")
            .body(r#"{"tag": "orders", "step": 20}"#)
    };
    let r = tag().send().await.unwrap();
    assert_eq!(
        r.status(),
        401,
        "an admin route without the secret is refused"
    );
    let r = tag().bearer_auth("not-the-secret").send().await.unwrap();
    assert_eq!(r.status(), 401, "and with a wrong one");
    let r = tag().bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(
        r.status(),
        201,
        "the secret from SUT_ADMIN_TOKEN is the server's"
    );
    let mut all = ids(&client, &addr, 50).await;
    terminate(child);

    let (child, addr) = spawn(&db);
    let after = ids(&client, &addr, 50).await;
    // The graceful stop gave the unissued tail back; the restart may reuse it, never an ID.
    all.extend(after);
    let unique: std::collections::BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "{all:?}");
    // Its incarnation is the operator's to read; anyone learns only that it answers.
    let public: serde_json::Value = client
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        public.get("instance").is_none() && public.get("tags").is_none(),
        "{public}"
    );
    let health: serde_json::Value = client
        .get(format!("http://{addr}/admin/health"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        health["instance"], 2,
        "each start is a new incarnation: {health}"
    );
    terminate(child);
}
