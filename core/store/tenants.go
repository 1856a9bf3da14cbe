package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/credentials"
)

// Tenant is a stored tenant.
type Tenant struct {
	ID, Name, Status, APIKeyPrefix string
}

// Channel is a stored channel.
type Channel struct {
	ID, TenantID, Name, Type, Mode, Status string
	RequireSignature                       bool
	// TenantActive is false when the channel's tenant is inactive.
	TenantActive bool
}

// Active reports whether the channel and its tenant accept traffic.
func (c Channel) Active() bool { return c.Status == "active" && c.TenantActive }

// ChannelTypes are the channel types.
var ChannelTypes = []string{"echo", "webhook"}

// TenantByAPIKey returns the active tenant of an API key: the current key, or the
// previous one during its rotation grace.
func (s *Store) TenantByAPIKey(ctx context.Context, key string) (Tenant, error) {
	t, _, err := s.TenantByAPIKeyUntil(ctx, key)
	return t, err
}

// TenantByAPIKeyUntil is TenantByAPIKey, and until when the key authenticates without
// a change to the tenant: the end of its rotation grace for the previous key, the zero
// time for the current one (valid until it is rotated or the tenant deactivated, which
// NotifyTenantChanges announces).
func (s *Store) TenantByAPIKeyUntil(ctx context.Context, key string) (Tenant, time.Time, error) {
	var t Tenant
	var until *time.Time
	err := s.pool.QueryRow(ctx, `
		SELECT id::text, name, status, api_key_prefix,
		       CASE WHEN api_key_hash = $1 THEN NULL ELSE previous_api_key_expires_at END
		FROM tenants
		WHERE status = 'active' AND (api_key_hash = $1
		   OR (previous_api_key_hash = $1 AND previous_api_key_expires_at > now()))`,
		credentials.Hash(key)).Scan(&t.ID, &t.Name, &t.Status, &t.APIKeyPrefix, &until)
	if until == nil {
		return t, time.Time{}, notFound(err)
	}
	return t, *until, notFound(err)
}

// TenantByName returns a tenant by name, case-insensitively.
func (s *Store) TenantByName(ctx context.Context, name string) (Tenant, error) {
	var t Tenant
	err := s.pool.QueryRow(ctx, `SELECT id::text, name, status, api_key_prefix FROM tenants WHERE lower(name) = lower($1)`,
		name).Scan(&t.ID, &t.Name, &t.Status, &t.APIKeyPrefix)
	return t, notFound(err)
}

const channelColumns = `c.id::text, c.tenant_id::text, c.name, c.type, c.mode, c.status, c.require_signature, t.status = 'active'`

func scanChannel(row pgx.Row) (Channel, error) {
	var c Channel
	err := row.Scan(&c.ID, &c.TenantID, &c.Name, &c.Type, &c.Mode, &c.Status, &c.RequireSignature, &c.TenantActive)
	return c, notFound(err)
}

// ChannelBySecret returns the channel of a channel secret.
func (s *Store) ChannelBySecret(ctx context.Context, secret string) (Channel, error) {
	return scanChannel(s.pool.QueryRow(ctx, `SELECT `+channelColumns+`
		FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.secret_hash = $1`, credentials.Hash(secret)))
}

// ChannelByPublishableKey returns the channel of a publishable key.
func (s *Store) ChannelByPublishableKey(ctx context.Context, key string) (Channel, error) {
	return scanChannel(s.pool.QueryRow(ctx, `SELECT `+channelColumns+`
		FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.publishable_key_hash = $1`, credentials.Hash(key)))
}

// ChannelByID returns a channel.
func (s *Store) ChannelByID(ctx context.Context, id string) (Channel, error) {
	return scanChannel(s.pool.QueryRow(ctx, `SELECT `+channelColumns+`
		FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.id = $1`, id))
}

// ChannelSecrets are a new channel's credentials, shown once.
type ChannelSecrets struct {
	Secret      string
	Publishable string
}

// ErrNoEncryptionKey: channel secrets need ENCRYPTION_KEY.
var ErrNoEncryptionKey = errors.New("ENCRYPTION_KEY is required to store channel secrets")

// DefaultKeyGrace is how long a rotated API key keeps working.
const DefaultKeyGrace = 24 * time.Hour
