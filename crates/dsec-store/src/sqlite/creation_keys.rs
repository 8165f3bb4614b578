//! [`CreationKeys`] on SQLite.

use rusqlite::{params, TransactionBehavior};

use super::SqliteStore;
use crate::creation_keys::CreationKeys;
use crate::Result;

impl CreationKeys for SqliteStore {
    async fn place_creation(&self, tenant: &str, key: &str, node: &str, now_ms: u64) -> Result<String> {
        let (tenant, key, node) = (tenant.to_string(), key.to_string(), node.to_string());
        self.with_conn(move |_, c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO creation_keys (tenant, key, node, created_at_ms) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (tenant, key) DO NOTHING",
                params![tenant, key, node, now_ms as i64],
            )?;
            let held: String =
                tx.query_row("SELECT node FROM creation_keys WHERE tenant = ?1 AND key = ?2", params![tenant, key], |r| r.get(0))?;
            tx.commit()?;
            Ok(held)
        })
        .await
    }

    async fn move_creation(&self, tenant: &str, key: &str, from: &str, to: &str) -> Result<bool> {
        let (tenant, key, from, to) = (tenant.to_string(), key.to_string(), from.to_string(), to.to_string());
        self.with_conn(move |_, c| {
            Ok(c.execute(
                "UPDATE creation_keys SET node = ?4 WHERE tenant = ?1 AND key = ?2 AND node = ?3",
                params![tenant, key, from, to],
            )? > 0)
        })
        .await
    }

    async fn forget_creations(&self, before_ms: u64) -> Result<u64> {
        self.with_conn(move |_, c| Ok(c.execute("DELETE FROM creation_keys WHERE created_at_ms < ?1", params![before_ms as i64])? as u64))
            .await
    }
}
