//! Serves stateright's Explorer for a model:
//! `cargo run --release -p models --example explore -- NAME [ADDR] [FLAW]`.

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "tokens".to_owned());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let flaw = args.next();
    println!("serving the `{name}` model on http://{addr}");
    if let Err(err) = models::serve_with_flaw(&name, &addr, flaw.as_deref()) {
        eprintln!("{err}");
        std::process::exit(2);
    }
}
