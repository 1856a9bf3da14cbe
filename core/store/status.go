package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/shared/ids"
)

// The statuses of tenants, channels and users.
const (
	StatusActive   = "active"
	StatusInactive = "inactive"
)

// NotifyTenantChanges is the PostgreSQL channel on which a trigger announces, with the
// tenant id, every committed change of a tenant's status, API keys or allowed origins
// and of its channels' status, credentials or tenant (migration 00007). The sidecars
// LISTEN on it (sidecar/tenants) and drop the tenant's cached credentials; the cores
// reload the allowed origins of the client API's CORS.
const NotifyTenantChanges = "tenant_changes"

// checkStatus refuses anything but StatusActive and StatusInactive.
func checkStatus(status string) error {
	if status != StatusActive && status != StatusInactive {
		return invalidf("status %q: must be %s or %s", status, StatusActive, StatusInactive)
	}
	return nil
}

// statusAction is the audit action of a status change of a kind of resource
// ("tenants.deactivate", "channels.activate").
func statusAction(kind, status string) string {
	if status == StatusActive {
		return kind + ".activate"
	}
	return kind + ".deactivate"
}

// DeactivateTenant sets a tenant inactive: its API keys, channels, tokens and portal
// users stop working, in the sidecars at once too (NotifyTenantChanges). changed is
// false when it was inactive already (nothing is written then).
func (o *Operator) DeactivateTenant(ctx context.Context, tenantID string) (Tenant, bool, error) {
	return o.SetTenantStatus(ctx, tenantID, StatusInactive)
}

// ActivateTenant sets an inactive tenant active again; changed is false when it was
// active already.
func (o *Operator) ActivateTenant(ctx context.Context, tenantID string) (Tenant, bool, error) {
	return o.SetTenantStatus(ctx, tenantID, StatusActive)
}

// SetTenantStatus sets a tenant's status (StatusActive or StatusInactive), audited as
// tenants.activate or tenants.deactivate in the same transaction; nothing is written
// when the tenant has that status already (changed is false).
func (o *Operator) SetTenantStatus(ctx context.Context, tenantID, status string) (t Tenant, changed bool, err error) {
	if err := checkStatus(status); err != nil {
		return Tenant{}, false, err
	}
	if !ids.IsUUID(tenantID) {
		return Tenant{}, false, ErrNotFound
	}
	err = o.s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT id::text, name, status, api_key_prefix FROM tenants WHERE id = $1 FOR UPDATE`,
			tenantID).Scan(&t.ID, &t.Name, &t.Status, &t.APIKeyPrefix)
		if err != nil || t.Status == status {
			return notFound(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE tenants SET status = $2, updated_at = now() WHERE id = $1`, tenantID, status); err != nil {
			return err
		}
		before := t.Status
		t.Status, changed = status, true
		return o.audit(ctx, tx, statusAction("tenants", status), tenantResource(t.ID), map[string]any{
			"before": map[string]any{"status": before}, "after": map[string]any{"status": t.Status},
		})
	})
	return t, changed, err
}

func channelResource(id string) string { return "channel:" + id }

// ChannelByName returns a tenant's channel by its name.
func (s *Store) ChannelByName(ctx context.Context, tenantID, name string) (Channel, error) {
	if !ids.IsUUID(tenantID) {
		return Channel{}, ErrNotFound
	}
	return scanChannel(s.pool.QueryRow(ctx, `SELECT `+channelColumns+`
		FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.tenant_id = $1 AND c.name = $2`, tenantID, name))
}

// SetChannelStatus sets a channel's status (StatusActive or StatusInactive): an
// inactive channel refuses its secret, publishable key, tokens and inbound webhooks, in
// the sidecars at once too (NotifyTenantChanges). Audited as channels.activate or
// channels.deactivate; nothing is written when it has that status already.
func (o *Operator) SetChannelStatus(ctx context.Context, channelID, status string) (Channel, bool, error) {
	if err := checkStatus(status); err != nil {
		return Channel{}, false, err
	}
	return o.updateChannel(ctx, channelID, statusAction("channels", status), "status", status,
		func(c Channel) bool { return c.Status == status })
}

// SetRequireSignature switches whether a channel's inbound webhooks must be signed.
// Audited as channels.update; nothing is written when it is set so already.
func (o *Operator) SetRequireSignature(ctx context.Context, channelID string, require bool) (Channel, bool, error) {
	return o.updateChannel(ctx, channelID, "channels.update", "require_signature", require,
		func(c Channel) bool { return c.RequireSignature == require })
}

// updateChannel sets one column of a channel to value unless same says it has it, and
// audits the change (the column before and after) in the same transaction.
func (o *Operator) updateChannel(ctx context.Context, channelID, action, column string, value any,
	same func(Channel) bool) (c Channel, changed bool, err error) {
	if !ids.IsUUID(channelID) {
		return Channel{}, false, ErrNotFound
	}
	err = o.s.inTx(ctx, func(tx pgx.Tx) error {
		if c, err = scanChannel(tx.QueryRow(ctx, `SELECT `+channelColumns+`
			FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.id = $1 FOR UPDATE OF c`, channelID)); err != nil {
			return err
		}
		if same(c) {
			return nil
		}
		before := map[string]any{"status": c.Status, "require_signature": c.RequireSignature}[column]
		// column is one of two constants above, never input.
		if _, err := tx.Exec(ctx, `UPDATE channels SET `+column+` = $2, updated_at = now() WHERE id = $1`, channelID, value); err != nil {
			return err
		}
		if c, err = scanChannel(tx.QueryRow(ctx, `SELECT `+channelColumns+`
			FROM channels c JOIN tenants t ON t.id = c.tenant_id WHERE c.id = $1`, channelID)); err != nil {
			return err
		}
		changed = true
		return o.audit(ctx, tx, action, channelResource(c.ID), map[string]any{
			"tenant_id": c.TenantID, "before": map[string]any{column: before}, "after": map[string]any{column: value},
		})
	})
	return c, changed, err
}

func tenantUserResource(id string) string { return "tenant_user:" + id }

const tenantUserColumns = `id::text, tenant_id::text, email, role, status, must_change_password`

func scanTenantUser(row pgx.Row) (TenantUser, error) {
	var u TenantUser
	err := row.Scan(&u.ID, &u.TenantID, &u.Email, &u.Role, &u.Status, &u.MustChangePassword)
	return u, notFound(err)
}

// TenantUserByEmail returns a tenant's portal user by email, compared
// case-insensitively.
func (s *Store) TenantUserByEmail(ctx context.Context, tenantID, email string) (TenantUser, error) {
	if !ids.IsUUID(tenantID) {
		return TenantUser{}, ErrNotFound
	}
	return scanTenantUser(s.pool.QueryRow(ctx, `SELECT `+tenantUserColumns+`
		FROM tenant_users WHERE tenant_id = $1 AND lower(email) = lower($2)`, tenantID, email))
}

// SetTenantUserStatus sets a portal user's status (StatusActive or StatusInactive).
// Deactivating also ends the user's sessions and voids their password reset links, in
// the same transaction; an inactive user cannot sign in. Audited as
// tenant_users.activate or tenant_users.deactivate; nothing is written when the user
// has that status already.
func (o *Operator) SetTenantUserStatus(ctx context.Context, userID, status string) (u TenantUser, changed bool, err error) {
	if err := checkStatus(status); err != nil {
		return TenantUser{}, false, err
	}
	if !ids.IsUUID(userID) {
		return TenantUser{}, false, ErrNotFound
	}
	err = o.s.inTx(ctx, func(tx pgx.Tx) error {
		if u, err = scanTenantUser(tx.QueryRow(ctx, `SELECT `+tenantUserColumns+`
			FROM tenant_users WHERE id = $1 FOR UPDATE`, userID)); err != nil || u.Status == status {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE tenant_users SET status = $2, updated_at = now() WHERE id = $1`, userID, status); err != nil {
			return err
		}
		var sessions, resets int64
		if status == StatusInactive {
			tag, err := tx.Exec(ctx, `DELETE FROM sessions WHERE user_kind = $1 AND user_id = $2`, KindTenant, userID)
			if err != nil {
				return err
			}
			sessions = tag.RowsAffected()
			if tag, err = tx.Exec(ctx, `DELETE FROM password_resets WHERE user_kind = $1 AND user_id = $2 AND used_at IS NULL`,
				KindTenant, userID); err != nil {
				return err
			}
			resets = tag.RowsAffected()
		}
		before := u.Status
		u.Status, changed = status, true
		changes := map[string]any{"tenant_id": u.TenantID, "email": u.Email,
			"before": map[string]any{"status": before}, "after": map[string]any{"status": status}}
		if status == StatusInactive {
			changes["sessions_ended"], changes["reset_links_voided"] = sessions, resets
		}
		return o.audit(ctx, tx, statusAction("tenant_users", status), tenantUserResource(u.ID), changes)
	})
	return u, changed, err
}
