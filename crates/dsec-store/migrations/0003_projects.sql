-- Projects: every principal is a project (a tenant of before becomes a
-- top-level one, its tokens keep working); a token carries the role it
-- grants in its project and the token that issued it (revoking one revokes
-- what it issued); a project may carry quotas.
UPDATE principals SET kind = 'project';
ALTER TABLE tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'admin';
ALTER TABLE tokens ADD COLUMN issuer BYTEA;
CREATE INDEX tokens_by_issuer ON tokens (issuer);
CREATE INDEX principals_by_parent ON principals (parent);
-- One row per project that has quotas; a NULL limit is no limit.
CREATE TABLE project_quotas (
    project TEXT PRIMARY KEY REFERENCES principals (name) ON DELETE CASCADE,
    sandboxes BIGINT,
    cpu_millis BIGINT,
    memory_mb BIGINT,
    disk_mb BIGINT,
    creations_per_s BIGINT,
    fncall_per_s BIGINT,
    overcommit BOOLEAN NOT NULL
);
