-- Inbound signatures already used, so that a captured request cannot be sent again
-- within the signature's tolerance (a signature is valid 300 s either side of its t).

-- +goose Up
CREATE TABLE inbound_signatures (
    channel_id uuid NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    -- SHA-256 of "<t>.<raw body>": what every v1 of the header signs, so that no subset
    -- of the header's signatures can be sent again either.
    digest bytea NOT NULL CHECK (length(digest) = 32),
    -- t + the tolerance: after it the signature is stale anyway, and the row is deleted.
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (channel_id, digest)
);

CREATE INDEX inbound_signatures_expires_at_idx ON inbound_signatures (expires_at);

-- +goose Down
DROP TABLE inbound_signatures;
