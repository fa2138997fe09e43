//! The PostgreSQL side of the one-time-token writer's batch ([`crate::sqldb::once_view`]): the
//! snapshot's reads by token and by key in one statement (arrays and `unnest`), the kept inserts
//! with their count in one, the kept consumes in one.

use sut::token::rows::{OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError};
use sut::token::rules::OnceRow;
use sut::token::store::{Forgotten, PurgeCounts};
use sut::token::{ActivityKey, UserId};

use super::{
    PgTokenStore, Tx, check_once_in, column, corrupt, counter, forgotten_in, get_u64,
    is_revoked_in, make_room_counted, mark_once_consumed_in, once_row, purge_expired_in,
    purge_once, read_once, revoke_in, revoked_jtis_in, to_sql, user_from_sql, user_to_sql,
};
pub use crate::sqldb::once_view::OnceHints;
use crate::sqldb::once_view::{Committed, OnceTx, run_batch};

impl PgTokenStore {
    /// Runs `ops` against a store whose every operation happens inside **one** serializable
    /// transaction, committed when `ops` returns `Ok` (group commit: one WAL flush for the lot),
    /// the one-time token operations served from a snapshot read up front (see
    /// [`crate::sqldb::once_view`]). A serialization failure rolls all of it back and runs `ops`
    /// again from the start, so `ops` must start from scratch on every call and nothing it
    /// computed may leave before this returns `Ok`.
    ///
    /// # Errors
    /// The first error `ops` returns (nothing committed), or a database failure.
    pub fn batch_once(
        &mut self,
        hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn sut::token::TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError> {
        let limits = self.limits;
        self.transact(|tx| run_batch(tx, limits, hints, ops))
    }
}

/// The token, key and row of a `tok_once` row read as `token, user_id, activity,
/// window_start_ms, expires_at_ms, consumed_at_ms`.
fn named_row(row: &tokio_postgres::Row) -> Result<(OnceToken, OnceRow), TokenStoreError> {
    let token = OnceToken::parse(&column::<String>(row, 0, "token")?)
        .ok_or_else(|| corrupt("one-time token text"))?;
    let key = OnceKey {
        user: user_from_sql(column(row, 1, "user_id")?),
        activity: ActivityKey::new(column::<String>(row, 2, "activity")?)
            .ok_or_else(|| corrupt("activity id"))?,
        window_start_ms: get_u64(row, 3, "window_start_ms")?,
    };
    Ok((token, once_row(key, row, 4)?))
}

impl OnceTx for Tx<'_> {
    fn revoke(
        &mut self,
        max: u64,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<Committed<RevokeOutcome>, TokenStoreError> {
        revoke_in(self, max, jti, keep_until_ms, now_ms)
    }

    fn is_revoked(&mut self, jti: &str) -> Result<bool, TokenStoreError> {
        is_revoked_in(self, jti)
    }

    fn revoked_jtis(&mut self) -> Result<Vec<String>, TokenStoreError> {
        revoked_jtis_in(self)
    }

    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        check_once_in(self, token, user, now_ms)
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        mark_once_consumed_in(self, token, now_ms)
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        purge_expired_in(self, now_ms)
    }

    fn forgotten(&mut self) -> Result<Forgotten, TokenStoreError> {
        forgotten_in(self)
    }

    fn make_room_once(
        &mut self,
        max: u64,
        now_ms: u64,
        rows: u64,
    ) -> Result<Committed<()>, TokenStoreError> {
        make_room_counted(self, Table::OnceTokens, max, now_ms, rows, purge_once)
    }

    fn once_counter(&mut self) -> Result<(u64, u64), TokenStoreError> {
        counter(self, Table::OnceTokens)
    }

    fn read_named(
        &mut self,
        tokens: &[OnceToken],
        keys: &[OnceKey],
    ) -> Result<Vec<(OnceToken, OnceRow)>, TokenStoreError> {
        let tokens: Vec<String> = tokens.iter().map(ToString::to_string).collect();
        let users: Vec<i64> = keys.iter().map(|k| user_to_sql(k.user)).collect();
        let activities: Vec<&str> = keys.iter().map(|k| k.activity.as_str()).collect();
        let windows: Vec<i64> = keys.iter().map(|k| to_sql(k.window_start_ms)).collect();
        // Two index lookups (an `OR` of the two would scan the table).
        let sql = "SELECT token, user_id, activity, window_start_ms, expires_at_ms, \
                          consumed_at_ms \
                   FROM tok_once WHERE token = ANY($1) \
                   UNION ALL \
                   SELECT o.token, o.user_id, o.activity, o.window_start_ms, o.expires_at_ms, \
                          o.consumed_at_ms \
                   FROM unnest($2::bigint[], $3::text[], $4::bigint[]) AS k(u, a, w) \
                   JOIN tok_once o \
                     ON o.user_id = k.u AND o.activity = k.a AND o.window_start_ms = k.w";
        self.query(sql, &[&tokens, &users, &activities, &windows])?
            .iter()
            .map(named_row)
            .collect()
    }

    fn read_once(&mut self, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
        read_once(self, token)
    }

    fn token_of(&mut self, key: &OnceKey) -> Result<Option<OnceToken>, TokenStoreError> {
        let sql = "SELECT token FROM tok_once \
                   WHERE user_id = $1 AND activity = $2 AND window_start_ms = $3";
        let params = [
            &user_to_sql(key.user) as super::Param<'_>,
            &key.activity.as_str(),
            &to_sql(key.window_start_ms),
        ];
        self.query_opt(sql, &params)?
            .map(|found| {
                OnceToken::parse(&column::<String>(&found, 0, "token")?)
                    .ok_or_else(|| corrupt("one-time token text"))
            })
            .transpose()
    }

    fn insert_all(&mut self, rows: &[(OnceToken, OnceRow)]) -> Result<(), TokenStoreError> {
        let tokens: Vec<String> = rows.iter().map(|(t, _)| t.to_string()).collect();
        let users: Vec<i64> = rows.iter().map(|(_, r)| user_to_sql(r.key.user)).collect();
        let activities: Vec<&str> = rows.iter().map(|(_, r)| r.key.activity.as_str()).collect();
        let windows: Vec<i64> = rows
            .iter()
            .map(|(_, r)| to_sql(r.key.window_start_ms))
            .collect();
        let expiries: Vec<i64> = rows.iter().map(|(_, r)| to_sql(r.expires_at_ms)).collect();
        let sql = "WITH inserted AS ( \
                     INSERT INTO tok_once \
                     (token, user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms) \
                     SELECT t, u, a, w, e, NULL FROM unnest($1::text[], $2::bigint[], \
                            $3::text[], $4::bigint[], $5::bigint[]) AS x(t, u, a, w, e) \
                     RETURNING 1) \
                   UPDATE tok_rows SET n = n + (SELECT COUNT(*) FROM inserted) \
                   WHERE tbl = 'tok_once'";
        let counted = self.execute(sql, &[&tokens, &users, &activities, &windows, &expiries])?;
        assert_eq!(counted, 1, "the schema creates every counter row");
        Ok(())
    }

    fn consume_all(&mut self, consumes: &[(OnceToken, u64)]) -> Result<u64, TokenStoreError> {
        let tokens: Vec<String> = consumes.iter().map(|(t, _)| t.to_string()).collect();
        let times: Vec<i64> = consumes.iter().map(|(_, at)| to_sql(*at)).collect();
        let sql = "UPDATE tok_once SET consumed_at_ms = x.at \
                   FROM unnest($1::text[], $2::bigint[]) AS x(token, at) \
                   WHERE tok_once.token = x.token AND tok_once.consumed_at_ms IS NULL";
        Ok(self.execute(sql, &[&tokens, &times])?)
    }
}
