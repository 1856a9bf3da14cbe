package store

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/activity"
)

// NotifyActivities is the PostgreSQL channel on which every new activity is announced
// with "<conversation id>:<seq>", so that streams on any core instance push it.
const NotifyActivities = "activities"

const activityColumns = `id::text, tenant_id::text, conversation_id::text, seq, type, sender,
	coalesce(text, ''), attachments, metadata, coalesce(idempotency_key, ''), inserted_at`

func scanActivity(row pgx.Row) (activity.Activity, error) {
	var a activity.Activity
	var att, meta []byte
	err := row.Scan(&a.ID, &a.TenantID, &a.ConversationID, &a.Seq, &a.Type, &a.Sender,
		&a.Text, &att, &meta, &a.IdempotencyKey, &a.InsertedAt)
	a.Attachments, a.Metadata = json.RawMessage(att), json.RawMessage(meta)
	return a, err
}

// CreateActivity is the one way activities are created. The client's fields are
// validated first (activity.FieldErrors); the server's come only from sys. The seq is
// taken from the conversation's row under its lock, in the insert transaction, so it is
// gap-free, and a closed conversation refuses the write (ErrConversationClosed). With
// an idempotency key, a repeat (also a concurrent one) returns the original activity
// and created false.
func (s *Store) CreateActivity(ctx context.Context, c activity.Client, sys activity.System) (a activity.Activity, created bool, err error) {
	if errs := c.Validate(s.limits); errs != nil {
		return a, false, errs
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		a, created, err = createActivity(ctx, tx, c, sys)
		return err
	})
	return a, created, err
}

// createActivity inserts within tx; c must be validated.
func createActivity(ctx context.Context, tx pgx.Tx, c activity.Client, sys activity.System) (activity.Activity, bool, error) {
	var seq int64
	var status string
	// The row lock serialises writers of one conversation: seq and the idempotency
	// check below are decided under it.
	err := tx.QueryRow(ctx, `SELECT status FROM conversations WHERE id = $1 AND tenant_id = $2 FOR UPDATE`,
		sys.ConversationID, sys.TenantID).Scan(&status)
	if err != nil {
		return activity.Activity{}, false, notFound(err)
	}
	if sys.IdempotencyKey != "" {
		a, err := scanActivity(tx.QueryRow(ctx, `SELECT `+activityColumns+` FROM activities
			WHERE conversation_id = $1 AND idempotency_key = $2`, sys.ConversationID, sys.IdempotencyKey))
		if err == nil {
			return a, false, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return activity.Activity{}, false, err
		}
	}
	if status != "active" {
		return activity.Activity{}, false, ErrConversationClosed
	}
	if err := tx.QueryRow(ctx, `UPDATE conversations SET last_seq = last_seq + 1, updated_at = now()
		WHERE id = $1 RETURNING last_seq`, sys.ConversationID).Scan(&seq); err != nil {
		return activity.Activity{}, false, err
	}
	var key, text any
	if sys.IdempotencyKey != "" {
		key = sys.IdempotencyKey
	}
	if c.Text != "" {
		text = c.Text
	}
	a, err := scanActivity(tx.QueryRow(ctx, `
		INSERT INTO activities (tenant_id, conversation_id, seq, type, sender, text, attachments, metadata, idempotency_key)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		RETURNING `+activityColumns,
		sys.TenantID, sys.ConversationID, seq, c.Type, sys.Sender, text, []byte(c.AttachmentsJSON()), []byte(c.Metadata), key))
	if err != nil {
		return activity.Activity{}, false, err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyActivities,
		sys.ConversationID+":"+strconv.FormatInt(seq, 10)); err != nil {
		return activity.Activity{}, false, err
	}
	return a, true, nil
}

// ListActivities returns up to limit activities of a tenant's conversation with a seq
// above after, oldest first, and whether more follow.
func (s *Store) ListActivities(ctx context.Context, tenantID, conversationID string, after int64, limit int) ([]activity.Activity, bool, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM conversations WHERE id = $1 AND tenant_id = $2)`,
		conversationID, tenantID).Scan(&exists); err != nil {
		return nil, false, err
	}
	if !exists {
		return nil, false, ErrNotFound
	}
	rows, err := s.pool.Query(ctx, `SELECT `+activityColumns+` FROM activities
		WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`, conversationID, after, limit+1)
	if err != nil {
		return nil, false, err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (activity.Activity, error) { return scanActivity(r) })
	if err != nil {
		return nil, false, err
	}
	more := len(list) > limit
	if more {
		list = list[:limit]
	}
	return list, more, nil
}

// Activity returns one activity of a conversation by seq.
func (s *Store) Activity(ctx context.Context, conversationID string, seq int64) (activity.Activity, error) {
	a, err := scanActivity(s.pool.QueryRow(ctx, `SELECT `+activityColumns+` FROM activities
		WHERE conversation_id = $1 AND seq = $2`, conversationID, seq))
	return a, notFound(err)
}
