//! The PostgreSQL engine's projects, roles and quotas (`Store`'s IAM
//! block). Checks that span rows (a quota against its parent's and its
//! siblings') lock the parent's row first, so replicas setting sibling
//! quotas at once are serialized.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::columns::{self, QUOTA_COLUMNS};
use crate::postgres::{get_principal, is_unique_violation, PgStore};
use crate::projects::check_delegation;
use crate::{NewToken, Quota, Result, Role, StoreError, TokenHash, TokenInfo};

/// Revokes `roots` and every token issued below them (one recursive
/// statement); returns the hashes it revoked now.
pub(crate) async fn revoke_cascade(c: &impl GenericClient, roots: &[TokenHash], now_ms: u64) -> Result<Vec<TokenHash>> {
    let roots: Vec<&[u8]> = roots.iter().map(|h| h.as_slice()).collect();
    let rows = c
        .query(
            "WITH RECURSIVE doomed (h) AS (
                 SELECT token_sha256 FROM tokens WHERE token_sha256 = ANY($1)
                 UNION SELECT t.token_sha256 FROM tokens t JOIN doomed d ON t.issuer = d.h)
             UPDATE tokens SET revoked_at_ms = $2
             WHERE token_sha256 IN (SELECT h FROM doomed) AND revoked_at_ms IS NULL
             RETURNING token_sha256",
            &[&roots, &(now_ms as i64)],
        )
        .await?;
    rows.iter().map(|r| columns::hash(r.try_get(0)?)).collect()
}

fn quota_row(r: &Row, first: usize) -> Result<Quota> {
    let mut values = [None; 6];
    for (i, v) in values.iter_mut().enumerate() {
        *v = r.try_get(first + i)?;
    }
    Ok(columns::quota(values, r.try_get(first + 6)?))
}

impl PgStore {
    pub(crate) async fn iam_issue_token(&self, principal: &str, token: NewToken, role: Role, issuer: Option<TokenHash>) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Locks the principal's row, so it cannot vanish before the insert.
        if tx.query_opt("SELECT 1 FROM principals WHERE name = $1 FOR SHARE", &[&principal]).await?.is_none() {
            return Err(StoreError::NoSuchPrincipal(principal.to_string()));
        }
        if let Some(i) = &issuer {
            // FOR SHARE: a revocation of the issuer waits for this insert,
            // then revokes the new token with it.
            let live =
                tx.query_opt("SELECT 1 FROM tokens WHERE token_sha256 = $1 AND revoked_at_ms IS NULL FOR SHARE", &[&i.as_slice()]).await?;
            if live.is_none() {
                return Err(StoreError::IssuerRevoked);
            }
        }
        let r = tx
            .execute(
                "INSERT INTO tokens (token_sha256, principal, created_at_ms, expires_at_ms, role, issuer) VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &token.hash.as_slice(),
                    &principal,
                    &(token.created_at_ms as i64),
                    &token.expires_at_ms.map(|e| e as i64),
                    &role.as_str(),
                    &issuer.as_ref().map(|i| i.as_slice()),
                ],
            )
            .await;
        match r {
            Ok(_) => Ok(tx.commit().await?),
            Err(e) if is_unique_violation(&e) => Err(StoreError::Exists("a token with this hash".into())),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) async fn iam_tokens(&self) -> Result<Vec<TokenInfo>> {
        let rows = self
            .query(
                "SELECT token_sha256, principal, role, created_at_ms, expires_at_ms, revoked_at_ms, issuer
                 FROM tokens ORDER BY principal, created_at_ms, token_sha256",
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(TokenInfo {
                    hash: columns::hash(r.try_get(0)?)?,
                    principal: r.try_get(1)?,
                    role: columns::role(r.try_get(2)?)?,
                    created_at_ms: r.try_get::<_, i64>(3)?.max(0) as u64,
                    expires_at_ms: r.try_get::<_, Option<i64>>(4)?.map(|t| t.max(0) as u64),
                    revoked_at_ms: r.try_get::<_, Option<i64>>(5)?.map(|t| t.max(0) as u64),
                    issuer: r.try_get::<_, Option<&[u8]>>(6)?.map(columns::hash).transpose()?,
                })
            })
            .collect()
    }

    pub(crate) async fn iam_delete_principal(&self, name: &str, now_ms: u64) -> Result<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        if tx.query_opt("SELECT 1 FROM principals WHERE name = $1 FOR UPDATE", &[&name]).await?.is_none() {
            return Ok(false);
        }
        if tx.query_opt("SELECT 1 FROM principals WHERE parent = $1 LIMIT 1", &[&name]).await?.is_some() {
            return Err(StoreError::HasChildren(name.to_string()));
        }
        let held = tx.query("SELECT token_sha256 FROM tokens WHERE principal = $1", &[&name]).await?;
        let held = held.iter().map(|r| columns::hash(r.try_get(0)?)).collect::<Result<Vec<_>>>()?;
        revoke_cascade(&tx, &held, now_ms).await?;
        let r = tx.execute("DELETE FROM principals WHERE name = $1", &[&name]).await;
        match r {
            Ok(_) => Ok(tx.commit().await.map(|_| true)?),
            // A child created meanwhile (its insert checked the parent first).
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) => {
                Err(StoreError::HasChildren(name.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) async fn iam_set_quota(&self, project: &str, quota: Option<Quota>) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let Some(p) = get_principal(&tx, project).await? else { return Err(StoreError::NoSuchPrincipal(project.to_string())) };
        let Some(q) = quota else {
            tx.execute("DELETE FROM project_quotas WHERE project = $1", &[&project]).await?;
            return Ok(tx.commit().await?);
        };
        let mut parent = None;
        let mut siblings = Vec::new();
        if let Some(name) = &p.parent {
            // Serializes every quota change among the parent's children.
            tx.query_opt("SELECT 1 FROM principals WHERE name = $1 FOR UPDATE", &[name]).await?;
            let row = tx.query_opt(&format!("SELECT {QUOTA_COLUMNS} FROM project_quotas WHERE project = $1"), &[name]).await?;
            parent = row.map(|r| quota_row(&r, 0)).transpose()?.map(|pq| (name.clone(), pq));
            let rows = tx
                .query(
                    &format!(
                        "SELECT {QUOTA_COLUMNS} FROM project_quotas q JOIN principals p ON p.name = q.project WHERE p.parent = $1 AND p.name <> $2"
                    ),
                    &[name, &project],
                )
                .await?;
            siblings = rows.iter().map(|r| quota_row(r, 0)).collect::<Result<Vec<_>>>()?;
        }
        check_delegation(project, &q, parent.as_ref().map(|(n, pq)| (n.as_str(), pq)), &siblings)?;
        let v = columns::quota_values(&q);
        tx.execute(
            &format!(
                "INSERT INTO project_quotas (project, {QUOTA_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (project) DO UPDATE SET sandboxes = excluded.sandboxes, cpu_millis = excluded.cpu_millis,
                   memory_mb = excluded.memory_mb, disk_mb = excluded.disk_mb, creations_per_s = excluded.creations_per_s,
                   fncall_per_s = excluded.fncall_per_s, overcommit = excluded.overcommit"
            ),
            &[&project, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &q.overcommit],
        )
        .await?;
        Ok(tx.commit().await?)
    }

    pub(crate) async fn iam_quotas(&self) -> Result<Vec<(String, Quota)>> {
        let rows = self.query(&format!("SELECT project, {QUOTA_COLUMNS} FROM project_quotas ORDER BY project"), &[]).await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, quota_row(r, 1)?))).collect()
    }
}
