package service_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/shared/limiterclient"
	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/shared/token"
)

// Every row of the limited-endpoints table: the default budget is allowed, the next
// request is denied with the full 429 contract; in plain text and over mutual TLS.
func TestEveryLimitedEndpoint(t *testing.T) {
	for _, mtls := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "mtls"}[mtls], func(t *testing.T) { testEveryLimitedEndpoint(t, mtls) })
	}
}

func testEveryLimitedEndpoint(t *testing.T, mutualTLS bool) {
	s := newStack(t, stackOptions{mutualTLS: mutualTLS})
	// Half a second into a minute (and a second): retry_after_ms is what remains.
	s.clock.set(s.start.Add(500 * time.Millisecond))
	ten := s.tenant()
	ch := s.channel(ten.id)
	const ip = "198.51.100.20"
	apiKey := map[string]string{"x-api-key": ten.apiKey}
	bearer := func(v string) map[string]string { return map[string]string{"authorization": "Bearer " + v} }

	cases := []struct {
		bucket  string
		budget  int
		retryMS int64
		// req builds the i-th request; identities are fresh per case.
		req func(i int, c channel, tn tenant) *authv3.CheckRequest
	}{
		{"activity_create (tenant API)", 100, 500, func(_ int, _ channel, tn tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/conversations/c1/activities", ip, map[string]string{"x-api-key": tn.apiKey})
		}},
		{"activity_create (client API)", 100, 500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/converger/conversations/c1/activities", ip, bearer(s.token(c, token.SrcSecret)))
		}},
		{"upload", 10, 500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/converger/conversations/c1/upload?userId=u1", ip, bearer(s.token(c, token.SrcSecret)))
		}},
		{"inbound", 500, 500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/channels/"+c.id+"/inbound", ip, nil)
		}},
		{"inbound (status)", 500, 500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/channels/"+c.id+"/status", ip, nil)
		}},
		{"token_generate", 10, 59_500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/converger/tokens/generate", ip, bearer(c.secret))
		}},
		{"token_generate (refresh)", 10, 59_500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/converger/tokens/refresh", ip, bearer(s.token(c, token.SrcSecret)))
		}},
		{"publishable_token_ip", 10, 59_500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/converger/tokens/publishable", "198.51.100.30", bearer(c.publishable))
		}},
		{"publishable_token (one channel, many IPs)", 300, 59_500, func(i int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/converger/tokens/publishable", fmt.Sprintf("203.0.113.%d", i/10), bearer(c.publishable))
		}},
		{"publishable_token (refresh of a publishable token)", 300, 59_500, func(_ int, c channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/converger/tokens/refresh", ip, bearer(s.token(c, token.SrcPublishable)))
		}},
		{"token_create", 10, 59_500, func(_ int, _ channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/api/v1/tokens", "192.0.2.77", apiKey)
		}},
		{"password_reset_ip (admin)", 5, 59_500, func(_ int, _ channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/admin/password/reset", "192.0.2.78", nil)
		}},
		{"password_reset_ip (portal)", 5, 59_500, func(_ int, _ channel, _ tenant) *authv3.CheckRequest {
			return request("POST", "/portal/password/reset", "192.0.2.79", nil)
		}},
	}
	for _, c := range cases {
		t.Run(c.bucket, func(t *testing.T) {
			tn := s.tenant()
			chn := s.channel(tn.id)
			for i := range c.budget {
				if r := s.check(c.req(i, chn, tn)); !isAllowed(r) {
					t.Fatalf("request %d of a budget of %d denied: %v", i+1, c.budget, r.GetDeniedResponse().GetBody())
				}
			}
			req := c.req(c.budget, chn, tn)
			assert429(t, s.check(req), req, c.retryMS)
		})
	}
	_ = ch
}

// The login rows and the per-account password reset are counted by the core through
// the Limiter service: Record failures, Peek before checking a password.
func TestLimiterServiceCoversTheCoreCountedRows(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	s.clock.set(s.start.Add(10 * time.Second))
	ctx := context.Background()
	for _, c := range []struct {
		bucket, key string
		budget      uint64
		windowMS    uint64
	}{
		{"login_ip", "203.0.113.5", 5, 60_000},
		{"login_account", "admin:alice@example.com", 5, 60_000},
		{"login_account", "tenant:acme:bob@example.com", 5, 60_000},
		{"login_account", "admin-2fa:6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a10", 5, 60_000},
		{"password_reset_account", "admin::alice@example.com", 3, 3_600_000},
	} {
		for i := uint64(1); i <= c.budget; i++ {
			r, err := s.limiter.Peek(ctx, &limiterpb.LimitRequest{Bucket: c.bucket, Key: c.key})
			if err != nil || !r.Allowed {
				t.Fatalf("%s %s: peek before failure %d: %v %v", c.bucket, c.key, i, r, err)
			}
			r, err = s.limiter.Record(ctx, &limiterpb.LimitRequest{Bucket: c.bucket, Key: c.key})
			if err != nil || !r.Allowed || r.Count != i || r.Limit != c.budget || r.WindowMs != c.windowMS {
				t.Fatalf("%s %s: record %d: %v %v", c.bucket, c.key, i, r, err)
			}
		}
		r, err := s.limiter.Peek(ctx, &limiterpb.LimitRequest{Bucket: c.bucket, Key: c.key})
		if err != nil || r.Allowed || r.RetryAfterMs != c.windowMS-10_000 {
			t.Fatalf("%s %s: peek after the budget: %v %v; want denied with %d ms left", c.bucket, c.key, r, err, c.windowMS-10_000)
		}
	}
	if !strings.Contains(s.metrics(), `converger_rate_limit_exceeded_count{bucket="login_account"} 3`) {
		t.Error("lockouts are not counted in converger_rate_limit_exceeded_count")
	}
}

func TestPeekNeverCounts(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	ctx := context.Background()
	req := &limiterpb.LimitRequest{Bucket: "login_ip", Key: "192.0.2.1"}
	for range 50 {
		r, err := s.limiter.Peek(ctx, req)
		if err != nil || !r.Allowed || r.Count != 0 {
			t.Fatalf("peek: %v %v", r, err)
		}
	}
	r, err := s.limiter.Check(ctx, &limiterpb.LimitRequest{Bucket: "login_ip", Key: "192.0.2.1", Hits: 2})
	if err != nil || !r.Allowed || r.Count != 2 {
		t.Fatalf("check of 2 hits: %v %v", r, err)
	}
	r, err = s.limiter.Peek(ctx, req)
	if err != nil || r.Count != 2 {
		t.Fatalf("peek after check: %v %v", r, err)
	}
}

func TestLimiterServiceRejectsBadRequests(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	ctx := context.Background()
	for _, req := range []*limiterpb.LimitRequest{
		{},
		{Bucket: "login_ip"},
		{Bucket: "no_such_bucket", Key: "k"},
		{Bucket: "Login-IP", Key: "k"},
		{Bucket: "login_ip", Key: strings.Repeat("k", 513)},
		{Bucket: "login_ip", Key: "k", Hits: 2_000_000},
	} {
		if r, err := s.limiter.Check(ctx, req); err == nil {
			t.Errorf("Check(%v) = %v, want InvalidArgument", req, r)
		}
	}
}

func TestKeysAreIsolated(t *testing.T) {
	s := newStack(t, stackOptions{yaml: "limits:\n  activity_create: {limit: 2, window: 1s}\n  inbound: {limit: 2, window: 1s}\n  token_create: {limit: 2, window: 60s}\n"})
	a, b := s.tenant(), s.tenant()
	ca, cb := s.channel(a.id), s.channel(b.id)
	use := func(mk func() *authv3.CheckRequest) {
		t.Helper()
		for range 2 {
			if !isAllowed(s.check(mk())) {
				t.Fatal("budget denied")
			}
		}
		if isAllowed(s.check(mk())) {
			t.Fatal("over the budget allowed")
		}
	}
	act := func(tn tenant) func() *authv3.CheckRequest {
		return func() *authv3.CheckRequest {
			return request("POST", "/api/v1/conversations/c/activities", "192.0.2.1", map[string]string{"x-api-key": tn.apiKey})
		}
	}
	inb := func(c channel) func() *authv3.CheckRequest {
		return func() *authv3.CheckRequest {
			return request("POST", "/api/v1/channels/"+c.id+"/inbound", "192.0.2.1", nil)
		}
	}
	tok := func(ip string) func() *authv3.CheckRequest {
		return func() *authv3.CheckRequest { return request("POST", "/api/v1/tokens", ip, nil) }
	}
	use(act(a))
	use(act(b))
	use(inb(ca))
	use(inb(cb))
	use(tok("192.0.2.10"))
	use(tok("192.0.2.11"))
	use(tok("2001:db8::10"))
	// The client-API activity shares the tenant's bucket with the tenant API.
	r := request("POST", "/api/v1/converger/conversations/c/activities", "192.0.2.1",
		map[string]string{"authorization": "Bearer " + s.token(ca, token.SrcSecret)})
	if isAllowed(s.check(r)) {
		t.Fatal("client API activity of tenant a allowed after the tenant API used a's budget")
	}
}

func TestWindowRollover(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	req := func() *authv3.CheckRequest { return request("POST", "/api/v1/tokens", "192.0.2.50", nil) }
	for window := range 3 {
		s.clock.set(s.start.Add(time.Duration(window) * time.Minute))
		for i := range 10 {
			if !isAllowed(s.check(req())) {
				t.Fatalf("window %d: request %d denied", window, i+1)
			}
		}
		s.clock.advance(time.Minute - time.Millisecond)
		r := req()
		assert429(t, s.check(r), r, 1)
	}
}

func TestRetryAfterIsRoundedUp(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	for i, c := range []struct {
		into    time.Duration // into the minute when the limit is reached
		retryMS int64
	}{
		{0, 60_000},
		{1 * time.Millisecond, 59_999},
		{58_999 * time.Millisecond, 1001},
		{59_001 * time.Millisecond, 999},
		{59_999 * time.Millisecond, 1},
	} {
		s.clock.set(s.start.Add(time.Duration(i)*time.Hour + c.into))
		ip := fmt.Sprintf("192.0.2.%d", 100+i)
		for range 10 {
			s.check(request("POST", "/api/v1/tokens", ip, nil))
		}
		r := request("POST", "/api/v1/tokens", ip, nil)
		assert429(t, s.check(r), r, c.retryMS)
	}
}

func TestDenialsAreVisibleInMetrics(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	for range 13 {
		s.check(request("POST", "/admin/password/reset", "192.0.2.9", nil))
	}
	s.check(request("GET", "/api/v1/conversations/c/activities", "192.0.2.9", nil))
	m := s.metrics()
	for _, want := range []string{
		`converger_rate_limit_exceeded_count{bucket="password_reset_ip"} 8`,
		`converger_sidecar_checks_total{bucket="password_reset_ip",decision="allowed"} 5`,
		`converger_sidecar_checks_total{bucket="password_reset_ip",decision="denied"} 8`,
		`converger_sidecar_checks_total{bucket="none",decision="allowed"} 1`,
		`converger_sidecar_check_duration_seconds_count 14`,
		`converger_sidecar_limiter_keys 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Unlimited routes and the logins (counted by the core) pass without counting.
func TestUnlimitedRoutesPass(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	for _, r := range [][2]string{
		{"GET", "/api/v1/conversations/c/activities"},
		{"GET", "/api/v1/converger/conversations/c/activities?watermark=abc"},
		{"POST", "/api/v1/conversations"},
		{"POST", "/admin/login"},
		{"POST", "/portal/login/totp"},
		{"GET", "/healthz"},
	} {
		for range 20 {
			if !isAllowed(s.check(request(r[0], r[1], "192.0.2.1", nil))) {
				t.Fatalf("%s %s denied", r[0], r[1])
			}
		}
	}
	if n := s.sc.Limiter.Len(); n != 0 {
		t.Fatalf("%d counters created by unlimited routes", n)
	}
}

// The Go client the core uses, against the real service.
func TestLimiterClient(t *testing.T) {
	for _, mtls := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "mtls"}[mtls], func(t *testing.T) { testLimiterClient(t, mtls) })
	}
}

func testLimiterClient(t *testing.T, mutualTLS bool) {
	s := newStack(t, stackOptions{noDatabase: true, mutualTLS: mutualTLS})
	s.clock.set(s.start.Add(59_500 * time.Millisecond))
	c, err := limiterclient.New(s.sc.GRPCAddr.String(), limiterclient.WithTLS(s.tls))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if mutualTLS {
		plain, err := limiterclient.New(s.sc.GRPCAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		if _, err := plain.Check(ctx, "login_account", "x", 1); err == nil {
			t.Fatal("a plain-text client was answered on the mutual TLS port")
		}
	}
	if r, err := c.Record(ctx, "login_account", "tenant:acme:eve@example.com", 5); err != nil || !r.Allowed || r.Count != 5 || r.Window != time.Minute {
		t.Fatalf("record: %+v %v", r, err)
	}
	r, err := c.Peek(ctx, "login_account", "tenant:acme:eve@example.com")
	if err != nil || r.Allowed || r.RetryAfter != 500*time.Millisecond || r.RetryAfterSeconds() != 1 {
		t.Fatalf("peek: %+v %v", r, err)
	}
	if r, err := c.Check(ctx, "password_reset_account", "admin::eve@example.com", 1); err != nil || !r.Allowed || r.Limit != 3 {
		t.Fatalf("check: %+v %v", r, err)
	}
	if _, err := c.Check(ctx, "nope", "k", 1); err == nil {
		t.Fatal("unknown bucket accepted")
	}
}

// Take over gRPC admits exactly the limit of 150 parallel calls and counts none it
// refuses; Refund gives one back; Check and Take of a per-tenant overridable bucket use
// the tenant's override, as the ext_authz Check does.
func TestTakeAndRefund(t *testing.T) {
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	req := &limiterpb.LimitRequest{Bucket: "login_account", Key: "admin:a@example.com"}
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 150 {
		wg.Go(func() {
			r, err := s.limiter.Take(ctx, req)
			if err != nil {
				t.Error(err)
				return
			}
			if r.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 5 {
		t.Fatalf("%d of 150 parallel Takes admitted, want 5", admitted.Load())
	}
	if r, err := s.limiter.Refund(ctx, req); err != nil || r.Count != 4 {
		t.Fatalf("refund: %v %v, want count 4", r, err)
	}
	if r, err := s.limiter.Take(ctx, req); err != nil || !r.Allowed || r.Count != 5 {
		t.Fatalf("take after the refund: %v %v", r, err)
	}

	ten := s.tenant()
	if _, err := s.db.Exec(ctx, `UPDATE tenants SET limits = '{"activity_create": {"limit": 2, "scale_ms": 60000}}' WHERE id = $1`, ten.id); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		r, err := s.limiter.Check(ctx, &limiterpb.LimitRequest{Bucket: "activity_create", Key: ten.id})
		if err != nil || r.Allowed != (i <= 2) || r.Limit != 2 || r.WindowMs != 60000 {
			t.Fatalf("check %d of a tenant with an override of 2/60s: %v %v", i, r, err)
		}
	}
	// The same counter as the tenant API's route.
	r := request("POST", "/api/v1/conversations/c1/activities", "192.0.2.1", map[string]string{"x-api-key": ten.apiKey})
	assert429(t, s.check(r), r, 60_000)
}
