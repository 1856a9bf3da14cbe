package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/shared/apierror"
)

// CORS of the client API (cors.go).

const (
	siteA    = "https://shop.example.com" // in CORS_ORIGINS
	siteB    = "http://127.0.0.1:3000"    // a tenant's own origin
	unlisted = "https://evil.example"
)

// corsEnv is a core whose CORS_ORIGINS lists origins.
func corsEnv(t *testing.T, origins ...string) *env {
	return newEnv(t, envOptions{deps: func(d *api.Deps, _ string) { d.CORSOrigins = origins }})
}

// preflight sends the browser's preflight of a POST with Authorization and JSON.
func (e *env) preflight(base, path, origin string) response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodOptions, base+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "authorization,content-type,x-ms-bot-agent")
	req.Header.Set("x-request-id", "pre-1")
	return send(e.t, req)
}

func send(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// originOption makes a WebSocket handshake carry an Origin, as a browser's does.
func originOption(origin string) *websocket.DialOptions {
	return &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {origin}}}
}

// attachmentURL is the signed contentUrl of an uploaded file, as the client API lists it.
func attachmentURL(t *testing.T, e *env, conv, tok, activityID string) string {
	t.Helper()
	for _, a := range e.dlList(tok, conv, "").Activities {
		if a.ID != activityID {
			continue
		}
		var atts []struct {
			ContentURL string `json:"contentUrl"`
		}
		if err := json.Unmarshal(a.Attachments, &atts); err != nil || len(atts) != 1 {
			t.Fatalf("attachments %s: %v", a.Attachments, err)
		}
		return atts[0].ContentURL
	}
	t.Fatalf("no activity %s", activityID)
	return ""
}

// vary reports whether a response varies by a header.
func (r response) vary(name string) bool {
	for _, v := range r.header.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), name) {
				return true
			}
		}
	}
	return false
}

// allowedPreflight checks a preflight's 204 and every header it must carry.
func allowedPreflight(t *testing.T, what string, r response, allowOrigin string) {
	t.Helper()
	r.exact(t, what, 204, map[string]string{
		"Access-Control-Allow-Origin":      allowOrigin,
		"Access-Control-Allow-Methods":     "GET, POST",
		"Access-Control-Allow-Headers":     "Authorization, Content-Type, x-idempotency-key, x-request-id, x-ms-bot-agent, x-requested-with",
		"Access-Control-Max-Age":           "600",
		"Access-Control-Expose-Headers":    "retry-after, x-request-id",
		"Access-Control-Allow-Credentials": "",
		"x-request-id":                     "pre-1",
	}, "")
	for _, h := range []string{"Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers"} {
		if !r.vary(h) {
			t.Errorf("%s: Vary %q lacks %s", what, r.header.Values("Vary"), h)
		}
	}
}

// refusedPreflight checks a preflight's 403 without CORS headers.
func refusedPreflight(t *testing.T, what string, r response) {
	t.Helper()
	r.exact(t, what, 403, map[string]string{"Access-Control-Allow-Origin": "", "Access-Control-Allow-Methods": "",
		"content-type": "application/json"}, jsonError("forbidden", "Requests from this origin are not allowed.", "pre-1"))
	if !r.vary("Origin") {
		t.Errorf("%s: Vary %q", what, r.header.Values("Vary"))
	}
}

// withOrigin adds an Origin header.
func withOrigin(h map[string]string, origin string) map[string]string {
	return withHeader(h, "Origin", origin)
}

// corsHeaders checks the CORS headers of an answer that is not a preflight: allowOrigin
// "" for none.
func corsHeaders(t *testing.T, what string, r response, allowOrigin string) {
	t.Helper()
	expose := "retry-after, x-request-id"
	if allowOrigin == "" {
		expose = ""
	}
	for k, want := range map[string]string{"Access-Control-Allow-Origin": allowOrigin, "Access-Control-Expose-Headers": expose,
		"Access-Control-Allow-Credentials": "", "Access-Control-Allow-Methods": ""} {
		if got := r.header.Get(k); got != want || (want == "" && len(r.header.Values(k)) > 0) {
			t.Errorf("%s: %s %q, want %q (status %d %s)", what, k, got, want, r.status, r.body)
		}
	}
	if !r.vary("Origin") {
		t.Errorf("%s: Vary %q", what, r.header.Values("Vary"))
	}
}

func TestCORSListedOrigins(t *testing.T) {
	e := corsEnv(t, siteA)
	s := e.setup("echo")
	const path = "/api/v1/converger/tokens/generate"

	allowedPreflight(t, "listed origin", e.preflight(e.base, path, siteA), siteA)
	refusedPreflight(t, "unlisted origin", e.preflight(e.base, path, unlisted))
	refusedPreflight(t, "the null origin", e.preflight(e.base, path, "null"))
	refusedPreflight(t, "another port of a listed host", e.preflight(e.base, path, siteA+":8443"))
	refusedPreflight(t, "a huge origin", e.preflight(e.base, path, "https://"+strings.Repeat("a", 1000)+".example"))
	refusedPreflight(t, "a non-ASCII origin", e.preflight(e.base, path, "https://sh\xf6p.example.com"))
	refusedPreflight(t, "a listed origin with a path", e.preflight(e.base, path, siteA+"/cart"))
	// Preflights of every client API path, the stream's and the attachments' too.
	for _, p := range []string{"/api/v1/converger/conversations", "/api/v1/converger/conversations/" + s.conv + "/upload",
		"/api/v1/converger/attachments/" + missingID, "/api/v1/converger/conversations/" + s.conv + "/stream"} {
		allowedPreflight(t, p, e.preflight(e.base, p, siteA), siteA)
	}

	// The actual requests: a token, a conversation and a message from the listed origin.
	r := e.do(http.MethodPost, path, nil, withOrigin(bearerHeader(s.secret), siteA))
	var tok tokenAnswer
	r.answer(t, 200, &tok)
	corsHeaders(t, "token from the listed origin", r, siteA)
	r = e.do(http.MethodPost, "/api/v1/converger/conversations", nil, withOrigin(bearerHeader(tok.Token), siteA))
	var conv conversationAnswer
	r.answer(t, 201, &conv)
	corsHeaders(t, "conversation from the listed origin", r, siteA)
	// An error answer carries the headers too, so that the page can read it.
	r = e.do(http.MethodPost, "/api/v1/converger/conversations", nil, withOrigin(bearerHeader("x.y.z"), siteA))
	r.errorCode(t, 403, "forbidden")
	corsHeaders(t, "a bad token from the listed origin", r, siteA)

	// An unlisted origin is refused before anything is done, without CORS headers.
	r = e.do(http.MethodPost, path, nil, withOrigin(bearerHeader(s.secret), unlisted))
	r.exact(t, "token from an unlisted origin", 403, map[string]string{"content-type": "application/json"},
		jsonError("forbidden", "Requests from this origin are not allowed.", r.header.Get("x-request-id")))
	corsHeaders(t, "token from an unlisted origin", r, "")
	before := e.count(`SELECT count(*) FROM activities`)
	r = e.do(http.MethodPost, "/api/v1/converger/conversations/"+conv.ConversationID+"/activities",
		map[string]any{"type": "message", "text": "hi"}, withOrigin(bearerHeader(conv.Token), unlisted))
	r.errorCode(t, 403, "forbidden")
	corsHeaders(t, "a message from an unlisted origin", r, "")
	if n := e.count(`SELECT count(*) FROM activities`); n != before {
		t.Fatalf("a refused origin's message was stored (%d activities, were %d)", n, before)
	}
	// The stream's handshake too.
	e.do(http.MethodGet, streamPath(conv.ConversationID, conv.Token, ""), nil, withOrigin(streamUpgradeHeaders, unlisted)).
		errorCode(t, 403, "forbidden")

	// The core's own origin needs no CORS and is never refused (PUBLIC_URL, or the Host
	// the request was sent to).
	for _, own := range []string{e.base, strings.Replace(e.base, "127.0.0.1", "localhost", 1)} {
		req, _ := http.NewRequest(http.MethodPost, strings.Replace(e.base, "127.0.0.1", hostOf(own), 1)+path, nil)
		req.Header.Set("Authorization", "Bearer "+s.secret)
		req.Header.Set("Origin", own)
		r = send(t, req)
		if r.status != 200 {
			t.Fatalf("same origin %s: %d %s", own, r.status, r.body)
		}
		corsHeaders(t, "same origin "+own, r, "")
	}
	// X-Forwarded-Host does not make another origin the core's own.
	req, _ := http.NewRequest(http.MethodPost, e.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.secret)
	req.Header.Set("Origin", unlisted)
	req.Header.Set("X-Forwarded-Host", strings.TrimPrefix(unlisted, "https://"))
	send(t, req).errorCode(t, 403, "forbidden")
	// No Origin (a server, a Direct Line client outside a browser): no CORS headers.
	r = e.do(http.MethodPost, path, nil, bearerHeader(s.secret))
	if r.status != 200 {
		t.Fatalf("without Origin: %d %s", r.status, r.body)
	}
	corsHeaders(t, "without Origin", r, "")
}

// hostOf is the host of an http://host:port URL.
func hostOf(u string) string {
	h := strings.TrimPrefix(u, "http://")
	return h[:strings.LastIndexByte(h, ':')]
}

func TestCORSAnyOrigin(t *testing.T) {
	e := corsEnv(t, api.CORSAnyOrigin)
	s := e.setup("echo")
	for _, origin := range []string{siteA, unlisted, "http://localhost:5173"} {
		allowedPreflight(t, origin, e.preflight(e.base, "/api/v1/converger/tokens/generate", origin), "*")
		r := e.do(http.MethodPost, "/api/v1/converger/tokens/generate", nil, withOrigin(bearerHeader(s.secret), origin))
		if r.status != 200 {
			t.Fatalf("%s: %d %s", origin, r.status, r.body)
		}
		corsHeaders(t, origin, r, "*")
	}
	// "null" and malformed origins are no origins: refused.
	refusedPreflight(t, "null", e.preflight(e.base, "/api/v1/converger/tokens/generate", "null"))
}

// Without CORS_ORIGINS and tenant origins, no other origin may call the client API.
func TestCORSNothingAllowedByDefault(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("echo")
	refusedPreflight(t, "default", e.preflight(e.base, "/api/v1/converger/tokens/generate", siteA))
	r := e.do(http.MethodPost, "/api/v1/converger/tokens/generate", nil, withOrigin(bearerHeader(s.secret), siteA))
	r.errorCode(t, 403, "forbidden")
	corsHeaders(t, "default", r, "")
}

// The tenant API, the inbound webhooks and the login pages send no CORS headers, even
// to a listed origin.
func TestCORSOnlyOnTheClientAPI(t *testing.T) {
	e := newEnv(t, envOptions{deps: func(d *api.Deps, _ string) {
		d.CORSOrigins = []string{api.CORSAnyOrigin}
		d.Pages = func(r fiber.Router) {
			r.Get("/admin/login", func(c *fiber.Ctx) error { return c.SendString("the login page") })
		}
	}})
	s := e.setup("webhook")
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/conversations/" + s.conv},
		{http.MethodOptions, "/api/v1/conversations/" + s.conv},
		{http.MethodPost, "/api/v1/channels/" + s.channelID + "/inbound"},
		{http.MethodOptions, "/api/v1/channels/" + s.channelID + "/inbound"},
		{http.MethodGet, "/admin/login"},
		{http.MethodOptions, "/admin/login"},
	} {
		var r response
		if c.method == http.MethodOptions {
			r = e.preflight(e.base, c.path, siteA)
		} else {
			r = e.do(c.method, c.path, nil, withOrigin(apiKey(s.key), siteA))
		}
		if r.status == 204 || r.status >= 500 {
			t.Errorf("%s %s: %d", c.method, c.path, r.status)
		}
		for k := range r.header {
			if strings.HasPrefix(strings.ToLower(k), "access-control-") {
				t.Errorf("%s %s: %s: %q", c.method, c.path, k, r.header.Get(k))
			}
		}
	}
}

// A tenant's own origins: its pages may call the client API with its credentials, and
// only with its credentials; a change applies to the next request on another core.
func TestCORSTenantOrigins(t *testing.T) {
	e := corsEnv(t, siteA)
	b := e.streamInstance(func(d *api.Deps) { d.CORSOrigins = []string{siteA} })
	mine := e.setup("echo")
	other := e.setup("echo")
	ctx := context.Background()
	const path = "/api/v1/converger/tokens/publishable"

	refusedPreflight(t, "before the tenant lists it", e.preflight(b.base, path, siteB))
	if _, err := e.store.As("test").SetTenantOrigins(ctx, mine.tenantID, []string{siteB}); err != nil {
		t.Fatal(err)
	}
	// The actual request on the other core: at once (the tenant's list is read fresh).
	r := e.do(http.MethodPost, path, nil, withOrigin(bearerHeader(mine.publishable), siteB))
	var tok tokenAnswer
	r.answer(t, 200, &tok)
	corsHeaders(t, "the tenant's origin", r, siteB)
	r = send(t, mustRequest(t, http.MethodPost, b.base+path, map[string]string{"Authorization": "Bearer " + mine.publishable, "Origin": siteB}))
	if r.status != 200 {
		t.Fatalf("on the other core: %d %s", r.status, r.body)
	}
	corsHeaders(t, "the tenant's origin on the other core", r, siteB)
	// Its preflight as soon as the other core has heard of the change (NOTIFY).
	waitFor(t, "the other core's preflight", func() bool { return e.preflight(b.base, path, siteB).status == 204 })
	allowedPreflight(t, "the tenant's origin", e.preflight(b.base, path, siteB), siteB)

	// Another tenant's credentials from that origin are refused, without CORS headers.
	r = e.do(http.MethodPost, path, nil, withOrigin(bearerHeader(other.publishable), siteB))
	r.errorCode(t, 403, "forbidden")
	corsHeaders(t, "another tenant's key from the origin", r, "")
	otherTok := e.clientToken(other.secret, nil).Token
	r = e.do(http.MethodPost, "/api/v1/converger/conversations", nil, withOrigin(bearerHeader(otherTok), siteB))
	r.errorCode(t, 403, "forbidden")
	corsHeaders(t, "another tenant's token from the origin", r, "")
	// CORS_ORIGINS serves every tenant.
	r = e.do(http.MethodPost, "/api/v1/converger/conversations", nil, withOrigin(bearerHeader(otherTok), siteA))
	if r.status != 201 {
		t.Fatalf("CORS_ORIGINS for another tenant: %d %s", r.status, r.body)
	}
	corsHeaders(t, "CORS_ORIGINS for another tenant", r, siteA)

	// The stream: the tenant's origin connects, another tenant's token from it does not.
	var conv conversationAnswer
	e.do(http.MethodPost, "/api/v1/converger/conversations", nil, withOrigin(bearerHeader(tok.Token), siteB)).answer(t, 201, &conv)
	w := dialStream(t, b.base, streamPath(conv.ConversationID, conv.Token, ""), originOption(siteB)).start()
	e.dlPost(conv.Token, conv.ConversationID, map[string]any{"type": "message", "text": "hello"})
	w.expect(5*time.Second, "hello", "echo: hello")

	// An attachment's download from the origin carries the headers; another tenant's
	// attachment from it is refused.
	one := filePart("a.png", "image/png", []byte("png"))
	id := uploadID(t, e.upload(conv.ConversationID, conv.Token, "", one))
	u := attachmentURL(t, e, conv.ConversationID, conv.Token, id)
	r = send(t, mustRequest(t, http.MethodGet, u, map[string]string{"Origin": siteB}))
	if r.status != 200 || string(r.body) != "png" {
		t.Fatalf("download from the tenant's origin: %d %s", r.status, r.body)
	}
	corsHeaders(t, "download from the tenant's origin", r, siteB)
	r = send(t, mustRequest(t, http.MethodGet, u, map[string]string{"Origin": unlisted}))
	r.errorCode(t, 403, "forbidden")
	corsHeaders(t, "download from an unlisted origin", r, "")

	// Removed: refused at once on the other core, and its preflight soon after.
	if _, err := e.store.As("test").SetTenantOrigins(ctx, mine.tenantID, nil); err != nil {
		t.Fatal(err)
	}
	r = send(t, mustRequest(t, http.MethodPost, b.base+path, map[string]string{"Authorization": "Bearer " + mine.publishable, "Origin": siteB}))
	r.errorCode(t, 403, "forbidden")
	corsHeaders(t, "a removed origin on the other core", r, "")
	waitFor(t, "the other core's preflight refused", func() bool { return e.preflight(b.base, path, siteB).status == 403 })
	// A deactivated tenant's origins do not count for preflights either.
	if _, err := e.store.As("test").SetTenantOrigins(ctx, mine.tenantID, []string{siteB}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the preflight allowed again", func() bool { return e.preflight(b.base, path, siteB).status == 204 })
	if _, _, err := e.store.As("test").DeactivateTenant(ctx, mine.tenantID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deactivated tenant's preflight refused", func() bool { return e.preflight(b.base, path, siteB).status == 403 })
}

// waitFor polls cond for up to 5 s: how long a NOTIFY may take on a loaded machine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustRequest(t *testing.T, method, u string, headers map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return req
}

// The CORS headers come before AUTHZ_ADDR's check, so that a page can read the
// sidecar's 429 (and its retry-after) instead of seeing a CORS failure.
func TestCORSHeadersOnTheCheckDenials(t *testing.T) {
	e := newEnv(t, envOptions{deps: func(d *api.Deps, _ string) {
		d.CORSOrigins = []string{siteA}
		// As core/authzcheck answers a denial of the sidecar.
		d.Middleware = []fiber.Handler{func(c *fiber.Ctx) error {
			if c.Method() == fiber.MethodOptions {
				return c.Next()
			}
			c.Set("retry-after", "1")
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			return c.Status(429).Send(apierror.RateLimited.Body(map[string]any{"retry_after_ms": 1000}, "check-1"))
		}}
	}})
	allowedPreflight(t, "preflight", e.preflight(e.base, "/api/v1/converger/tokens/generate", siteA), siteA)
	r := e.do(http.MethodPost, "/api/v1/converger/tokens/generate", nil, withOrigin(nil, siteA))
	if r.status != 429 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	corsHeaders(t, "a 429 of the check", r, siteA)
}
