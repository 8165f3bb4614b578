//! [`CreationKeys`] on PostgreSQL.

use super::PgStore;
use crate::creation_keys::CreationKeys;
use crate::Result;

impl CreationKeys for PgStore {
    async fn place_creation(&self, tenant: &str, key: &str, node: &str, now_ms: u64) -> Result<String> {
        // One statement: the insert's own row, or (on conflict, where
        // RETURNING gives nothing) the row an earlier call inserted.
        let rows = self
            .query(
                "WITH ins AS (
                   INSERT INTO creation_keys (tenant, key, node, created_at_ms) VALUES ($1, $2, $3, $4)
                   ON CONFLICT (tenant, key) DO NOTHING RETURNING node)
                 SELECT node FROM ins UNION ALL SELECT node FROM creation_keys WHERE tenant = $1 AND key = $2",
                &[&tenant, &key, &node, &(now_ms as i64)],
            )
            .await?;
        if let Some(row) = rows.first() {
            return Ok(row.try_get(0)?);
        }
        // A concurrent first insert committed after this statement's
        // snapshot was taken: read it now.
        let rows = self.query("SELECT node FROM creation_keys WHERE tenant = $1 AND key = $2", &[&tenant, &key]).await?;
        match rows.first() {
            Some(row) => Ok(row.try_get(0)?),
            None => Err(crate::StoreError::Corrupt { table: "creation_keys", detail: format!("key {key:?} neither inserted nor found") }),
        }
    }

    async fn move_creation(&self, tenant: &str, key: &str, from: &str, to: &str) -> Result<bool> {
        Ok(self
            .execute("UPDATE creation_keys SET node = $4 WHERE tenant = $1 AND key = $2 AND node = $3", &[&tenant, &key, &from, &to])
            .await?
            > 0)
    }

    async fn forget_creations(&self, before_ms: u64) -> Result<u64> {
        self.execute("DELETE FROM creation_keys WHERE created_at_ms < $1", &[&(before_ms as i64)]).await
    }
}
