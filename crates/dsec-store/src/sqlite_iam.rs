//! The SQLite engine's projects, roles and quotas (`Store`'s IAM block).
//! Every write keeps the in-memory index of live tokens exact, as the rest
//! of the engine does.

use rusqlite::{params, OptionalExtension, Transaction};

use crate::columns::{self, QUOTA_COLUMNS};
use crate::projects::check_delegation;
use crate::sqlite::{get_principal, load_live, SqliteStore};
use crate::{Grant, NewToken, Quota, Result, Role, StoreError, TokenHash, TokenInfo};

/// Revokes `roots` and every token issued below them; returns the hashes
/// it revoked now.
pub(crate) fn revoke_cascade(tx: &Transaction<'_>, roots: &[TokenHash], now_ms: u64) -> Result<Vec<TokenHash>> {
    let mut revoked = Vec::new();
    let mut frontier: Vec<TokenHash> = roots.to_vec();
    let mut seen = std::collections::HashSet::new();
    while let Some(h) = frontier.pop() {
        if !seen.insert(h) {
            continue;
        }
        let n = tx.execute(
            "UPDATE tokens SET revoked_at_ms = ?1 WHERE token_sha256 = ?2 AND revoked_at_ms IS NULL",
            params![now_ms as i64, h.to_vec()],
        )?;
        if n > 0 {
            revoked.push(h);
        }
        // Children of an already-revoked token are revoked too (they were,
        // when it was), but a walk costs nothing when they are.
        let mut stmt = tx.prepare_cached("SELECT token_sha256 FROM tokens WHERE issuer = ?1")?;
        let children = stmt.query_map([h.to_vec()], |r| r.get::<_, Vec<u8>>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
        for c in children {
            frontier.push(columns::hash(&c)?);
        }
    }
    Ok(revoked)
}

fn quota_of(tx: &Transaction<'_>, project: &str) -> Result<Option<Quota>> {
    let row = tx.query_row(&format!("SELECT {QUOTA_COLUMNS} FROM project_quotas WHERE project = ?1"), [project], quota_row).optional()?;
    Ok(row)
}

fn quota_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Quota> {
    let values = [r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?];
    Ok(columns::quota(values, r.get::<_, i64>(6)? != 0))
}

impl SqliteStore {
    pub(crate) async fn iam_issue_token(&self, principal: &str, token: NewToken, role: Role, issuer: Option<TokenHash>) -> Result<()> {
        let name = principal.to_string();
        self.with_conn(move |inner, c| {
            let tx = c.transaction()?;
            let Some(p) = get_principal(&tx, &name)? else { return Err(StoreError::NoSuchPrincipal(name)) };
            if let Some(i) = issuer {
                let live: Option<i64> = tx
                    .query_row("SELECT 1 FROM tokens WHERE token_sha256 = ?1 AND revoked_at_ms IS NULL", [i.to_vec()], |r| r.get(0))
                    .optional()?;
                if live.is_none() {
                    return Err(StoreError::IssuerRevoked);
                }
            }
            let r = tx.execute(
                "INSERT INTO tokens (token_sha256, principal, created_at_ms, expires_at_ms, role, issuer) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    token.hash.to_vec(),
                    name,
                    token.created_at_ms as i64,
                    token.expires_at_ms.map(|e| e as i64),
                    role.as_str(),
                    issuer.map(|i| i.to_vec())
                ],
            );
            match r {
                Ok(_) => {}
                Err(rusqlite::Error::SqliteFailure(f, _)) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
                    return Err(StoreError::Exists("a token with this hash".into()))
                }
                Err(e) => return Err(e.into()),
            }
            tx.commit()?;
            inner.index().insert(token.hash, Grant { principal: p, expires_at_ms: token.expires_at_ms, role });
            Ok(())
        })
        .await
    }

    pub(crate) async fn iam_tokens(&self) -> Result<Vec<TokenInfo>> {
        self.with_conn(|_, c| {
            let mut stmt = c.prepare(
                "SELECT token_sha256, principal, role, created_at_ms, expires_at_ms, revoked_at_ms, issuer
                 FROM tokens ORDER BY principal, created_at_ms, token_sha256",
            )?;
            type Row = (Vec<u8>, String, String, i64, Option<i64>, Option<i64>, Option<Vec<u8>>);
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)))?
                .collect::<rusqlite::Result<Vec<Row>>>()?;
            rows.into_iter()
                .map(|(hash, principal, role, created, expires, revoked, issuer)| {
                    Ok(TokenInfo {
                        hash: columns::hash(&hash)?,
                        principal,
                        role: columns::role(&role)?,
                        created_at_ms: created.max(0) as u64,
                        expires_at_ms: expires.map(|t| t.max(0) as u64),
                        revoked_at_ms: revoked.map(|t| t.max(0) as u64),
                        issuer: issuer.map(|i| columns::hash(&i)).transpose()?,
                    })
                })
                .collect()
        })
        .await
    }

    pub(crate) async fn iam_delete_principal(&self, name: &str, now_ms: u64) -> Result<bool> {
        let name = name.to_string();
        self.with_conn(move |inner, c| {
            let tx = c.transaction()?;
            if get_principal(&tx, &name)?.is_none() {
                return Ok(false);
            }
            let child: Option<String> =
                tx.query_row("SELECT name FROM principals WHERE parent = ?1 LIMIT 1", [&name], |r| r.get(0)).optional()?;
            if child.is_some() {
                return Err(StoreError::HasChildren(name));
            }
            let held = {
                let mut stmt = tx.prepare("SELECT token_sha256 FROM tokens WHERE principal = ?1")?;
                let rows = stmt.query_map([&name], |r| r.get::<_, Vec<u8>>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
                rows.iter().map(|h| columns::hash(h)).collect::<Result<Vec<_>>>()?
            };
            revoke_cascade(&tx, &held, now_ms)?;
            tx.execute("DELETE FROM principals WHERE name = ?1", [&name])?;
            tx.commit()?;
            *inner.index() = load_live(c)?;
            Ok(true)
        })
        .await
    }

    pub(crate) async fn iam_set_quota(&self, project: &str, quota: Option<Quota>) -> Result<()> {
        let project = project.to_string();
        self.with_conn(move |_, c| {
            // Immediate: no other writer between the check and the write.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let Some(p) = get_principal(&tx, &project)? else { return Err(StoreError::NoSuchPrincipal(project)) };
            let Some(q) = quota else {
                tx.execute("DELETE FROM project_quotas WHERE project = ?1", [&project])?;
                return Ok(tx.commit()?);
            };
            let parent = match &p.parent {
                Some(parent) => quota_of(&tx, parent)?.map(|pq| (parent.clone(), pq)),
                None => None,
            };
            let siblings: Vec<Quota> = match &p.parent {
                Some(parent) => {
                    let mut stmt = tx.prepare(&format!(
                        "SELECT {QUOTA_COLUMNS} FROM project_quotas q JOIN principals p ON p.name = q.project
                         WHERE p.parent = ?1 AND p.name <> ?2"
                    ))?;
                    let rows = stmt.query_map(params![parent, project], quota_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
                    rows
                }
                None => vec![],
            };
            check_delegation(&project, &q, parent.as_ref().map(|(n, pq)| (n.as_str(), pq)), &siblings)?;
            let v = columns::quota_values(&q);
            tx.execute(
                &format!(
                    "INSERT INTO project_quotas (project, {QUOTA_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (project) DO UPDATE SET sandboxes = excluded.sandboxes, cpu_millis = excluded.cpu_millis,
                       memory_mb = excluded.memory_mb, disk_mb = excluded.disk_mb, creations_per_s = excluded.creations_per_s,
                       fncall_per_s = excluded.fncall_per_s, overcommit = excluded.overcommit"
                ),
                params![project, v[0], v[1], v[2], v[3], v[4], v[5], q.overcommit as i64],
            )?;
            Ok(tx.commit()?)
        })
        .await
    }

    pub(crate) async fn iam_quotas(&self) -> Result<Vec<(String, Quota)>> {
        self.with_conn(|_, c| {
            let mut stmt = c.prepare(&format!("SELECT project, {QUOTA_COLUMNS} FROM project_quotas ORDER BY project"))?;
            let rows = stmt
                .query_map([], |r| {
                    let values = [r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?];
                    Ok((r.get::<_, String>(0)?, columns::quota(values, r.get::<_, i64>(7)? != 0)))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }
}
