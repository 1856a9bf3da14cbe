package service_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/shared/token"
)

func (s *stack) busiest(top uint32, bucket string) *limiterpb.BusiestResponse {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.limiter.Busiest(ctx, &limiterpb.BusiestRequest{Top: top, Bucket: bucket})
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

func (s *stack) traffic() *limiterpb.TrafficResponse {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.limiter.Traffic(ctx, &limiterpb.TrafficRequest{})
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

func currentMinute(t *testing.T, r *limiterpb.TrafficResponse, bucket string) *limiterpb.MinuteCount {
	t.Helper()
	for _, b := range r.GetBuckets() {
		if b.GetBucket() == bucket {
			m := b.GetMinutes()
			if len(m) != 60 {
				t.Fatalf("%s: %d minutes", bucket, len(m))
			}
			return m[59]
		}
	}
	return &limiterpb.MinuteCount{}
}

// Traffic driven through the ext_authz Check shows in the minute counts and among the
// busiest keys, in the documented key forms, with the limit (a tenant's override at
// once) and the end of the window; API keys and channel secrets never appear.
func TestLiveViewOfChecks(t *testing.T) {
	s := newStack(t, stackOptions{})
	s.waitListening()
	s.clock.set(s.start.Add(10 * time.Second))
	ten := s.tenant()
	ch := s.channel(ten.id)
	for range 12 { // token_create: 10 a minute per IP
		s.check(request("POST", "/api/v1/tokens", "203.0.113.9", nil))
	}
	for range 3 {
		s.check(request("POST", "/api/v1/conversations/c/activities", "192.0.2.1", map[string]string{"x-api-key": ten.apiKey}))
		s.check(request("POST", "/api/v1/converger/tokens/generate", "192.0.2.1", map[string]string{"authorization": "Bearer " + ch.secret}))
	}
	tok := s.token(ch, token.SrcSecret)
	s.check(request("POST", "/api/v1/converger/conversations/c/activities", "192.0.2.1", map[string]string{"authorization": "Bearer " + tok}))

	tr := s.traffic()
	if tr.GetNodes() != 1 || tr.GetNowMs() != s.clock.now().UnixMilli() {
		t.Fatalf("traffic of %d nodes at %d", tr.GetNodes(), tr.GetNowMs())
	}
	for _, c := range []struct {
		bucket          string
		allowed, denied uint64
	}{{"token_create", 10, 2}, {"activity_create", 4, 0}, {"token_generate", 3, 0}} {
		if m := currentMinute(t, tr, c.bucket); m.GetAllowed() != c.allowed || m.GetDenied() != c.denied {
			t.Errorf("%s this minute: %d allowed, %d denied; want %d and %d", c.bucket, m.GetAllowed(), m.GetDenied(), c.allowed, c.denied)
		}
	}

	want := map[string]*limiterpb.BusyKey{
		"token_create:ip:203.0.113.9":      {Count: 12, Limit: 10, WindowMs: 60_000},
		"activity_create:tenant:" + ten.id: {Count: 4, Limit: 100, WindowMs: 1000},
		"token_generate:channel:" + ch.id:  {Count: 3, Limit: 10, WindowMs: 60_000},
	}
	check := func(b *limiterpb.BusiestResponse) {
		t.Helper()
		got := map[string]*limiterpb.BusyKey{}
		for _, bb := range b.GetBuckets() {
			for _, k := range bb.GetKeys() {
				if !strings.HasPrefix(k.GetKey(), bb.GetBucket()+":") {
					t.Errorf("key %q of bucket %s", k.GetKey(), bb.GetBucket())
				}
				for _, secret := range []string{ten.apiKey, ch.secret, tok} {
					if strings.Contains(k.GetKey(), secret) {
						t.Fatalf("a credential is shown as a key: %q", k.GetKey())
					}
				}
				got[k.GetKey()] = k
			}
		}
		for key, w := range want {
			k := got[key]
			if k == nil {
				t.Errorf("%s is not among the busiest: %v", key, b)
				continue
			}
			end := (s.clock.now().UnixMilli()/int64(w.WindowMs) + 1) * int64(w.WindowMs)
			if k.GetCount() != w.Count || k.GetLimit() != w.Limit || k.GetWindowMs() != w.WindowMs || k.GetWindowEndMs() != end {
				t.Errorf("%s: %v, want %d/%d per %d ms ending at %d", key, k, w.Count, w.Limit, w.WindowMs, end)
			}
		}
	}
	check(s.busiest(0, ""))

	// A tenant's new override shows at once.
	if _, err := s.db.Exec(context.Background(), `WITH u AS (UPDATE tenants SET limits = '{"activity_create":{"limit":7,"scale_ms":1000}}'
		WHERE id = $1 RETURNING id) SELECT pg_notify('rate_limit_overrides', id::text) FROM u`, ten.id); err != nil {
		t.Fatal(err)
	}
	want["activity_create:tenant:"+ten.id].Limit = 7
	deadline := time.Now().Add(10 * time.Second)
	for {
		if k := s.busiest(1, "activity_create").GetBuckets(); len(k) == 1 && k[0].GetKeys()[0].GetLimit() == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new override did not show among the busiest keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	check(s.busiest(0, ""))
	if b := s.busiest(1, "token_create").GetBuckets(); len(b) != 1 || len(b[0].GetKeys()) != 1 {
		t.Fatalf("one bucket, top 1: %v", b)
	}

	// A window later the keys of the 1 s windows have gone; the minute counts stay.
	s.clock.advance(2 * time.Second)
	for _, bb := range s.busiest(0, "").GetBuckets() {
		if bb.GetBucket() == "activity_create" {
			t.Errorf("activity_create keys after their window: %v", bb)
		}
	}
	if m := currentMinute(t, s.traffic(), "token_create"); m.GetAllowed() != 10 {
		t.Errorf("token_create minute after 2 s: %v", m)
	}

	ctx := context.Background()
	for _, r := range []*limiterpb.BusiestRequest{{Top: 101}, {Bucket: "Not A Bucket"}} {
		if _, err := s.limiter.Busiest(ctx, r); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Busiest(%v): %v, want InvalidArgument", r, err)
		}
	}
}

// Without a database, API keys and channel secrets are counted by hash: the busiest keys
// show the hash, never the credential.
func TestLiveViewNeverShowsCredentials(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	apiKey := "cvg_live_" + randomB64(32)
	secret := randomB64(32)
	publishable := "cvg_pk_" + randomB64(24)
	reqs := []*authv3.CheckRequest{
		request("POST", "/api/v1/conversations/c/activities", "192.0.2.1", map[string]string{"x-api-key": apiKey}),
		request("POST", "/api/v1/converger/tokens/generate", "192.0.2.1", map[string]string{"authorization": "Bearer " + secret}),
		request("POST", "/api/v1/converger/tokens/publishable", "192.0.2.1", map[string]string{"authorization": "Bearer " + publishable}),
	}
	for range 5 {
		for _, r := range reqs {
			s.check(r)
		}
	}
	b := s.busiest(100, "")
	seen := map[string]bool{}
	for _, bb := range b.GetBuckets() {
		seen[bb.GetBucket()] = true
		for _, k := range bb.GetKeys() {
			for _, cred := range []string{apiKey, secret, publishable, apiKey[9:], secret[:20], publishable[7:]} {
				if strings.Contains(k.GetKey(), cred) {
					t.Fatalf("credential in key %q", k.GetKey())
				}
			}
			if bb.GetBucket() != "publishable_token_ip" && !strings.Contains(k.GetKey(), ":unverified:") {
				t.Errorf("key %q is not the hash of the credential", k.GetKey())
			}
		}
	}
	for _, want := range []string{"activity_create", "token_generate", "publishable_token_ip", "publishable_token"} {
		if !seen[want] {
			t.Errorf("no busy key of %s: %v", want, b)
		}
	}
}

// The bucket list carries the built-in and installation limits; the cluster answer
// says the backend is local.
func TestLiveViewBucketsAndBackend(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true, yaml: "limits:\n  inbound: {limit: 2000, window: 1s}\nroutes:\n" +
		"  - {method: POST, path: /api/v1/conversations, bucket: conversation_create, per: tenant, from: api_key, limit: 20, window: 1s}\n"})
	ctx := context.Background()
	bs, err := s.limiter.Buckets(ctx, &limiterpb.BucketsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*limiterpb.Bucket{}
	for _, b := range bs.GetBuckets() {
		byName[b.GetName()] = b
	}
	in := byName["inbound"]
	if in == nil || !in.GetOverridable() || in.GetBuiltIn().GetLimit() != 500 || in.GetInstallation().GetLimit() != 2000 ||
		in.GetInstallation().GetWindowMs() != 1000 || in.GetKeyPrefix() != "channel:" || in.GetPer() != "channel" {
		t.Errorf("inbound: %v", in)
	}
	if a := byName["activity_create"]; a == nil || a.GetInstallation() != nil || a.GetBuiltIn().GetLimit() != 100 {
		t.Errorf("activity_create: %v", a)
	}
	if c := byName["conversation_create"]; c == nil || c.GetBuiltIn() != nil || c.GetOverridable() || c.GetKeyPrefix() != "tenant:" {
		t.Errorf("conversation_create: %v", c)
	}
	cl, err := s.limiter.Cluster(ctx, &limiterpb.ClusterRequest{})
	if err != nil || cl.GetBackend() != "local" || len(cl.GetMembers()) != 0 {
		t.Fatalf("cluster: %v, %v", cl, err)
	}
}

// Hits given back (a login that succeeded) do not count among the busiest: a Take and
// its Refund leave nothing, a failure stays; the refunds' own counter is never shown.
func TestLiveViewDeductsRefunds(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	ctx := context.Background()
	for _, key := range []string{"admin:ok@example.com", "admin:guess@example.com"} {
		if _, err := s.limiter.Take(ctx, &limiterpb.LimitRequest{Bucket: "login_account", Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.limiter.Refund(ctx, &limiterpb.LimitRequest{Bucket: "login_account", Key: "admin:ok@example.com"}); err != nil {
		t.Fatal(err)
	}
	b := s.busiest(10, "")
	var keys []string
	for _, bb := range b.GetBuckets() {
		for _, k := range bb.GetKeys() {
			keys = append(keys, fmt.Sprintf("%s=%d", k.GetKey(), k.GetCount()))
		}
	}
	if got := strings.Join(keys, ","); got != "login_account:admin:guess@example.com=1" {
		t.Fatalf("busiest: %s", got)
	}
	if m := currentMinute(t, s.traffic(), "login_account"); m.GetAllowed() != 2 {
		t.Fatalf("two Takes this minute: %v", m)
	}
}
