//! The functions' secrets as the registry keeps them: one row per (function, name), the value
//! sealed by the gateway ([`crate::seal`], slot `secret:<function>:<name>`) before it reaches
//! this module. Setting a function's secrets replaces them all (a rotation); they are not
//! versioned with the manifest: every version of the function, and a rollback, runs with the
//! current values.
//!
//! Must not know: the seal key, the values, who may set them.

use super::{Registry, RegistryError};
use rusqlite::{Connection, params};

/// Creates the table (at open).
pub(super) fn create_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS function_secrets (
             name TEXT NOT NULL, key TEXT NOT NULL, sealed TEXT NOT NULL, set_at INTEGER NOT NULL,
             PRIMARY KEY (name, key));",
    )
}

impl Registry {
    /// Replaces every secret of the function `name` with `sealed` ((name, sealed value) pairs).
    pub fn set_secrets(&self, name: &str, sealed: &[(String, String)]) -> Result<(), RegistryError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM function_secrets WHERE name = ?1", [name])?;
        let now = crate::time::now_s() as i64;
        for (key, value) in sealed {
            tx.execute(
                "INSERT INTO function_secrets (name, key, sealed, set_at) VALUES (?1, ?2, ?3, ?4)",
                params![name, key, value, now],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The function's secrets, (name, sealed value), by name.
    pub fn sealed_secrets(&self, name: &str) -> Result<Vec<(String, String)>, RegistryError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT key, sealed FROM function_secrets WHERE name = ?1 ORDER BY key")?;
        let rows = stmt.query_map([name], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The names of the function's secrets, sorted.
    pub fn secret_names(&self, name: &str) -> Result<Vec<String>, RegistryError> {
        Ok(self.sealed_secrets(name)?.into_iter().map(|(k, _)| k).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_secrets_replaces_them_all_and_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        reg.set_secrets("f", &[("B".into(), "sealed-b".into()), ("A".into(), "sealed-a".into())]).expect("set");
        reg.set_secrets("g", &[("A".into(), "other".into())]).expect("set g");
        assert_eq!(reg.secret_names("f").expect("names"), ["A", "B"]);
        reg.set_secrets("f", &[("C".into(), "sealed-c".into())]).expect("rotate");
        drop(reg);
        let reg = Registry::open(dir.path()).expect("reopen");
        assert_eq!(reg.sealed_secrets("f").expect("f"), [("C".to_owned(), "sealed-c".to_owned())]);
        assert_eq!(reg.sealed_secrets("g").expect("g"), [("A".to_owned(), "other".to_owned())]);
        assert!(reg.sealed_secrets("h").expect("none").is_empty());
    }
}
