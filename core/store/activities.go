package store

import (
	"context"
	"encoding/json"
	"errors"

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
// taken from the conversation's row under its lock, in the statement that inserts the
// activity, so it is gap-free, and a closed conversation refuses the write
// (ErrConversationClosed). With an idempotency key, a repeat (also a concurrent one)
// returns the original activity and created false.
func (s *Store) CreateActivity(ctx context.Context, c activity.Client, sys activity.System) (a activity.Activity, created bool, err error) {
	if errs := c.Validate(s.limits); errs != nil {
		return a, false, errs
	}
	return createActivity(ctx, s.pool, c, sys)
}

// queryRower is a pool or a transaction.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insertActivity takes the next seq of an active conversation and inserts the activity
// in one statement: one round trip, with the conversation's row lock held only while
// it runs. It returns no row when the conversation is missing, another tenant's or
// closed. The migrations' trigger announces the activity (NotifyActivities).
const insertActivity = `
	WITH conv AS (
		UPDATE conversations SET last_seq = last_seq + 1, updated_at = now()
		WHERE id = $2 AND tenant_id = $1 AND status = 'active'
		RETURNING last_seq, channel_id
	), ins AS (
		INSERT INTO activities (tenant_id, conversation_id, seq, type, sender, text, attachments, metadata, idempotency_key)
		SELECT $1, $2, conv.last_seq, $3, $4, $5, $6::jsonb, $7::jsonb, $8 FROM conv
		RETURNING ` + activityColumns + `
	)
	SELECT ins.*, conv.channel_id::text FROM ins, conv`

// createActivity inserts through q (the pool, or a transaction); c must be validated.
func createActivity(ctx context.Context, q queryRower, c activity.Client, sys activity.System) (activity.Activity, bool, error) {
	// A conversation reopened between the insert and the look at why it failed is
	// tried again; three rounds are plenty for that race.
	for range 3 {
		a, err := insertActivityRow(ctx, q, c, sys)
		switch {
		case err == nil:
			return a, true, nil
		case isUniqueViolation(err) && sys.IdempotencyKey != "":
			// The statement failed as a whole, seq included: the original stands.
			orig, err := activityByKey(ctx, q, sys)
			return orig, false, err
		case !errors.Is(err, pgx.ErrNoRows):
			return activity.Activity{}, false, err
		}
		var status string
		if err := q.QueryRow(ctx, `SELECT status FROM conversations WHERE id = $1 AND tenant_id = $2`,
			sys.ConversationID, sys.TenantID).Scan(&status); err != nil {
			return activity.Activity{}, false, notFound(err)
		}
		if sys.IdempotencyKey != "" {
			orig, err := activityByKey(ctx, q, sys)
			if err == nil {
				return orig, false, nil
			}
			if !errors.Is(err, ErrNotFound) {
				return activity.Activity{}, false, err
			}
		}
		if status != "active" {
			return activity.Activity{}, false, ErrConversationClosed
		}
	}
	return activity.Activity{}, false, ErrConversationClosed
}

// insertActivityRow runs insertActivity. In a transaction, an insert with an
// idempotency key runs under a savepoint, so that a repeat's unique violation does not
// abort the caller's transaction.
func insertActivityRow(ctx context.Context, q queryRower, c activity.Client, sys activity.System) (activity.Activity, error) {
	tx, inTx := q.(pgx.Tx)
	if !inTx || sys.IdempotencyKey == "" {
		return scanInsertedActivity(ctx, q, c, sys)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return activity.Activity{}, err
	}
	a, err := scanInsertedActivity(ctx, sp, c, sys)
	if err != nil {
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			return activity.Activity{}, rbErr
		}
		return activity.Activity{}, err
	}
	return a, sp.Commit(ctx)
}

func scanInsertedActivity(ctx context.Context, q queryRower, c activity.Client, sys activity.System) (activity.Activity, error) {
	var key, text any
	if sys.IdempotencyKey != "" {
		key = sys.IdempotencyKey
	}
	if c.Text != "" {
		text = c.Text
	}
	var a activity.Activity
	var att, meta []byte
	err := q.QueryRow(ctx, insertActivity, sys.TenantID, sys.ConversationID, c.Type, sys.Sender, text,
		[]byte(c.AttachmentsJSON()), []byte(c.Metadata), key).Scan(
		&a.ID, &a.TenantID, &a.ConversationID, &a.Seq, &a.Type, &a.Sender,
		&a.Text, &att, &meta, &a.IdempotencyKey, &a.InsertedAt, &a.ChannelID)
	a.Attachments, a.Metadata = json.RawMessage(att), json.RawMessage(meta)
	return a, err
}

// activityByKey returns the activity of sys's conversation with sys's idempotency key.
func activityByKey(ctx context.Context, q queryRower, sys activity.System) (activity.Activity, error) {
	a, err := scanActivity(q.QueryRow(ctx, `SELECT `+activityColumns+` FROM activities
		WHERE conversation_id = $1 AND idempotency_key = $2`, sys.ConversationID, sys.IdempotencyKey))
	return a, notFound(err)
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
