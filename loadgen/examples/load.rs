//! Runs one load test and prints the report as JSON (a stand-in for the bench CLI, used for the
//! figures in docs/load.md).
//!
//! `cargo run --release -p loadgen --example load -- WORKLOAD USERS RATE|closed DURATION_S
//! WARMUP_S [HOST] [HLOG_DIR]`

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_owned());
    let rate = get(2, "closed");
    let opts = loadgen::LoadOptions {
        workload: get(0, "id"),
        users: get(1, "16").parse().expect("USERS"),
        rate: if rate == "closed" {
            None
        } else {
            Some(rate.parse().expect("RATE"))
        },
        duration_s: get(3, "10").parse().expect("DURATION_S"),
        warmup_s: get(4, "2").parse().expect("WARMUP_S"),
        host: a.get(5).filter(|h| h.as_str() != "-").cloned(),
        hlog_dir: a.get(6).map(std::path::PathBuf::from),
    };
    match loadgen::run(opts) {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).expect("serializable report")
            );
            if !report.passed() {
                eprintln!("verification FAILED");
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    }
}
