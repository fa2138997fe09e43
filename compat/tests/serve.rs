//! The stand-ins serve their APIs: `id-compat --api leaf` hands out rising IDs from its SQLite
//! segments, `tcc-compat` answers its ledger to the operator only. (This test also makes
//! `cargo test --workspace` build both binaries, which the black-box tests of `scenarios` run.)

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// A started stand-in, killed when dropped.
struct Served {
    child: Child,
    addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Served {
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {bin}: {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{bin} said {line:?}"))
        .to_owned();
    Served { child, addr }
}

/// `GET path` with an optional bearer token: the status code and the body.
fn get(addr: &str, path: &str, bearer: Option<&str>) -> (u16, String) {
    request(addr, "GET", path, bearer, "")
}

/// `METHOD path` with an optional bearer token and a JSON body: the status code and the body.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

#[test]
fn id_compat_speaks_leaf_and_hands_out_rising_ids() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leaf.db");
    let served = serve(
        env!("CARGO_BIN_EXE_id-compat"),
        &[
            "--api",
            "leaf",
            "--db",
            db.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--step",
            "3",
        ],
        &[],
    );
    let ids: Vec<u64> = (0..7)
        .map(|_| {
            let (status, body) = get(&served.addr, "/api/segment/get/orders", None);
            assert_eq!(status, 200, "{body}");
            body.trim()
                .parse()
                .unwrap_or_else(|_| panic!("not an ID: {body:?}"))
        })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[test]
fn tcc_compat_takes_admin_requests_from_the_operator_only() {
    let dir = tempfile::tempdir().unwrap();
    let (db, payments) = (dir.path().join("tcc.db"), dir.path().join("pay.db"));
    let served = serve(
        env!("CARGO_BIN_EXE_tcc-compat"),
        &[
            "--db",
            db.to_str().unwrap(),
            "--payments",
            payments.to_str().unwrap(),
        ],
        &[("SUT_ADMIN_TOKEN", "compat-test-secret")],
    );
    let accounts = r#"{"user": 1, "count": 2, "balance_minor": 50}"#;
    let open = |bearer| request(&served.addr, "POST", "/admin/accounts", bearer, accounts).0;
    assert_eq!(open(None), 401);
    assert_eq!(open(Some("someone-else")), 401);
    assert_eq!(open(Some("compat-test-secret")), 201);
    let (status, ledger) = get(&served.addr, "/ledger", None);
    assert_eq!(status, 200);
    assert!(
        ledger.contains(r#""balances_minor":100"#),
        "two accounts of 50: {ledger}"
    );
}
