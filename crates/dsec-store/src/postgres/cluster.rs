//! [`ClusterStore`] on PostgreSQL.

use super::{node_record, PgStore, NODE_COLUMNS};
use crate::cluster::{ClusterStore, Member, Membership};
use crate::{columns, NewToken, NodeRecord, Result, TokenHash};

impl ClusterStore for PgStore {
    async fn add_join_token(&self, t: NewToken) -> Result<()> {
        self.execute(
            "INSERT INTO join_tokens (token_sha256, created_at_ms, expires_at_ms) VALUES ($1, $2, $3)",
            &[&t.hash.as_slice(), &(t.created_at_ms as i64), &t.expires_at_ms.map(|e| e as i64)],
        )
        .await?;
        Ok(())
    }

    async fn join_token_live(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        let rows = self
            .query(
                "SELECT 1 FROM join_tokens WHERE token_sha256 = $1 AND revoked_at_ms IS NULL
                   AND (expires_at_ms IS NULL OR expires_at_ms > $2)",
                &[&hash.as_slice(), &(now_ms as i64)],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn revoke_join_token(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        Ok(self
            .execute(
                "UPDATE join_tokens SET revoked_at_ms = $1 WHERE token_sha256 = $2 AND revoked_at_ms IS NULL",
                &[&(now_ms as i64), &hash.as_slice()],
            )
            .await?
            > 0)
    }

    async fn join_node(&self, n: &NodeRecord, m: &Membership) -> Result<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Serializes joins of one name (a first join racing a rejoin).
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&n.name]).await?;
        let existed = !tx.query("SELECT 1 FROM nodes WHERE name = $1", &[&n.name]).await?.is_empty();
        tx.execute(
            &format!(
                "INSERT INTO nodes ({NODE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (name) DO UPDATE SET url = excluded.url, labels = excluded.labels, backends = excluded.backends,
                   pool = excluded.pool, last_seen_ms = excluded.last_seen_ms,
                   state = CASE WHEN nodes.state = 'draining' THEN 'draining' ELSE excluded.state END"
            ),
            &[
                &n.name,
                &n.url,
                &columns::labels_json(&n.labels),
                &columns::backends_json(&n.backends),
                &n.pool,
                &n.state.as_str(),
                &n.last_seen_ms.map(|t| t as i64),
                &(n.registered_at_ms as i64),
            ],
        )
        .await?;
        tx.execute(
            "INSERT INTO node_members (name, secret, cpu_millis, memory_mb, max_sandboxes) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE SET secret = excluded.secret, cpu_millis = excluded.cpu_millis,
               memory_mb = excluded.memory_mb, max_sandboxes = excluded.max_sandboxes",
            &[&n.name, &m.secret, &(m.cpu_millis as i64), &(m.memory_mb as i64), &(m.max_sandboxes as i64)],
        )
        .await?;
        tx.commit().await?;
        Ok(existed)
    }

    async fn members(&self) -> Result<Vec<Member>> {
        let cols: String = NODE_COLUMNS.split(", ").map(|col| format!("n.{col}")).collect::<Vec<_>>().join(", ");
        let rows = self
            .query(
                &format!(
                    "SELECT {cols}, m.secret, m.cpu_millis, m.memory_mb, m.max_sandboxes
                       FROM nodes n LEFT JOIN node_members m ON m.name = n.name ORDER BY n.name"
                ),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let secret: Option<String> = r.try_get(8)?;
                let membership = match secret {
                    Some(secret) => Some(Membership {
                        secret,
                        cpu_millis: r.try_get::<_, i64>(9)?.max(0) as u64,
                        memory_mb: r.try_get::<_, i64>(10)?.max(0) as u64,
                        max_sandboxes: r.try_get::<_, i64>(11)?.max(0) as u64,
                    }),
                    None => None,
                };
                Ok(Member { node: node_record(r)?, membership })
            })
            .collect()
    }
}
