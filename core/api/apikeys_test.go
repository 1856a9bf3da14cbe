package api_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/store"
)

// keyLookups counts the queries that look an API key up.
type keyLookups struct{ n atomic.Int64 }

func (k *keyLookups) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "api_key_hash = $1") {
		k.n.Add(1)
	}
	return ctx
}

func (k *keyLookups) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// newCountingEnv is an env whose API counts its API key lookups.
func newCountingEnv(t *testing.T) (*env, *keyLookups) {
	lookups := &keyLookups{}
	e := newEnv(t, envOptions{deps: func(d *api.Deps, dbURL string) {
		pc, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		pc.ConnConfig.Tracer = lookups
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		d.Store = store.New(pool, nil, d.Limits)
	}})
	return e, lookups
}

// remembered waits until the API answers a key from memory: once its Listener follows
// the tenants' changes, and the key was looked up once.
func remembered(t *testing.T, e *env, lookups *keyLookups, key, conv string) {
	t.Helper()
	waitFor(t, "the key answered from memory", func() bool {
		e.do("GET", "/api/v1/conversations/"+conv, nil, apiKey(key)).data(t, 200, &struct{}{})
		before := lookups.n.Load()
		e.do("GET", "/api/v1/conversations/"+conv, nil, apiKey(key)).data(t, 200, &struct{}{})
		return lookups.n.Load() == before
	})
}

func TestAPIKeysAreRememberedUntilTheyChange(t *testing.T) {
	e, lookups := newCountingEnv(t)
	s := e.setup("webhook")
	remembered(t, e, lookups, s.key, s.conv)
	before := lookups.n.Load()
	for range 20 {
		e.post(s.key, s.conv, map[string]any{"text": "hi"})
	}
	if n := lookups.n.Load() - before; n != 0 {
		t.Fatalf("%d key lookups for 20 requests with a remembered key", n)
	}
	// A key that does not authenticate is asked about every time, and refused.
	for range 2 {
		e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey("cvg_live_nope")).errorCode(t, 401, "unauthorized")
	}
	if n := lookups.n.Load() - before; n != 2 {
		t.Fatalf("%d key lookups for 2 requests with an unknown key, want 2", n)
	}

	// A rotation with a grace: both keys work, the previous one only until the grace
	// ends, which no notification announces.
	r, err := e.store.As("test").RotateAPIKey(context.Background(), s.tenantID, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	remembered(t, e, lookups, s.key, s.conv)
	remembered(t, e, lookups, r.Key, s.conv)
	time.Sleep(time.Until(r.PreviousExpiresAt) + 10*time.Millisecond)
	e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey(s.key)).errorCode(t, 401, "unauthorized")
	e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey(r.Key)).data(t, 200, &struct{}{})

	// A rotation without a grace: the previous key stops as its notification arrives.
	r2, err := e.store.As("test").RotateAPIKey(context.Background(), s.tenantID, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replaced key refused", func() bool {
		return e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey(r.Key)).status == 401
	})
	remembered(t, e, lookups, r2.Key, s.conv)

	// A deactivated tenant's key stops too.
	if _, _, err := e.store.As("test").DeactivateTenant(context.Background(), s.tenantID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deactivated tenant's key refused", func() bool {
		return e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey(r2.Key)).status == 401
	})
}

// A change whose notification is lost, because the LISTEN connection broke, is seen
// once the connection is back: the keys remembered before are forgotten.
func TestAPIKeysForgottenWhenTheListenerReconnects(t *testing.T) {
	e, lookups := newCountingEnv(t)
	s := e.setup("webhook")
	remembered(t, e, lookups, s.key, s.conv)
	// The tenant is deactivated in the transaction that ends the listener's backend, so
	// that the notification finds nobody listening (the core reconnects 100 ms later at
	// the earliest).
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE tenants SET status = 'inactive' WHERE id = $1`, s.tenantID); err != nil {
			return err
		}
		var ended int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %') t`).Scan(&ended)
		if err == nil && ended != 1 {
			t.Errorf("ended %d listening backends, want 1", ended)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deactivated tenant's key refused after the reconnection", func() bool {
		return e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey(s.key)).status == 401
	})
}
