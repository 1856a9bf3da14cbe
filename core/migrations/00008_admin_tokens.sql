-- Admin API tokens (the console's API, /admin/api/v1): made by `core admins token create`
-- for one admin, read-only or read-write, shown once and stored as SHA-256. A token works
-- while it is neither revoked nor expired and its admin is active.

-- +goose Up
CREATE TABLE admin_tokens (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    admin_user_id uuid NOT NULL REFERENCES admin_users (id) ON DELETE CASCADE,
    name text NOT NULL,
    scope text NOT NULL CHECK (scope IN ('read', 'write')),
    token_hash bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    -- The first characters of the token, to recognise it in lists.
    token_prefix text NOT NULL,
    expires_at timestamptz,
    revoked_at timestamptz,
    last_used_at timestamptz,
    inserted_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX admin_tokens_admin_idx ON admin_tokens (admin_user_id);
-- The audit log's filters.
CREATE INDEX audit_logs_actor_idx ON audit_logs (actor, id);
CREATE INDEX audit_logs_resource_idx ON audit_logs (resource, id);
CREATE INDEX audit_logs_action_idx ON audit_logs (action, id);

-- +goose Down
DROP INDEX audit_logs_action_idx;
DROP INDEX audit_logs_resource_idx;
DROP INDEX audit_logs_actor_idx;
DROP TABLE admin_tokens;
