-- Tenants and their channels. The core owns this schema; the sidecars only read it.

-- +goose Up
CREATE TABLE tenants (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name text NOT NULL,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    -- SHA-256 of the API key; the key itself is shown once and never stored.
    api_key_hash bytea NOT NULL UNIQUE CHECK (octet_length(api_key_hash) = 32),
    api_key_prefix text NOT NULL,
    -- The key before the last rotation stays valid until previous_api_key_expires_at.
    previous_api_key_hash bytea UNIQUE CHECK (octet_length(previous_api_key_hash) = 32),
    previous_api_key_expires_at timestamptz,
    -- Rate-limit overrides by bucket name. Every change of limits must run
    -- NOTIFY rate_limit_overrides, '<tenant id>' in the same transaction: the sidecars
    -- LISTEN on that channel and drop the tenant's cached overrides.
    limits jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(limits) = 'object'),
    inserted_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((previous_api_key_hash IS NULL) = (previous_api_key_expires_at IS NULL))
);

CREATE UNIQUE INDEX tenants_lower_name_key ON tenants (lower(name));

CREATE TABLE channels (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name text NOT NULL,
    type text NOT NULL CHECK (type IN ('webhook', 'echo')),
    mode text NOT NULL DEFAULT 'duplex' CHECK (mode IN ('inbound', 'outbound', 'duplex')),
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    -- SHA-256 of the secret, for lookup.
    secret_hash bytea NOT NULL UNIQUE CHECK (octet_length(secret_hash) = 32),
    -- The secret sealed with AES-256-GCM (ENCRYPTION_KEY), nonce first: inbound
    -- signatures need the plaintext.
    secret_ciphertext bytea NOT NULL,
    publishable_key_hash bytea UNIQUE CHECK (octet_length(publishable_key_hash) = 32),
    require_signature boolean NOT NULL DEFAULT true,
    inserted_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Also the index for looking channels up by tenant_id.
    UNIQUE (tenant_id, name)
);

-- +goose Down
DROP TABLE channels;
DROP TABLE tenants;
