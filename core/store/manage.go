package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/mail"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/ids"
)

// NotifyRateLimitOverrides is the PostgreSQL channel on which every change of
// tenants.limits is announced with the tenant id, in the transaction of the change; the
// sidecars LISTEN on it (sidecar/tenants.NotifyChannel) and drop that tenant's cached
// overrides.
const NotifyRateLimitOverrides = "rate_limit_overrides"

// MaxKeyGrace bounds how long a rotated API key may keep working.
const MaxKeyGrace = 30 * 24 * time.Hour

// ChannelModes are the channel modes.
var ChannelModes = []string{"inbound", "outbound", "duplex"}

// ErrInvalid marks input the store refuses; the error's text says why.
var ErrInvalid = errors.New("invalid input")

type invalidError string

func (e invalidError) Error() string        { return string(e) }
func (e invalidError) Is(target error) bool { return target == ErrInvalid }

func invalidf(format string, args ...any) error { return invalidError(fmt.Sprintf(format, args...)) }

// CheckName checks a tenant or channel name: 1 to 100 characters, no control characters,
// no leading or trailing space. what names the field in the error ("tenant name").
func CheckName(what, name string) error {
	switch {
	case name == "":
		return invalidf("%s is empty", what)
	case !utf8.ValidString(name):
		return invalidf("%s is not valid UTF-8", what)
	case utf8.RuneCountInString(name) > 100:
		return invalidf("%s is longer than 100 characters", what)
	case strings.TrimSpace(name) != name:
		return invalidf("%s starts or ends with a space", what)
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return invalidf("%s contains a control character", what)
	}
	return nil
}

// CheckEmail checks an email address: a bare address (no display name), at most 254
// bytes.
func CheckEmail(email string) error {
	a, err := mail.ParseAddress(email)
	if err != nil || a.Address != email || a.Name != "" || len(email) > 254 {
		return invalidf("%q is not an email address such as ops@example.com", email)
	}
	return nil
}

// Operator performs the audited changes of the management commands and the admin
// pages: each change and its audit_logs row commit together, and no secret reaches the
// audit log.
type Operator struct {
	s     *Store
	actor string
	via   string // how the actor acted, when it matters (Via)
}

// As returns the audited operations, recorded as done by actor ("cli:alice",
// "admin:<user id>").
func (s *Store) As(actor string) *Operator { return &Operator{s: s, actor: actor} }

func tenantResource(id string) string { return "tenant:" + id }

// CreateTenant creates a tenant and returns its API key, the only time it is seen.
// A name taken by another tenant, in any case, is ErrConflict.
func (o *Operator) CreateTenant(ctx context.Context, name string) (Tenant, string, error) {
	if err := CheckName("tenant name", name); err != nil {
		return Tenant{}, "", err
	}
	key := credentials.NewAPIKey()
	var t Tenant
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO tenants (name, api_key_hash, api_key_prefix) VALUES ($1, $2, $3)
			RETURNING id::text, name, status, api_key_prefix`,
			name, credentials.Hash(key), credentials.DisplayPrefix(key)).Scan(&t.ID, &t.Name, &t.Status, &t.APIKeyPrefix)
		if isUniqueViolation(err) {
			return ErrConflict
		}
		if err != nil {
			return err
		}
		return o.audit(ctx, tx, "tenants.create", tenantResource(t.ID), map[string]any{
			"after": map[string]any{"name": t.Name, "status": t.Status, "api_key_prefix": t.APIKeyPrefix},
		})
	})
	if err != nil {
		return Tenant{}, "", err
	}
	return t, key, nil
}

// KeyRotation is the outcome of RotateAPIKey.
type KeyRotation struct {
	Tenant Tenant
	// Key is the new API key, shown once.
	Key string
	// PreviousPrefix is the display prefix of the key that was replaced.
	PreviousPrefix string
	// PreviousExpiresAt is when the replaced key stops working; zero when it stopped at
	// once (no grace).
	PreviousExpiresAt time.Time
	// DroppedPrevious: the key replaced by an earlier rotation was still within its
	// grace and stopped working now.
	DroppedPrevious bool
}

// RotateAPIKey gives a tenant a new API key. The current key becomes the previous key
// and keeps working for grace (0: it stops at once). There is one previous-key slot: a
// rotation within the grace of an earlier one replaces that earlier previous key, which
// stops working at once, so at most two keys ever work — the newest and the one it
// replaced. Rotating twice in a row therefore invalidates the original key immediately;
// DroppedPrevious reports it.
func (o *Operator) RotateAPIKey(ctx context.Context, tenantID string, grace time.Duration) (KeyRotation, error) {
	if grace < 0 || grace > MaxKeyGrace {
		return KeyRotation{}, invalidf("the grace must be from 0 to %s", MaxKeyGrace)
	}
	if !ids.IsUUID(tenantID) {
		return KeyRotation{}, ErrNotFound
	}
	r := KeyRotation{Key: credentials.NewAPIKey()}
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT api_key_prefix, coalesce(previous_api_key_expires_at > now(), false)
			FROM tenants WHERE id = $1 FOR UPDATE`, tenantID).Scan(&r.PreviousPrefix, &r.DroppedPrevious)
		if err != nil {
			return notFound(err)
		}
		var expires *time.Time
		err = tx.QueryRow(ctx, `
			UPDATE tenants SET
				previous_api_key_hash = CASE WHEN $3::bigint > 0 THEN api_key_hash END,
				previous_api_key_expires_at = CASE WHEN $3::bigint > 0 THEN now() + $3::bigint * interval '1 microsecond' END,
				api_key_hash = $1, api_key_prefix = $2, updated_at = now()
			WHERE id = $4
			RETURNING id::text, name, status, api_key_prefix, previous_api_key_expires_at`,
			credentials.Hash(r.Key), credentials.DisplayPrefix(r.Key), grace.Microseconds(), tenantID,
		).Scan(&r.Tenant.ID, &r.Tenant.Name, &r.Tenant.Status, &r.Tenant.APIKeyPrefix, &expires)
		if err != nil {
			return err
		}
		if expires != nil {
			r.PreviousExpiresAt = *expires
		}
		return o.audit(ctx, tx, "tenants.rotate_key", tenantResource(r.Tenant.ID), map[string]any{
			"before": map[string]any{"api_key_prefix": r.PreviousPrefix},
			"after": map[string]any{"api_key_prefix": r.Tenant.APIKeyPrefix,
				"previous_api_key_expires_at": expires},
			"grace":                grace.String(),
			"dropped_previous_key": r.DroppedPrevious,
		})
	})
	if err != nil {
		return KeyRotation{}, err
	}
	return r, nil
}

// CreateChannel creates a channel of a tenant with a new secret (stored as SHA-256 and
// sealed with ENCRYPTION_KEY) and publishable key (SHA-256); the secrets are returned
// only here. A name the tenant already uses is ErrConflict.
func (o *Operator) CreateChannel(ctx context.Context, tenantID, name, typ, mode string) (Channel, ChannelSecrets, error) {
	if o.s.sealer == nil {
		return Channel{}, ChannelSecrets{}, ErrNoEncryptionKey
	}
	if err := CheckName("channel name", name); err != nil {
		return Channel{}, ChannelSecrets{}, err
	}
	if !slices.Contains(ChannelTypes, typ) {
		return Channel{}, ChannelSecrets{}, invalidf("channel type %q: must be one of %s", typ, strings.Join(ChannelTypes, ", "))
	}
	if !slices.Contains(ChannelModes, mode) {
		return Channel{}, ChannelSecrets{}, invalidf("channel mode %q: must be one of %s", mode, strings.Join(ChannelModes, ", "))
	}
	if !ids.IsUUID(tenantID) {
		return Channel{}, ChannelSecrets{}, ErrNotFound
	}
	sec := ChannelSecrets{Secret: credentials.NewChannelSecret(), Publishable: credentials.NewPublishableKey()}
	var c Channel
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `SELECT id::text FROM tenants WHERE id = $1 FOR SHARE`, tenantID).Scan(&id)
		if err != nil {
			return notFound(err)
		}
		err = tx.QueryRow(ctx, `
			INSERT INTO channels (tenant_id, name, type, mode, secret_hash, secret_ciphertext, publishable_key_hash)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id::text`,
			tenantID, name, typ, mode, credentials.Hash(sec.Secret), o.s.sealer.Seal([]byte(sec.Secret)),
			credentials.Hash(sec.Publishable)).Scan(&id)
		if isUniqueViolation(err) {
			return ErrConflict
		}
		if err != nil {
			return err
		}
		if c, err = scanChannel(tx.QueryRow(ctx, `SELECT `+channelColumns+`
			FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.id = $1`, id)); err != nil {
			return err
		}
		return o.audit(ctx, tx, "channels.create", "channel:"+c.ID, map[string]any{
			"after": map[string]any{"tenant_id": c.TenantID, "name": c.Name, "type": c.Type, "mode": c.Mode,
				"status": c.Status, "require_signature": c.RequireSignature},
		})
	})
	if err != nil {
		return Channel{}, ChannelSecrets{}, err
	}
	return c, sec, nil
}

// TenantLimits is a tenant's stored rate-limit overrides.
type TenantLimits struct {
	// Raw is tenants.limits as stored.
	Raw json.RawMessage
	// Overrides are Raw parsed; nil when Invalid.
	Overrides buckets.Overrides
	// Invalid is why Raw does not pass buckets.ParseOverrides (written by hand, or by
	// an older version); the sidecars then ignore it.
	Invalid error
}

func parseLimits(raw []byte) TenantLimits {
	l := TenantLimits{Raw: json.RawMessage(raw)}
	l.Overrides, l.Invalid = buckets.ParseOverrides(raw)
	return l
}

// Limits returns a tenant's stored overrides.
func (s *Store) Limits(ctx context.Context, tenantID string) (TenantLimits, error) {
	if !ids.IsUUID(tenantID) {
		return TenantLimits{}, ErrNotFound
	}
	var raw []byte
	if err := s.pool.QueryRow(ctx, `SELECT limits FROM tenants WHERE id = $1`, tenantID).Scan(&raw); err != nil {
		return TenantLimits{}, notFound(err)
	}
	return parseLimits(raw), nil
}

// LimitsChange is the outcome of SetLimits and ClearLimits.
type LimitsChange struct {
	Before  TenantLimits
	After   buckets.Overrides
	Changed bool // false: the stored document was already After, nothing was written
}

// CheckOverride checks one override: an overridable bucket, a positive count and a
// window of whole milliseconds up to buckets.MaxOverrideWindow.
func CheckOverride(name string, l buckets.Limit) error {
	if b, ok := buckets.Lookup(name); !ok || !b.Overridable {
		return invalidf("%q is not an overridable bucket (allowed: %s)", name, strings.Join(buckets.OverridableNames(), ", "))
	}
	switch {
	case l.Count == 0:
		return invalidf("%s: the limit must be a positive integer", name)
	case l.Window <= 0 || l.Window%time.Millisecond != 0:
		return invalidf("%s: the window must be a positive whole number of milliseconds, such as 1s, 500ms or 1m", name)
	case l.Window > buckets.MaxOverrideWindow:
		return invalidf("%s: the window must be at most %s", name, buckets.MaxOverrideWindow)
	}
	return nil
}

// ParseOverride reads an override of bucket name as `core limits set` and the console's
// form take it, "LIMIT/WINDOW" (e.g. "2000/1s"), and checks it (CheckOverride).
func ParseOverride(name, value string) (buckets.Limit, error) {
	if b, ok := buckets.Lookup(name); !ok || !b.Overridable {
		return buckets.Limit{}, invalidf("%q is not an overridable bucket (allowed: %s)", name, strings.Join(buckets.OverridableNames(), ", "))
	}
	count, window, ok := strings.Cut(strings.TrimSpace(value), "/")
	if !ok {
		return buckets.Limit{}, invalidf("%q: write LIMIT/WINDOW, e.g. 2000/1s", value)
	}
	n, err := strconv.ParseUint(count, 10, 64)
	if err != nil || n == 0 || n > math.MaxUint32 {
		return buckets.Limit{}, invalidf("the limit %q must be a positive integer up to %d", count, uint32(math.MaxUint32))
	}
	d, err := time.ParseDuration(window)
	if err != nil {
		return buckets.Limit{}, invalidf("the window %q is not a duration such as 500ms, 1s, 60s or 1h", window)
	}
	l := buckets.Limit{Count: uint32(n), Window: d}
	return l, CheckOverride(name, l)
}

// SetLimits merges set into a tenant's overrides. The merged document must pass
// buckets.ParseOverrides. The UPDATE, NOTIFY rate_limit_overrides '<tenant id>' and the
// audit row (before and after) are one transaction, so the sidecars hear of the change
// exactly when it commits; an unchanged document writes and announces nothing.
func (o *Operator) SetLimits(ctx context.Context, tenantID string, set buckets.Overrides) (LimitsChange, error) {
	if len(set) == 0 {
		return LimitsChange{}, invalidf("no limits to set")
	}
	for name, l := range set {
		if err := CheckOverride(name, l); err != nil {
			return LimitsChange{}, err
		}
	}
	return o.changeLimits(ctx, tenantID, "limits.set", func(doc map[string]json.RawMessage) {
		for name, l := range set {
			doc[name] = json.RawMessage(fmt.Sprintf(`{"limit":%d,"scale_ms":%d}`, l.Count, l.Window.Milliseconds()))
		}
	})
}

// ClearLimits removes the named overrides of a tenant (all of them when names is
// empty), so that those buckets fall back to the installation's limits. Like SetLimits
// it writes, announces and audits in one transaction, and nothing when nothing changes.
// Clearing everything also repairs a stored document that does not parse.
func (o *Operator) ClearLimits(ctx context.Context, tenantID string, names []string) (LimitsChange, error) {
	for _, name := range names {
		if b, ok := buckets.Lookup(name); !ok || !b.Overridable {
			return LimitsChange{}, invalidf("%q is not an overridable bucket (allowed: %s)", name, strings.Join(buckets.OverridableNames(), ", "))
		}
	}
	return o.changeLimits(ctx, tenantID, "limits.clear", func(doc map[string]json.RawMessage) {
		if len(names) == 0 {
			clear(doc)
		}
		for _, name := range names {
			delete(doc, name)
		}
	})
}

// EditLimits sets the overrides in set and removes those named in drop, in one
// transaction, as SetLimits and ClearLimits do (the console's form, which shows every
// bucket): audited as limits.set, or limits.clear when nothing is set.
func (o *Operator) EditLimits(ctx context.Context, tenantID string, set buckets.Overrides, drop []string) (LimitsChange, error) {
	if len(set) == 0 && len(drop) == 0 {
		return LimitsChange{}, invalidf("no limits to set or clear")
	}
	for name, l := range set {
		if err := CheckOverride(name, l); err != nil {
			return LimitsChange{}, err
		}
	}
	for _, name := range drop {
		if b, ok := buckets.Lookup(name); !ok || !b.Overridable {
			return LimitsChange{}, invalidf("%q is not an overridable bucket (allowed: %s)", name, strings.Join(buckets.OverridableNames(), ", "))
		}
		if _, both := set[name]; both {
			return LimitsChange{}, invalidf("%s is both set and cleared", name)
		}
	}
	action := "limits.set"
	if len(set) == 0 {
		action = "limits.clear"
	}
	return o.changeLimits(ctx, tenantID, action, func(doc map[string]json.RawMessage) {
		for _, name := range drop {
			delete(doc, name)
		}
		for name, l := range set {
			doc[name] = json.RawMessage(fmt.Sprintf(`{"limit":%d,"scale_ms":%d}`, l.Count, l.Window.Milliseconds()))
		}
	})
}

func (o *Operator) changeLimits(ctx context.Context, tenantID, action string, edit func(map[string]json.RawMessage)) (LimitsChange, error) {
	if !ids.IsUUID(tenantID) {
		return LimitsChange{}, ErrNotFound
	}
	var ch LimitsChange
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		var raw []byte
		// The id as PostgreSQL spells it: the sidecars compare the payload with it.
		if err := tx.QueryRow(ctx, `SELECT id::text, limits FROM tenants WHERE id = $1 FOR UPDATE`,
			tenantID).Scan(&tenantID, &raw); err != nil {
			return notFound(err)
		}
		ch.Before = parseLimits(raw)
		doc := map[string]json.RawMessage{}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return err // the column's CHECK keeps it an object
		}
		edit(doc)
		merged, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		// The final check is the parser the sidecars use.
		if ch.After, err = buckets.ParseOverrides(merged); err != nil {
			return invalidf("the tenant's stored limits would not be valid (%v); `core limits clear` without buckets resets them", err)
		}
		after := ch.After.JSON()
		if ch.Before.Invalid == nil && bytes.Equal(ch.Before.Overrides.JSON(), after) {
			return nil
		}
		ch.Changed = true
		if _, err := tx.Exec(ctx, `UPDATE tenants SET limits = $2, updated_at = now() WHERE id = $1`, tenantID, after); err != nil {
			return err
		}
		// Delivered to the listeners when, and only if, this transaction commits.
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyRateLimitOverrides, tenantID); err != nil {
			return err
		}
		return o.audit(ctx, tx, action, tenantResource(tenantID), map[string]any{
			"before": ch.Before.Raw, "after": json.RawMessage(after),
		})
	})
	if err != nil {
		return LimitsChange{}, err
	}
	return ch, nil
}

// AdminUser is a user of the admin pages.
type AdminUser struct {
	ID, Email, Role, Status string
	MustChangePassword      bool
}

// CreateAdminUser creates an admin user with a password hash made by core/passwords.
// An email taken by another admin, in any case, is ErrConflict.
func (o *Operator) CreateAdminUser(ctx context.Context, email, passwordHash string, mustChangePassword bool) (AdminUser, error) {
	if err := CheckEmail(email); err != nil {
		return AdminUser{}, err
	}
	if !strings.HasPrefix(passwordHash, "$") {
		return AdminUser{}, invalidf("the password hash is not in a known format")
	}
	var u AdminUser
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO admin_users (email, password_hash, must_change_password) VALUES ($1, $2, $3)
			RETURNING id::text, email, role, status, must_change_password`,
			email, passwordHash, mustChangePassword).Scan(&u.ID, &u.Email, &u.Role, &u.Status, &u.MustChangePassword)
		if isUniqueViolation(err) {
			return ErrConflict
		}
		if err != nil {
			return err
		}
		return o.audit(ctx, tx, "admins.create", "admin_user:"+u.ID, map[string]any{
			"after": map[string]any{"email": u.Email, "role": u.Role, "status": u.Status,
				"must_change_password": u.MustChangePassword},
		})
	})
	if err != nil {
		return AdminUser{}, err
	}
	return u, nil
}
