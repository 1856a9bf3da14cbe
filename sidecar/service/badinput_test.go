package service_test

import (
	"encoding/base64"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// Malformed and hostile input never crashes the sidecar, never turns into a gRPC error,
// and never lets a request past a counted route's limit.
func TestBadInput(t *testing.T) {
	s := newStack(t, stackOptions{yaml: "limits:\n  token_create: {limit: 3, window: 60s}\n  inbound: {limit: 3, window: 1s}\n  activity_create: {limit: 3, window: 1s}\n"})

	t.Run("empty and partial requests pass an unlimited decision", func(t *testing.T) {
		for _, r := range []*authv3.CheckRequest{
			{},
			{Attributes: &authv3.AttributeContext{}},
			{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{}}},
			{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{}}}},
			{Attributes: &authv3.AttributeContext{Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{}}}},
		} {
			if !isAllowed(s.check(r)) {
				t.Fatalf("%v denied", r)
			}
		}
	})

	limited := func(t *testing.T, name string, mk func() *authv3.CheckRequest) {
		t.Helper()
		allowed := 0
		for range 10 {
			if isAllowed(s.check(mk())) {
				allowed++
			}
		}
		if allowed > 3 {
			t.Fatalf("%s: %d of 10 allowed past a limit of 3", name, allowed)
		}
	}

	t.Run("addresses that are not IPs share one counter", func(t *testing.T) {
		bad := []string{"", "not-an-ip", "999.1.1.1", "[::1", "1.2.3.4:x", strings.Repeat("9", 10_000)}
		i := 0
		limited(t, "non-IP sources", func() *authv3.CheckRequest {
			i++
			if i%4 == 0 {
				r := request("POST", "/api/v1/tokens", "", nil)
				r.Attributes.Source = nil
				return r
			}
			return request("POST", "/api/v1/tokens", bad[i%len(bad)], nil)
		})
		limited(t, "garbage x-forwarded-for", func() *authv3.CheckRequest {
			return request("POST", "/api/v1/tokens", "198.51.100.99", map[string]string{"x-forwarded-for": strings.Repeat("garbage, ", 20_000)})
		})
	})

	t.Run("a 100 KB path", func(t *testing.T) {
		long := strings.Repeat("a", 100<<10)
		limited(t, "100 KB channel id", func() *authv3.CheckRequest {
			return request("POST", "/api/v1/channels/"+long+"/inbound", "192.0.2.1", nil)
		})
		if !isAllowed(s.check(request("GET", "/"+long, "192.0.2.1", nil))) {
			t.Fatal("a long unlimited path was denied")
		}
		if n := s.sc.Limiter.Len(); n > 10 {
			t.Fatalf("%d counters", n)
		}
	})

	t.Run("huge headers", func(t *testing.T) {
		huge := strings.Repeat("A", 200<<10)
		for _, h := range []map[string]string{
			{"authorization": "Bearer " + huge},
			{"authorization": huge},
			{"x-api-key": huge},
			{"x-request-id": huge},
		} {
			r := request("POST", "/api/v1/converger/conversations/c/activities", "192.0.2.1", h)
			if isAllowed(s.check(r)) {
				t.Fatalf("huge credential allowed on a counted route")
			}
		}
		r := request("POST", "/api/v1/tokens", "192.0.2.2", map[string]string{"x-request-id": huge})
		for range 3 {
			s.check(r)
		}
		_, headers, env := denial(t, s.check(r), &authv3.CheckRequest{})
		if len(env.Error.RequestID) > 128 || headers["x-request-id"] != env.Error.RequestID {
			t.Fatalf("a huge x-request-id was echoed: %d bytes", len(env.Error.RequestID))
		}
	})

	t.Run("malformed tokens", func(t *testing.T) {
		b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
		for _, tok := range []string{
			"", ".", "..", "a.b", "a.b.c.d", "eyJ", "eyJhbGciOiJub25lIn0..",
			b64(`{"alg":"none","typ":"JWT"}`) + "." + b64(`{"type":"converger","tenant_id":"x"}`) + ".",
			b64(`{"alg":"EdDSA","kid":"`+strings.Repeat("k", 5000)+`"}`) + "." + b64(`{}`) + "." + b64("sig"),
			b64(`{"alg":"EdDSA"`) + "." + b64(`[1,2,3]`) + ".%%%",
			strings.Repeat("eyJ.", 1000),
			"\x00\x01\x02",
		} {
			r := request("POST", "/api/v1/converger/tokens/refresh", "192.0.2.1", map[string]string{"authorization": "Bearer " + tok})
			assertRejected(t, s.check(r), r, 403, "forbidden")
		}
	})

	t.Run("odd methods and paths", func(t *testing.T) {
		for _, c := range [][2]string{
			{"POST", "/api/v1/%zz/tokens"}, {"POST", "/../../etc/passwd"}, {"\x00", "/api/v1/tokens"},
			{"POST", "api/v1/tokens"}, {"POST", "/api/v1/tokens\x00"}, {strings.Repeat("P", 10_000), "/"},
		} {
			s.check(request(c[0], c[1], "192.0.2.3", nil))
		}
		// Spellings the core's router folds together are one route.
		limited(t, "spellings of /api/v1/tokens", func() *authv3.CheckRequest {
			p := []string{"/api/v1/tokens", "/API/v1/tokens/", "//api/v1//tokens", "/api/v1/%74okens", "/api/x/../v1/tokens?q=1"}
			return request("POST", p[int(reqSeq.Load())%len(p)], "192.0.2.4", nil)
		})
	})

	// Still serving.
	if !isAllowed(s.check(request("GET", "/api/v1/conversations/c", "192.0.2.1", nil))) {
		t.Fatal("sidecar stopped answering")
	}
}
