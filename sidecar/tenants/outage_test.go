package tenants

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
)

// bound is how long any lookup may take when it waits at most Wait = 50 ms: the wait
// plus a margin for a busy machine under the race detector.
const (
	testWait = 50 * time.Millisecond
	bound    = 250 * time.Millisecond
)

func TestDatabaseDown(t *testing.T) {
	srv := pgserver.StartForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, srv.URL()); err != nil {
		t.Fatal(err)
	}
	const ttl = 30 * time.Second
	e := newEnv(t, srv.URL(), Options{Wait: testWait, CredentialTTL: ttl, OverrideTTL: ttl})
	key := newKey("ck_")
	id := e.addTenant(key)
	e.exec(`UPDATE tenants SET limits = $2 WHERE id = $1`, id, uploadLimit(6))
	secret := newKey("cs_")
	ch := e.addChannel(id, secret, "")
	e.listen()
	waitFor(t, 10*time.Second, "Listening", e.d.Listening)

	// Warm the cache. A loaded machine may take longer than Wait to answer the first
	// lookups, which then return Unavailable while the load goes on: retry until cached.
	waitFor(t, 10*time.Second, "the tenant to be cached", func() bool {
		got, st := e.d.TenantByAPIKey(key)
		return st == Found && got.ID == id
	})
	waitFor(t, 10*time.Second, "the channel to be cached", func() bool {
		_, st := e.d.ChannelBySecret(secret)
		return st == Found
	})
	waitFor(t, 10*time.Second, "the overrides to be cached", func() bool { return e.overrideIs(id, 6) })
	if !e.d.Healthy() || e.rec.dbErrors() != 0 {
		t.Fatal("unhealthy before the outage")
	}

	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(ttl + time.Second) // everything cached is now expired

	var slowest time.Duration
	lookup := func(f func()) {
		t.Helper()
		slowest = max(slowest, timed(f))
	}
	// Expired values are served stale, as found.
	lookup(func() {
		if got, st := e.d.TenantByAPIKey(key); st != Found || got != (Tenant{ID: id, Active: true}) {
			t.Errorf("cached key while the database is down: %+v, %v; want the stale tenant", got, st)
		}
	})
	lookup(func() {
		if got, st := e.d.ChannelBySecret(secret); st != Found || got.ID != ch {
			t.Errorf("cached secret while the database is down: %+v, %v; want the stale channel", got, st)
		}
	})
	lookup(func() {
		if !e.overrideIs(id, 6) {
			t.Error("cached overrides are not served while the database is down")
		}
	})
	// Uncached keys are unavailable, and no lookup waits on the database.
	for i := range 200 {
		lookup(func() {
			if got, st := e.d.TenantByAPIKey(newKey("ck_")); st != Unavailable || got != (Tenant{}) {
				t.Errorf("uncached key %d while the database is down: %+v, %v; want unavailable", i, got, st)
			}
		})
	}
	lookup(func() {
		if _, st := e.d.ChannelTenant("00000000-0000-4000-8000-000000000001"); st != Unavailable {
			t.Errorf("uncached channel while the database is down: %v; want unavailable", st)
		}
	})
	t.Logf("slowest of %d lookups while the database is down: %v", 204, slowest)
	if slowest > bound {
		t.Errorf("a lookup took %v while the database was down, more than %v", slowest, bound)
	}
	waitFor(t, 5*time.Second, "Healthy() to turn false", func() bool { return !e.d.Healthy() })
	if n := e.rec.count("api_keys", ResultFallback); n < 201 {
		t.Errorf("%d api_keys fallbacks counted, want at least 201", n)
	}
	if n := e.rec.count("overrides", ResultFallback); n < 1 {
		t.Errorf("%d overrides fallbacks counted, want at least 1", n)
	}
	if n := e.rec.dbErrors(); n < 1 {
		t.Error("no database error counted")
	}
	const down = "database unavailable"
	// The breaker opens before it writes its warning: on a loaded machine the test can
	// see the one before the other.
	waitFor(t, 5*time.Second, "the outage to be logged", func() bool { return e.logs.count(down) > 0 })
	if n := e.logs.count(down); n != 1 {
		t.Errorf("the outage was logged %d times, want once:\n%s", n, e.logs)
	}

	// Override notifications: the interruption is warned about once, however many
	// reconnection attempts fail.
	waitFor(t, 5*time.Second, "a failed reconnection of LISTEN", func() bool { return e.rec.dbError("listen") >= 2 })
	if n := e.logs.count(listenWarning); n != 1 {
		t.Errorf("the LISTEN interruption was warned about %d times, want once:\n%s", n, e.logs)
	}

	// The database comes back: the directory notices by itself.
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	waitFor(t, 15*time.Second, "Healthy() to turn true again", e.d.Healthy)
	t.Logf("healthy %v after the restart", time.Since(restarted))
	waitFor(t, 15*time.Second, "Listening() after the restart", e.d.Listening)
	if n := e.logs.count("database reachable again"); n != 1 {
		t.Errorf("the recovery was logged %d times, want once", n)
	}

	e.admin = newPool(t, srv.URL()) // the old one's connections died with the server
	key2 := newKey("ck_")
	id2 := e.addTenant(key2)
	// Fresh lookups are answered by the database again; the first ones may still meet a
	// connection that died with the old server.
	waitFor(t, 5*time.Second, "a fresh lookup to be found", func() bool {
		got, st := e.d.TenantByAPIKey(key2)
		return st == Found && got.ID == id2
	})
	waitFor(t, 5*time.Second, "the stale key to be reloaded", func() bool {
		hits := e.rec.count("api_keys", ResultHit)
		got, st := e.d.TenantByAPIKey(key)
		return st == Found && got.ID == id && e.rec.count("api_keys", ResultHit) == hits+1
	})
	if !e.d.Healthy() {
		t.Error("unhealthy after lookups succeeded")
	}
	for _, s := range []string{key, key2, secret} {
		if strings.Contains(e.logs.String(), s) {
			t.Errorf("a credential was logged:\n%s", e.logs)
		}
	}
}

// blockedLoads counts the directory's API key queries that wait on a lock.
func (e *env) blockedLoads() int {
	return e.queryInt(`
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'
		  AND query LIKE '%api_key_hash = $1%'`)
}

func TestSlowDatabase(t *testing.T) {
	const ttl = 30 * time.Second
	e := newEnv(t, "", Options{Wait: testWait, CredentialTTL: ttl, QueryTimeout: 20 * time.Second})
	warm := newKey("ck_")
	warmID := e.addTenant(warm)
	cold := newKey("ck_")
	coldID := e.addTenant(cold)
	var loads atomic.Int32
	load := e.d.apiKeys.load
	e.d.apiKeys.load = func(ctx context.Context, h [32]byte) (Tenant, bool, error) {
		loads.Add(1)
		return load(ctx, h)
	}
	waitFor(t, 10*time.Second, "the warm key to be cached", func() bool {
		_, st := e.d.TenantByAPIKey(warm)
		return st == Found
	})
	e.clock.Advance(ttl)
	// Counted from here: on a busy machine the warm-up's first lookup may already have
	// given up waiting for its load (a fallback) before the load filled the cache.
	fallbacks := e.rec.count("api_keys", ResultFallback)

	// Another transaction holds an ACCESS EXCLUSIVE lock on tenants: every SELECT on it
	// waits until the lock goes.
	ctx := t.Context()
	tx, err := e.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	if d := timed(func() {
		if got, st := e.d.TenantByAPIKey(warm); st != Found || got.ID != warmID {
			t.Errorf("expired key, slow database: %+v, %v; want the stale tenant", got, st)
		}
	}); d > bound {
		t.Errorf("expired key, slow database: took %v, more than %v", d, bound)
	}
	if d := timed(func() {
		if got, st := e.d.TenantByAPIKey(cold); st != Unavailable {
			t.Errorf("uncached key, slow database: %+v, %v; want unavailable", got, st)
		}
	}); d > bound {
		t.Errorf("uncached key, slow database: took %v, more than %v", d, bound)
	}
	waitFor(t, 5*time.Second, "both loads to wait on the lock", func() bool { return e.blockedLoads() == 2 })

	// More lookups of the same keys, concurrently, join the loads in flight: they all
	// answer within the bound and start no query of their own.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	for i := range 100 {
		k := cold
		if i%2 == 0 {
			k = warm
		}
		wg.Go(func() {
			var st Status
			d := timed(func() { _, st = e.d.TenantByAPIKey(k) })
			if (k == cold && st != Unavailable) || (k == warm && st != Found) {
				t.Errorf("concurrent lookup while blocked: %v", st)
			}
			mu.Lock()
			slowest = max(slowest, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("slowest of 100 concurrent lookups on a blocked database: %v", slowest)
	if slowest > bound {
		t.Errorf("a concurrent lookup took %v, more than %v", slowest, bound)
	}
	if n := e.blockedLoads(); n != 2 {
		t.Errorf("%d queries wait on the lock, want 2 (one load per key)", n)
	}
	if n := e.rec.count("api_keys", ResultFallback) - fallbacks; n != 102 {
		t.Errorf("%d fallbacks counted while blocked, want 102", n)
	}
	if !e.d.Healthy() {
		t.Error("a slow database made the directory unhealthy")
	}

	// The lock goes: the loads in flight finish and fill the cache.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct{ key, id string }{{cold, coldID}, {warm, warmID}} {
		waitFor(t, 5*time.Second, "the late load to fill the cache", func() bool {
			hits := e.rec.count("api_keys", ResultHit)
			got, st := e.d.TenantByAPIKey(k.key)
			return st == Found && got.ID == k.id && e.rec.count("api_keys", ResultHit) == hits+1
		})
	}
	if n := loads.Load(); n != 3 {
		t.Errorf("%d loads, want 3: the first of the warm key, then one per key while blocked", n)
	}
	if n := e.rec.dbErrors(); n != 0 {
		t.Errorf("%d database errors counted for a slow database", n)
	}
}
