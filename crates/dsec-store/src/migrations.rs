//! Versioned schema migrations, one ordered list for both engines.
//!
//! Each step's SQL (`migrations/NNNN_name.sql`) keeps to what SQLite and
//! PostgreSQL both read the same way: `BIGINT`, `BOOLEAN`, `BYTEA` and
//! `TEXT` columns (SQLite's type affinity stores them as integers, integers
//! and blobs as given), `CREATE TABLE`, `CREATE INDEX`, `ALTER TABLE ... ADD COLUMN`, `UPDATE`,
//! `INSERT ... SELECT`.
//! Each engine applies every step above the database's version once, in a
//! transaction of its own, and records it in `schema_version`; a database
//! whose version is above the newest here is refused
//! (`StoreError::NewerSchema`).

/// One step of the schema.
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "tenants", sql: include_str!("../migrations/0001_tenants.sql") },
    Migration { version: 2, name: "principals_tokens_nodes", sql: include_str!("../migrations/0002_principals_tokens_nodes.sql") },
    Migration { version: 3, name: "projects", sql: include_str!("../migrations/0003_projects.sql") },
    Migration { version: 4, name: "cluster", sql: include_str!("../migrations/0004_cluster.sql") },
];

/// The schema version this build writes.
pub fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The DDL of the version table.
pub(crate) const VERSION_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_count_up_from_one_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1);
        }
        assert_eq!(latest(), MIGRATIONS.len() as i64);
    }
}
