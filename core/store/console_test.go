package store_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
)

func TestAdminTokens(t *testing.T) {
	e := newManageEnv(t)
	alice := e.adminUser("alice@example.com")
	tok, secret, err := e.op.CreateAdminToken(e.ctx, alice.ID, "deploy bot", store.ScopeRead, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "cvg_admin_") || len(secret) != 53 || !strings.HasPrefix(secret, tok.Prefix) ||
		tok.Scope != store.ScopeRead || tok.AdminEmail != "alice@example.com" || tok.ExpiresAt != nil {
		t.Fatalf("token %+v, secret %q", tok, secret)
	}
	// Only its hash is stored.
	var stored int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM admin_tokens WHERE token_hash = sha256($1::bytea)`, []byte(secret)).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("stored by hash: %d, %v", stored, err)
	}
	a, err := e.st.AdminByToken(e.ctx, secret)
	if err != nil || a.AdminID != alice.ID || a.Scope != store.ScopeRead || a.TokenID != tok.ID || a.Email != "alice@example.com" {
		t.Fatalf("AdminByToken: %+v, %v", a, err)
	}
	list, err := e.st.AdminTokens(e.ctx, alice.ID)
	if err != nil || len(list) != 1 || list[0].LastUsedAt == nil {
		t.Fatalf("tokens %+v, %v (the lookup records the last use)", list, err)
	}
	for _, bad := range []string{"", secret + "x", "cvg_admin_" + strings.Repeat("A", 43)} {
		if _, err := e.st.AdminByToken(e.ctx, bad); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("AdminByToken(%q): %v", bad, err)
		}
	}

	// Expired and revoked tokens, and tokens of inactive admins, stop working.
	_, short, err := e.op.CreateAdminToken(e.ctx, alice.ID, "short", store.ScopeWrite, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE admin_tokens SET expires_at = now() - interval '1 second' WHERE name = 'short'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.AdminByToken(e.ctx, short); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("expired token: %v", err)
	}
	if _, changed, err := e.op.RevokeAdminToken(e.ctx, tok.ID); err != nil || !changed {
		t.Fatalf("revoke: %v %v", changed, err)
	}
	if _, changed, err := e.op.RevokeAdminToken(e.ctx, tok.ID); err != nil || changed {
		t.Fatalf("revoke twice: %v %v", changed, err)
	}
	if _, err := e.st.AdminByToken(e.ctx, secret); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoked token: %v", err)
	}
	_, third, _ := e.op.CreateAdminToken(e.ctx, alice.ID, "third", store.ScopeWrite, 0)
	if _, err := e.pool.Exec(e.ctx, `UPDATE admin_users SET status = 'inactive' WHERE id = $1`, alice.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.AdminByToken(e.ctx, third); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("token of an inactive admin: %v", err)
	}

	// Validation.
	for _, c := range []struct {
		admin, name, scope string
		ttl                time.Duration
		want               error
	}{
		{alice.ID, "x", "admin", 0, store.ErrInvalid},
		{alice.ID, "", store.ScopeRead, 0, store.ErrInvalid},
		{alice.ID, "x", store.ScopeRead, -time.Second, store.ErrInvalid},
		{alice.ID, "x", store.ScopeRead, 400 * 24 * time.Hour, store.ErrInvalid},
		{"00000000-0000-4000-8000-000000000000", "x", store.ScopeRead, 0, store.ErrNotFound},
		{"nope", "x", store.ScopeRead, 0, store.ErrNotFound},
	} {
		if _, _, err := e.op.CreateAdminToken(e.ctx, c.admin, c.name, c.scope, c.ttl); !errors.Is(err, c.want) {
			t.Errorf("CreateAdminToken(%q, %q, %q, %v): %v, want %v", c.admin, c.name, c.scope, c.ttl, err, c.want)
		}
	}
	// Both are audited, without the secret.
	rows, _, err := e.st.SearchAuditLogs(e.ctx, store.AuditQuery{Resource: "admin_token:" + tok.ID, Limit: 10})
	if err != nil || len(rows) != 2 || rows[0].Action != "admins.token_revoke" || rows[1].Action != "admins.token_create" {
		t.Fatalf("audit %+v, %v", rows, err)
	}
	if strings.Contains(string(rows[1].Changes), secret[len(tok.Prefix):]) {
		t.Fatalf("the secret is in the audit log: %s", rows[1].Changes)
	}
}

func TestTenantsPagesAndSearch(t *testing.T) {
	e := newManageEnv(t)
	for i := range 7 {
		e.tenant(fmt.Sprintf("Acme-%d", 6-i))
	}
	other, _ := e.tenant("globex")
	if _, _, err := e.op.CreateChannel(e.ctx, other.ID, "web", "echo", "duplex"); err != nil {
		t.Fatal(err)
	}
	var names []string
	cursor := store.Cursor{}
	for pages := 0; ; pages++ {
		page, more, err := e.st.Tenants(e.ctx, "acme", cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, ten := range page {
			names = append(names, ten.Name)
		}
		if !more {
			if pages != 2 {
				t.Errorf("%d pages of 3 for 7 tenants", pages+1)
			}
			break
		}
		last := page[len(page)-1]
		if cursor, err = store.ParseCursor(store.Cursor{Name: last.Name, ID: last.ID}.String()); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(names, ","); got != "Acme-0,Acme-1,Acme-2,Acme-3,Acme-4,Acme-5,Acme-6" {
		t.Fatalf("pages: %s", got)
	}
	byID, _, err := e.st.Tenants(e.ctx, strings.ToUpper(other.ID), store.Cursor{}, 10)
	if err != nil || len(byID) != 1 || byID[0].Name != "globex" || byID[0].Channels != 1 {
		t.Fatalf("by id: %+v, %v", byID, err)
	}
	if none, _, err := e.st.Tenants(e.ctx, "%", store.Cursor{}, 10); err != nil || len(none) != 0 {
		t.Fatalf("%% is not a pattern: %+v, %v", none, err)
	}
	for _, bad := range []string{"!", "bm9wZQ", store.Cursor{Name: "x", ID: "nope"}.String()} {
		if _, err := store.ParseCursor(bad); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("ParseCursor(%q): %v", bad, err)
		}
	}
	info, err := e.st.TenantByID(e.ctx, other.ID)
	if err != nil || info.Name != "globex" || info.Channels != 1 || info.InsertedAt.IsZero() {
		t.Fatalf("TenantByID: %+v, %v", info, err)
	}
	chans, more, err := e.st.TenantChannels(e.ctx, other.ID, store.Cursor{}, 10)
	if err != nil || more || len(chans) != 1 || chans[0].Name != "web" || chans[0].Type != "echo" {
		t.Fatalf("channels %+v %v %v", chans, more, err)
	}
	if _, _, err := e.st.TenantChannels(e.ctx, "00000000-0000-4000-8000-000000000000", store.Cursor{}, 10); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("channels of no tenant: %v", err)
	}
}

// Changes made through Via carry how the actor acted; the audit log filters by actor,
// action and resource, and names admin actors by email.
func TestAuditSearchAndVia(t *testing.T) {
	e := newManageEnv(t)
	bob := e.adminUser("bob@example.com")
	ten, _ := e.tenant("acme")
	op := e.st.As("admin:" + bob.ID).Via("token:1234")
	if _, err := op.SetLimits(e.ctx, ten.ID, buckets.Overrides{"inbound": {Count: 2000, Window: time.Second}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := op.SetTenantStatus(e.ctx, ten.ID, store.StatusInactive); err != nil {
		t.Fatal(err)
	}
	rows, more, err := e.st.SearchAuditLogs(e.ctx, store.AuditQuery{Actor: "admin:" + bob.ID, Limit: 1})
	if err != nil || !more || len(rows) != 1 || rows[0].Action != "tenants.deactivate" || rows[0].ActorEmail != "bob@example.com" {
		t.Fatalf("newest of bob's: %+v %v %v", rows, more, err)
	}
	older, more, err := e.st.SearchAuditLogs(e.ctx, store.AuditQuery{Actor: "admin:" + bob.ID, Before: rows[0].ID, Limit: 5})
	if err != nil || more || len(older) != 1 || older[0].Action != "limits.set" {
		t.Fatalf("older: %+v %v %v", older, more, err)
	}
	var changes map[string]any
	if err := json.Unmarshal(older[0].Changes, &changes); err != nil || changes["via"] != "token:1234" || changes["after"] == nil {
		t.Fatalf("changes %s", older[0].Changes)
	}
	if got, _, _ := e.st.SearchAuditLogs(e.ctx, store.AuditQuery{Action: "limits.set", Resource: "tenant:" + ten.ID, Limit: 5}); len(got) != 1 {
		t.Fatalf("by action and resource: %+v", got)
	}
	if got, _, _ := e.st.SearchAuditLogs(e.ctx, store.AuditQuery{Action: "tenants.create", Limit: 5}); len(got) != 1 || got[0].ActorEmail != "" || got[0].Actor != "test:alice" {
		t.Fatalf("a command's entry: %+v", got)
	}
}
