//! The real deployment: every role its own process, on one throwaway PostgreSQL (fsync on), on
//! one throwaway MariaDB (every commit synced) or on SQLite files. Two ID servers share one
//! database and never hand out the same ID; draws cross the network from the coordinator to the
//! wallet and inventory processes; a wallet killed with -9 mid-run is restarted and every draw
//! still ends settled, with money conserved.
//!
//! The PostgreSQL and MariaDB cases are ignored (and reported so) on machines without them;
//! `.ci/run` installs both. The SQLite cases run everywhere.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chaos::{Backend, Deployment, DeploymentSpec, RoleProcess};
use serde_json::{Value, json};

fn spec(id_servers: usize, backend: Backend) -> DeploymentSpec {
    let mut spec = DeploymentSpec::new(env!("CARGO_BIN_EXE_sut-server").into());
    spec.id_servers = id_servers;
    spec.backend = backend;
    spec.participant_timeout_ms = 500;
    // The draws below choose their luck (a winning draw has an inventory branch).
    spec.extra_args = vec!["--test-forced-outcomes".into()];
    // Activity 1 at 100, registered in every process that keeps a registry.
    spec.activities = vec!["1:100".into()];
    spec
}

async fn post_as(client: &reqwest::Client, url: String, bearer: &str, body: Value) -> (u16, Value) {
    let r = client
        .post(url)
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get_as(client: &reqwest::Client, url: String, bearer: &str) -> (u16, Value) {
    let r = client
        .get(url)
        .bearer_auth(bearer)
        .send()
        .await
        .expect("get");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get(client: &reqwest::Client, url: String) -> (u16, Value) {
    let r = client.get(url).send().await.expect("get");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
async fn id_servers_on_one_postgres_database_never_duplicate() {
    id_servers_never_duplicate(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
async fn id_servers_on_one_mariadb_database_never_duplicate() {
    id_servers_never_duplicate(Backend::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_servers_on_one_sqlite_file_never_duplicate() {
    id_servers_never_duplicate(Backend::Sqlite).await;
}

async fn id_servers_never_duplicate(backend: Backend) {
    let cluster = tokio::task::spawn_blocking(move || Deployment::start(&spec(2, backend)))
        .await
        .unwrap()
        .expect("start the deployment");
    let client = reqwest::Client::new();
    let urls = cluster.id_urls();
    let (status, _) = post_as(
        &client,
        format!("{}/admin/tags", urls[0]),
        cluster.admin_token(),
        json!({"tag": "order", "step": 50}),
    )
    .await;
    assert_eq!(status, 201);
    let mut tasks = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        for _ in 0..4 {
            let (client, url) = (client.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..150 {
                    let (status, body) = get(&client, format!("{url}/id/order")).await;
                    assert_eq!(status, 200, "{body}");
                    got.push(body["id"].as_u64().expect("id"));
                }
                (i, got)
            }));
        }
    }
    let mut all = BTreeSet::new();
    let mut per_server: Vec<Vec<u64>> = vec![Vec::new(); urls.len()];
    for task in tasks {
        let (server, got) = task.await.unwrap();
        for w in got.windows(2) {
            assert!(w[0] < w[1], "one client's IDs from one server go up: {w:?}");
        }
        for id in &got {
            assert!(all.insert(*id), "ID {id} handed out twice");
        }
        per_server[server].extend(got);
    }
    assert_eq!(all.len(), 2 * 4 * 150);
    assert!(per_server.iter().all(|ids| !ids.is_empty()));
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

/// Where a client draws: the token service (its JWT and one-time tokens) and the coordinator.
#[derive(Clone)]
struct Drawer {
    client: reqwest::Client,
    token: String,
    coordinator: String,
    admin: String,
}

impl Drawer {
    /// A user's JWT and a one-time token for activity 1.
    async fn tokens(&self, user: u64) -> (String, String) {
        let (status, v) = post_as(
            &self.client,
            format!("{}/tokens", self.token),
            &self.admin,
            json!({"user": user}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let jwt = v["token"].as_str().unwrap().to_owned();
        let (status, v) = post_as(
            &self.client,
            format!("{}/tokens/once", self.token),
            &jwt,
            json!({"user": user, "activity": "1"}),
        )
        .await;
        assert!(matches!(status, 200 | 201), "{v}");
        (jwt, v["token"].as_str().unwrap().to_owned())
    }

    /// One draw per user, in turn, as a real client makes it (a JWT from the token service, a
    /// one-time token for the activity, the draw); returns the handles answered 200 or 202.
    async fn draws(&self, users: std::ops::Range<u64>) -> Vec<String> {
        let mut xids = Vec::new();
        for user in users {
            let (jwt, once) = self.tokens(user).await;
            let body = json!({
                "activity": 1, "price_minor": 100, "won": user % 3 == 0, "once_token": once,
            });
            let url = format!("{}/lottery/draw", self.coordinator);
            let (status, body) = post_as(&self.client, url, &jwt, body).await;
            if matches!(status, 200 | 202) {
                xids.push(body["draw"].as_str().expect("a draw handle").to_owned());
            }
        }
        xids
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
async fn draws_cross_processes_on_postgres_and_settle_after_a_wallet_crash() {
    draws_settle_after_a_wallet_crash(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
async fn draws_cross_processes_on_mariadb_and_settle_after_a_wallet_crash() {
    draws_settle_after_a_wallet_crash(Backend::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draws_cross_processes_on_sqlite_files_and_settle_after_a_wallet_crash() {
    draws_settle_after_a_wallet_crash(Backend::Sqlite).await;
}

async fn draws_settle_after_a_wallet_crash(backend: Backend) {
    let mut cluster = tokio::task::spawn_blocking(move || Deployment::start(&spec(1, backend)))
        .await
        .unwrap()
        .expect("start the deployment");
    let client = reqwest::Client::new();
    let wallet = cluster.url(RoleProcess::Wallet);
    let inventory = cluster.url(RoleProcess::Inventory);
    let coordinator = cluster.url(RoleProcess::Coordinator);
    let admin = cluster.admin_token().to_owned();
    let (status, body) = post_as(
        &client,
        format!("{wallet}/admin/accounts"),
        &admin,
        json!({"user": 1, "count": 60, "balance_minor": 1_000}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post_as(
        &client,
        format!("{inventory}/admin/stock"),
        &admin,
        json!({"activity": 1, "units": 100}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let drawer = Drawer {
        client: client.clone(),
        token: cluster.url(RoleProcess::Token),
        coordinator: coordinator.clone(),
        admin,
    };

    let confirmed = drawer.draws(1..21).await;
    assert_eq!(confirmed.len(), 20, "every draw confirmed while all are up");

    // The wallet dies mid-run for about two seconds: the draws begun meanwhile are cancelled or
    // wait for compensation, and nothing is lost.
    tokio::task::block_in_place(|| cluster.service(RoleProcess::Wallet).unwrap().kill9())
        .expect("kill -9 the wallet");
    let outage: Vec<_> = (21..31)
        .map(|user| {
            let drawer = drawer.clone();
            tokio::spawn(async move { drawer.draws(user..user + 1).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| cluster.service(RoleProcess::Wallet).unwrap().restart())
        .expect("restart the wallet");
    let mut during = Vec::new();
    for task in outage {
        during.extend(task.await.unwrap());
    }
    let after = drawer.draws(31..41).await;
    assert_eq!(
        after.len(),
        10,
        "draws confirm again once the wallet is back"
    );

    // Every draw ends settled: none in progress, pending or dead-lettered.
    let deadline = Instant::now() + Duration::from_secs(30);
    for draw in confirmed.iter().chain(&during).chain(&after) {
        loop {
            let (status, body) = get_as(
                &client,
                format!("{coordinator}/lottery/draws/{draw}"),
                cluster.admin_token(),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            let s = body["status"].as_str().unwrap_or_default().to_owned();
            if s == "confirmed" || s == "cancelled" {
                break;
            }
            assert!(Instant::now() < deadline, "draw {draw} still {s}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for url in [&wallet, &inventory, &coordinator] {
        let (status, report) =
            get_as(&client, format!("{url}/ledger"), cluster.admin_token()).await;
        assert_eq!(status, 200);
        assert_eq!(report["safe"], true, "{url}: {report}");
    }
    let (_, report) = get_as(&client, format!("{wallet}/ledger"), cluster.admin_token()).await;
    assert_eq!(report["frozen_minor"], 0, "nothing stays frozen: {report}");
    let collected = report["collected_minor"].as_u64().unwrap();
    assert!(
        collected >= 100 * 30,
        "the draws before and after the crash were paid: {report}"
    );
    assert_eq!(
        report["balances_minor"].as_u64().unwrap() + collected,
        60 * 1_000,
        "money is conserved across the crash"
    );
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

/// Runs one statement on `url`.
async fn sql(url: &str, statement: &str) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    client.batch_execute(statement).await.expect(statement);
    drop(client);
    let _ = conn.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
async fn a_lottery_process_whose_database_went_away_exits_and_its_restart_recovers() {
    let mut cluster =
        tokio::task::spawn_blocking(move || Deployment::start(&spec(1, Backend::Postgres)))
            .await
            .unwrap()
            .expect("start the deployment");
    let client = reqwest::Client::new();
    let coordinator = cluster.url(RoleProcess::Coordinator);
    let admin = cluster.admin_token().to_owned();
    let (status, body) = post_as(
        &client,
        format!("{}/admin/accounts", cluster.url(RoleProcess::Wallet)),
        &admin,
        json!({"user": 1, "count": 5, "balance_minor": 1_000}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let drawer = Drawer {
        client: client.clone(),
        token: cluster.url(RoleProcess::Token),
        coordinator: coordinator.clone(),
        admin: admin.clone(),
    };
    let before = drawer.draws(1..2).await;
    assert_eq!(before.len(), 1, "a draw while everything is up");
    // The next draw's tokens, while the token service still has its database.
    let (jwt, once) = drawer.tokens(2).await;
    assert!(cluster.revive().is_empty(), "nothing is down yet");

    // The coordinator's database goes away (its sessions ended, new ones refused; the token
    // service's stays): its next commit fails, it answers 503 (or the connection ends) and
    // exits for a restart on its log.
    let admin_url = cluster.postgres().unwrap().url_for("postgres");
    sql(&admin_url, "ALTER DATABASE coord ALLOW_CONNECTIONS false").await;
    sql(
        &admin_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'coord'",
    )
    .await;
    let refused = client
        .post(format!("{coordinator}/lottery/draw"))
        .bearer_auth(&jwt)
        .json(&json!({"activity": 1, "price_minor": 100, "won": false, "once_token": once}))
        .send()
        .await;
    assert!(
        refused.as_ref().is_err() || refused.as_ref().is_ok_and(|r| r.status() == 503),
        "{refused:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cluster.service(RoleProcess::Coordinator).unwrap().is_down() {
        assert!(Instant::now() < deadline, "the coordinator did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = cluster.service(RoleProcess::Coordinator).unwrap().log();
    let log = std::fs::read_to_string(log).unwrap();
    assert!(log.contains("fail-stop"), "{log}");

    // The supervisor's round: the database back, the coordinator restarted on its log.
    sql(&admin_url, "ALTER DATABASE coord ALLOW_CONNECTIONS true").await;
    let revived = tokio::task::block_in_place(|| cluster.revive());
    assert!(
        revived
            .iter()
            .any(|(w, up)| *w == RoleProcess::Coordinator && *up),
        "{revived:?}"
    );
    assert_eq!(
        cluster.service(RoleProcess::Coordinator).unwrap().starts(),
        2
    );
    // Draws confirm again through the restarted coordinator, and the wallet was paid for the
    // one before the outage and the one after; the refused one froze nothing.
    // (User 4: a losing draw, no stock needed.)
    let after = drawer.draws(4..5).await;
    assert_eq!(after.len(), 1, "a draw after the restart");
    let wallet = cluster.url(RoleProcess::Wallet);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, report) =
            get_as(&client, format!("{wallet}/ledger"), cluster.admin_token()).await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["safe"], true, "{report}");
        if report["frozen_minor"] == 0 && report["collected_minor"] == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wallet never settled: {report}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}
