-- Inbound provider webhooks: the provider message ids a channel has received, so that a
-- repeated delivery answers the original activity, and the delivery statuses providers
-- report per channel.

-- +goose Up
CREATE TABLE inbound_messages (
    channel_id uuid NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    provider_message_id text NOT NULL CHECK (provider_message_id <> ''),
    -- Taken first, in the transaction that creates the activity, and set in the same
    -- transaction: never NULL once committed. A concurrent delivery of the same id waits
    -- on this key and then reads the original's activity.
    activity_id uuid REFERENCES activities (id) ON DELETE CASCADE,
    inserted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel_id, provider_message_id)
);

CREATE INDEX inbound_messages_activity_id_idx ON inbound_messages (activity_id);

CREATE TABLE delivery_statuses (
    channel_id uuid NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    -- Which field named the message: provider ids and delivery ids are separate names.
    id_field text NOT NULL CHECK (id_field IN ('provider_message_id', 'delivery_id')),
    message_id text NOT NULL CHECK (message_id <> ''),
    -- Moves only forward (core/inbound: queued < sent < delivered < read; failed from
    -- queued or sent).
    status text NOT NULL CHECK (status IN ('queued', 'sent', 'delivered', 'read', 'failed')),
    inserted_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel_id, id_field, message_id)
);

-- +goose Down
DROP TABLE delivery_statuses;
DROP TABLE inbound_messages;
