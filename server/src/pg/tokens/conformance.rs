//! Conformance: the random operation sequences of the SQLite token store's conformance test,
//! applied to [`MemoryTokenStore`](sut::token::MemoryTokenStore) and [`PgTokenStore`], must give
//! identical results, step by step. One PostgreSQL server for the test, a fresh database per
//! case.

use std::cell::Cell;

use cluster::Postgres;
use proptest::prelude::*;

use super::PgTokenStore;
use crate::pg::{create_database, url_with_database};
use crate::sqlite::tokens_conformance::{LIMITS, agree, op};

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn memory_and_postgres_token_stores_agree() {
    let server = Postgres::start().expect("start PostgreSQL");
    let case = Cell::new(0u32);
    let config = ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60))| {
        let name = format!("tok_case_{}", case.get());
        case.set(case.get() + 1);
        create_database(&server.url(), &name).expect("create database");
        let url = url_with_database(&server.url(), &name);
        agree(&mut PgTokenStore::open(&url, LIMITS).expect("open"), &ops)?;
    });
}
