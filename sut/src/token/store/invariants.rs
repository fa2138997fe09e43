//! The structural invariants of [`MemoryTokenStore`]: what its bounds and its key index
//! promise after any sequence of operations.

use super::MemoryTokenStore;

impl MemoryTokenStore {
    /// Checks the store's structural invariants; the first violation found, described.
    ///
    /// - each table holds at most its bound of rows ([`super::TokenStoreLimits`]);
    /// - the key index is exact: every key names a token whose row has that key, and every row
    ///   is indexed under its key (so a key has at most one token and a token one key);
    /// - every row expires after its table's horizon ([`super::Forgotten`]): a purge deletes
    ///   everything up to the reading it was given, and nothing at or below the horizon is
    ///   inserted afterwards.
    ///
    /// # Errors
    /// A description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let revocations = self.revoked.len() as u64;
        if revocations > self.limits.revocations_max {
            return Err(format!(
                "{revocations} revocations above the bound {}",
                self.limits.revocations_max
            ));
        }
        let once_tokens = self.once_by_token.len() as u64;
        if once_tokens > self.limits.once_tokens_max {
            return Err(format!(
                "{once_tokens} one-time tokens above the bound {}",
                self.limits.once_tokens_max
            ));
        }
        let horizon = self.forgotten;
        if let Some((jti, keep)) = self
            .revoked
            .iter()
            .find(|(_, keep)| super::rules::forgotten(**keep, horizon.revocations_until_ms))
        {
            return Err(format!(
                "revocation {jti} kept until {keep} is at or below the horizon {}",
                horizon.revocations_until_ms
            ));
        }
        if let Some((token, row)) = self
            .once_by_token
            .iter()
            .find(|(_, row)| super::rules::forgotten(row.expires_at_ms, horizon.once_until_ms))
        {
            return Err(format!(
                "one-time token {token:?} expiring at {} is at or below the horizon {}",
                row.expires_at_ms, horizon.once_until_ms
            ));
        }
        for (key, token) in &self.once_by_key {
            match self.once_by_token.get(token) {
                None => return Err(format!("key {key:?} indexes missing token {token:?}")),
                Some(row) if row.key != *key => {
                    return Err(format!(
                        "key {key:?} indexes token {token:?} of key {:?}",
                        row.key
                    ));
                }
                Some(_) => {}
            }
        }
        for (token, row) in &self.once_by_token {
            if self.once_by_key.get(&row.key) != Some(token) {
                return Err(format!(
                    "token {token:?} of key {:?} is not indexed under its key",
                    row.key
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
