package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/activity"
)

// Conversation is a stored conversation.
type Conversation struct {
	ID         string
	TenantID   string
	ChannelID  string
	Status     string // active or closed
	LastSeq    int64
	Metadata   json.RawMessage
	InsertedAt time.Time
	UpdatedAt  time.Time
}

const conversationColumns = `id::text, tenant_id::text, channel_id::text, status, last_seq, metadata, inserted_at, updated_at`

func scanConversation(row pgx.Row) (Conversation, error) {
	var c Conversation
	var meta []byte
	err := row.Scan(&c.ID, &c.TenantID, &c.ChannelID, &c.Status, &c.LastSeq, &meta, &c.InsertedAt, &c.UpdatedAt)
	c.Metadata = meta
	return c, notFound(err)
}

// CreateConversation opens a conversation on a tenant's channel. metadata must be a
// JSON object (nil for none); a channel of another tenant is ErrNotFound.
func (s *Store) CreateConversation(ctx context.Context, tenantID, channelID string, metadata json.RawMessage) (Conversation, error) {
	if len(metadata) == 0 {
		metadata = json.RawMessage("{}")
	}
	return scanConversation(s.pool.QueryRow(ctx, `
		INSERT INTO conversations (tenant_id, channel_id, metadata)
		SELECT tenant_id, id, $3 FROM channels WHERE id = $2 AND tenant_id = $1
		RETURNING `+conversationColumns, tenantID, channelID, []byte(metadata)))
}

// Conversation returns a tenant's conversation.
func (s *Store) Conversation(ctx context.Context, tenantID, id string) (Conversation, error) {
	return scanConversation(s.pool.QueryRow(ctx, `SELECT `+conversationColumns+`
		FROM conversations WHERE id = $1 AND tenant_id = $2`, id, tenantID))
}

// StatusEvent is the metadata of the conversationUpdate activity that a close or a
// reopen appends: {"event":"conversation_closed","status":"closed","reason":"manual"},
// or "conversation_reopened" and "active". Every close and reopen there is today is
// asked for by a caller, so the reason is "manual".
func StatusEvent(status string) json.RawMessage {
	event := "conversation_closed"
	if status == "active" {
		event = "conversation_reopened"
	}
	b, _ := json.Marshal(map[string]string{"event": event, "status": status, "reason": "manual"})
	return b
}

// SetConversationStatus closes or reopens a conversation. It is idempotent: a real
// transition appends a conversationUpdate activity from "system" (before closing,
// after reopening), whose metadata is StatusEvent, and changed is true.
func (s *Store) SetConversationStatus(ctx context.Context, tenantID, id, status string) (c Conversation, changed bool, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		c, err = scanConversation(tx.QueryRow(ctx, `SELECT `+conversationColumns+`
			FROM conversations WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenantID))
		if err != nil || c.Status == status {
			return err
		}
		changed = true
		event := activity.Client{Type: "conversationUpdate", Metadata: StatusEvent(status)}
		if err := event.Validate(activity.DefaultLimits); err != nil {
			return err
		}
		sys := activity.System{TenantID: tenantID, ConversationID: id, Sender: "system"}
		if status == "closed" {
			if _, _, err := createActivity(ctx, tx, event, sys); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE conversations SET status = $2, updated_at = now() WHERE id = $1`, id, status); err != nil {
			return err
		}
		if status == "active" {
			if _, _, err := createActivity(ctx, tx, event, sys); err != nil {
				return err
			}
		}
		c, err = scanConversation(tx.QueryRow(ctx, `SELECT `+conversationColumns+` FROM conversations WHERE id = $1`, id))
		return err
	})
	return c, changed, err
}
