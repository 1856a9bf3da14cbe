package identity

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/routes"
)

const (
	tenantID  = "6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a10"
	channelID = "0b9d7d2e-13a4-4c55-8f0e-6e2f1b7a9c21"
)

func signer(t *testing.T) (*token.Signer, *token.Verifier) {
	t.Helper()
	k, _ := token.GenerateKey()
	s, err := token.ParseSigningKey(k)
	if err != nil {
		t.Fatal(err)
	}
	v, err := token.ParseVerifyKeys(s.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

func req(headers map[string]string, source string) *Request {
	return &Request{Header: func(n string) string { return headers[n] }, Source: source}
}

func TestTokenIdentities(t *testing.T) {
	s, v := signer(t)
	r := New(nil, NewTokenCache(v, 0), nil)
	tok, _ := s.Issue(token.Claims{TenantID: tenantID, ChannelID: channelID, Src: token.SrcPublishable}, time.Now())
	h := map[string]string{"authorization": "bEaReR   " + tok}
	id, rej := r.Identify(routes.Step{Per: buckets.PerTenant, From: routes.FromToken}, req(h, ""))
	if rej != nil || id.ID != tenantID || id.TenantID != tenantID || id.Src != token.SrcPublishable {
		t.Fatalf("tenant from token: %+v %v", id, rej)
	}
	id, rej = r.Identify(routes.Step{Per: buckets.PerChannel, From: routes.FromToken}, req(h, ""))
	if rej != nil || id.ID != channelID || id.TenantID != tenantID {
		t.Fatalf("channel from token: %+v %v", id, rej)
	}
	for _, bad := range []string{"", tok, "Bearer", "Bearer ", "Token " + tok, "Bearer " + tok + "x"} {
		if _, rej := r.Identify(routes.Step{Per: buckets.PerTenant, From: routes.FromToken}, req(map[string]string{"authorization": bad}, "")); rej == nil || rej.Status != 403 {
			t.Errorf("authorization %.30q: %v, want 403", bad, rej)
		}
	}
	// Without verify keys every token is refused.
	none := New(nil, NewTokenCache(nil, 0), nil)
	if _, rej := none.Identify(routes.Step{Per: buckets.PerTenant, From: routes.FromToken}, req(h, "")); rej == nil {
		t.Error("a token was accepted without verify keys")
	}
}

func TestCredentialsWithoutADatabaseAreCountedUnverified(t *testing.T) {
	r := New(nil, NewTokenCache(nil, 0), nil)
	key := "cvg_live_" + strings.Repeat("k", 43)
	a, rej := r.Identify(routes.Step{Per: buckets.PerTenant, From: routes.FromAPIKey}, req(map[string]string{"x-api-key": key}, ""))
	b, _ := r.Identify(routes.Step{Per: buckets.PerTenant, From: routes.FromAPIKey}, req(map[string]string{"x-api-key": key}, ""))
	c, _ := r.Identify(routes.Step{Per: buckets.PerTenant, From: routes.FromAPIKey}, req(map[string]string{"x-api-key": key + "x"}, ""))
	if rej != nil || a.ID != b.ID || a.ID == c.ID || !strings.HasPrefix(a.ID, "unverified:") || strings.Contains(a.ID, key) || a.TenantID != "" {
		t.Fatalf("unverified identities: %+v %+v %+v %v", a, b, c, rej)
	}
	// Implausible credentials are refused without a lookup.
	for from, h := range map[routes.Source]map[string]string{
		routes.FromAPIKey:         {"x-api-key": "cvg_test_" + strings.Repeat("k", 43)},
		routes.FromChannelSecret:  {"authorization": "Bearer short"},
		routes.FromPublishableKey: {"authorization": "Bearer " + strings.Repeat("k", 43)},
	} {
		per := buckets.PerChannel
		if from == routes.FromAPIKey {
			per = buckets.PerTenant
		}
		if _, rej := r.Identify(routes.Step{Per: per, From: from}, req(h, "")); rej == nil {
			t.Errorf("%s: implausible credential accepted", from)
		}
	}
}

func TestPathAndIPIdentities(t *testing.T) {
	ips, _ := clientip.Parse("10.0.0.0/8")
	r := New(nil, NewTokenCache(nil, 0), ips)
	p := req(nil, "")
	p.ChannelID = "anything"
	if id, _ := r.Identify(routes.Step{Per: buckets.PerChannel, From: routes.FromPath}, p); id.ID != "anything" {
		t.Errorf("path id: %+v", id)
	}
	p.ChannelID = strings.Repeat("x", 65)
	id, _ := r.Identify(routes.Step{Per: buckets.PerChannel, From: routes.FromPath}, p)
	if !strings.HasPrefix(id.ID, "sha256:") || len(id.ID) > 64 {
		t.Errorf("long path id kept verbatim: %d bytes", len(id.ID))
	}
	for src, want := range map[string]string{"10.1.1.1": "203.0.113.1", "198.51.100.1": "198.51.100.1", "bogus": UnknownIP, "": UnknownIP} {
		got, _ := r.Identify(routes.Step{Per: buckets.PerIP, From: routes.FromIP}, req(map[string]string{"x-forwarded-for": "203.0.113.1"}, src))
		if got.ID != want {
			t.Errorf("source %q: %q, want %q", src, got.ID, want)
		}
	}
}

func TestTokenCache(t *testing.T) {
	s, v := signer(t)
	now := time.Now()
	v.Now = func() time.Time { return now }
	c := NewTokenCache(v, 50)
	tok, _ := s.Issue(token.Claims{TenantID: tenantID, ChannelID: channelID, Src: token.SrcSecret}, now)
	for range 2 { // verified, then from the cache
		if c.Verify(tok) == nil {
			t.Fatal("valid token refused")
		}
	}
	if len(c.m) != 1 {
		t.Fatalf("%d cached", len(c.m))
	}
	// A cached token still expires on time.
	now = now.Add(token.Lifetime + time.Minute)
	if c.Verify(tok) != nil {
		t.Fatal("expired cached token accepted")
	}
	// Invalid tokens are remembered, and the cache stays bounded.
	for i := range 500 {
		if c.Verify(fmt.Sprintf("bad.%d.token", i)) != nil {
			t.Fatal("bad token accepted")
		}
	}
	if len(c.m) > 50 {
		t.Fatalf("cache grew to %d entries, bound 50", len(c.m))
	}
}

func BenchmarkTokenCacheHit(b *testing.B) {
	k, _ := token.GenerateKey()
	s, _ := token.ParseSigningKey(k)
	v, _ := token.ParseVerifyKeys(s.PublicKey())
	c := NewTokenCache(v, 0)
	tok, _ := s.Issue(token.Claims{TenantID: tenantID, ChannelID: channelID, Src: token.SrcSecret}, time.Now())
	c.Verify(tok)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if c.Verify(tok) == nil {
				b.Fatal("refused")
			}
		}
	})
}

// A token over a caller's buffer, reused once Verify returns, stays cached as it was.
func TestTokenCacheKeepsNoCallerBuffer(t *testing.T) {
	s, v := signer(t)
	c := NewTokenCache(v, 0)
	tok, err := s.Issue(token.Claims{TenantID: tenantID, ChannelID: channelID, Src: token.SrcSecret}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	buf := []byte(tok)
	if c.Verify(unsafe.String(&buf[0], len(buf))) == nil {
		t.Fatal("a valid token was refused")
	}
	copy(buf, strings.Repeat("x", len(buf)))
	c.mu.RLock()
	defer c.mu.RUnlock()
	if _, ok := c.m[tok]; !ok || len(c.m) != 1 {
		t.Fatalf("the cache holds %d tokens, not the one verified", len(c.m))
	}
}

// The ids Identify builds in Request.Buf are those it builds without it.
func TestIdsBuiltInTheBuffer(t *testing.T) {
	ips, _ := clientip.Parse("10.0.0.0/8")
	r := New(nil, NewTokenCache(nil, 0), ips)
	for _, c := range []struct {
		step    routes.Step
		headers map[string]string
		source  string
	}{
		{routes.Step{From: routes.FromIP, Per: buckets.PerIP}, map[string]string{"x-forwarded-for": "2001:db8:1:2:3:4:5:6"}, "10.0.0.1"},
		{routes.Step{From: routes.FromIP, Per: buckets.PerIP}, nil, "[::ffff:192.0.2.1]:80"},
		{routes.Step{From: routes.FromAPIKey, Per: buckets.PerTenant}, map[string]string{"x-api-key": "cvg_live_" + strings.Repeat("a", 30)}, "10.0.0.1"},
		{routes.Step{From: routes.FromChannelSecret, Per: buckets.PerChannel}, map[string]string{"authorization": "Bearer " + strings.Repeat("s", 40)}, "10.0.0.1"},
	} {
		without, err1 := r.Identify(c.step, req(c.headers, c.source))
		rq := req(c.headers, c.source)
		rq.Buf = make([]byte, 0, MaxBufferedID)
		with, err2 := r.Identify(c.step, rq)
		if err1 != nil || err2 != nil || with != without || with.ID == "" {
			t.Errorf("%v: %+v %v with the buffer, %+v %v without", c.step.From, with, err2, without, err1)
		}
	}
}
