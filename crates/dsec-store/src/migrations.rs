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
    Migration { version: 6, name: "creation_keys", sql: include_str!("../migrations/0006_creation_keys.sql") },
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
    fn versions_count_up_from_one() {
        // Strictly increasing (a number may be left for a step that lands
        // later; engines apply every step above the database's version).
        assert_eq!(MIGRATIONS.first().map(|m| m.version), Some(1));
        for pair in MIGRATIONS.windows(2) {
            assert!(pair[0].version < pair[1].version, "{} then {}", pair[0].name, pair[1].name);
        }
        assert_eq!(latest(), MIGRATIONS.last().map_or(0, |m| m.version));
    }
}
