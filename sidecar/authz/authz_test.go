package authz

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/shared/tracing"
	"github.com/converger/edge/sidecar/identity"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/metrics"
	"github.com/converger/edge/sidecar/routes"
	"github.com/converger/edge/sidecar/traffic"
)

type defaults struct{}

func (defaults) BaseLimit(bucket string, route buckets.Limit) (buckets.Limit, bool) {
	if b, ok := buckets.Lookup(bucket); ok {
		return b.Default, true
	}
	return route, route.Count > 0
}

func newServer(tb testing.TB) (*Server, *token.Signer) {
	tb.Helper()
	k, _ := token.GenerateKey()
	signer, _ := token.ParseSigningKey(k)
	v, _ := token.ParseVerifyKeys(signer.PublicKey())
	table, err := routes.New(routes.BuiltIn())
	if err != nil {
		tb.Fatal(err)
	}
	ips, _ := clientip.Parse("10.0.0.0/8")
	s, err := New(table, identity.New(nil, identity.NewTokenCache(v, 0), ips), limiter.New(limiter.Options{}), defaults{}, nil, metrics.New())
	if err != nil {
		tb.Fatal(err)
	}
	return s, signer
}

func checkRequest(method, path, source string, headers map[string]string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: source}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: method, Path: path, Headers: headers}},
	}}
}

// The raw header list Envoy sends with encode_raw_headers is read like the map.
func TestHeaderMapIsRead(t *testing.T) {
	s, _ := newServer(t)
	r := checkRequest("POST", "/api/v1/tokens", "10.0.0.1", nil)
	r.Attributes.Request.Http.HeaderMap = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: "x-forwarded-for", RawValue: []byte("198.51.100.3")},
		{Key: "x-request-id", Value: "abc"},
	}}
	for range 10 {
		if resp := checkProto(s, r); resp.GetDeniedResponse() != nil {
			t.Fatal("denied within the budget")
		}
	}
	resp := checkProto(s, checkRequest("POST", "/api/v1/tokens", "198.51.100.3", nil))
	if resp.GetDeniedResponse().GetStatus().GetCode() != 429 {
		t.Fatalf("the client behind the proxy was not the counted one: %v", resp)
	}
}

// BenchmarkCheck measures the sidecar's own work per Check (no gRPC): route matching,
// identity, limit and response, over a mix of routes and 10,000 keys; with the live
// view's recorder (traffic=on, as the sidecar runs) and without it (traffic=off), so
// that one run compares them (benchstat).
func BenchmarkCheck(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "traffic=off"
		if on {
			name = "traffic=on"
		}
		b.Run(name, func(b *testing.B) { benchmarkCheck(b, on) })
	}
}

// BenchmarkCheckTracing is the Check with tracing off, and on with 1 % of the requests
// sampled (OTEL_TRACES_SAMPLER=parentbased_traceidratio, the sampled spans sent to a
// collector on loopback that takes them).
func BenchmarkCheckTracing(b *testing.B) {
	b.Run("tracing=off", func(b *testing.B) { benchmarkCheck(b, false) })
	b.Run("tracing=on-1pct", func(b *testing.B) {
		collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/x-protobuf")
		}))
		defer collector.Close()
		b.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
		b.Setenv("OTEL_TRACES_SAMPLER_ARG", "0.01")
		stop, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: collector.URL + "/v1/traces", Protocol: "http/protobuf"}, "bench")
		if err != nil {
			b.Fatal(err)
		}
		defer stop(context.Background())
		benchmarkCheck(b, false)
	})
}

func benchmarkCheck(b *testing.B, recordTraffic bool) {
	s, signer := newServer(b)
	if recordTraffic {
		s.RecordTraffic(traffic.New(s.limiter))
	}
	var reqs []*authv3.CheckRequest
	for i := range 10_000 {
		ip := fmt.Sprintf("198.51.%d.%d", i/250, i%250)
		ch := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		switch i % 4 {
		case 0:
			reqs = append(reqs, checkRequest("POST", "/api/v1/tokens", "10.0.0.1", map[string]string{"x-forwarded-for": ip, "x-request-id": "r"}))
		case 1:
			reqs = append(reqs, checkRequest("POST", "/api/v1/channels/"+ch+"/inbound", ip, map[string]string{"x-request-id": "r"}))
		case 2:
			tok, _ := signer.Issue(token.Claims{TenantID: ch, ChannelID: ch, Src: token.SrcSecret}, time.Now())
			reqs = append(reqs, checkRequest("POST", "/api/v1/converger/conversations/c/activities", ip, map[string]string{"authorization": "Bearer " + tok}))
		case 3:
			reqs = append(reqs, checkRequest("GET", "/api/v1/converger/conversations/c/activities?watermark=x", ip, nil))
		}
	}
	for _, r := range reqs {
		checkProto(s, r)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			s.Check(ctx, reqs[i%len(reqs)])
			i++
		}
	})
}

// checkProto answers a CheckRequest as Check does.
func checkProto(s *Server, r *authv3.CheckRequest) *authv3.CheckResponse {
	resp, _ := s.Check(context.Background(), r)
	return resp
}

// A decision asks for no other headers than RequestHeaders, on any route, with any
// credential: a caller that reads requests itself extracts those only.
func TestDecisionReadsOnlyRequestHeaders(t *testing.T) {
	s, signer := newServer(t)
	tok, _ := signer.Issue(token.Claims{TenantID: "t", ChannelID: "c", Src: token.SrcPublishable}, time.Now())
	asked := map[string]bool{}
	for _, r := range routes.BuiltIn() {
		path := strings.NewReplacer(":channel_id", "00000000-0000-4000-8000-000000000001", ":id", "c").Replace(r.Pattern)
		for _, h := range []map[string]string{
			nil,
			{"authorization": "Bearer " + tok, "x-request-id": "r", "x-forwarded-for": "198.51.100.1"},
			{"authorization": "Bearer cvg_pk_" + strings.Repeat("a", 20), "x-api-key": "cvg_live_" + strings.Repeat("b", 20)},
		} {
			for range 12 { // past every limit: the denials read headers too
				s.Verdict(context.Background(), Request{Method: r.Method, Path: path, Source: "10.0.0.1", Header: func(name string) string {
					asked[name] = true
					if !slices.Contains(RequestHeaders, name) {
						t.Errorf("%s %s: the decision asked for header %q", r.Method, r.Pattern, name)
					}
					return h[name]
				}})
			}
		}
	}
	for _, name := range RequestHeaders {
		if !asked[name] {
			t.Errorf("no decision asked for %s: is it still one of RequestHeaders?", name)
		}
	}
}
