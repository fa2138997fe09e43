//! `GET /openapi.json` serves the generated description, and every operation it describes is
//! routed (a request to it never reaches the 404 `field: path` fallback or a 405), and every
//! error answer carries the documented `{"error", "field"?}` body with a documented status.

use std::time::Duration;

use reqwest::{Client, Method};
use serde_json::Value;
use sut_server::{ServerConfig, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_described_operation_is_routed_and_answers_as_described() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        ServerConfig::new(&dir.path().join("ids.db")),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", server.addr);
    let client = Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();

    let served = client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(
        served.text().await.unwrap(),
        sut_server::openapi::openapi_json()
    );

    let doc: Value = serde_json::from_str(&sut_server::openapi::openapi_json()).unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let url = format!(
                "{base}{}",
                path.replace("{tag}", "nosuchtag").replace("{id}", "12345")
            );
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut req = client.request(method.clone(), &url);
            if op.get("requestBody").is_some() {
                // A body of the wrong shape: every body route must refuse it as documented.
                req = req
                    .header("content-type", "application/json")
                    .body("{\"unexpected\": true}");
            }
            let r = req.send().await.unwrap();
            let status = r.status();
            let text = r.text().await.unwrap();
            let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            assert!(
                !(status == 404 && body["field"] == "path"),
                "{method} {path} is described but not routed"
            );
            assert_ne!(status, 405, "{method} {path}: method not routed");
            assert!(
                op["responses"][status.as_str()].is_object(),
                "{method} {path} answered {status}, which it does not describe: {text}"
            );
            if !status.is_success() {
                assert!(body["error"].is_string(), "{method} {path}: {text}");
            }
        }
    }
    assert_eq!(operations, sut_server::ROUTES.len());
    server.shutdown().await.unwrap();
}
