package envoywire

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/rlsapi"
)

// The codec writes the configured header names and the dynamic metadata exactly as
// rlsapi builds them.
func TestRateLimitNamesAndMetadata(t *testing.T) {
	rules, err := rls.ParseFiles(map[string]string{"m.yaml": `domain: m
descriptors:
  - key: k
    metadata: {team: {name: blue}, n: 1}
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: j
    metadata: {team: {size: 2}, n: 2}
    rate_limit: {unit: hour, requests_per_unit: 5}
`})
	if err != nil {
		t.Fatal(err)
	}
	mk := func() *rlsapi.Server {
		return rlsapi.New(rls.New(limiter.New(limiter.Options{Now: fixedNow}), rules, rls.Options{
			ResponseHeaders: true, DynamicMetadata: true, HeaderNames: rls.HeaderNames{"X-Limit", "X-Left", "X-Reset"},
		}), nil)
	}
	std, wire := mk(), mk()
	req := &rlsv3.RateLimitRequest{Domain: "m", HitsAddend: 2, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "a"}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "j", Value: "b"}}, HitsAddend: wrapperspb.UInt64(1)},
	}}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	sresp, err := std.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	wresp, err := rateLimitWire(wire, b)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(sresp, wresp) {
		t.Fatalf("answers differ:\nstandard %v\ncodec    %v", sresp, wresp)
	}
	h := wresp.GetResponseHeadersToAdd()
	if len(h) != 3 || h[0].GetKey() != "X-Limit" || h[0].GetValue() != "3" || h[1].GetKey() != "X-Left" || h[1].GetValue() != "1" || h[2].GetKey() != "X-Reset" {
		t.Errorf("headers %v", h)
	}
	md := wresp.GetDynamicMetadata().AsMap()
	want := map[string]any{
		"domain":     "m",
		"hitsAddend": 2.0,
		"descriptors": []any{
			map[string]any{"entries": []any{"k=a"}},
			map[string]any{"entries": []any{"j=b"}, "hitsAddend": 1.0},
		},
		"metadata": map[string]any{"team": map[string]any{"name": "blue", "size": 2.0}, "n": 1.0},
	}
	if !proto.Equal(mustStruct(t, want), mustStruct(t, md)) {
		t.Errorf("dynamic metadata %v\nwant %v", md, want)
	}
}

func mustStruct(t *testing.T, m map[string]any) proto.Message {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
