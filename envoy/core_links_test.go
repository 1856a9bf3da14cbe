package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log/slog"
	"maps"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pquerna/otp/totp"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/console"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// edgePort is the public listener of envoy.yaml.
const edgePort = 10000

// TestCoreLinksAreRouted walks a real core the way a browser and API clients would — the
// login pages of both realms (sign-in, password change, TOTP enrolment, reset by email,
// sign-out) and the client, tenant and upload APIs — and collects every redirect target,
// link, form action and URL the core emits. Each must be one Envoy (envoy.yaml) routes to
// the core, a WebSocket URL to a route with upgrades on: behind Envoy, a sign-in that ends
// on Envoy's JSON 404 is the failure this guards against.
func TestCoreLinksAreRouted(t *testing.T) {
	bs, err := ReadBootstrap("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := startCrawlCore(t)
	c.crawlPages("/admin", "admin@example.com", "")
	c.crawlPages("/portal", "ann@example.com", "acme")
	c.crawlAPIs()

	links := c.collected()
	for _, want := range []string{"/admin", "/portal", "/admin/login", "/admin/password/change", "/portal/totp/enrol", "/admin/login/totp",
		"/api/v1/converger/tokens/generate", "/admin/tenants", "/admin/limits", "/admin/audit"} {
		if _, ok := links[want]; !ok {
			t.Errorf("the crawl never saw %s: it does not reach every page (saw %v)", want, keys(links))
		}
	}
	var sawLimitsForm bool
	for path := range links {
		sawLimitsForm = sawLimitsForm || strings.HasPrefix(path, "/admin/tenants/") && strings.HasSuffix(path, "/limits")
	}
	if !sawLimitsForm {
		t.Errorf("the crawl never reached a tenant's page and its limits form (saw %v)", keys(links))
	}
	var sawStream, sawAttachment bool
	for path, l := range links {
		m, ok, err := RouteRequest(bs, edgePort, "GET", "edge.test", path)
		switch {
		case err != nil:
			t.Errorf("%s (%s): %v", path, l.from, err)
		case !ok || m.Cluster != coreCluster:
			t.Errorf("%s, emitted by %s, is not routed to the core by envoy.yaml: %+v (matched %v)", path, l.from, m, ok)
		case l.websocket && !m.WebSocket:
			t.Errorf("%s, a WebSocket URL emitted by %s, goes to a route without WebSocket upgrades (%s)", path, l.from, m.Route)
		}
		sawStream = sawStream || l.websocket
		sawAttachment = sawAttachment || strings.HasPrefix(path, "/api/v1/converger/attachments/")
	}
	if !sawStream || !sawAttachment {
		t.Errorf("the crawl saw no streamUrl (%v) or no contentUrl (%v)", sawStream, sawAttachment)
	}
	t.Logf("%d distinct paths checked", len(links))

	// The check itself can fail: a path Envoy does not route is refused.
	if m, ok, _ := RouteRequest(bs, edgePort, "GET", "edge.test", "/administrator"); ok && m.Cluster == coreCluster {
		t.Errorf("/administrator reaches the core: %+v", m)
	}
}

// link is a URL the core emitted, by path.
type link struct {
	from      string // where it was seen
	websocket bool
}

type crawlCore struct {
	t      *testing.T
	base   *url.URL
	st     *store.Store
	mails  *outbox
	secret string // the channel secret
	apiKey string // the tenant's

	mu    sync.Mutex
	links map[string]link
}

// outbox keeps the emails the pages send.
type outbox struct {
	mu   sync.Mutex
	msgs []mail.Message
}

func (o *outbox) Send(_ context.Context, m mail.Message) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.msgs = append(o.msgs, m)
	return nil
}

const crawlPassword = "correct horse battery staple"

func startCrawlCore(t *testing.T) *crawlCore {
	ctx := context.Background()
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, _ := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	st := store.New(pool, sealer, activity.DefaultLimits)
	cheap := passwords.Params{Memory: 64, Time: 1, Threads: 1}
	hash, err := passwords.HashWith(crawlPassword, cheap)
	if err != nil {
		t.Fatal(err)
	}
	op := st.As("test")
	tenant, apiKey, err := op.CreateTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, err := op.CreateChannel(ctx, tenant.ID, "web", "echo", "duplex")
	if err != nil {
		t.Fatal(err)
	}
	// The admin must change a generated password first: that page is crawled too.
	if _, err := op.CreateAdminUser(ctx, "admin@example.com", hash, true); err != nil {
		t.Fatal(err)
	}
	if _, err := op.CreateTenantUser(ctx, tenant.ID, "ann@example.com", hash, false); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base, _ := url.Parse("http://" + ln.Addr().String())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	limiter := login.NewLocalLimiter(nil)
	t.Cleanup(limiter.Close)
	mails := &outbox{}
	pages, err := login.New(login.Options{Store: st, Sealer: sealer, Limiter: limiter, Mailer: mails,
		PublicURL: base.String(), PasswordParams: cheap, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := token.GenerateKey()
	signer, _ := token.ParseSigningKey(key)
	verifier, _ := token.ParseVerifyKeys(signer.PublicKey())
	cons, err := console.New(console.Options{Store: st, Pages: pages, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	app, _ := api.New(api.Deps{Store: st, Signer: signer, Verifier: verifier, PublicURL: base.String(),
		Limits: activity.DefaultLimits, MaxUploadBytes: 1 << 20, Logger: quiet, Pages: pages.Register, Console: cons.Register})
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() {
		_ = app.ShutdownWithTimeout(5 * time.Second)
		pages.Close()
	})
	return &crawlCore{t: t, base: base, st: st, mails: mails, secret: sec.Secret, apiKey: apiKey, links: map[string]link{}}
}

// record notes a URL the core emitted; relative ones are resolved against from.
func (c *crawlCore) record(from, raw string) {
	c.t.Helper()
	raw = strings.TrimSpace(html.UnescapeString(raw))
	if raw == "" || strings.HasPrefix(raw, "#") || strings.HasPrefix(raw, "data:") || strings.HasPrefix(raw, "otpauth:") {
		return
	}
	ref, err := url.Parse(raw)
	if err != nil {
		c.t.Errorf("%s emitted an unparsable URL %q: %v", from, raw, err)
		return
	}
	fromURL, _ := url.Parse(from)
	u := c.base.ResolveReference(fromURL).ResolveReference(ref)
	ws := u.Scheme == "ws" || u.Scheme == "wss"
	if u.Host != c.base.Host {
		c.t.Errorf("%s emitted %s, a URL off the core's PUBLIC_URL %s", from, raw, c.base)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.links[u.Path]; !ok || ws && !l.websocket {
		c.links[u.Path] = link{from: from, websocket: ws}
	}
}

func (c *crawlCore) collected() map[string]link {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.links)
}

func keys(m map[string]link) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// browser is a client with cookies that does not follow redirects: each Location is
// recorded, then followed by hand.
type browser struct {
	c      *crawlCore
	client *http.Client
	seen   map[string]bool
}

func (c *crawlCore) newBrowser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{c: c, seen: map[string]bool{}, client: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

var (
	attrRe = regexp.MustCompile(`(?i)\b(href|action|src)="([^"]*)"`)
	csrfRe = regexp.MustCompile(`name="_csrf" value="([^"]*)"`)
)

// do sends a request, records the Location and the page's links, follows redirects of
// GETs, and returns the last page's body and URL.
func (b *browser) do(method, path string, form url.Values) (body, at string) {
	b.c.t.Helper()
	for hop := 0; hop < 10; hop++ {
		var rd io.Reader
		if form != nil {
			rd = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequest(method, b.c.base.ResolveReference(&url.URL{Path: path}).String(), rd)
		if form != nil {
			req.Header.Set("content-type", "application/x-www-form-urlencoded")
		}
		resp, err := b.client.Do(req)
		if err != nil {
			b.c.t.Fatal(err)
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		where := method + " " + path
		for _, m := range attrRe.FindAllStringSubmatch(string(raw), -1) {
			b.c.record(path, m[2])
		}
		loc := resp.Header.Get("Location")
		if loc == "" {
			if resp.StatusCode >= 500 {
				b.c.t.Errorf("%s: %d", where, resp.StatusCode)
			}
			return string(raw), path
		}
		b.c.record(path, loc)
		u, _ := url.Parse(loc)
		method, path, form = "GET", b.c.base.ResolveReference(u).Path, nil
	}
	b.c.t.Fatalf("more than 10 redirects from %s", path)
	return "", ""
}

// visit GETs a page and every same-site page it links to (not forms), once each.
func (b *browser) visit(path string, depth int) {
	if b.seen[path] || depth > 3 {
		return
	}
	b.seen[path] = true
	body, _ := b.do("GET", path, nil)
	for _, m := range attrRe.FindAllStringSubmatch(body, -1) {
		if strings.EqualFold(m[1], "href") && strings.HasPrefix(m[2], "/") && !strings.Contains(m[2], "logout") {
			b.visit(html.UnescapeString(m[2]), depth+1)
		}
	}
}

func (b *browser) csrf(body string) string {
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		b.c.t.Fatalf("no _csrf in the page:\n%s", body)
	}
	return html.UnescapeString(m[1])
}

// crawlPages walks one realm's pages: the sign-in page (and a wrong password), the
// reset request and the emailed link, the sign-in, the pages after it, and sign-out.
func (c *crawlCore) crawlPages(prefix, email, tenant string) {
	b := c.newBrowser()
	b.visit(prefix, 0)
	body, _ := b.do("GET", prefix+"/login", nil)
	form := url.Values{"_csrf": {b.csrf(body)}, "email": {email}, "password": {"wrong password!!"}}
	if tenant != "" {
		form.Set("tenant_name", tenant)
	}
	b.do("POST", prefix+"/login", form)

	body, _ = b.do("GET", prefix+"/password/reset", nil)
	b.do("POST", prefix+"/password/reset", url.Values{"_csrf": {b.csrf(body)}, "email": {email}, "tenant_name": {tenant}})
	deadline := time.Now().Add(5 * time.Second)
	var resetLink string
	for resetLink == "" && time.Now().Before(deadline) {
		c.mails.mu.Lock()
		for _, m := range c.mails.msgs {
			if m.To == email {
				resetLink = regexp.MustCompile(`https?://\S+`).FindString(m.Body)
			}
		}
		c.mails.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	if resetLink == "" {
		c.t.Fatalf("no reset email to %s", email)
	}
	c.record("the reset email", resetLink)
	u, _ := url.Parse(resetLink)
	b.visit(u.Path, 0)

	body, _ = b.do("GET", prefix+"/login", nil)
	form.Set("_csrf", b.csrf(body))
	form.Set("password", crawlPassword)
	body, at := b.do("POST", prefix+"/login", form)
	if at == prefix+"/password/change" {
		newPassword := crawlPassword + " again"
		body, at = b.do("POST", at, url.Values{"_csrf": {b.csrf(body)}, "password": {newPassword}, "password_confirm": {newPassword}})
	}
	if at != prefix {
		c.t.Fatalf("signing in to %s ended on %s:\n%s", prefix, at, body)
	}
	for k := range b.seen {
		delete(b.seen, k)
	}
	b.visit(prefix, 0)

	// TOTP: enrol (the recovery codes' page), sign out, and sign in through the TOTP step.
	body, _ = b.do("GET", prefix+"/totp/enrol", nil)
	m := regexp.MustCompile(`id="totp-secret">([A-Z2-7]+)<`).FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no TOTP secret on %s/totp/enrol:\n%s", prefix, body)
	}
	code, _ := totp.GenerateCode(m[1], time.Now())
	b.do("POST", prefix+"/totp/enrol", url.Values{"_csrf": {b.csrf(body)}, "code": {code}})
	body, _ = b.do("GET", prefix, nil)
	b.do("POST", prefix+"/logout", url.Values{"_csrf": {b.csrf(body)}})
	body, _ = b.do("GET", prefix+"/login", nil)
	form.Set("_csrf", b.csrf(body))
	if prefix == "/admin" {
		form.Set("password", crawlPassword+" again")
	}
	body, at = b.do("POST", prefix+"/login", form)
	if at != prefix+"/login/totp" {
		c.t.Fatalf("signing in with TOTP on ended on %s:\n%s", at, body)
	}
	code, _ = totp.GenerateCode(m[1], time.Now().Add(30*time.Second)) // a later step than the enrolment's
	body, at = b.do("POST", at, url.Values{"_csrf": {b.csrf(body)}, "code": {code}})
	if at != prefix {
		c.t.Fatalf("the TOTP step ended on %s:\n%s", at, body)
	}
	b.do("POST", prefix+"/logout", url.Values{"_csrf": {b.csrf(body)}})
}

// crawlAPIs records the URLs of the client API (streamUrl, contentUrl), the tenant API
// and the legacy token's links.
func (c *crawlCore) crawlAPIs() {
	t := c.t
	call := func(method, path, auth, contentType string, body []byte, headers ...string) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(method, c.base.String()+path, bytes.NewReader(body))
		if auth != "" {
			req.Header.Set("authorization", "Bearer "+auth)
		}
		if contentType != "" {
			req.Header.Set("content-type", contentType)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
		}
		for _, v := range resp.Header.Values("Link") {
			for _, m := range regexp.MustCompile(`<([^>]*)>`).FindAllStringSubmatch(v, -1) {
				c.record(method+" "+path+" (Link)", m[1])
			}
		}
		if loc := resp.Header.Get("Location"); loc != "" {
			c.record(method+" "+path+" (Location)", loc)
		}
		var doc map[string]any
		_ = json.Unmarshal(raw, &doc)
		c.recordJSON(method+" "+path, doc)
		return doc
	}
	tok := call("POST", "/api/v1/converger/tokens/generate", c.secret, "application/json", []byte(`{"user":{"id":"alice"}}`))["token"].(string)
	conv := call("POST", "/api/v1/converger/conversations", tok, "", nil)
	id, bound := conv["conversationId"].(string), conv["token"].(string)
	call("GET", "/api/v1/converger/conversations/"+id, bound, "", nil)

	var mp bytes.Buffer
	w := multipart.NewWriter(&mp)
	part, _ := w.CreateFormFile("file", "hello.txt")
	fmt.Fprint(part, "hello")
	w.Close()
	call("POST", "/api/v1/converger/conversations/"+id+"/upload?userId=alice", bound, w.FormDataContentType(), mp.Bytes())
	call("GET", "/api/v1/converger/conversations/"+id+"/activities", bound, "", nil)

	call("GET", "/api/v1/conversations/"+id+"/activities", "", "", nil, "x-api-key", c.apiKey)
	call("POST", "/api/v1/tokens", "", "application/json", []byte(`{"conversation_id":"`+id+`","user_id":"alice"}`), "x-api-key", c.apiKey)
}

// recordJSON records every string of an answer that is a URL or an absolute path.
func (c *crawlCore) recordJSON(from string, v any) {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			c.recordJSON(from, e)
		}
	case []any:
		for _, e := range v {
			c.recordJSON(from, e)
		}
	case string:
		if slices.ContainsFunc([]string{"http://", "https://", "ws://", "wss://", "/"}, func(p string) bool { return strings.HasPrefix(v, p) }) {
			c.record(from, v)
		}
	}
}
