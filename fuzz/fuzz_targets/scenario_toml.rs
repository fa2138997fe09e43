#![no_main]
//! `sim::scenario::Scenario::parse` on arbitrary text: an error naming file:line, never a panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = sim::scenario::Scenario::parse("fuzz.toml", text) {
        let shown = e.to_string();
        assert!(
            shown.starts_with("fuzz.toml"),
            "error without its file: {shown}"
        );
    }
});
