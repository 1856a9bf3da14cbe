package migrations

import (
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/pgserver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(testContext(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func tableExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var exists bool
	if err := conn.QueryRow(testContext(t), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

func TestUpIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url := pgserver.NewTestDatabase(t, nil)
	sqlFiles, err := fs.Glob(files, "*.sql")
	if err != nil || len(sqlFiles) < 2 {
		t.Fatalf("embedded migrations: %v %v", sqlFiles, err)
	}
	want := int64(len(sqlFiles))
	for i := range 2 {
		if err := Up(ctx, url); err != nil {
			t.Fatalf("Up #%d: %v", i+1, err)
		}
		current, latest, err := Version(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if current != want || latest != want {
			t.Errorf("after Up #%d: version %d of %d, want %d of %d", i+1, current, latest, want, want)
		}
	}
	conn := connect(t, url)
	var applied int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM goose_db_version WHERE version_id > 0").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied != want {
		t.Errorf("%d migrations recorded, want %d", applied, want)
	}
	for _, table := range []string{"tenants", "channels", "conversations", "activities", "attachments",
		"admin_users", "tenant_users", "sessions", "password_resets", "audit_logs"} {
		if !tableExists(t, conn, table) {
			t.Errorf("table %s missing", table)
		}
	}
}

func TestDown(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url := pgserver.NewTestDatabase(t, Up)
	config, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*config)
	defer db.Close()
	p, err := newProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, url)
	for _, table := range []string{"tenants", "channels"} {
		if tableExists(t, conn, table) {
			t.Errorf("table %s still there after down", table)
		}
	}
	if err := Up(ctx, url); err != nil {
		t.Fatalf("Up after down: %v", err)
	}
	if !tableExists(t, conn, "channels") {
		t.Error("Up after down did not recreate channels")
	}
}

func TestInvalidURLIsNotEchoed(t *testing.T) {
	err := Up(context.Background(), "postgres://user:s3cret@host:notaport/db")
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("err = %v", err)
	}
}

func hash(t *testing.T) []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// sqlState returns the SQLSTATE of err, or "" if it is not a PostgreSQL error.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

const (
	uniqueViolation = "23505"
	checkViolation  = "23514"
	notNull         = "23502"
)

func TestConstraints(t *testing.T) {
	t.Parallel()
	conn := connect(t, pgserver.NewTestDatabase(t, Up))
	ctx := testContext(t)

	newTenant := func(name string, keyHash []byte) (string, error) {
		var id string
		err := conn.QueryRow(ctx, `INSERT INTO tenants (name, api_key_hash, api_key_prefix)
			VALUES ($1, $2, 'cvg_live_abcd') RETURNING id`, name, keyHash).Scan(&id)
		return id, err
	}
	mustTenant := func(t *testing.T, name string) string {
		t.Helper()
		id, err := newTenant(name, hash(t))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	newChannel := func(t *testing.T, tenantID, name string) error {
		_, err := conn.Exec(ctx, `INSERT INTO channels (tenant_id, name, type, secret_hash, secret_ciphertext)
			VALUES ($1, $2, 'echo', $3, $4)`, tenantID, name, hash(t), []byte("sealed"))
		return err
	}
	wantState := func(t *testing.T, err error, state string) {
		t.Helper()
		if sqlState(err) != state {
			t.Errorf("err = %v, want SQLSTATE %s", err, state)
		}
	}

	t.Run("tenant defaults", func(t *testing.T) {
		id := mustTenant(t, "Defaults")
		var status, limits string
		var inserted, updated time.Time
		if err := conn.QueryRow(ctx, "SELECT status, limits::text, inserted_at, updated_at FROM tenants WHERE id = $1", id).
			Scan(&status, &limits, &inserted, &updated); err != nil {
			t.Fatal(err)
		}
		if status != "active" || limits != "{}" || inserted.IsZero() || updated.IsZero() {
			t.Errorf("status %q, limits %q, inserted_at %v, updated_at %v", status, limits, inserted, updated)
		}
	})
	t.Run("tenant name unique ignoring case", func(t *testing.T) {
		mustTenant(t, "Acme")
		_, err := newTenant("ACME", hash(t))
		wantState(t, err, uniqueViolation)
	})
	t.Run("tenant status", func(t *testing.T) {
		id := mustTenant(t, "Status")
		_, err := conn.Exec(ctx, "UPDATE tenants SET status = 'deleted' WHERE id = $1", id)
		wantState(t, err, checkViolation)
		if _, err := conn.Exec(ctx, "UPDATE tenants SET status = 'inactive' WHERE id = $1", id); err != nil {
			t.Error(err)
		}
	})
	t.Run("tenant limits", func(t *testing.T) {
		id := mustTenant(t, "Limits")
		for _, bad := range []string{`[]`, `"x"`, `1`, `null`} {
			_, err := conn.Exec(ctx, "UPDATE tenants SET limits = $2::jsonb WHERE id = $1", id, bad)
			wantState(t, err, checkViolation)
		}
		_, err := conn.Exec(ctx, "UPDATE tenants SET limits = NULL WHERE id = $1", id)
		wantState(t, err, notNull)
		if _, err := conn.Exec(ctx, `UPDATE tenants SET limits = '{"inbound":{"limit":2000,"scale_ms":1000}}' WHERE id = $1`, id); err != nil {
			t.Error(err)
		}
	})
	t.Run("tenant key hashes", func(t *testing.T) {
		_, err := newTenant("Short", []byte("short"))
		wantState(t, err, checkViolation)
		id := mustTenant(t, "Rotated")
		var current []byte
		if err := conn.QueryRow(ctx, "SELECT api_key_hash FROM tenants WHERE id = $1", id).Scan(&current); err != nil {
			t.Fatal(err)
		}
		_, err = newTenant("Copycat", current)
		wantState(t, err, uniqueViolation)
		_, err = conn.Exec(ctx, "UPDATE tenants SET previous_api_key_hash = $2 WHERE id = $1", id, hash(t))
		wantState(t, err, checkViolation) // an expiry is required with a previous key
		if _, err := conn.Exec(ctx, `UPDATE tenants SET previous_api_key_hash = api_key_hash, api_key_hash = $2,
			previous_api_key_expires_at = now() + interval '24 hours' WHERE id = $1`, id, hash(t)); err != nil {
			t.Error(err)
		}
	})
	t.Run("channel names unique per tenant", func(t *testing.T) {
		a, b := mustTenant(t, "Tenant A"), mustTenant(t, "Tenant B")
		if err := newChannel(t, a, "support"); err != nil {
			t.Fatal(err)
		}
		wantState(t, newChannel(t, a, "support"), uniqueViolation)
		if err := newChannel(t, b, "support"); err != nil {
			t.Errorf("same name in another tenant: %v", err)
		}
	})
	t.Run("channel defaults and checks", func(t *testing.T) {
		id := mustTenant(t, "Channels")
		if err := newChannel(t, id, "web"); err != nil {
			t.Fatal(err)
		}
		var mode, status string
		var requireSignature bool
		if err := conn.QueryRow(ctx, "SELECT mode, status, require_signature FROM channels WHERE tenant_id = $1", id).
			Scan(&mode, &status, &requireSignature); err != nil {
			t.Fatal(err)
		}
		if mode != "duplex" || status != "active" || !requireSignature {
			t.Errorf("mode %q, status %q, require_signature %v", mode, status, requireSignature)
		}
		for _, set := range []string{"type = 'sms'", "mode = 'both'", "status = 'gone'", "publishable_key_hash = '\\x00'"} {
			_, err := conn.Exec(ctx, "UPDATE channels SET "+set+" WHERE tenant_id = $1", id)
			wantState(t, err, checkViolation)
		}
	})
	t.Run("deleting a tenant deletes its channels", func(t *testing.T) {
		id := mustTenant(t, "Doomed")
		if err := newChannel(t, id, "c"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "DELETE FROM tenants WHERE id = $1", id); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM channels WHERE tenant_id = $1", id).Scan(&n); err != nil || n != 0 {
			t.Errorf("%d channels left (err %v)", n, err)
		}
	})
}

// The core's pool reads pool settings from DATABASE_URL; migrating through the same URL
// must not send them to PostgreSQL, which refuses unknown parameters.
func TestUpAcceptsPoolSettings(t *testing.T) {
	t.Parallel()
	url := pgserver.NewTestDatabase(t, nil)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	if err := Up(testContext(t), url+sep+"pool_max_conns=3&pool_max_conn_lifetime=1h"); err != nil {
		t.Fatalf("Up with pool settings in the URL: %v", err)
	}
	if !tableExists(t, connect(t, url), "activities") {
		t.Fatal("activities missing after Up")
	}
}
