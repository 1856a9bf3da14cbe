package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
)

// listenTenantChanges is a connection that LISTENs on tenant_changes.
func (e *manageEnv) listenTenantChanges() *pgx.Conn {
	e.t.Helper()
	conn, err := pgx.Connect(e.ctx, e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close(e.ctx) })
	if _, err := conn.Exec(e.ctx, "LISTEN "+store.NotifyTenantChanges); err != nil {
		e.t.Fatal(err)
	}
	return conn
}

// expectNotified waits for one tenant_changes notification with the tenant id.
func (e *manageEnv) expectNotified(conn *pgx.Conn, what, tenantID string) {
	e.t.Helper()
	if p, ok := waitNotification(e.ctx, conn, 5*time.Second); !ok || p != tenantID {
		e.t.Fatalf("%s: notification %q %v, want %s", what, p, ok, tenantID)
	}
}

// expectQuiet checks that no tenant_changes notification arrives for a moment.
func (e *manageEnv) expectQuiet(conn *pgx.Conn, what string) {
	e.t.Helper()
	if p, ok := waitNotification(e.ctx, conn, 200*time.Millisecond); ok {
		e.t.Fatalf("%s: unexpected notification %q", what, p)
	}
}

func (e *manageEnv) channel(tenantID, name string) store.Channel {
	e.t.Helper()
	c, _, err := e.op.CreateChannel(e.ctx, tenantID, name, "webhook", "duplex")
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// A tenant is deactivated and activated again: each real change is audited and
// announced on tenant_changes; a repeat writes and announces nothing.
func TestOperatorTenantStatus(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, key := e.tenant("acme")
	conn := e.listenTenantChanges()
	if _, changed, err := e.op.ActivateTenant(e.ctx, ten.ID); err != nil || changed {
		t.Fatalf("activating an active tenant: %v %v", changed, err)
	}
	e.expectQuiet(conn, "activating an active tenant")
	if got, changed, err := e.op.DeactivateTenant(e.ctx, ten.ID); err != nil || !changed || got.Status != store.StatusInactive {
		t.Fatalf("deactivate: %+v %v %v", got, changed, err)
	}
	e.expectNotified(conn, "deactivate", ten.ID)
	if _, err := e.st.TenantByAPIKey(e.ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an inactive tenant's key: %v", err)
	}
	got, changed, err := e.op.ActivateTenant(e.ctx, ten.ID)
	if err != nil || !changed || got.Status != store.StatusActive || got.Name != "acme" {
		t.Fatalf("activate: %+v %v %v", got, changed, err)
	}
	e.expectNotified(conn, "activate", ten.ID)
	if _, err := e.st.TenantByAPIKey(e.ctx, key); err != nil {
		t.Fatalf("the key of a tenant active again: %v", err)
	}
	a := e.audits("tenant:" + ten.ID)
	if len(a) != 3 || a[2].Action != "tenants.activate" || a[2].Actor != "test:alice" ||
		string(a[2].Changes) != `{"after": {"status": "active"}, "before": {"status": "inactive"}}` {
		t.Fatalf("audit: %+v", a)
	}
	if _, _, err := e.op.SetTenantStatus(e.ctx, ten.ID, "paused"); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("an unknown status: %v", err)
	}
	if _, _, err := e.op.ActivateTenant(e.ctx, "00000000-0000-0000-0000-000000000000"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown tenant: %v", err)
	}
	// An API key rotation is announced too: the old key may have stopped working.
	if _, err := e.op.RotateAPIKey(e.ctx, ten.ID, 0); err != nil {
		t.Fatal(err)
	}
	e.expectNotified(conn, "rotation", ten.ID)
}

// Channels are deactivated, activated and their require_signature switched, each
// audited with before and after and announced with the channel's tenant.
func TestOperatorChannelUpdates(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, _ := e.tenant("acme")
	ch := e.channel(ten.ID, "whatsapp")
	if got, err := e.st.ChannelByName(e.ctx, ten.ID, "whatsapp"); err != nil || got.ID != ch.ID {
		t.Fatalf("ChannelByName: %+v %v", got, err)
	}
	if _, err := e.st.ChannelByName(e.ctx, ten.ID, "WhatsApp"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("names are exact: %v", err)
	}
	conn := e.listenTenantChanges()

	got, changed, err := e.op.SetChannelStatus(e.ctx, ch.ID, store.StatusInactive)
	if err != nil || !changed || got.Status != store.StatusInactive || got.Active() {
		t.Fatalf("deactivate: %+v %v %v", got, changed, err)
	}
	e.expectNotified(conn, "channel deactivated", ten.ID)
	if _, changed, err := e.op.SetChannelStatus(e.ctx, ch.ID, store.StatusInactive); err != nil || changed {
		t.Fatalf("deactivate twice: %v %v", changed, err)
	}
	e.expectQuiet(conn, "deactivate twice")
	if got, changed, err = e.op.SetChannelStatus(e.ctx, ch.ID, store.StatusActive); err != nil || !changed || !got.Active() {
		t.Fatalf("activate: %+v %v %v", got, changed, err)
	}
	e.expectNotified(conn, "channel activated", ten.ID)

	if got, changed, err = e.op.SetRequireSignature(e.ctx, ch.ID, false); err != nil || !changed || got.RequireSignature {
		t.Fatalf("require_signature off: %+v %v %v", got, changed, err)
	}
	if _, changed, err = e.op.SetRequireSignature(e.ctx, ch.ID, false); err != nil || changed {
		t.Fatalf("require_signature off twice: %v %v", changed, err)
	}
	a := e.audits("channel:" + ch.ID)
	want := []struct{ action, changes string }{
		{"channels.create", ""},
		{"channels.deactivate", `{"after": {"status": "inactive"}, "before": {"status": "active"}, "tenant_id": "` + ten.ID + `"}`},
		{"channels.activate", `{"after": {"status": "active"}, "before": {"status": "inactive"}, "tenant_id": "` + ten.ID + `"}`},
		{"channels.update", `{"after": {"require_signature": false}, "before": {"require_signature": true}, "tenant_id": "` + ten.ID + `"}`},
	}
	if len(a) != len(want) {
		t.Fatalf("audit: %+v", a)
	}
	for i, w := range want {
		if a[i].Action != w.action || (w.changes != "" && string(a[i].Changes) != w.changes) {
			t.Errorf("audit %d: %s %s, want %s %s", i, a[i].Action, a[i].Changes, w.action, w.changes)
		}
	}
	if _, _, err := e.op.SetChannelStatus(e.ctx, "00000000-0000-0000-0000-000000000000", store.StatusActive); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown channel: %v", err)
	}
	if _, _, err := e.op.SetRequireSignature(e.ctx, "nope", true); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("malformed id: %v", err)
	}
}

// A portal user is deactivated (sessions end, reset links stop working) and activated.
func TestOperatorTenantUserStatus(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, _ := e.tenant("acme")
	hash, err := passwords.HashWith("peter-password-1", passwords.Params{Memory: 64, Time: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	u, err := e.op.CreateTenantUser(e.ctx, ten.ID, "Peter@example.com", hash, false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.st.TenantUserByEmail(e.ctx, ten.ID, "peter@EXAMPLE.com"); err != nil || got.ID != u.ID {
		t.Fatalf("TenantUserByEmail: %+v %v", got, err)
	}
	now := time.Now()
	e.session(store.KindTenant, u.ID, now, time.Hour)
	if err := e.st.CreatePasswordReset(e.ctx, store.KindTenant, u.ID, make([]byte, 32), now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got, changed, err := e.op.SetTenantUserStatus(e.ctx, u.ID, store.StatusInactive)
	if err != nil || !changed || got.Status != store.StatusInactive {
		t.Fatalf("deactivate: %+v %v %v", got, changed, err)
	}
	if n := e.countSessions(store.KindTenant, u.ID); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
	if _, err := e.st.PasswordResetUser(e.ctx, make([]byte, 32), store.KindTenant, now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a reset link of a deactivated user: %v", err)
	}
	if lu, err := e.st.TenantUserForLogin(e.ctx, "acme", "peter@example.com"); err != nil || lu.Active {
		t.Fatalf("login view: %+v %v", lu, err)
	}
	if _, changed, err := e.op.SetTenantUserStatus(e.ctx, u.ID, store.StatusInactive); err != nil || changed {
		t.Fatalf("twice: %v %v", changed, err)
	}
	if got, changed, err = e.op.SetTenantUserStatus(e.ctx, u.ID, store.StatusActive); err != nil || !changed || got.Status != store.StatusActive {
		t.Fatalf("activate: %+v %v %v", got, changed, err)
	}
	if lu, err := e.st.TenantUserForLogin(e.ctx, "acme", "peter@example.com"); err != nil || !lu.Active {
		t.Fatalf("login view: %+v %v", lu, err)
	}
	a := e.audits("tenant_user:" + u.ID)
	if len(a) != 3 || a[1].Action != "tenant_users.deactivate" || a[2].Action != "tenant_users.activate" ||
		string(a[1].Changes) != `{"after": {"status": "inactive"}, "email": "Peter@example.com", "before": {"status": "active"}, "tenant_id": "`+ten.ID+`", "sessions_ended": 1, "reset_links_voided": 1}` {
		t.Fatalf("audit: %+v", a)
	}
}
