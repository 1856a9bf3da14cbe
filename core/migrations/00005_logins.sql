-- The login pages' state beyond 00002: the stage of a session (a half-signed-in session
-- waits for its TOTP code), a TOTP enrolment in progress, the last accepted TOTP step of
-- each user (a code is never accepted twice), and the hashed single-use recovery codes.

-- +goose Up
-- 'totp': the password was right and the TOTP code is due; such a session grants
-- nothing else. 'signed_in': a full session.
ALTER TABLE sessions ADD COLUMN stage text NOT NULL DEFAULT 'signed_in'
    CHECK (stage IN ('totp', 'signed_in'));
-- The otpauth URI of a TOTP enrolment not yet confirmed, sealed with ENCRYPTION_KEY.
ALTER TABLE sessions ADD COLUMN totp_pending bytea;

-- The time step (Unix time / 30 s) of the last TOTP code accepted from the user; a code
-- whose step is not later is refused as reused.
ALTER TABLE admin_users ADD COLUMN totp_last_step bigint;
ALTER TABLE tenant_users ADD COLUMN totp_last_step bigint;

CREATE TABLE recovery_codes (
    user_kind text NOT NULL CHECK (user_kind IN ('admin', 'tenant')),
    user_id uuid NOT NULL,
    -- SHA-256 of the user and the code: the code itself is shown once, at enrolment.
    code_hash bytea NOT NULL CHECK (octet_length(code_hash) = 32),
    used_at timestamptz,
    inserted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_kind, user_id, code_hash)
);

CREATE INDEX password_resets_user_idx ON password_resets (user_kind, user_id);

-- +goose Down
DROP INDEX password_resets_user_idx;
DROP TABLE recovery_codes;
ALTER TABLE tenant_users DROP COLUMN totp_last_step;
ALTER TABLE admin_users DROP COLUMN totp_last_step;
ALTER TABLE sessions DROP COLUMN totp_pending;
ALTER TABLE sessions DROP COLUMN stage;
