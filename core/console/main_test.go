package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/gofiber/fiber/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/authzcheck"
	"github.com/converger/edge/core/console"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/docs/openapi"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/limiterclient"
	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/service"
)

// TestMain checks every exchange of the tests with the admin API against its OpenAPI
// document (docs/openapi).
func TestMain(m *testing.M) {
	os.Exit(openapi.CheckDefaultTransport(func() int { return pgserver.RunTests(m) }, openapi.AdminAPI))
}

// cheap are argon2id parameters that keep the tests fast.
var cheap = passwords.Params{Memory: 64, Time: 1, Threads: 1}

const adminPassword = "correct horse battery staple"

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// clock is the sidecar's wall clock, so that windows move only when a test moves them.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// env is the core with the console, the login pages and the ext_authz check of
// AUTHZ_ADDR, in front of a real sidecar (in this process) on a fresh database, reached
// over HTTP from loopback; each client says who it is in x-forwarded-for, as a trusted
// proxy would.
type env struct {
	t       *testing.T
	base    string
	st      *store.Store
	pool    *pgxpool.Pool
	dbURL   string
	clock   *clock
	sidecar *service.Sidecar
	// authz asks the sidecar's ext_authz Check directly, as Envoy does.
	authz authv3.AuthorizationClient
	pages *login.Pages
}

type envOptions struct {
	// sidecar overrides the console's Sidecar (nil: the real one's Limiter client).
	sidecar console.Sidecar
	// noSidecar runs the console without a sidecar (LIMITER_ADDR unset).
	noSidecar bool
	// dbURL is the database to use instead of a fresh test database.
	dbURL string
	// databaseTimeout is the console's (zero: its default).
	databaseTimeout time.Duration
}

// sidecarYAML is the installation's configuration: inbound has an installation limit.
const sidecarYAML = "database_wait_ms: 5000\nlimits:\n  inbound: {limit: 2000, window: 1s}\n"

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx := context.Background()
	dbURL := o.dbURL
	if dbURL == "" {
		dbURL = pgserver.NewTestDatabase(t, migrations.Up)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, _ := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	st := store.New(pool, sealer, activity.DefaultLimits)
	key, _ := token.GenerateKey()
	signer, _ := token.ParseSigningKey(key)
	verifier, _ := token.ParseVerifyKeys(signer.PublicKey())

	e := &env{t: t, st: st, pool: pool, dbURL: dbURL, clock: &clock{}}
	// Ten seconds into a minute, a day ahead: every window starts fresh.
	e.clock.ns.Store(time.Now().Truncate(time.Minute).Add(24*time.Hour + 10*time.Second).UnixNano())
	e.sidecar = service.StartForTest(t, map[string]string{"DATABASE_URL": dbURL, "TRUSTED_PROXIES": "127.0.0.1",
		"TOKEN_VERIFY_KEYS": signer.PublicKey()}, sidecarYAML, service.Options{Logger: quietLogger(), Now: e.clock.now})
	lim, err := limiterclient.New(e.sidecar.GRPCAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	conn, err := grpc.NewClient(e.sidecar.GRPCAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.authz = authv3.NewAuthorizationClient(conn)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.base = "http://" + ln.Addr().String()
	proxies, _ := clientip.Parse("127.0.0.1")
	pages, err := login.New(login.Options{Store: st, Sealer: sealer, Limiter: lim, Mailer: mail.Log{Logger: quietLogger()},
		ClientIP: proxies, PublicURL: e.base, PasswordParams: cheap, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	e.pages = pages
	var sc console.Sidecar = lim
	switch {
	case o.noSidecar:
		sc = nil
	case o.sidecar != nil:
		sc = o.sidecar
	}
	cons, err := console.New(console.Options{Store: st, Pages: pages, Sidecar: sc, DatabaseTimeout: o.databaseTimeout,
		SidecarTimeout: time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	// A Check that fails is refused rather than let through unchecked, with a budget a
	// loaded machine keeps: a test that counts what the sidecar limits must not count
	// requests that were never checked.
	checker, err := authzcheck.New(authzcheck.Options{Addr: e.sidecar.GRPCAddr.String(), Logger: quietLogger(),
		Timeout: 5 * time.Second, FailClosed: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checker.Close() })
	app, _ := api.New(api.Deps{Store: st, Signer: signer, Verifier: verifier, PublicURL: e.base, Limits: activity.DefaultLimits,
		MaxUploadBytes: 1 << 20, Logger: quietLogger(), Middleware: []fiber.Handler{checker.Handler},
		Pages: pages.Register, Console: cons.Register, Limiter: lim, Credentialed: cons.Credentialed})
	// As core serve does: a listener that drains a request it answered early (413).
	go func() { _ = app.Listener(netlimit.Wrap(ln, netlimit.Options{Logger: quietLogger()})) }()
	t.Cleanup(func() {
		_ = app.ShutdownWithTimeout(5 * time.Second)
		pages.Close()
	})
	return e
}

var seq atomic.Int64

// ip is a new client address, so that each client has its own admin_write budget.
func ip() string { return fmt.Sprintf("198.51.100.%d", seq.Add(1)%250+1) }

// admin creates an admin with adminPassword.
func (e *env) admin(email string) store.AdminUser {
	e.t.Helper()
	hash, err := passwords.HashWith(adminPassword, cheap)
	if err != nil {
		e.t.Fatal(err)
	}
	u, err := e.st.As("test").CreateAdminUser(context.Background(), email, hash, false)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// token makes an admin API token.
func (e *env) token(u store.AdminUser, scope string) (store.AdminToken, string) {
	e.t.Helper()
	t, secret, err := e.st.As("test").CreateAdminToken(context.Background(), u.ID, "test", scope, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return t, secret
}

// tenant creates a tenant and returns it with its API key.
func (e *env) tenant(name string) (store.Tenant, string) {
	e.t.Helper()
	t, key, err := e.st.As("test").CreateTenant(context.Background(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	return t, key
}

// client is an HTTP client of the core from one address, with its own cookies, that
// does not follow redirects; with a token it sends Authorization: Bearer.
type client struct {
	e     *env
	ip    string
	http  *http.Client
	token string
	// csrf is the session's CSRF token once signed in.
	csrf string
}

func (e *env) client() *client {
	jar, _ := cookiejar.New(nil)
	return &client{e: e, ip: ip(), http: &http.Client{Jar: jar, Timeout: 15 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (e *env) tokenClient(secret string) *client {
	c := e.client()
	c.token = secret
	return c
}

// response is an answer with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("body is not JSON (%d): %s", r.status, r.body)
	}
}

// data decodes {"data": ...} into v and returns the meta.
func (r response) data(t *testing.T, status int, v any) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	var doc struct {
		Data json.RawMessage `json:"data"`
		Meta map[string]any  `json:"meta"`
	}
	r.json(t, &doc)
	if v != nil {
		if err := json.Unmarshal(doc.Data, v); err != nil {
			t.Fatalf("data: %v in %s", err, r.body)
		}
	}
	return doc.Meta
}

// errorCode checks an error answer: its status and the envelope with a request id.
func (r response) errorCode(t *testing.T, status int, code string) map[string]any {
	t.Helper()
	var env struct {
		Error struct {
			Code      string         `json:"code"`
			Message   string         `json:"message"`
			Details   map[string]any `json:"details"`
			RequestID string         `json:"request_id"`
		} `json:"error"`
	}
	if r.status != status {
		t.Fatalf("status %d, want %d %s: %s", r.status, status, code, r.body)
	}
	r.json(t, &env)
	if env.Error.Code != code || env.Error.Message == "" || env.Error.RequestID == "" || r.header.Get("x-request-id") != env.Error.RequestID ||
		!strings.HasPrefix(r.header.Get("content-type"), "application/json") {
		t.Fatalf("got %d %s (%s), want %d %q in the envelope with a request id", r.status, r.body, r.header.Get("content-type"), status, code)
	}
	return env.Error.Details
}

// do sends a request; body is JSON (any value), a string or []byte sent as is, or nil.
func (c *client) do(method, path string, body any, headers ...string) response {
	c.e.t.Helper()
	var rd io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
		contentType = "application/json"
	case []byte:
		rd = bytes.NewReader(b)
		contentType = "application/json"
	case url.Values:
		rd = strings.NewReader(b.Encode())
		contentType = "application/x-www-form-urlencoded"
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
		contentType = "application/json"
	}
	req, err := http.NewRequest(method, c.e.base+path, rd)
	if err != nil {
		c.e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("content-type", contentType)
	}
	req.Header.Set("x-forwarded-for", c.ip)
	if c.token != "" {
		req.Header.Set("authorization", "Bearer "+c.token)
	}
	if c.csrf != "" && method != "GET" {
		req.Header.Set("x-csrf-token", c.csrf)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

var csrfField = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// formCSRF is a page's CSRF token.
func formCSRF(t *testing.T, r response) string {
	t.Helper()
	m := csrfField.FindSubmatch(r.body)
	if m == nil {
		t.Fatalf("no _csrf in the page (%d):\n%s", r.status, r.body)
	}
	return html.UnescapeString(string(m[1]))
}

// signIn signs the client in as the admin with that email through the login form and
// keeps the session's CSRF token.
func (c *client) signIn(email string) *client {
	c.e.t.Helper()
	page := c.do("GET", "/admin/login", nil)
	r := c.do("POST", "/admin/login", url.Values{"_csrf": {formCSRF(c.e.t, page)}, "email": {email}, "password": {adminPassword}})
	if r.status != 303 || r.header.Get("Location") != "/admin" {
		c.e.t.Fatalf("signing in as %s: %d %s %s", email, r.status, r.header.Get("Location"), r.body)
	}
	c.csrf = formCSRF(c.e.t, c.do("GET", "/admin", nil))
	return c
}

// check asks the sidecar's ext_authz Check about a request, as Envoy does, from ip.
func (e *env) check(method, path, fromIP string, headers map[string]string) *authv3.CheckResponse {
	e.t.Helper()
	h := map[string]string{"x-request-id": fmt.Sprintf("req-%d", seq.Add(1))}
	for k, v := range headers {
		h[k] = v
	}
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: fromIP, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: method, Path: path, Headers: h, Protocol: "HTTP/1.1", Scheme: "http", Host: "core.test"}},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.authz.Check(ctx, req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// allowedInWindow moves the sidecar to a fresh second and counts how many of n checks
// pass.
func (e *env) allowedInWindow(n int, method, path string, headers map[string]string) int {
	e.t.Helper()
	e.clock.advance(time.Second)
	allowed := 0
	for range n {
		if r := e.check(method, path, "192.0.2.10", headers); r.GetStatus().GetCode() == 0 && r.GetDeniedResponse() == nil {
			allowed++
		}
	}
	return allowed
}

// waitListening waits until the sidecar LISTENs for override notifications.
func (e *env) waitListening() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + e.sidecar.HTTPAddr.String() + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"override_notifications":true`) {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the sidecar never listened for override notifications")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// auditOf returns the audit entries of a resource, newest first.
func (e *env) auditOf(resource string) []store.AuditRecord {
	e.t.Helper()
	list, _, err := e.st.SearchAuditLogs(context.Background(), store.AuditQuery{Resource: resource, Limit: 100})
	if err != nil {
		e.t.Fatal(err)
	}
	return list
}

// parallel runs f n times at once and waits.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}
