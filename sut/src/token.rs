//! Idempotency tokens (issue "Tokens, the TCC lottery, and the real HTTP server"): not built yet.
