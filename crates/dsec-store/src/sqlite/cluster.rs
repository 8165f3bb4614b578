//! [`ClusterStore`] on SQLite.

use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::{node_record, node_row, SqliteStore, NODE_COLUMNS};
use crate::cluster::{ClusterStore, Member, Membership};
use crate::{columns, NewToken, NodeRecord, Result, TokenHash};

impl ClusterStore for SqliteStore {
    async fn add_join_token(&self, t: NewToken) -> Result<()> {
        self.with_conn(move |_, c| {
            c.execute(
                "INSERT INTO join_tokens (token_sha256, created_at_ms, expires_at_ms) VALUES (?1, ?2, ?3)",
                params![t.hash.as_slice(), t.created_at_ms as i64, t.expires_at_ms.map(|e| e as i64)],
            )?;
            Ok(())
        })
        .await
    }

    async fn join_token_live(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        let hash = *hash;
        self.with_conn(move |_, c| {
            let found: Option<i64> = c
                .query_row(
                    "SELECT 1 FROM join_tokens WHERE token_sha256 = ?1 AND revoked_at_ms IS NULL
                       AND (expires_at_ms IS NULL OR expires_at_ms > ?2)",
                    params![hash.as_slice(), now_ms as i64],
                    |r| r.get(0),
                )
                .optional()?;
            Ok(found.is_some())
        })
        .await
    }

    async fn revoke_join_token(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        let hash = *hash;
        self.with_conn(move |_, c| {
            Ok(c.execute(
                "UPDATE join_tokens SET revoked_at_ms = ?1 WHERE token_sha256 = ?2 AND revoked_at_ms IS NULL",
                params![now_ms as i64, hash.as_slice()],
            )? > 0)
        })
        .await
    }

    async fn join_node(&self, node: &NodeRecord, m: &Membership) -> Result<bool> {
        let (n, m) = (node.clone(), m.clone());
        self.with_conn(move |_, c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let existed = tx.query_row("SELECT 1 FROM nodes WHERE name = ?1", [&n.name], |_| Ok(())).optional()?.is_some();
            tx.execute(
                &format!(
                    "INSERT INTO nodes ({NODE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (name) DO UPDATE SET url = excluded.url, labels = excluded.labels, backends = excluded.backends,
                       pool = excluded.pool, last_seen_ms = excluded.last_seen_ms,
                       state = CASE WHEN nodes.state = 'draining' THEN 'draining' ELSE excluded.state END"
                ),
                params![
                    n.name,
                    n.url,
                    columns::labels_json(&n.labels),
                    columns::backends_json(&n.backends),
                    n.pool,
                    n.state.as_str(),
                    n.last_seen_ms.map(|t| t as i64),
                    n.registered_at_ms as i64
                ],
            )?;
            tx.execute(
                "INSERT INTO node_members (name, secret, cpu_millis, memory_mb, max_sandboxes) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (name) DO UPDATE SET secret = excluded.secret, cpu_millis = excluded.cpu_millis,
                   memory_mb = excluded.memory_mb, max_sandboxes = excluded.max_sandboxes",
                params![n.name, m.secret, m.cpu_millis as i64, m.memory_mb as i64, m.max_sandboxes as i64],
            )?;
            tx.commit()?;
            Ok(existed)
        })
        .await
    }

    async fn members(&self) -> Result<Vec<Member>> {
        self.with_conn(|_, c| {
            let cols: String = NODE_COLUMNS.split(", ").map(|col| format!("n.{col}")).collect::<Vec<_>>().join(", ");
            let mut stmt = c.prepare(&format!(
                "SELECT {cols}, m.secret, m.cpu_millis, m.memory_mb, m.max_sandboxes
                   FROM nodes n LEFT JOIN node_members m ON m.name = n.name ORDER BY n.name"
            ))?;
            let rows = stmt
                .query_map([], |r| {
                    let secret: Option<String> = r.get(8)?;
                    let extra = match secret {
                        Some(secret) => Some((secret, r.get::<_, i64>(9)?, r.get::<_, i64>(10)?, r.get::<_, i64>(11)?)),
                        None => None,
                    };
                    Ok((node_row(r)?, extra))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(row, extra)| {
                    Ok(Member {
                        node: node_record(row)?,
                        membership: extra.map(|(secret, cpu, mem, max)| Membership {
                            secret,
                            cpu_millis: cpu.max(0) as u64,
                            memory_mb: mem.max(0) as u64,
                            max_sandboxes: max.max(0) as u64,
                        }),
                    })
                })
                .collect()
        })
        .await
    }
}
