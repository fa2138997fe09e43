//! What recording the history costs the load generator at its maximum rate: the real-system
//! clients (one request at a time per thread, as in `scenarios/real/`) against a fresh Redis
//! (`INCR`, RDB only: the fastest ID source here), fault-free, in alternating runs with the
//! history recorded and without, on the same server. Prints each run and the median ratio.
//!
//! ```sh
//! cargo run --release -p blackbox --example history_cost -- [CLIENTS] [ROUND_S] [ROUNDS]
//! ```

use std::time::Duration;

use blackbox::real::{IdSystem, recording_cost};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let (clients, round_s, rounds) = (arg(1, 8), arg(2, 5), arg(3, 4));
    let system = IdSystem::RedisIncr(chaos::RedisPersistence::Rdb { after_s: 3600 });
    let rates = match recording_cost(
        system,
        clients,
        Duration::from_secs(round_s),
        u32::try_from(rounds).unwrap_or(4),
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("history_cost: {e}");
            std::process::exit(2);
        }
    };
    for (recorded, rate) in &rates {
        let what = if *recorded {
            "recorded"
        } else {
            "not recorded"
        };
        println!("{what:>13}: {rate:>10.0} requests/s");
    }
    let side = |want: bool| -> Vec<f64> {
        rates
            .iter()
            .filter(|(r, _)| *r == want)
            .map(|(_, x)| *x)
            .collect()
    };
    let (with, without) = (median(side(true)), median(side(false)));
    println!(
        "median: {with:.0} requests/s recorded, {without:.0} not: recording costs {:.1}% \
         ({clients} clients, {round_s} s runs, {rounds} pairs)",
        (1.0 - with / without) * 100.0
    );
}
