-- The apiserver's first schema, from before versioned migrations: one token
-- per tenant. A SQLite database made then already has this table (and no
-- schema_version), so this step adopts it unchanged; PostgreSQL runs it too,
-- so both engines count versions alike.
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    token_sha256 BYTEA NOT NULL UNIQUE,
    admin BOOLEAN NOT NULL,
    created_at_ms BIGINT NOT NULL
);
