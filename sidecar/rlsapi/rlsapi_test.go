package rlsapi

import (
	"context"
	"fmt"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/rls"
)

const benchRules = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: path
    value: /api/*
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 4000000000}
`

// BenchmarkShouldRateLimit measures a call without gRPC's transport: converting the
// request, deciding, building the response and marshaling it, as the server does.
func BenchmarkShouldRateLimit(b *testing.B) {
	rules, err := rls.ParseFiles(map[string]string{"bench.yaml": benchRules})
	if err != nil {
		b.Fatal(err)
	}
	s := New(rls.New(limiter.New(limiter.Options{}), rules, rls.Options{ResponseHeaders: true, Metrics: rls.NewMetrics(prometheus.NewRegistry())}), nil)
	reqs := make([]*rlsv3.RateLimitRequest, 10_000)
	for i := range reqs {
		ip := fmt.Sprintf("10.0.%d.%d", i/250, i%250)
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}},
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/api/v1/x"}, {Key: "remote_address", Value: ip}}},
		}}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		var buf []byte
		for pb.Next() {
			resp, err := s.ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
			if err != nil {
				b.Fatal(err)
			}
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], resp)
			i++
		}
	})
}
