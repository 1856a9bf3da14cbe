package store

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/inbound"
	"github.com/converger/edge/shared/ids"
)

// InboundChannel returns a channel with its secret unsealed, for verifying an inbound
// request's signature. The secret is the HMAC key; it must never be logged.
func (s *Store) InboundChannel(ctx context.Context, id string) (Channel, []byte, error) {
	if s.sealer == nil {
		return Channel{}, nil, ErrNoEncryptionKey
	}
	var c Channel
	var sealed []byte
	err := s.pool.QueryRow(ctx, `SELECT `+channelColumns+`, c.secret_ciphertext
		FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.id = $1`, id).Scan(
		&c.ID, &c.TenantID, &c.Name, &c.Type, &c.Mode, &c.Status, &c.RequireSignature, &c.TenantActive, &sealed)
	if err != nil {
		return Channel{}, nil, notFound(err)
	}
	secret, err := s.sealer.Open(sealed)
	if err != nil {
		return Channel{}, nil, err
	}
	return c, secret, nil
}

// InboundMessage is an inbound message for CreateInboundActivity: the client's fields,
// and the channel adapter's sender, provider message id and conversation.
type InboundMessage struct {
	Client activity.Client
	Sender string
	// ProviderMessageID makes the delivery idempotent per channel; "" for none.
	ProviderMessageID string
	// ConversationID is a conversation of the channel's tenant; "" opens a new
	// conversation of the channel.
	ConversationID string
	// Signed is the request's signature, recorded so that it cannot be used twice;
	// nil for an unsigned request.
	Signed *Signed
}

// Signed is a signed inbound request for replay protection (inbound.ReplayKey).
type Signed struct {
	Digest    []byte
	ExpiresAt time.Time
}

// ErrReplayed: the signed request was received already (inbound.ErrReplayed).
var ErrReplayed = inbound.ErrReplayed

// useSignature records a signed request in tx, first in its transaction: false when it
// was recorded already (a replay; a concurrent one waits for the first transaction and
// then sees its row). A transaction that fails leaves no record, so the request can be
// sent again.
func useSignature(ctx context.Context, tx pgx.Tx, channelID string, sig *Signed) (bool, error) {
	if sig == nil {
		return true, nil
	}
	tag, err := tx.Exec(ctx, `INSERT INTO inbound_signatures (channel_id, digest, expires_at)
		VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, channelID, sig.Digest, sig.ExpiresAt)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// RunInboundSignaturePurge deletes stale recorded signatures every period until ctx
// ends, logging failures to log.
func (s *Store) RunInboundSignaturePurge(ctx context.Context, period time.Duration, log *slog.Logger) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if _, err := s.PurgeInboundSignatures(ctx, now); err != nil && ctx.Err() == nil {
				log.Warn("store: deleting stale inbound signatures failed", "error", err)
			}
		}
	}
}

// PurgeInboundSignatures deletes the recorded signatures that went stale before now.
func (s *Store) PurgeInboundSignatures(ctx context.Context, now time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM inbound_signatures WHERE expires_at < $1`, now)
	return tag.RowsAffected(), err
}

// CreateInboundActivity creates the activity of an inbound message on channel ch, in one
// transaction through the trusted create. The client's fields are validated first
// (activity.FieldErrors).
//
// With a provider message id, the id is taken first in inbound_messages: a repeat (also
// a concurrent one, which waits for the first transaction to commit) returns the
// original activity and created false, whatever its body says and without opening a
// conversation. The provider id is also the activity's idempotency key.
//
// An explicit conversation of another tenant is ErrNotFound, a closed one
// ErrConversationClosed; without one, a new conversation of the channel is opened.
//
// A signed request (m.Signed) is recorded first: a replay of it returns the original
// activity with created false when it carries a provider message id, else ErrReplayed.
func (s *Store) CreateInboundActivity(ctx context.Context, ch Channel, m InboundMessage) (a activity.Activity, created bool, err error) {
	if errs := m.Client.Validate(s.limits); errs != nil {
		return a, false, errs
	}
	if m.ConversationID != "" && !ids.IsUUID(m.ConversationID) {
		return a, false, ErrNotFound
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		fresh, err := useSignature(ctx, tx, ch.ID, m.Signed)
		if err != nil {
			return err
		}
		if !fresh {
			if m.ProviderMessageID == "" {
				return ErrReplayed
			}
			a, err = inboundOriginal(ctx, tx, ch.ID, m.ProviderMessageID)
			return err
		}
		if m.ProviderMessageID != "" {
			tag, err := tx.Exec(ctx, `INSERT INTO inbound_messages (channel_id, provider_message_id)
				VALUES ($1, $2) ON CONFLICT DO NOTHING`, ch.ID, m.ProviderMessageID)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				// Another transaction took the id and has committed (ON CONFLICT waits
				// for it): this statement sees its row.
				a, err = inboundOriginal(ctx, tx, ch.ID, m.ProviderMessageID)
				return err
			}
		}
		convID := m.ConversationID
		if convID == "" {
			if err := tx.QueryRow(ctx, `INSERT INTO conversations (tenant_id, channel_id)
				VALUES ($1, $2) RETURNING id::text`, ch.TenantID, ch.ID).Scan(&convID); err != nil {
				return err
			}
		}
		sys := activity.System{TenantID: ch.TenantID, ConversationID: convID, Sender: m.Sender, IdempotencyKey: m.ProviderMessageID}
		a, created, err = createActivity(ctx, tx, m.Client, sys)
		if err != nil || m.ProviderMessageID == "" {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE inbound_messages SET activity_id = $3
			WHERE channel_id = $1 AND provider_message_id = $2`, ch.ID, m.ProviderMessageID, a.ID)
		return err
	})
	if err != nil {
		return activity.Activity{}, false, err
	}
	return a, created, nil
}

// inboundOriginal returns the activity recorded for a channel's provider message id.
func inboundOriginal(ctx context.Context, q queryRower, channelID, providerMessageID string) (activity.Activity, error) {
	a, err := scanActivity(q.QueryRow(ctx, `SELECT `+activityColumns+` FROM activities
		WHERE id = (SELECT activity_id FROM inbound_messages WHERE channel_id = $1 AND provider_message_id = $2)`,
		channelID, providerMessageID))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, errors.New("store: an inbound message id is recorded without its activity")
	}
	return a, err
}

// DeliveryStatus is the recorded delivery status of a message of a channel.
type DeliveryStatus struct {
	Status    inbound.Status
	UpdatedAt time.Time
	// Applied is whether the update that returned it changed it.
	Applied bool
}

// UpdateDeliveryStatus records a delivery status of a channel's message. The status
// only moves forward (inbound.Status.Advances): an update that does not is ignored and
// the current status returned with Applied false. A replay of a signed request (sig,
// recorded first; nil for none) is not applied either: it answers the current status.
func (s *Store) UpdateDeliveryStatus(ctx context.Context, channelID string, u inbound.StatusUpdate, sig *Signed) (d DeliveryStatus, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		fresh, err := useSignature(ctx, tx, channelID, sig)
		if err != nil {
			return err
		}
		if !fresh {
			return tx.QueryRow(ctx, `SELECT status, updated_at FROM delivery_statuses
				WHERE channel_id = $1 AND id_field = $2 AND message_id = $3`,
				channelID, u.IDField, u.ID).Scan(&d.Status, &d.UpdatedAt)
		}
		err = tx.QueryRow(ctx, `INSERT INTO delivery_statuses (channel_id, id_field, message_id, status)
			VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING status, updated_at`,
			channelID, u.IDField, u.ID, string(u.Status)).Scan(&d.Status, &d.UpdatedAt)
		if err == nil {
			d.Applied = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		// Recorded before: decide under the row's lock, so that concurrent updates of
		// one message apply in some order and never move it backwards.
		if err := tx.QueryRow(ctx, `SELECT status, updated_at FROM delivery_statuses
			WHERE channel_id = $1 AND id_field = $2 AND message_id = $3 FOR UPDATE`,
			channelID, u.IDField, u.ID).Scan(&d.Status, &d.UpdatedAt); err != nil {
			return err
		}
		if !u.Status.Advances(d.Status) {
			return nil
		}
		d.Applied = true
		return tx.QueryRow(ctx, `UPDATE delivery_statuses SET status = $4, updated_at = now()
			WHERE channel_id = $1 AND id_field = $2 AND message_id = $3 RETURNING status, updated_at`,
			channelID, u.IDField, u.ID, string(u.Status)).Scan(&d.Status, &d.UpdatedAt)
	})
	return d, err
}
