package login_test

import (
	"context"
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
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/limiterclient"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/service"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// cheap are argon2id parameters that keep the tests fast; production uses
// passwords.Default.
var cheap = passwords.Params{Memory: 64, Time: 1, Threads: 1}

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// clock is a settable clock shared by the pages, the limiter and the tests' TOTP codes.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// newClock starts one second into a minute, so that a 60 s window has 59 s left.
func newClock() *clock {
	return &clock{t: time.Now().Truncate(time.Minute).Add(time.Second)}
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// mailbox is the pages' mail sender in the tests.
type mailbox struct {
	mu   sync.Mutex
	msgs []mail.Message
	in   chan struct{}
}

func newMailbox() *mailbox { return &mailbox{in: make(chan struct{}, 1000)} }

func (m *mailbox) Send(_ context.Context, msg mail.Message) error {
	m.mu.Lock()
	m.msgs = append(m.msgs, msg)
	m.mu.Unlock()
	m.in <- struct{}{}
	return nil
}

// to returns the messages sent to addr so far.
func (m *mailbox) to(addr string) []mail.Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []mail.Message
	for _, msg := range m.msgs {
		if msg.To == addr {
			out = append(out, msg)
		}
	}
	return out
}

// waitFor waits up to 5 s for the n-th message to addr and returns it.
func (m *mailbox) waitFor(t *testing.T, addr string, n int) mail.Message {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		if got := m.to(addr); len(got) >= n {
			return got[n-1]
		}
		select {
		case <-m.in:
		case <-deadline:
			t.Fatalf("no email #%d to %s within 5 s (got %d)", n, addr, len(m.to(addr)))
		}
	}
}

// env is the core's app with the login pages on a fresh database, reached over HTTP.
type env struct {
	t     *testing.T
	base  string
	st    *store.Store
	pool  *pgxpool.Pool
	clock *clock
	mails *mailbox
	// limiter is what the pages count with: the sidecar's client or a local limiter.
	limiter login.Limiter
	sealer  *credentials.Sealer
	pages   *login.Pages
}

type envOptions struct {
	// sidecar: count in a real sidecar (started in-process on the env's clock) through
	// its Limiter gRPC service, as LIMITER_ADDR does.
	sidecar bool
	// limiter replaces the limiter (a broken one).
	limiter      login.Limiter
	idle, maxAge time.Duration
	publicURL    string
	purge        time.Duration // PurgeInterval (zero: the default)
	hashes       *passwords.Gate
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx := context.Background()
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, _ := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	st := store.New(pool, sealer, activity.DefaultLimits)
	clk := newClock()
	e := &env{t: t, st: st, pool: pool, clock: clk, mails: newMailbox(), sealer: sealer}
	switch {
	case o.limiter != nil:
		e.limiter = o.limiter
	case o.sidecar:
		e.limiter = startSidecar(t, clk)
	default:
		local := login.NewLocalLimiter(clk.now)
		t.Cleanup(local.Close)
		e.limiter = local
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.base = "http://" + ln.Addr().String()
	public := o.publicURL
	if public == "" {
		public = e.base
	}
	// The tests reach the core from 127.0.0.1 and say who the client is in
	// x-forwarded-for, as a trusted proxy would.
	proxies, _ := clientip.Parse("127.0.0.1")
	pages, err := login.New(login.Options{Store: st, Sealer: sealer, Limiter: e.limiter, Mailer: e.mails,
		ClientIP: proxies, PublicURL: public, IdleTimeout: o.idle, MaxAge: o.maxAge, PasswordParams: cheap,
		PurgeInterval: o.purge, Hashes: o.hashes, Now: clk.now, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	e.pages = pages
	key, _ := token.GenerateKey()
	signer, _ := token.ParseSigningKey(key)
	verifier, _ := token.ParseVerifyKeys(signer.PublicKey())
	app, _ := api.New(api.Deps{Store: st, Signer: signer, Verifier: verifier, PublicURL: public,
		Limits: activity.DefaultLimits, MaxUploadBytes: 1 << 20, Logger: quietLogger(), Pages: pages.Register, Credentialed: pages.SignedIn})
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() {
		_ = app.ShutdownWithTimeout(5 * time.Second)
		pages.Close()
	})
	return e
}

// startSidecar starts the real sidecar on loopback with the built-in limits and the
// clock clk, and returns a client of its Limiter service.
func startSidecar(t *testing.T, clk *clock) *limiterclient.Client {
	t.Helper()
	sc := service.StartForTest(t, nil, "", service.Options{Logger: quietLogger(), Now: clk.now})
	client, err := limiterclient.New(sc.GRPCAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// admin creates an admin with a password.
func (e *env) admin(email, password string, mustChange bool) store.AdminUser {
	e.t.Helper()
	hash, err := passwords.HashWith(password, cheap)
	if err != nil {
		e.t.Fatal(err)
	}
	u, err := e.st.As("test").CreateAdminUser(context.Background(), email, hash, mustChange)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// tenantUser creates a tenant user (and its tenant when new) with a password.
func (e *env) tenantUser(tenantName, email, password string) store.TenantUser {
	e.t.Helper()
	ctx := context.Background()
	ten, err := e.st.TenantByName(ctx, tenantName)
	if err != nil {
		if ten, _, err = e.st.As("test").CreateTenant(ctx, tenantName); err != nil {
			e.t.Fatal(err)
		}
	}
	hash, err := passwords.HashWith(password, cheap)
	if err != nil {
		e.t.Fatal(err)
	}
	u, err := e.st.As("test").CreateTenantUser(ctx, ten.ID, email, hash, false)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// exec runs SQL on the test database.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

// browser is an HTTP client with its own cookie jar, coming from one client address
// (x-forwarded-for), that does not follow redirects.
type browser struct {
	t    *testing.T
	e    *env
	c    *http.Client
	ip   string
	jar  *cookiejar.Jar
	base *url.URL
}

func (e *env) browser(ip string) *browser {
	jar, _ := cookiejar.New(nil)
	base, _ := url.Parse(e.base)
	return &browser{t: e.t, e: e, ip: ip, jar: jar, base: base, c: &http.Client{
		Jar:           jar,
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// page is an answer with its body read.
type page struct {
	status int
	header http.Header
	body   string
}

// location is the path a redirect leads to.
func (p page) location() string { return p.header.Get("Location") }

var csrfField = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// csrf is the page's CSRF token.
func (p page) csrf(t *testing.T) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no _csrf field in the page (%d):\n%s", p.status, p.body)
	}
	return m[1]
}

// text returns the text of the element with that id ("" when there is none).
func (p page) text(id string) string {
	m := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*>([^<]*)<`).FindStringSubmatch(p.body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

func (p page) has(id string) bool { return strings.Contains(p.body, `id="`+id+`"`) }

func (b *browser) do(method, path string, form url.Values) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.e.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("content-type", "application/x-www-form-urlencoded")
	}
	if b.ip != "" {
		req.Header.Set("x-forwarded-for", b.ip)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return page{status: resp.StatusCode, header: resp.Header, body: string(raw)}
}

func (b *browser) get(path string) page { return b.do("GET", path, nil) }

// submit gets the form's page, fills in its CSRF token and posts the values to action.
func (b *browser) submit(formPath, action string, values url.Values) page {
	b.t.Helper()
	f := b.get(formPath)
	if f.status != 200 {
		b.t.Fatalf("GET %s: %d\n%s", formPath, f.status, f.body)
	}
	if values == nil {
		values = url.Values{}
	}
	values.Set("_csrf", f.csrf(b.t))
	return b.do("POST", action, values)
}

// login signs in at /admin/login.
func (b *browser) login(email, password string) page {
	b.t.Helper()
	return b.submit("/admin/login", "/admin/login", url.Values{"email": {email}, "password": {password}})
}

// portalLogin signs in at /portal/login.
func (b *browser) portalLogin(tenant, email, password string) page {
	b.t.Helper()
	return b.submit("/portal/login", "/portal/login",
		url.Values{"tenant_name": {tenant}, "email": {email}, "password": {password}})
}

// postOn posts values from the page at pagePath (for its CSRF token) to action.
func (b *browser) postOn(pagePath, action string, values url.Values) page {
	b.t.Helper()
	return b.submit(pagePath, action, values)
}

// cookie returns the browser's cookie of that name ("" when none).
func (b *browser) cookie(name string) string {
	for _, c := range b.jar.Cookies(b.base) {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// setCookie puts a cookie into the browser's jar.
func (b *browser) setCookie(name, value string) {
	b.jar.SetCookies(b.base, []*http.Cookie{{Name: name, Value: value, Path: "/"}})
}

// expect checks an answer's status and, for a redirect, where it leads.
func expect(t *testing.T, what string, p page, status int, location string) {
	t.Helper()
	if p.status != status || (location != "" && p.location() != location) {
		t.Fatalf("%s: %d (location %q), want %d (location %q); error %q\n%s", what, p.status, p.location(),
			status, location, p.text("error"), p.body)
	}
}

// expectError checks an answer's status and its id="error" text.
func expectError(t *testing.T, what string, p page, status int, msg string) {
	t.Helper()
	if p.status != status || p.text("error") != msg {
		t.Fatalf("%s: %d with error %q, want %d with %q\n%s", what, p.status, p.text("error"), status, msg, p.body)
	}
}
