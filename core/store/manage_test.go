package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/pgserver"
	sidecartenants "github.com/converger/edge/sidecar/tenants"
)

type manageEnv struct {
	t    *testing.T
	ctx  context.Context
	url  string
	pool *pgxpool.Pool
	st   *store.Store
	op   *store.Operator
}

func newManageEnv(t *testing.T) *manageEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	url := pgserver.NewTestDatabase(t, migrations.Up)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, err := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(pool, sealer, activity.DefaultLimits)
	return &manageEnv{t: t, ctx: ctx, url: url, pool: pool, st: st, op: st.As("test:alice")}
}

func (e *manageEnv) tenant(name string) (store.Tenant, string) {
	e.t.Helper()
	t, key, err := e.op.CreateTenant(e.ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return t, key
}

// audits returns the audit rows of resource, oldest first.
func (e *manageEnv) audits(resource string) []store.AuditEntry {
	e.t.Helper()
	list, err := e.st.AuditLogs(e.ctx, resource, 100)
	if err != nil {
		e.t.Fatal(err)
	}
	for i, j := 0, len(list)-1; i < j; i, j = i+1, j-1 {
		list[i], list[j] = list[j], list[i]
	}
	return list
}

func (e *manageEnv) storedLimits(tenantID string) string {
	e.t.Helper()
	var doc string
	if err := e.pool.QueryRow(e.ctx, `SELECT limits::text FROM tenants WHERE id = $1`, tenantID).Scan(&doc); err != nil {
		e.t.Fatal(err)
	}
	return doc
}

// noSecrets fails if any audit row mentions one of the secrets.
func (e *manageEnv) noSecrets(secrets ...string) {
	e.t.Helper()
	for _, a := range e.audits("") {
		for _, s := range secrets {
			if s != "" && strings.Contains(string(a.Changes), s) {
				e.t.Errorf("audit row %d (%s) contains a secret: %s", a.ID, a.Action, a.Changes)
			}
		}
	}
}

func TestOperatorCreateTenant(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, key := e.tenant("Acme")
	if !strings.HasPrefix(key, credentials.APIKeyPrefix) || ten.APIKeyPrefix != key[:13] || ten.Status != "active" {
		t.Fatalf("tenant %+v key %q", ten, key)
	}
	var hash []byte
	if err := e.pool.QueryRow(e.ctx, `SELECT api_key_hash FROM tenants WHERE id = $1`, ten.ID).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	if string(hash) != string(credentials.Hash(key)) {
		t.Fatal("the stored hash is not the key's SHA-256")
	}
	if got, err := e.st.TenantByAPIKey(e.ctx, key); err != nil || got.ID != ten.ID {
		t.Fatalf("TenantByAPIKey: %+v %v", got, err)
	}
	if _, _, err := e.op.CreateTenant(e.ctx, "ACME"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate name in another case: %v", err)
	}
	for _, bad := range []string{"", " acme", "acme ", "a\x00b", "a\nb", strings.Repeat("x", 101)} {
		if _, _, err := e.op.CreateTenant(e.ctx, bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CreateTenant(%q): %v, want ErrInvalid", bad, err)
		}
	}
	a := e.audits("")
	if len(a) != 1 || a[0].Action != "tenants.create" || a[0].Actor != "test:alice" || a[0].Resource != "tenant:"+ten.ID {
		t.Fatalf("audit rows (failed attempts must write none): %+v", a)
	}
	var changes struct {
		After map[string]any `json:"after"`
	}
	if err := json.Unmarshal(a[0].Changes, &changes); err != nil || changes.After["name"] != "Acme" || changes.After["api_key_prefix"] != ten.APIKeyPrefix {
		t.Fatalf("changes %s: %v", a[0].Changes, err)
	}
	e.noSecrets(key, key[13:])
}

func TestOperatorRotateAPIKeyGrace(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, key1 := e.tenant("acme")
	valid := func(key string) bool {
		t.Helper()
		got, err := e.st.TenantByAPIKey(e.ctx, key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil && got.ID == ten.ID
	}

	before := time.Now()
	r1, err := e.op.RotateAPIKey(e.ctx, ten.ID, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key2 := r1.Key
	if key2 == key1 || r1.PreviousPrefix != key1[:13] || r1.Tenant.APIKeyPrefix != key2[:13] || r1.DroppedPrevious {
		t.Fatalf("rotation %+v", r1)
	}
	if d := r1.PreviousExpiresAt.Sub(before); d < 24*time.Hour-time.Minute || d > 24*time.Hour+time.Minute {
		t.Fatalf("previous key expires %s after the rotation, want 24h", d)
	}
	if !valid(key1) || !valid(key2) {
		t.Fatalf("within the grace both keys work: old %v new %v", valid(key1), valid(key2))
	}
	// Until when each key works without another change: the previous key until its
	// grace ends, the current one without an end.
	if _, until, err := e.st.TenantByAPIKeyUntil(e.ctx, key1); err != nil || !until.Equal(r1.PreviousExpiresAt) {
		t.Fatalf("previous key until %v (%v), want %v", until, err, r1.PreviousExpiresAt)
	}
	if _, until, err := e.st.TenantByAPIKeyUntil(e.ctx, key2); err != nil || !until.IsZero() {
		t.Fatalf("current key until %v (%v), want no end", until, err)
	}
	// The grace ends (moved into the past rather than waited for).
	if _, err := e.pool.Exec(e.ctx, `UPDATE tenants SET previous_api_key_expires_at = now() - interval '1 second' WHERE id = $1`, ten.ID); err != nil {
		t.Fatal(err)
	}
	if valid(key1) || !valid(key2) {
		t.Fatalf("after the grace: old %v (want false) new %v (want true)", valid(key1), valid(key2))
	}

	// Two rotations within one grace: the one slot keeps the key just replaced; the
	// key before it stops at once.
	r2, err := e.op.RotateAPIKey(e.ctx, ten.ID, time.Hour)
	if err != nil || r2.DroppedPrevious {
		t.Fatalf("rotation 2: %+v %v (the previous key had expired: nothing dropped)", r2, err)
	}
	r3, err := e.op.RotateAPIKey(e.ctx, ten.ID, time.Hour)
	if err != nil || !r3.DroppedPrevious || r3.PreviousPrefix != r2.Key[:13] {
		t.Fatalf("rotation 3: %+v %v", r3, err)
	}
	if valid(key2) || !valid(r2.Key) || !valid(r3.Key) {
		t.Fatalf("after two rotations within the grace: key2 %v r2 %v r3 %v", valid(key2), valid(r2.Key), valid(r3.Key))
	}

	// No grace: the replaced key stops at once.
	r4, err := e.op.RotateAPIKey(e.ctx, ten.ID, 0)
	if err != nil || !r4.PreviousExpiresAt.IsZero() {
		t.Fatalf("rotation without grace: %+v %v", r4, err)
	}
	if valid(r3.Key) || valid(r2.Key) || !valid(r4.Key) {
		t.Fatal("without grace only the new key works")
	}
	var prev []byte
	if err := e.pool.QueryRow(e.ctx, `SELECT previous_api_key_hash FROM tenants WHERE id = $1`, ten.ID).Scan(&prev); err != nil || prev != nil {
		t.Fatalf("previous hash %x %v, want NULL", prev, err)
	}

	for _, g := range []time.Duration{-time.Second, store.MaxKeyGrace + time.Second} {
		if _, err := e.op.RotateAPIKey(e.ctx, ten.ID, g); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("grace %s: %v", g, err)
		}
	}
	if _, err := e.op.RotateAPIKey(e.ctx, "00000000-0000-0000-0000-000000000000", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown tenant: %v", err)
	}
	if _, err := e.op.RotateAPIKey(e.ctx, "nope", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("malformed id: %v", err)
	}
	rot := 0
	for _, a := range e.audits("tenant:" + ten.ID) {
		if a.Action == "tenants.rotate_key" {
			rot++
		}
	}
	if rot != 4 {
		t.Errorf("%d rotation audit rows, want 4", rot)
	}
	e.noSecrets(key1, key2, r2.Key, r3.Key, r4.Key, key1[13:], r4.Key[13:])
}

func TestOperatorDeactivateTenant(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, key := e.tenant("acme")
	got, changed, err := e.op.DeactivateTenant(e.ctx, ten.ID)
	if err != nil || !changed || got.Status != "inactive" {
		t.Fatalf("deactivate: %+v %v %v", got, changed, err)
	}
	if _, err := e.st.TenantByAPIKey(e.ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an inactive tenant's key: %v", err)
	}
	if _, changed, err := e.op.DeactivateTenant(e.ctx, ten.ID); err != nil || changed {
		t.Fatalf("second deactivate: %v %v", changed, err)
	}
	if a := e.audits("tenant:" + ten.ID); len(a) != 2 || a[1].Action != "tenants.deactivate" ||
		string(a[1].Changes) != `{"after": {"status": "inactive"}, "before": {"status": "active"}}` {
		t.Fatalf("audit: %+v", a)
	}
	if _, _, err := e.op.DeactivateTenant(e.ctx, "00000000-0000-0000-0000-000000000000"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown tenant: %v", err)
	}
}

func TestOperatorCreateChannel(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, _ := e.tenant("acme")
	c, sec, err := e.op.CreateChannel(e.ctx, ten.ID, "web", "webhook", "inbound")
	if err != nil {
		t.Fatal(err)
	}
	if c.Type != "webhook" || c.Mode != "inbound" || c.TenantID != ten.ID || !c.Active() || !c.RequireSignature {
		t.Fatalf("channel %+v", c)
	}
	if got, err := e.st.ChannelBySecret(e.ctx, sec.Secret); err != nil || got.ID != c.ID {
		t.Fatalf("ChannelBySecret: %v", err)
	}
	if got, err := e.st.ChannelByPublishableKey(e.ctx, sec.Publishable); err != nil || got.ID != c.ID {
		t.Fatalf("ChannelByPublishableKey: %v", err)
	}
	if _, got, err := e.st.InboundChannel(e.ctx, c.ID); err != nil || string(got) != sec.Secret {
		t.Fatalf("sealed secret does not open to the secret: %v", err)
	}
	var sealed []byte
	if err := e.pool.QueryRow(e.ctx, `SELECT secret_ciphertext FROM channels WHERE id = $1`, c.ID).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sealed), sec.Secret) {
		t.Fatal("the secret is stored in plaintext")
	}
	if _, _, err := e.op.CreateChannel(e.ctx, ten.ID, "web", "echo", "duplex"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate channel name: %v", err)
	}
	other, _ := e.tenant("other")
	if _, _, err := e.op.CreateChannel(e.ctx, other.ID, "web", "echo", "duplex"); err != nil {
		t.Fatalf("the same name in another tenant: %v", err)
	}
	for _, tc := range [][3]string{{"x", "sms", "duplex"}, {"x", "echo", "both"}, {"", "echo", "duplex"}} {
		if _, _, err := e.op.CreateChannel(e.ctx, ten.ID, tc[0], tc[1], tc[2]); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CreateChannel(%q): %v, want ErrInvalid", tc, err)
		}
	}
	if _, _, err := e.op.CreateChannel(e.ctx, "00000000-0000-0000-0000-000000000000", "x", "echo", "duplex"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown tenant: %v", err)
	}
	unsealed := store.New(e.pool, nil, activity.DefaultLimits).As("test")
	if _, _, err := unsealed.CreateChannel(e.ctx, ten.ID, "y", "echo", "duplex"); !errors.Is(err, store.ErrNoEncryptionKey) {
		t.Fatalf("without ENCRYPTION_KEY: %v", err)
	}
	a := e.audits("channel:" + c.ID)
	if len(a) != 1 || a[0].Action != "channels.create" {
		t.Fatalf("audit %+v", a)
	}
	var changes struct {
		After map[string]any `json:"after"`
	}
	if err := json.Unmarshal(a[0].Changes, &changes); err != nil || changes.After["tenant_id"] != ten.ID || changes.After["mode"] != "inbound" {
		t.Fatalf("changes %s %v", a[0].Changes, err)
	}
	e.noSecrets(sec.Secret, sec.Publishable)
}

func TestOperatorLimitsSetMergeClear(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, _ := e.tenant("acme")
	other, _ := e.tenant("other")

	ch, err := e.op.SetLimits(e.ctx, ten.ID, buckets.Overrides{buckets.Inbound: {Count: 2000, Window: time.Second}})
	if err != nil || !ch.Changed || len(ch.Before.Overrides) != 0 {
		t.Fatalf("set: %+v %v", ch, err)
	}
	ch, err = e.op.SetLimits(e.ctx, ten.ID, buckets.Overrides{buckets.ActivityCreate: {Count: 300, Window: time.Minute}})
	if err != nil || !ch.Changed {
		t.Fatal(err)
	}
	want := `{"inbound": {"limit": 2000, "scale_ms": 1000}, "activity_create": {"limit": 300, "scale_ms": 60000}}`
	if got := e.storedLimits(ten.ID); got != want {
		t.Fatalf("merged limits %s, want %s", got, want)
	}
	if got := e.storedLimits(other.ID); got != `{}` {
		t.Fatalf("another tenant's limits changed: %s", got)
	}
	// The same values again: nothing written, nothing audited.
	ch, err = e.op.SetLimits(e.ctx, ten.ID, buckets.Overrides{buckets.Inbound: {Count: 2000, Window: time.Second}})
	if err != nil || ch.Changed {
		t.Fatalf("unchanged set: %+v %v", ch, err)
	}
	l, err := e.st.Limits(e.ctx, ten.ID)
	if err != nil || l.Invalid != nil || len(l.Overrides) != 2 || l.Overrides[buckets.ActivityCreate] != (buckets.Limit{Count: 300, Window: time.Minute}) {
		t.Fatalf("Limits: %+v %v", l, err)
	}

	for name, bad := range map[string]buckets.Overrides{
		"not overridable": {buckets.LoginIP: {Count: 1, Window: time.Second}},
		"unknown":         {"nope": {Count: 1, Window: time.Second}},
		"zero limit":      {buckets.Upload: {Count: 0, Window: time.Second}},
		"zero window":     {buckets.Upload: {Count: 1}},
		"sub-ms window":   {buckets.Upload: {Count: 1, Window: 1500 * time.Microsecond}},
		"too long":        {buckets.Upload: {Count: 1, Window: 25 * time.Hour}},
		"empty":           {},
	} {
		if _, err := e.op.SetLimits(e.ctx, ten.ID, bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := e.op.ClearLimits(e.ctx, ten.ID, []string{"login_ip"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("clear login_ip: %v", err)
	}
	if _, err := e.op.SetLimits(e.ctx, "00000000-0000-0000-0000-000000000000", buckets.Overrides{buckets.Upload: {Count: 1, Window: time.Second}}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown tenant: %v", err)
	}

	ch, err = e.op.ClearLimits(e.ctx, ten.ID, []string{buckets.Inbound, buckets.Upload})
	if err != nil || !ch.Changed || len(ch.After) != 1 {
		t.Fatalf("clear inbound: %+v %v", ch, err)
	}
	if got := e.storedLimits(ten.ID); got != `{"activity_create": {"limit": 300, "scale_ms": 60000}}` {
		t.Fatalf("after clearing inbound: %s", got)
	}
	if ch, err := e.op.ClearLimits(e.ctx, ten.ID, []string{buckets.Inbound}); err != nil || ch.Changed {
		t.Fatalf("clearing what is not set: %+v %v", ch, err)
	}
	if ch, err := e.op.ClearLimits(e.ctx, ten.ID, nil); err != nil || !ch.Changed || len(ch.After) != 0 {
		t.Fatalf("clear all: %+v %v", ch, err)
	}
	if got := e.storedLimits(ten.ID); got != `{}` {
		t.Fatalf("after clearing all: %s", got)
	}

	a := e.audits("tenant:" + ten.ID)
	var actions []string
	for _, x := range a {
		actions = append(actions, x.Action)
	}
	if got := strings.Join(actions, ","); got != "tenants.create,limits.set,limits.set,limits.clear,limits.clear" {
		t.Fatalf("audit actions %s", got)
	}
	if got := string(a[2].Changes); got != `{"after": {"inbound": {"limit": 2000, "scale_ms": 1000}, "activity_create": {"limit": 300, "scale_ms": 60000}}, "before": {"inbound": {"limit": 2000, "scale_ms": 1000}}}` {
		t.Fatalf("limits.set changes %s", got)
	}
}

// TestOperatorLimitsInvalidStoredDocument: a document edited by hand that the sidecars'
// parser refuses is reported, blocks a merge, and is repaired by clearing everything.
func TestOperatorLimitsInvalidStoredDocument(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, _ := e.tenant("acme")
	if _, err := e.pool.Exec(e.ctx, `UPDATE tenants SET limits = '{"login_ip":{"limit":1,"scale_ms":1000}}' WHERE id = $1`, ten.ID); err != nil {
		t.Fatal(err)
	}
	l, err := e.st.Limits(e.ctx, ten.ID)
	if err != nil || l.Invalid == nil || l.Overrides != nil {
		t.Fatalf("Limits: %+v %v", l, err)
	}
	if _, err := e.op.SetLimits(e.ctx, ten.ID, buckets.Overrides{buckets.Upload: {Count: 5, Window: time.Second}}); !errors.Is(err, store.ErrInvalid) ||
		!strings.Contains(err.Error(), "login_ip") {
		t.Fatalf("set over an invalid document: %v", err)
	}
	ch, err := e.op.ClearLimits(e.ctx, ten.ID, nil)
	if err != nil || !ch.Changed || ch.Before.Invalid == nil {
		t.Fatalf("clear: %+v %v", ch, err)
	}
	if got := e.storedLimits(ten.ID); got != `{}` {
		t.Fatalf("after the repair: %s", got)
	}
}

// waitNotification waits up to d for a notification on conn.
func waitNotification(ctx context.Context, conn *pgx.Conn, d time.Duration) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		return "", false
	}
	return n.Payload, true
}

func listen(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+store.NotifyRateLimitOverrides); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestLimitsNotifyOnCommitOnly holds the change's transaction open after its NOTIFY (an
// exclusive lock on audit_logs stops the audit insert, which comes after the NOTIFY): no
// notification arrives while it is open, one arrives when it commits, and none when it
// rolls back.
func TestLimitsNotifyOnCommitOnly(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, _ := e.tenant("acme")
	conn := listen(t, e.url)
	if _, ok := waitNotification(e.ctx, conn, 100*time.Millisecond); ok {
		t.Fatal("a notification before any change")
	}

	lockAudit := func() pgx.Tx {
		tx, err := e.pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Released on failure too: the pool closes only when every connection is back.
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(e.ctx, `LOCK TABLE audit_logs IN EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	// blocked waits until a backend waits for a lock on audit_logs.
	blocked := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_locks
				WHERE relation = 'audit_logs'::regclass AND NOT granted`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the change never waited on the audit_logs lock")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Commit.
	lock := lockAudit()
	done := make(chan error, 1)
	go func() {
		_, err := e.op.SetLimits(e.ctx, ten.ID, buckets.Overrides{buckets.Upload: {Count: 7, Window: time.Second}})
		done <- err
	}()
	blocked()
	if p, ok := waitNotification(e.ctx, conn, 300*time.Millisecond); ok {
		t.Fatalf("notification %q while the change's transaction is still open", p)
	}
	if got := e.storedLimits(ten.ID); got != `{}` {
		t.Fatalf("uncommitted limits visible: %s", got)
	}
	if err := lock.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SetLimits did not finish")
	}
	if p, ok := waitNotification(e.ctx, conn, 5*time.Second); !ok || p != ten.ID {
		t.Fatalf("after commit: notification %q %v, want the tenant id %s", p, ok, ten.ID)
	}

	// Rollback: the change is cancelled while it waits.
	lock = lockAudit()
	cctx, cancel := context.WithCancel(e.ctx)
	go func() {
		_, err := e.op.SetLimits(cctx, ten.ID, buckets.Overrides{buckets.Upload: {Count: 9, Window: time.Second}})
		done <- err
	}()
	blocked()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled SetLimits succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled SetLimits did not return")
	}
	if err := lock.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if p, ok := waitNotification(e.ctx, conn, 500*time.Millisecond); ok {
		t.Fatalf("notification %q from a rolled-back change", p)
	}
	if got := e.storedLimits(ten.ID); got != `{"upload": {"limit": 7, "scale_ms": 1000}}` {
		t.Fatalf("limits after the rollback: %s", got)
	}
	if a := e.audits("tenant:" + ten.ID); len(a) != 2 {
		t.Fatalf("%d audit rows, want 2 (create, one set)", len(a))
	}
}

func TestNotifyChannelIsTheSidecars(t *testing.T) {
	if store.NotifyRateLimitOverrides != sidecartenants.NotifyChannel {
		t.Fatalf("core notifies %q, the sidecar listens on %q", store.NotifyRateLimitOverrides, sidecartenants.NotifyChannel)
	}
	if store.NotifyTenantChanges != sidecartenants.NotifyTenantChanges {
		t.Fatalf("core notifies %q, the sidecar listens on %q", store.NotifyTenantChanges, sidecartenants.NotifyTenantChanges)
	}
}

func TestOperatorCreateAdminUser(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	hash, err := passwords.HashWith("a long enough password", passwords.Params{Memory: 64, Time: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	u, err := e.op.CreateAdminUser(e.ctx, "Ops@Example.com", hash, true)
	if err != nil || u.Email != "Ops@Example.com" || !u.MustChangePassword || u.Role != "admin" || u.Status != "active" {
		t.Fatalf("admin %+v %v", u, err)
	}
	var stored string
	if err := e.pool.QueryRow(e.ctx, `SELECT password_hash FROM admin_users WHERE id = $1`, u.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if ok, err := passwords.Verify("a long enough password", stored); !ok || err != nil {
		t.Fatalf("stored hash does not verify: %v %v", ok, err)
	}
	if _, err := e.op.CreateAdminUser(e.ctx, "ops@example.COM", hash, false); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate email in another case: %v", err)
	}
	for _, bad := range []string{"", "ops", "Ops <ops@example.com>", "ops@example.com\n"} {
		if _, err := e.op.CreateAdminUser(e.ctx, bad, hash, false); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("email %q: %v", bad, err)
		}
	}
	a := e.audits("admin_user:" + u.ID)
	if len(a) != 1 || a[0].Action != "admins.create" ||
		string(a[0].Changes) != `{"after": {"role": "admin", "email": "Ops@Example.com", "status": "active", "must_change_password": true}}` {
		t.Fatalf("audit %+v", a)
	}
	e.noSecrets(hash, "a long enough password")
}

func TestRedactChanges(t *testing.T) {
	got, err := store.RedactChanges(map[string]any{
		"api_key": "cvg_live_x", "api_key_prefix": "cvg_live_abcd", "secret": "s", "channel_secret": "s",
		"publishable_key": "cvg_pk_x", "password": "p", "new_password": "p", "password_hash": "$argon2id$",
		"must_change_password": true, "token": "t", "previous_api_key_expires_at": "2026-01-01T00:00:00Z",
		"nested": []any{map[string]any{"totp_secret": "x", "name": "n"}}, "after": map[string]any{"key": "k", "limit": 5},
		"limits":     map[string]any{"token_generate": map[string]any{"limit": 5}, "publishable_token": map[string]any{"limit": 6}},
		"otp_secret": 123456,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"after":{"key":"[redacted]","limit":5},"api_key":"[redacted]","api_key_prefix":"cvg_live_abcd",` +
		`"channel_secret":"[redacted]","limits":{"publishable_token":{"limit":6},"token_generate":{"limit":5}},"must_change_password":true,"nested":[{"name":"n","totp_secret":"[redacted]"}],` +
		`"new_password":"[redacted]","otp_secret":"[redacted]","password":"[redacted]","password_hash":"[redacted]",` +
		`"previous_api_key_expires_at":"2026-01-01T00:00:00Z","publishable_key":"[redacted]","secret":"[redacted]","token":"[redacted]"}`
	if string(got) != want {
		t.Fatalf("redacted\n%s\nwant\n%s", got, want)
	}
	if got, _ := store.RedactChanges(nil); string(got) != `{}` {
		t.Errorf("nil: %s", got)
	}
	if got, _ := store.RedactChanges("x"); string(got) != `{"value":"x"}` {
		t.Errorf("a string: %s", got)
	}
}

// TestAuditRedactsWhatCallersPass: the stored row is redacted even when a caller passes a
// secret by mistake.
func TestAuditRedactsWhatCallersPass(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	if err := e.st.Audit(e.ctx, "test", "sessions.create", "admin_user:x", map[string]any{"password": "hunter2hunter2", "ip": "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	a := e.audits("admin_user:x")
	if len(a) != 1 || string(a[0].Changes) != `{"ip": "127.0.0.1", "password": "[redacted]"}` {
		t.Fatalf("audit %+v", a)
	}
}
