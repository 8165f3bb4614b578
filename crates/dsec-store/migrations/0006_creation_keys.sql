-- Which node holds each keyed creation (a tenant's Idempotency-Key on
-- POST /v1/sandboxes), recorded by the apiserver replica that placed it
-- before it asks the node: a retry through any replica goes to that same
-- node, whose journal makes it one sandbox.
CREATE TABLE creation_keys (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    node TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX creation_keys_by_age ON creation_keys (created_at_ms);
