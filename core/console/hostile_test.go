package console_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/console"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/sidecar/routes"
)

// The console's writes are counted per client IP in admin_write by the sidecar, like
// every other write endpoint: over the limit they are answered 429 before the core
// authenticates anything; reads are never counted.
func TestWritesAreRateLimited(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeWrite)
	ten, _ := e.tenant("acme")
	c := e.tokenClient(tok)
	limit := int(buckets.BuiltIn[len(buckets.BuiltIn)-1].Default.Count)
	if buckets.BuiltIn[len(buckets.BuiltIn)-1].Name != buckets.AdminWrite {
		t.Fatal("admin_write is not the last built-in bucket")
	}
	path := "/admin/api/v1/tenants/" + ten.ID + "/limits"
	var ok, limited atomic.Int64
	parallel(limit+10, func(i int) {
		r := c.do("PATCH", path, `{"limits":{"upload":{"limit":20,"scale_ms":1000}}}`)
		switch r.status {
		case 200:
			ok.Add(1)
		case 429:
			limited.Add(1)
			if r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), `"rate_limited"`) {
				t.Errorf("429 without retry-after or the envelope: %v %s", r.header, r.body)
			}
		default:
			t.Errorf("status %d: %s", r.status, r.body)
		}
	})
	if ok.Load() != int64(limit) || limited.Load() != 10 {
		t.Fatalf("%d allowed and %d limited of %d writes, want %d and 10", ok.Load(), limited.Load(), limit+10, limit)
	}
	// Unauthenticated floods of writes are counted too, so they stop at the edge.
	anon := e.client()
	for range limit {
		anon.do("POST", "/admin/api/v1/tenants/"+ten.ID+"/deactivate", nil)
	}
	anon.do("POST", "/admin/api/v1/tenants/"+ten.ID+"/deactivate", nil).errorCode(t, 429, "rate_limited")
	// Reads are not counted; another address has its own budget; the page forms count too.
	c.do("GET", path, nil).data(t, 200, nil)
	other := e.tokenClient(tok)
	other.do("DELETE", path, nil).data(t, 200, nil)
	for range limit {
		other.do("POST", "/admin/tenants/"+ten.ID+"/status", nil)
	}
	other.do("DELETE", path, nil).errorCode(t, 429, "rate_limited")
	// The next minute's window has room again.
	e.clock.advance(time.Minute)
	c.do("DELETE", path, nil).data(t, 200, nil)
}

// Every write route the console serves is one the sidecar counts (routes.AdminWrites),
// and every one the sidecar counts is served.
func TestEveryWriteIsCounted(t *testing.T) {
	e := newEnv(t, envOptions{noSidecar: true})
	cons, err := console.New(console.Options{Store: e.st, Pages: e.pages})
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	cons.Register(app)
	table, err := routes.New(routes.AdminWrites())
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, r := range app.GetRoutes(true) {
		if r.Method == "GET" || r.Method == "HEAD" {
			continue
		}
		served++
		path := strings.NewReplacer(":id", "00000000-0000-4000-8000-000000000000", ":bucket", "upload").Replace(r.Path)
		m, _, ok := table.Match(r.Method, path)
		if !ok || len(m.Steps) != 1 || m.Steps[0].Bucket != buckets.AdminWrite || m.Steps[0].Per != buckets.PerIP {
			t.Errorf("%s %s is not counted in admin_write per IP", r.Method, r.Path)
		}
	}
	if served != len(routes.AdminWrites()) {
		t.Errorf("the console serves %d write routes, the sidecar counts %d", served, len(routes.AdminWrites()))
	}
}

// Floods of requests without credentials, or with made-up tokens, are answered 401
// quickly and the core stays up.
func TestUnauthenticatedFlood(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.admin("alice@example.com")
	start := time.Now()
	var wrong atomic.Int64
	parallel(400, func(i int) {
		c := e.client()
		auth := ""
		if i%2 == 0 {
			auth = "Bearer cvg_admin_" + strings.Repeat(string(rune('A'+i%26)), 43)
		}
		r := c.do("GET", "/admin/api/v1/tenants?q="+strings.Repeat("x", i%300), nil, "authorization", auth)
		if r.status != 401 && r.status != 400 {
			wrong.Add(1)
		}
	})
	if wrong.Load() != 0 {
		t.Fatalf("%d answers were neither 401 nor 400", wrong.Load())
	}
	t.Logf("400 unauthenticated requests in %v", time.Since(start))
	u := e.admin("bob@example.com")
	_, tok := e.token(u, store.ScopeRead)
	e.tokenClient(tok).do("GET", "/admin/api/v1/tenants", nil).data(t, 200, nil)
}

// Hostile query strings and bodies on every endpoint: a clear 4xx in the envelope,
// never a 500.
func TestHostileInput(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeWrite)
	ten, _ := e.tenant("acme")
	c := e.tokenClient(tok)
	id := ten.ID
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/admin/api/v1/tenants?q=%c3%28&limit=%ff", nil},
		{"GET", "/admin/api/v1/tenants?cursor=" + strings.Repeat("A", 5000), nil},
		{"GET", "/admin/api/v1/tenants/%ff", nil},
		{"GET", "/admin/api/v1/tenants/" + id + "/channels?limit=-1", nil},
		{"GET", "/admin/api/v1/tenants/" + id + "/limits?x=%00", nil},
		{"PATCH", "/admin/api/v1/tenants/" + id + "/limits", strings.Repeat("[", 10000)},
		{"PATCH", "/admin/api/v1/tenants/" + id + "/limits", `{"limits":{"` + strings.Repeat("a", 10000) + `":{}}}`},
		{"PATCH", "/admin/api/v1/tenants/" + id + "/limits", "{\"limits\":{\"up\xffload\":{}}}"},
		{"PATCH", "/admin/api/v1/tenants/" + id + "/limits", []byte{0x1f, 0x8b, 0x08, 0, 0, 0}},
		{"DELETE", "/admin/api/v1/tenants/" + id + "/limits/%ff", nil},
		{"DELETE", "/admin/api/v1/tenants/" + id + "/limits/" + strings.Repeat("b", 2000), nil},
		{"POST", "/admin/api/v1/tenants/" + id + "/deactivate", strings.Repeat("x", 1<<20)},
		{"GET", "/admin/api/v1/audit?resource=" + strings.Repeat("%ff", 50), nil},
		{"GET", "/admin/api/v1/live?top=1000000000000000000000", nil},
	} {
		resp := c.do(r.method, r.path, r.body)
		if resp.status >= 500 || resp.status < 200 {
			t.Errorf("%s %.80s: %d %s", r.method, r.path, resp.status, resp.body)
		}
		if resp.status >= 400 && !strings.Contains(string(resp.body), `"request_id"`) {
			t.Errorf("%s %.80s: %d without the envelope: %.200s", r.method, r.path, resp.status, resp.body)
		}
	}
	// The tenant is as it was.
	if l, _ := e.st.Limits(context.Background(), id); string(l.Raw) != "{}" {
		t.Fatalf("limits %s", l.Raw)
	}
	var out tenantOut
	c.do("GET", "/admin/api/v1/tenants/"+id, nil).data(t, 200, &out)
	if out.Status != "active" {
		t.Fatalf("the tenant is %s", out.Status)
	}
}

// With PostgreSQL hung or stopped, the API answers 503 in the envelope within its
// timeout, and recovers when the database is back.
func TestDatabaseDown(t *testing.T) {
	srv := pgserver.StartForTest(t)
	ctx := context.Background()
	dbURL, err := srv.CreateDatabase(ctx, "console_down")
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{dbURL: dbURL, databaseTimeout: 2 * time.Second})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeWrite)
	ten, _ := e.tenant("acme")
	c := e.tokenClient(tok)
	c.do("GET", "/admin/api/v1/tenants", nil).data(t, 200, nil)
	s := e.client().signIn("alice@example.com")

	// Hung: a lock held elsewhere makes every query of tenants wait; the request gives
	// up at the console's database timeout.
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.do("GET", "/admin/api/v1/tenants", nil).errorCode(t, 503, "unavailable")
	if took := time.Since(start); took < time.Second || took > 6*time.Second {
		t.Errorf("a hung query answered after %v, want about the 2 s timeout", took)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	c.do("GET", "/admin/api/v1/tenants", nil).data(t, 200, nil)

	// Down.
	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/admin/api/v1/tenants", ""},
		{"GET", "/admin/api/v1/tenants/" + ten.ID + "/limits", ""},
		{"PATCH", "/admin/api/v1/tenants/" + ten.ID + "/limits", `{"limits":{"upload":{"limit":5,"scale_ms":1000}}}`},
		{"GET", "/admin/api/v1/audit", ""},
	} {
		start := time.Now()
		var body any
		if r.body != "" {
			body = r.body
		}
		resp := c.do(r.method, r.path, body)
		resp.errorCode(t, 503, "unavailable")
		if took := time.Since(start); took > 4*time.Second || resp.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: 503 after %v, retry-after %q", r.method, r.path, took, resp.header.Get("Retry-After"))
		}
	}
	// A session's page too: 503, not a 500.
	if r := s.do("GET", "/admin/tenants", nil); r.status != 503 {
		t.Errorf("the tenants page with the database down: %d", r.status)
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for c.do("GET", "/admin/api/v1/tenants", nil).status != 200 {
		if time.Now().After(deadline) {
			t.Fatal("the API did not recover with the database")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hungSidecar answers nothing until the call's deadline; down answers an error at once.
type hungSidecar struct{ down bool }

func (h hungSidecar) wait(ctx context.Context) error {
	if h.down {
		return errors.New("connection refused")
	}
	<-ctx.Done()
	return ctx.Err()
}
func (h hungSidecar) Buckets(ctx context.Context) (*limiterpb.BucketsResponse, error) {
	return nil, h.wait(ctx)
}
func (h hungSidecar) Traffic(ctx context.Context) (*limiterpb.TrafficResponse, error) {
	return nil, h.wait(ctx)
}
func (h hungSidecar) Busiest(ctx context.Context, _ uint32, _ string) (*limiterpb.BusiestResponse, error) {
	return nil, h.wait(ctx)
}
func (h hungSidecar) Cluster(ctx context.Context) (*limiterpb.ClusterResponse, error) {
	return nil, h.wait(ctx)
}

// With the sidecar down or hung, the live view is a 503 within the sidecar timeout, and
// a tenant's limits still answer, saying the installation's are unknown.
func TestSidecarDown(t *testing.T) {
	for _, sc := range []hungSidecar{{down: true}, {}} {
		e := newEnv(t, envOptions{sidecar: sc})
		u := e.admin("alice@example.com")
		_, tok := e.token(u, store.ScopeRead)
		ten, _ := e.tenant("acme")
		c := e.tokenClient(tok)
		start := time.Now()
		c.do("GET", "/admin/api/v1/live", nil).errorCode(t, 503, "unavailable")
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("down %v: 503 after %v", sc.down, took)
		}
		var l limitsOut
		c.do("GET", "/admin/api/v1/tenants/"+ten.ID+"/limits", nil).data(t, 200, &l)
		if _, in, _, eff, src, _ := l.bucket(t, "inbound"); l.InstallationKnown || in != nil || eff != nil || src != "unknown" {
			t.Errorf("down %v: inbound %v %v %s, known %v", sc.down, in, eff, src, l.InstallationKnown)
		}
	}
	e := newEnv(t, envOptions{noSidecar: true})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeRead)
	if d := e.tokenClient(tok).do("GET", "/admin/api/v1/live", nil); d.status != 503 || !strings.Contains(string(d.body), "LIMITER_ADDR") {
		t.Errorf("no sidecar: %d %s", d.status, d.body)
	}
}
