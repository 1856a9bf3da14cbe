-- Conversations and their activities, attachments, the users of the admin and tenant
-- portals with their sessions and password resets, and the audit log.

-- +goose Up
CREATE TABLE conversations (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    channel_id uuid NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'closed')),
    -- The seq of the newest activity. Activities take last_seq + 1 under this row's lock,
    -- in their insert transaction, so seq is gap-free.
    last_seq bigint NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    metadata jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    inserted_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX conversations_tenant_id_idx ON conversations (tenant_id);
CREATE INDEX conversations_channel_id_idx ON conversations (channel_id);

CREATE TABLE activities (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    conversation_id uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq bigint NOT NULL CHECK (seq > 0),
    type text NOT NULL,
    sender text NOT NULL,
    text text,
    attachments jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(attachments) = 'array'),
    metadata jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    idempotency_key text,
    -- The server's clock only: never taken from a client.
    inserted_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (conversation_id, seq)
);

CREATE UNIQUE INDEX activities_idempotency_key_idx ON activities (conversation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE attachments (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    conversation_id uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    name text NOT NULL DEFAULT '',
    content_type text NOT NULL,
    size bigint NOT NULL CHECK (size >= 0),
    bytes bytea NOT NULL,
    inserted_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX attachments_conversation_id_idx ON attachments (conversation_id);

CREATE TABLE admin_users (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email text NOT NULL,
    password_hash text NOT NULL,
    role text NOT NULL DEFAULT 'admin',
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    must_change_password boolean NOT NULL DEFAULT false,
    -- Sealed with ENCRYPTION_KEY; NULL while two-factor authentication is off.
    totp_secret bytea,
    inserted_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX admin_users_lower_email_key ON admin_users (lower(email));

CREATE TABLE tenant_users (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    email text NOT NULL,
    password_hash text NOT NULL,
    role text NOT NULL DEFAULT 'member',
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    must_change_password boolean NOT NULL DEFAULT false,
    totp_secret bytea,
    inserted_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX tenant_users_tenant_lower_email_key ON tenant_users (tenant_id, lower(email));

-- Server-side sessions: the cookie holds a random id, the table its SHA-256.
CREATE TABLE sessions (
    id_hash bytea PRIMARY KEY CHECK (octet_length(id_hash) = 32),
    user_kind text NOT NULL CHECK (user_kind IN ('admin', 'tenant')),
    user_id uuid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

CREATE INDEX sessions_user_idx ON sessions (user_kind, user_id);

CREATE TABLE password_resets (
    token_hash bytea PRIMARY KEY CHECK (octet_length(token_hash) = 32),
    user_kind text NOT NULL CHECK (user_kind IN ('admin', 'tenant')),
    user_id uuid NOT NULL,
    expires_at timestamptz NOT NULL,
    used_at timestamptz
);

CREATE TABLE audit_logs (
    id bigserial PRIMARY KEY,
    actor text NOT NULL,
    action text NOT NULL,
    resource text NOT NULL,
    -- Secrets are redacted before they get here.
    changes jsonb NOT NULL DEFAULT '{}',
    inserted_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE audit_logs;
DROP TABLE password_resets;
DROP TABLE sessions;
DROP TABLE tenant_users;
DROP TABLE admin_users;
DROP TABLE attachments;
DROP TABLE activities;
DROP TABLE conversations;
