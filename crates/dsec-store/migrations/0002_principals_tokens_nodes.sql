-- Principals with any number of tokens (each with an optional expiry and a
-- revocation time), and the node registry. A principal is a tenant today;
-- `kind` and `parent` are there for projects, which nest.
CREATE TABLE principals (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    parent TEXT REFERENCES principals (name),
    admin BOOLEAN NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE TABLE tokens (
    token_sha256 BYTEA PRIMARY KEY,
    principal TEXT NOT NULL REFERENCES principals (name) ON DELETE CASCADE,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked_at_ms BIGINT
);
CREATE INDEX tokens_by_principal ON tokens (principal);
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    labels TEXT NOT NULL,
    backends TEXT NOT NULL,
    pool TEXT NOT NULL,
    state TEXT NOT NULL,
    last_seen_ms BIGINT,
    registered_at_ms BIGINT NOT NULL
);
-- Every tenant of the first schema, with its one token, which keeps working.
INSERT INTO principals (name, kind, parent, admin, created_at_ms)
    SELECT name, 'tenant', NULL, admin, created_at_ms FROM tenants;
INSERT INTO tokens (token_sha256, principal, created_at_ms, expires_at_ms, revoked_at_ms)
    SELECT token_sha256, name, created_at_ms, NULL, NULL FROM tenants;
DROP TABLE tenants;
