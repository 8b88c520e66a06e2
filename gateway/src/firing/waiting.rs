//! What the rate limits hold back: each rate-limited function's firings waiting for their
//! token ([`Firings::rate_waiting`]), counted from the table when the gateway's metrics are
//! scraped.
//!
//! Must not know: NATS, HTTP, the dispatcher, the metrics' format.

use super::{FiringError, Firings};
use htfaas_functions::store::from_db;

impl Firings {
    /// Per function, in name order, its firings a rate limit holds: pending, given the time
    /// their token will be there (`rate_reserved`) and never tried (a retry's backoff is not
    /// the rate's). Functions holding none are left out. Blocks on the table: async callers
    /// use `Firings::call`.
    pub fn rate_waiting(&self) -> Result<Vec<(String, u64)>, FiringError> {
        self.with(|conn| {
            let mut held = conn.prepare_cached(
                "SELECT function, COUNT(*) FROM firings \
                 WHERE state = 'pending' AND rate_reserved = 1 AND attempts = 0 \
                 GROUP BY function ORDER BY function",
            )?;
            let rows = held.query_map([], |r| Ok((r.get::<_, String>(0)?, from_db(r.get::<_, i64>(1)?))))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }
}
