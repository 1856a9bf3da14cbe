package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/authzcheck"
	"github.com/converger/edge/shared/limiterclient"
	"github.com/converger/edge/sidecar/service"
)

// edgeEnv is the core behind the real sidecar (started in this process over the core's
// database): every request checked by its ext_authz Check (AUTHZ_ADDR), and the legacy
// WebSocket's activities counted through its Limiter service (LIMITER_ADDR).
func edgeEnv(t *testing.T, limits string) *env {
	t.Helper()
	return newEnv(t, envOptions{deps: func(d *api.Deps, dbURL string) {
		sc := service.StartForTest(t, map[string]string{"DATABASE_URL": dbURL, "TOKEN_VERIFY_KEYS": d.Signer.PublicKey()},
			"database_wait_ms: 5000\n"+limits, service.Options{Logger: d.Logger})
		// A generous timeout: a Check that a loaded machine delays must not fail open.
		checker, err := authzcheck.New(authzcheck.Options{Addr: sc.GRPCAddr.String(), Logger: d.Logger, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { checker.Close() })
		client, err := limiterclient.New(sc.GRPCAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		d.Middleware = []fiber.Handler{checker.Handler}
		d.Limiter = client
	}})
}

// The legacy WebSocket counts activity_create for the token's tenant with the tenant
// API's budget: with a limit of 20 per window, 5 activities through the tenant API and
// 30 frames over three sockets of two tokens create 15 more and refuse 15 (rate_limited,
// with retry_after_ms); the tenant API is then over its limit too.
func TestLegacyWebSocketSharesTheTenantBudget(t *testing.T) {
	e := edgeEnv(t, "limits:\n  activity_create: {limit: 20, window: 1h}\n  token_create: {limit: 1000, window: 1h}\n")
	s := e.setup("webhook")
	path := "/api/v1/conversations/" + s.conv + "/activities"
	for i := range 5 {
		if r := e.do("POST", path, map[string]any{"type": "message", "text": fmt.Sprint("rest ", i)}, apiKey(s.key)); r.status != 201 {
			t.Fatalf("tenant API activity %d: %d %s", i+1, r.status, r.body)
		}
	}
	a, b := e.legacyToken(s, "alice"), e.legacyToken(s, "bob")
	sockets := []*legacyClient{dialLegacy(t, e.base, a), dialLegacy(t, e.base, a), dialLegacy(t, e.base, b)}
	created, limited := 0, 0
	for i := range 10 {
		for j, w := range sockets {
			f := w.call(fmt.Sprintf("%d-%d", j, i), "new_activity", map[string]any{"type": "message", "text": "socket"})
			if f.Status == "ok" {
				created++
				continue
			}
			if p := f.failure(t, "rate_limited"); p.RetryAfterMS <= 0 || !strings.Contains(p.Message, "tenant") {
				t.Fatalf("refusal %+v", p)
			}
			limited++
		}
	}
	if created != 15 || limited != 15 {
		t.Fatalf("socket frames: %d created and %d refused, want 15 and 15 (the tenant's budget of 20 less the API's 5)", created, limited)
	}
	if r := e.do("POST", path, map[string]any{"type": "message", "text": "over"}, apiKey(s.key)); r.status != 429 {
		t.Fatalf("the tenant API after the sockets spent the budget: %d %s", r.status, r.body)
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM activities WHERE conversation_id = $1`, s.conv).Scan(&n); err != nil || n != 20 {
		t.Fatalf("%d activities stored (%v), want 20", n, err)
	}
}

// dialRefused dials the legacy WebSocket expecting the upgrade to be refused with
// status, and returns the answer's body.
func dialRefused(t *testing.T, base, tok string, status int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL(base, legacyPath(tok)), nil)
	if err == nil {
		c.CloseNow()
		t.Fatalf("connected, want %d", status)
	}
	if resp == nil || resp.StatusCode != status {
		t.Fatalf("dial: %v, want status %d", err, status)
	}
	var body [512]byte
	n, _ := resp.Body.Read(body[:])
	return string(body[:n])
}

// Sockets per token and per conversation are bounded: a sixth socket of one token is
// 429, and so is the 51st of one conversation; a closed socket gives its place back.
func TestLegacyWebSocketSocketsAreBounded(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	issue := func(user string) string {
		tok, err := e.signer.IssueLegacy(s.conv, s.tenantID, user, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	first := issue("u0")
	var open []*legacyClient
	for range 5 {
		open = append(open, dialLegacy(t, e.base, first))
	}
	if body := dialRefused(t, e.base, first, 429); !strings.Contains(body, "rate_limited") || !strings.Contains(body, "token") {
		t.Fatalf("the sixth socket of a token: %s", body)
	}
	// A closed socket gives its place back.
	_ = open[0].c.Close(websocket.StatusNormalClosure, "")
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, _, err := websocket.Dial(ctx, wsURL(e.base, legacyPath(first)), nil)
		cancel()
		if err == nil {
			t.Cleanup(func() { _ = c.CloseNow() })
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the closed socket's place did not come back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// 5 of the conversation are open; 45 more over nine tokens make 50.
	for i := 1; i <= 9; i++ {
		tok := issue(fmt.Sprint("u", i))
		for range 5 {
			dialLegacy(t, e.base, tok)
		}
	}
	if body := dialRefused(t, e.base, issue("u10"), 429); !strings.Contains(body, "conversation") {
		t.Fatalf("the 51st socket of a conversation: %s", body)
	}
	// Another conversation is not affected.
	other := e.setup("webhook")
	tok, _ := e.signer.IssueLegacy(other.conv, other.tenantID, "x", time.Now())
	dialLegacy(t, e.base, tok)
}
