package service_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/shared/token"
)

// The client IP of IP-counted routes follows TRUSTED_PROXIES: each case uses up its
// resolved IP's budget and checks that the resolved IP, and nothing else, is spent.
func TestTrustedProxies(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true, env: map[string]string{"TRUSTED_PROXIES": "10.0.0.0/8, 2001:db8:ffff::/48"}})
	cases := []struct {
		name, source, xff, client string
	}{
		{"untrusted source, spoofed header ignored", "198.51.100.1", "203.0.113.1", "198.51.100.1"},
		{"trusted source, client from the header", "10.0.0.1", "203.0.113.2", "203.0.113.2"},
		{"right to left, skipping trusted hops", "10.0.0.1", "1.1.1.1, 203.0.113.3, 10.9.9.9", "203.0.113.3"},
		{"unparsable entry stops at the last trusted hop", "10.0.0.1", "203.0.113.4, bogus, 10.7.7.7", "10.7.7.7"},
		{"all trusted gives the left-most", "10.0.0.1", "10.5.5.5, 10.6.6.6", "10.5.5.5"},
		{"IPv6 client", "10.0.0.1", "2001:db8:1::5", "2001:db8:1::5"},
		{"bracketed IPv6 with port", "10.0.0.1", "[2001:db8:2::6]:8443", "2001:db8:2::6"},
		{"IPv4 with port", "10.0.0.1", "203.0.113.7:5555", "203.0.113.7"},
		{"trusted IPv6 source", "2001:db8:ffff::1", "203.0.113.8", "203.0.113.8"},
		{"IPv4-mapped source matches the IPv4 range", "::ffff:10.0.0.1", "203.0.113.9", "203.0.113.9"},
		{"IPv4-mapped client counts as IPv4", "10.0.0.1", "::ffff:203.0.113.10", "203.0.113.10"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			via := func(source, xff string) *authv3.CheckRequest {
				h := map[string]string{}
				if xff != "" {
					h["x-forwarded-for"] = xff
				}
				return request("POST", "/api/v1/tokens", source, h)
			}
			for i := range 10 {
				if !isAllowed(s.check(via(c.source, c.xff))) {
					t.Fatalf("request %d denied", i+1)
				}
			}
			if isAllowed(s.check(via(c.source, c.xff))) {
				t.Fatal("11th request allowed")
			}
			// The same client directly (no proxy) is also spent: the counter is its IP.
			if isAllowed(s.check(via(c.client, ""))) {
				t.Fatalf("%s was not the counted client", c.client)
			}
		})
	}
}

// Requests with missing or invalid credentials on tenant- or channel-counted routes are
// answered like the core would and are not counted.
func TestBadCredentialsAreAnsweredAndNotCounted(t *testing.T) {
	s := newStack(t, stackOptions{yaml: "limits:\n  activity_create: {limit: 3, window: 1s}\n  token_generate: {limit: 3, window: 60s}\n  upload: {limit: 3, window: 1s}\n"})
	ten := s.tenant()
	ch := s.channel(ten.id)
	other, _ := token.GenerateKey()
	foreign, _ := token.ParseSigningKey(other)
	foreignTok, _ := foreign.Issue(token.Claims{TenantID: ten.id, ChannelID: ch.id, Src: token.SrcSecret}, s.clock.now())
	expired, _ := s.signer.Issue(token.Claims{TenantID: ten.id, ChannelID: ch.id, Src: token.SrcSecret}, s.clock.now().Add(-time.Hour))
	inactive := s.tenant()
	if _, err := s.db.Exec(context.Background(), `UPDATE tenants SET status = 'inactive' WHERE id = $1`, inactive.id); err != nil {
		t.Fatal(err)
	}
	inactiveCh := s.channel(ten.id)
	if _, err := s.db.Exec(context.Background(), `UPDATE channels SET status = 'inactive' WHERE id = $1`, inactiveCh.id); err != nil {
		t.Fatal(err)
	}

	act := "/api/v1/conversations/c1/activities"
	client := "/api/v1/converger/conversations/c1/activities"
	bad := []struct {
		name, path string
		headers    map[string]string
		status     int
		code       string
	}{
		{"no API key", act, nil, 401, "unauthorized"},
		{"unknown API key", act, map[string]string{"x-api-key": "cvg_live_" + randomB64(32)}, 401, "unauthorized"},
		{"malformed API key", act, map[string]string{"x-api-key": "not a key"}, 401, "unauthorized"},
		{"inactive tenant's key", act, map[string]string{"x-api-key": inactive.apiKey}, 401, "unauthorized"},
		{"no token", client, nil, 403, "forbidden"},
		{"garbage token", client, map[string]string{"authorization": "Bearer abc.def.ghi"}, 403, "forbidden"},
		{"token of another key", client, map[string]string{"authorization": "Bearer " + foreignTok}, 403, "forbidden"},
		{"expired token", client, map[string]string{"authorization": "Bearer " + expired}, 403, "forbidden"},
		{"basic auth", client, map[string]string{"authorization": "Basic dXNlcjpwYXNz"}, 403, "forbidden"},
		{"channel secret as token", "/api/v1/converger/conversations/c1/upload", map[string]string{"authorization": "Bearer " + ch.secret}, 403, "forbidden"},
		{"unknown secret", "/api/v1/converger/tokens/generate", map[string]string{"authorization": "Bearer " + randomB64(32)}, 403, "forbidden"},
		{"inactive channel's secret", "/api/v1/converger/tokens/generate", map[string]string{"authorization": "Bearer " + inactiveCh.secret}, 403, "forbidden"},
		{"token instead of a secret", "/api/v1/converger/tokens/generate", map[string]string{"authorization": "Bearer " + s.token(ch, token.SrcSecret)}, 400, "bad_request"},
		{"refresh with an expired token", "/api/v1/converger/tokens/refresh", map[string]string{"authorization": "Bearer " + expired}, 403, "forbidden"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			for range 20 {
				r := request("POST", b.path, "192.0.2.1", b.headers)
				assertRejected(t, s.check(r), r, b.status, b.code)
			}
		})
	}
	// None of it was counted: the real credentials still have their whole budget.
	good := []*authv3.CheckRequest{
		request("POST", act, "192.0.2.1", map[string]string{"x-api-key": ten.apiKey}),
		request("POST", "/api/v1/converger/tokens/generate", "192.0.2.1", map[string]string{"authorization": "Bearer " + ch.secret}),
	}
	for _, r := range good {
		for i := range 3 {
			if !isAllowed(s.check(r)) {
				t.Fatalf("%s: request %d of the budget denied after bad credentials", r.Attributes.Request.Http.Path, i+1)
			}
		}
	}
	if !strings.Contains(s.metrics(), `converger_sidecar_checks_total{bucket="activity_create",decision="rejected"}`) {
		t.Error("rejections are not in the metrics")
	}
}

// A publishable key exchange counts the client IP before the key is looked up, so a
// flood of bad keys from one address ends in 429.
func TestPublishableIPIsCountedBeforeTheKey(t *testing.T) {
	s := newStack(t, stackOptions{})
	for i := range 10 {
		r := request("POST", "/api/v1/converger/tokens/publishable", "192.0.2.44",
			map[string]string{"authorization": "Bearer cvg_pk_" + randomB64(24)})
		assertRejected(t, s.check(r), r, 403, "forbidden")
		_ = i
	}
	r := request("POST", "/api/v1/converger/tokens/publishable", "192.0.2.44",
		map[string]string{"authorization": "Bearer cvg_pk_" + randomB64(24)})
	assert429(t, s.check(r), r, 60_000)
}

// Inbound webhooks are counted on the path id before anything else: unknown channels
// and ids that are not UUIDs included.
func TestInboundCountsTheRawChannelID(t *testing.T) {
	s := newStack(t, stackOptions{yaml: "limits:\n  inbound: {limit: 3, window: 1s}\n"})
	for _, id := range []string{"not-a-uuid", "6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a10", strings.Repeat("x", 5000)} {
		for i := range 3 {
			if !isAllowed(s.check(request("POST", "/api/v1/channels/"+id+"/inbound", "192.0.2.1", nil))) {
				t.Fatalf("%.20s: request %d denied", id, i+1)
			}
		}
		r := request("POST", "/api/v1/channels/"+id+"/status", "192.0.2.1", nil)
		assert429(t, s.check(r), r, 1000)
	}
}

// A channel id is counted in its canonical (lower-case) form, as the core looks it up:
// 1,500 posts with random case variants of one id share one counter of 500, and the
// lower-case id is spent after them.
func TestInboundCaseVariantsShareOneCounter(t *testing.T) {
	s := newStack(t, stackOptions{yaml: "limits:\n  inbound: {limit: 500, window: 1h}\n"})
	ch := s.channel(s.tenant().id)
	rng := rand.New(rand.NewPCG(1, 2))
	allowed := 0
	for range 1500 {
		b := []byte(ch.id)
		for i, c := range b {
			if c >= 'a' && c <= 'f' && rng.IntN(2) == 0 {
				b[i] = c - 'a' + 'A'
			}
		}
		path := []string{"/inbound", "/status"}[rng.IntN(2)]
		if isAllowed(s.check(request("POST", "/api/v1/channels/"+string(b)+path, "192.0.2.1", nil))) {
			allowed++
		}
	}
	if allowed != 500 {
		t.Fatalf("%d of 1,500 case variants allowed, want 500 (one counter)", allowed)
	}
	r := request("POST", "/api/v1/channels/"+ch.id+"/inbound", "192.0.2.1", nil)
	if isAllowed(s.check(r)) {
		t.Fatal("the canonical id is not spent by its case variants")
	}
	upper := request("POST", "/api/v1/channels/"+strings.ToUpper(ch.id)+"/inbound", "192.0.2.1", nil)
	if isAllowed(s.check(upper)) {
		t.Fatal("the upper-case id has its own counter")
	}
}

// IPv6 clients are counted per /64 (CLIENT_IPV6_PREFIX): 20 addresses of one /64 share
// one token_create budget of 10, another /64 has its own, and with a /128 prefix each
// address is its own client again.
func TestIPv6ClientsArePerPrefix(t *testing.T) {
	post := func(s *stack, ip string) bool {
		return isAllowed(s.check(request("POST", "/api/v1/tokens", ip, nil)))
	}
	s := newStack(t, stackOptions{noDatabase: true})
	allowed := 0
	for i := range 20 {
		// Spellings vary too: expanded, compressed, upper-case.
		ip := fmt.Sprintf("2001:db8:aa:bb:%x:%x:%x:%x", (i*7919)&0xffff, i, 0xffff-i, i*3)
		if i%3 == 0 {
			ip = strings.ToUpper(fmt.Sprintf("2001:0db8:00aa:00bb::%x", i+1))
		}
		if post(s, ip) {
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("%d of 20 addresses of one /64 allowed, want 10 (one budget)", allowed)
	}
	if !post(s, "2001:db8:aa:bc::1") {
		t.Fatal("another /64 is spent too")
	}
	// IPv4-mapped IPv6 is the IPv4 address.
	for range 10 {
		post(s, "192.0.2.200")
	}
	if post(s, "::ffff:192.0.2.200") {
		t.Fatal("an IPv4-mapped spelling has its own budget")
	}

	s = newStack(t, stackOptions{noDatabase: true, env: map[string]string{"CLIENT_IPV6_PREFIX": "128"}})
	for i := range 20 {
		if !post(s, fmt.Sprintf("2001:db8:aa:bb::%x", i+1)) {
			t.Fatalf("with CLIENT_IPV6_PREFIX=128, address %d denied", i+1)
		}
	}
}
