package tenants

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// fakeClock is the directory's clock: TTLs pass only when a test moves it.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// recorder counts the directory's metric events.
type recorder struct {
	mu    sync.Mutex
	cache map[string]int // "cache/result"
	db    map[string]int // by op
}

func newRecorder() *recorder { return &recorder{cache: map[string]int{}, db: map[string]int{}} }

func (r *recorder) CacheCounter(cache, result string) Counter {
	return recordedCounter{r, cache + "/" + result}
}

type recordedCounter struct {
	r   *recorder
	key string
}

func (c recordedCounter) Inc() {
	c.r.mu.Lock()
	c.r.cache[c.key]++
	c.r.mu.Unlock()
}

func (r *recorder) DBError(op string) {
	r.mu.Lock()
	r.db[op]++
	r.mu.Unlock()
}

func (r *recorder) count(cache, result string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cache[cache+"/"+result]
}

// events is the number of cache events of one cache, whatever their result.
func (r *recorder) events(cache string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, v := range r.cache {
		if strings.HasPrefix(k, cache+"/") {
			n += v
		}
	}
	return n
}

func (r *recorder) dbError(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.db[op]
}

func (r *recorder) dbErrors() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.db {
		n += v
	}
	return n
}

// logBuffer collects the directory's log output.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) count(substr string) int { return strings.Count(l.String(), substr) }

// env is a directory over a real database, with an administrative pool of its own for
// the test's SQL.
type env struct {
	t     *testing.T
	url   string
	d     *Directory
	pool  *pgxpool.Pool // the directory's
	admin *pgxpool.Pool
	clock *fakeClock
	rec   *recorder
	logs  *logBuffer
}

// newEnv builds a directory over url (a fresh test database when url is ""). Zero
// options take test defaults: a lookup waits up to 5 s, so that tests of what a lookup
// answers do not depend on how fast the machine is; the tests of the bound set Wait.
func newEnv(t *testing.T, url string, o Options) *env {
	t.Helper()
	if url == "" {
		url = pgserver.NewTestDatabase(t, migrations.Up)
	}
	e := &env{t: t, url: url, clock: newClock(), rec: newRecorder(), logs: &logBuffer{}}
	e.pool = newPool(t, url)
	e.admin = newPool(t, url)
	if o.Wait == 0 {
		o.Wait = 5 * time.Second
	}
	o.Now = e.clock.Now
	o.Metrics = e.rec
	o.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.d = New(e.pool, o)
	return e
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// listen runs the directory's Listen until the test ends.
func (e *env) listen() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.d.Listen(ctx)
	}()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			e.t.Error("Listen did not return within 10 s of its context ending")
		}
	})
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.admin.Exec(ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) queryInt(sql string, args ...any) int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := e.admin.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// setLimits changes a tenant's overrides, announcing the change when notify is set, in
// one transaction as the core does.
func (e *env) setLimits(tenantID, doc string, notify bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := e.admin.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	if _, err := tx.Exec(ctx, `UPDATE tenants SET limits = $2::jsonb, updated_at = now() WHERE id = $1`, tenantID, doc); err != nil {
		e.t.Fatal(err)
	}
	if notify {
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, tenantID); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
}

func newKey(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// addTenant inserts an active tenant whose API key is key and returns its id.
func (e *env) addTenant(key string) string {
	e.t.Helper()
	var id string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := e.admin.QueryRow(ctx, `
		INSERT INTO tenants (name, api_key_hash, api_key_prefix) VALUES ($1, $2, $3)
		RETURNING id::text`, newKey("tenant-"), hash(key), key[:8]).Scan(&id)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// addChannel inserts an active channel of tenantID with the given secret and, unless it
// is "", publishable key, and returns its id.
func (e *env) addChannel(tenantID, secret, publishable string) string {
	e.t.Helper()
	var pub []byte
	if publishable != "" {
		pub = hash(publishable)
	}
	var id string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := e.admin.QueryRow(ctx, `
		INSERT INTO channels (tenant_id, name, type, secret_hash, secret_ciphertext, publishable_key_hash)
		VALUES ($1, $2, 'webhook', $3, '\x00'::bytea, $4) RETURNING id::text`,
		tenantID, newKey("channel-"), hash(secret), pub).Scan(&id)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// timed returns how long f took.
func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}
