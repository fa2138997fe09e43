//! Shared by the hostile suites (included with `#[path]`, so that the mutation gate, which
//! compiles each suite as a module, gets it too).

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs one step of a bench: a panic is a broken promise like any other, reported with its
/// message.
pub fn unpanicked(step: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(step)).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(format!("panicked: {msg}"))
    })
}
