//! The TCC lottery (issue "Tokens, the TCC lottery, and the real HTTP server"): not built yet.

pub mod wheel;
