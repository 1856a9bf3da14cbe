package store

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// AuditEntry is one row of audit_logs: who (Actor, e.g. "cli:alice" or "admin:<user id>")
// did what (Action, e.g. "limits.set") to which resource ("tenant:<id>"), and the
// changes, a JSON object with secrets redacted.
type AuditEntry struct {
	ID                      int64
	Actor, Action, Resource string
	Changes                 json.RawMessage
	InsertedAt              time.Time
}

// Redacted replaces the value of every secret field in audit changes.
const Redacted = "[redacted]"

// isSecretField reports whether an audit field name holds a credential: a password,
// a secret, a token, or a key (but not a key's display prefix or expiry).
func isSecretField(name string) bool {
	n := strings.ToLower(name)
	switch {
	case strings.HasSuffix(n, "_prefix"), strings.HasSuffix(n, "_at"):
		return false
	case strings.Contains(n, "password"), strings.Contains(n, "secret"), strings.Contains(n, "token"):
		return true
	case n == "key" || strings.HasSuffix(n, "_key") || n == "hash" || strings.HasSuffix(n, "_hash"):
		return true
	}
	return false
}

// RedactChanges returns changes as a JSON object with the value of every secret field
// (see isSecretField) that is a string or a number, at any depth, replaced by Redacted.
// A value that is not an object is wrapped as {"value": ...}. Callers never pass secrets;
// this is the second line of defence.
func RedactChanges(changes any) (json.RawMessage, error) {
	if changes == nil {
		return json.RawMessage("{}"), nil
	}
	b, err := json.Marshal(changes)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	if _, ok := v.(map[string]any); !ok {
		v = map[string]any{"value": v}
	}
	return json.Marshal(redact(v))
}

// isScalar: a string or a number, what a credential is written as. Objects and arrays
// under a secret-looking name are searched instead (the limits of the bucket
// "publishable_token" are not a token), and booleans and null say nothing secret
// (must_change_password: true).
func isScalar(v any) bool {
	switch v.(type) {
	case string, float64:
		return true
	}
	return false
}

func redact(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, val := range t {
			if isSecretField(k) && isScalar(val) {
				t[k] = Redacted
			} else {
				t[k] = redact(val)
			}
		}
	case []any:
		for i := range t {
			t[i] = redact(t[i])
		}
	}
	return v
}

// audit writes an entry within tx, so that it commits or rolls back with the change
// it records.
func audit(ctx context.Context, tx pgx.Tx, actor, action, resource string, changes any) error {
	doc, err := RedactChanges(changes)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO audit_logs (actor, action, resource, changes) VALUES ($1, $2, $3, $4)`,
		actor, action, resource, []byte(doc))
	return err
}

// Via returns the audited operations of o, recorded with how the actor acted ("session",
// "token:<token id>") under "via" in each entry's changes: the admin API tells which of
// an admin's tokens made a change.
func (o *Operator) Via(via string) *Operator { return &Operator{s: o.s, actor: o.actor, via: via} }

// audit writes an entry of o's actor within tx.
func (o *Operator) audit(ctx context.Context, tx pgx.Tx, action, resource string, changes any) error {
	if o.via != "" {
		switch c := changes.(type) {
		case nil:
			changes = map[string]any{"via": o.via}
		case map[string]any:
			m := make(map[string]any, len(c)+1)
			for k, v := range c {
				m[k] = v
			}
			m["via"] = o.via
			changes = m
		default:
			changes = map[string]any{"value": c, "via": o.via}
		}
	}
	return audit(ctx, tx, o.actor, action, resource, changes)
}

// Audit records a change made outside the store's audited operations (a login, a
// setting changed through another path), with secrets redacted.
func (s *Store) Audit(ctx context.Context, actor, action, resource string, changes any) error {
	return s.inTx(ctx, func(tx pgx.Tx) error { return audit(ctx, tx, actor, action, resource, changes) })
}

// AuditLogs returns up to limit entries about resource ("" for all), newest first.
func (s *Store) AuditLogs(ctx context.Context, resource string, limit int) ([]AuditEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, actor, action, resource, changes, inserted_at FROM audit_logs
		WHERE $1 = '' OR resource = $1 ORDER BY id DESC LIMIT $2`, resource, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		var changes []byte
		err := r.Scan(&e.ID, &e.Actor, &e.Action, &e.Resource, &changes, &e.InsertedAt)
		e.Changes = changes
		return e, err
	})
}
