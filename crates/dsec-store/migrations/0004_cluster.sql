-- Cluster membership: the tokens an admin hands to edges so they may join
-- (SHA-256 only, optional expiry, revocation), and what each joined edge
-- declared beyond its `nodes` row: the secret apiservers present to it and
-- its capacity (CPU in thousandths of a core).
CREATE TABLE join_tokens (
    token_sha256 BYTEA PRIMARY KEY,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked_at_ms BIGINT
);
CREATE TABLE node_members (
    name TEXT PRIMARY KEY REFERENCES nodes (name) ON DELETE CASCADE,
    secret TEXT NOT NULL,
    cpu_millis BIGINT NOT NULL,
    memory_mb BIGINT NOT NULL,
    max_sandboxes BIGINT NOT NULL
);
