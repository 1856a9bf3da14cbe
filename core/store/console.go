package store

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/shared/ids"
)

// What the operators' console (core/console) reads and its API tokens.

// The scopes of admin API tokens.
const (
	ScopeRead  = "read"  // GET only
	ScopeWrite = "write" // everything the admin may do
)

// MaxAdminTokenTTL bounds how long an admin token may be made to last.
const MaxAdminTokenTTL = 366 * 24 * time.Hour

// AdminToken is an admin API token, without its secret.
type AdminToken struct {
	ID, AdminID, AdminEmail, Name, Scope string
	// Prefix is the token's first characters, to recognise it.
	Prefix                           string
	ExpiresAt, RevokedAt, LastUsedAt *time.Time
	InsertedAt                       time.Time
}

// tokenPrefixLength is how much of a token is kept for display: "cvg_admin_" and 6
// characters.
const tokenPrefixLength = len(credentials.AdminTokenPrefix) + 6

func adminTokenResource(id string) string { return "admin_token:" + id }

// CreateAdminToken makes an admin API token for an admin: scope ScopeRead or ScopeWrite,
// lasting ttl (0: until revoked). The token is returned only here and stored as SHA-256.
// Audited as admins.token_create.
func (o *Operator) CreateAdminToken(ctx context.Context, adminID, name, scope string, ttl time.Duration) (AdminToken, string, error) {
	if err := CheckName("token name", name); err != nil {
		return AdminToken{}, "", err
	}
	if scope != ScopeRead && scope != ScopeWrite {
		return AdminToken{}, "", invalidf("scope %q: must be %s or %s", scope, ScopeRead, ScopeWrite)
	}
	if ttl < 0 || ttl > MaxAdminTokenTTL {
		return AdminToken{}, "", invalidf("the lifetime must be from 0 (until revoked) to %s", MaxAdminTokenTTL)
	}
	if !ids.IsUUID(adminID) {
		return AdminToken{}, "", ErrNotFound
	}
	secret := credentials.NewAdminToken()
	var t AdminToken
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT email FROM admin_users WHERE id = $1 FOR SHARE`, adminID).Scan(&t.AdminEmail); err != nil {
			return notFound(err)
		}
		var expires *time.Time
		if ttl > 0 {
			e := time.Now().Add(ttl)
			expires = &e
		}
		err := tx.QueryRow(ctx, `INSERT INTO admin_tokens (admin_user_id, name, scope, token_hash, token_prefix, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING id::text, admin_user_id::text, name, scope, token_prefix, expires_at, inserted_at`,
			adminID, name, scope, credentials.Hash(secret), secret[:tokenPrefixLength], expires).Scan(
			&t.ID, &t.AdminID, &t.Name, &t.Scope, &t.Prefix, &t.ExpiresAt, &t.InsertedAt)
		if err != nil {
			return err
		}
		return o.audit(ctx, tx, "admins.token_create", adminTokenResource(t.ID), map[string]any{
			"after": map[string]any{"admin_user_id": t.AdminID, "name": t.Name, "scope": t.Scope,
				"token_prefix": t.Prefix, "expires_at": t.ExpiresAt},
		})
	})
	if err != nil {
		return AdminToken{}, "", err
	}
	return t, secret, nil
}

// RevokeAdminToken stops a token at once; changed is false when it was revoked already.
// Audited as admins.token_revoke.
func (o *Operator) RevokeAdminToken(ctx context.Context, tokenID string) (t AdminToken, changed bool, err error) {
	if !ids.IsUUID(tokenID) {
		return AdminToken{}, false, ErrNotFound
	}
	err = o.s.inTx(ctx, func(tx pgx.Tx) error {
		if t, err = scanAdminToken(tx.QueryRow(ctx, `SELECT `+adminTokenColumns+` FROM admin_tokens k
			JOIN admin_users u ON u.id = k.admin_user_id WHERE k.id = $1 FOR UPDATE OF k`, tokenID)); err != nil || t.RevokedAt != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `UPDATE admin_tokens SET revoked_at = now() WHERE id = $1 RETURNING revoked_at`,
			tokenID).Scan(&t.RevokedAt); err != nil {
			return err
		}
		changed = true
		return o.audit(ctx, tx, "admins.token_revoke", adminTokenResource(t.ID), map[string]any{
			"admin_user_id": t.AdminID, "name": t.Name, "token_prefix": t.Prefix,
		})
	})
	return t, changed, err
}

const adminTokenColumns = `k.id::text, k.admin_user_id::text, u.email, k.name, k.scope, k.token_prefix,
	k.expires_at, k.revoked_at, k.last_used_at, k.inserted_at`

func scanAdminToken(row pgx.Row) (AdminToken, error) {
	var t AdminToken
	err := row.Scan(&t.ID, &t.AdminID, &t.AdminEmail, &t.Name, &t.Scope, &t.Prefix, &t.ExpiresAt, &t.RevokedAt,
		&t.LastUsedAt, &t.InsertedAt)
	return t, notFound(err)
}

// AdminTokens lists an admin's tokens, newest first.
func (s *Store) AdminTokens(ctx context.Context, adminID string) ([]AdminToken, error) {
	if !ids.IsUUID(adminID) {
		return nil, ErrNotFound
	}
	rows, err := s.pool.Query(ctx, `SELECT `+adminTokenColumns+` FROM admin_tokens k
		JOIN admin_users u ON u.id = k.admin_user_id WHERE k.admin_user_id = $1 ORDER BY k.inserted_at DESC, k.id`, adminID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AdminToken, error) { return scanAdminToken(r) })
}

// TokenAdmin is the admin an API token acts for.
type TokenAdmin struct {
	AdminID, Email, Scope, TokenID string
}

// lastUsedResolution is how often a token's last use is written.
const lastUsedResolution = time.Minute

// AdminByToken returns the admin and scope of a token that works now: known, neither
// revoked nor expired, of an active admin.
// Anything else is ErrNotFound. The token's last use is recorded, at most once a minute.
func (s *Store) AdminByToken(ctx context.Context, token string) (TokenAdmin, error) {
	var a TokenAdmin
	var lastUsed *time.Time
	err := s.pool.QueryRow(ctx, `SELECT u.id::text, u.email, k.scope, k.id::text, k.last_used_at
		FROM admin_tokens k JOIN admin_users u ON u.id = k.admin_user_id
		WHERE k.token_hash = $1 AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())
		  AND u.status = 'active'`,
		credentials.Hash(token)).Scan(&a.AdminID, &a.Email, &a.Scope, &a.TokenID, &lastUsed)
	if err != nil {
		return TokenAdmin{}, notFound(err)
	}
	if lastUsed == nil || time.Since(*lastUsed) > lastUsedResolution {
		if _, err := s.pool.Exec(ctx, `UPDATE admin_tokens SET last_used_at = now() WHERE id = $1`, a.TokenID); err != nil {
			return TokenAdmin{}, err
		}
	}
	return a, nil
}

// AdminByEmail returns the admin with that email, compared case-insensitively.
func (s *Store) AdminByEmail(ctx context.Context, email string) (AdminUser, error) {
	var u AdminUser
	err := s.pool.QueryRow(ctx, `SELECT id::text, email, role, status, must_change_password FROM admin_users
		WHERE lower(email) = lower($1)`, email).Scan(&u.ID, &u.Email, &u.Role, &u.Status, &u.MustChangePassword)
	return u, notFound(err)
}

// TenantInfo is a tenant as the console shows it.
type TenantInfo struct {
	Tenant
	Channels              int
	AllowedOrigins        []string
	InsertedAt, UpdatedAt time.Time
}

// Cursor is where a page of a list sorted by name (case-insensitively) starts: after the
// row with this name and id. The zero Cursor starts at the beginning.
type Cursor struct{ Name, ID string }

// ErrBadCursor: a cursor that no page of ours handed out.
var ErrBadCursor = errors.New("malformed cursor")

// String encodes a cursor for a URL.
func (c Cursor) String() string {
	if c == (Cursor{}) {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(c.ID + ":" + c.Name))
}

// ParseCursor decodes what Cursor.String made; "" is the beginning.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(s) > 1024 {
		return Cursor{}, ErrBadCursor
	}
	id, name, ok := strings.Cut(string(b), ":")
	if !ok || !ids.IsUUID(id) || !utf8.ValidString(name) {
		return Cursor{}, ErrBadCursor
	}
	return Cursor{Name: name, ID: strings.ToLower(id)}, nil
}

const tenantInfoColumns = `t.id::text, t.name, t.status, t.api_key_prefix,
	(SELECT count(*) FROM channels c WHERE c.tenant_id = t.id), t.allowed_origins, t.inserted_at, t.updated_at`

func scanTenantInfo(row pgx.Row) (TenantInfo, error) {
	var t TenantInfo
	err := row.Scan(&t.ID, &t.Name, &t.Status, &t.APIKeyPrefix, &t.Channels, &t.AllowedOrigins, &t.InsertedAt, &t.UpdatedAt)
	return t, notFound(err)
}

// Tenants returns up to limit tenants after the cursor, by name (case-insensitively),
// whose name contains query (case-insensitively), or whose id it is; and whether more
// follow.
func (s *Store) Tenants(ctx context.Context, query string, after Cursor, limit int) ([]TenantInfo, bool, error) {
	q := strings.ToLower(strings.TrimSpace(query))
	byID := ""
	if ids.IsUUID(q) {
		byID = q
	}
	afterID := after.ID
	if afterID == "" {
		afterID = "00000000-0000-0000-0000-000000000000"
	}
	rows, err := s.pool.Query(ctx, `SELECT `+tenantInfoColumns+` FROM tenants t
		WHERE ($1 = '' OR strpos(lower(t.name), $1) > 0 OR t.id::text = $2)
		  AND (lower(t.name), t.id) > (lower($3), $4::uuid)
		ORDER BY lower(t.name), t.id LIMIT $5`, q, byID, after.Name, afterID, limit+1)
	if err != nil {
		return nil, false, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TenantInfo, error) { return scanTenantInfo(r) })
	if err != nil {
		return nil, false, err
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// TenantByID returns a tenant.
func (s *Store) TenantByID(ctx context.Context, id string) (TenantInfo, error) {
	if !ids.IsUUID(id) {
		return TenantInfo{}, ErrNotFound
	}
	return scanTenantInfo(s.pool.QueryRow(ctx, `SELECT `+tenantInfoColumns+` FROM tenants t WHERE t.id = $1`, id))
}

// ChannelInfo is a channel as the console shows it (never its secrets).
type ChannelInfo struct {
	Channel
	InsertedAt, UpdatedAt time.Time
}

// TenantChannels returns up to limit of a tenant's channels after the cursor, by name,
// and whether more follow; ErrNotFound when there is no such tenant.
func (s *Store) TenantChannels(ctx context.Context, tenantID string, after Cursor, limit int) ([]ChannelInfo, bool, error) {
	if !ids.IsUUID(tenantID) {
		return nil, false, ErrNotFound
	}
	afterID := after.ID
	if afterID == "" {
		afterID = "00000000-0000-0000-0000-000000000000"
	}
	var out []ChannelInfo
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var id string
		if err := tx.QueryRow(ctx, `SELECT id::text FROM tenants WHERE id = $1`, tenantID).Scan(&id); err != nil {
			return notFound(err)
		}
		rows, err := tx.Query(ctx, `SELECT `+channelColumns+`, c.inserted_at, c.updated_at
			FROM channels c JOIN tenants t ON t.id = c.tenant_id
			WHERE c.tenant_id = $1 AND (lower(c.name), c.id) > (lower($2), $3::uuid)
			ORDER BY lower(c.name), c.id LIMIT $4`, tenantID, after.Name, afterID, limit+1)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChannelInfo, error) {
			var c ChannelInfo
			err := r.Scan(&c.ID, &c.TenantID, &c.Name, &c.Type, &c.Mode, &c.Status, &c.RequireSignature, &c.TenantActive,
				&c.InsertedAt, &c.UpdatedAt)
			return c, err
		})
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// AuditQuery selects audit entries: each non-empty field must match exactly; Before
// (when not 0) takes the entries older than that id.
type AuditQuery struct {
	Actor, Action, Resource string
	Before                  int64
	Limit                   int
}

// AuditRecord is an audit entry with the email of an admin actor ("" for others).
type AuditRecord struct {
	AuditEntry
	ActorEmail string
}

// SearchAuditLogs returns up to q.Limit entries matching q, newest first, and whether
// older ones match too.
func (s *Store) SearchAuditLogs(ctx context.Context, q AuditQuery) ([]AuditRecord, bool, error) {
	before := q.Before
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := s.pool.Query(ctx, `SELECT a.id, a.actor, a.action, a.resource, a.changes, a.inserted_at, coalesce(u.email, '')
		FROM audit_logs a LEFT JOIN admin_users u ON a.actor = 'admin:' || u.id::text
		WHERE ($1 = '' OR a.actor = $1) AND ($2 = '' OR a.action = $2) AND ($3 = '' OR a.resource = $3) AND a.id < $4
		ORDER BY a.id DESC LIMIT $5`, q.Actor, q.Action, q.Resource, before, q.Limit+1)
	if err != nil {
		return nil, false, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditRecord, error) {
		var e AuditRecord
		var changes []byte
		err := r.Scan(&e.ID, &e.Actor, &e.Action, &e.Resource, &changes, &e.InsertedAt, &e.ActorEmail)
		e.Changes = changes
		return e, err
	})
	if err != nil {
		return nil, false, err
	}
	if len(out) > q.Limit {
		return out[:q.Limit], true, nil
	}
	return out, false, nil
}
