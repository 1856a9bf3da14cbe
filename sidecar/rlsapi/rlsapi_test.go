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

// A decision becomes the RateLimitResponse field by field, for few and many statuses.
func TestResponse(t *testing.T) {
	for _, n := range []int{1, smallN, smallN + 3} {
		d := &rls.Response{Code: rls.OverLimit, Header: n - 1, Statuses: make([]rls.Status, n)}
		for i := range n {
			d.Statuses[i] = rls.Status{Code: rls.OK, Remaining: uint32(i)}
		}
		d.Statuses[n-1] = rls.Status{Code: rls.OverLimit, HasLimit: true, Reset: 42,
			Limit: rls.CurrentLimit{PerUnit: 7, Unit: rls.Minute, Multiplier: 5, Name: "burst"}}
		out := response(d)
		if out.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(out.GetStatuses()) != n {
			t.Fatalf("%d: %v", n, out)
		}
		for i, st := range out.GetStatuses()[:n-1] {
			if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != uint32(i) || st.GetCurrentLimit() != nil || st.GetDurationUntilReset() != nil {
				t.Errorf("%d: status %d: %v", n, i, st)
			}
		}
		last := out.GetStatuses()[n-1]
		l := last.GetCurrentLimit()
		if last.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || l.GetRequestsPerUnit() != 7 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
			l.GetUnitMultiplier().GetValue() != 5 || l.GetName() != "burst" || last.GetDurationUntilReset().AsDuration().Seconds() != 42 {
			t.Errorf("%d: last status %v", n, last)
		}
		h := out.GetResponseHeadersToAdd()
		if len(h) != 3 || h[0].GetKey() != HeaderLimit || h[0].GetValue() != "7" || h[1].GetValue() != "0" || h[2].GetKey() != HeaderReset || h[2].GetValue() != "42" {
			t.Errorf("%d: headers %v", n, h)
		}
		if _, err := proto.Marshal(out); err != nil {
			t.Error(err)
		}
	}
	if out := response(&rls.Response{Code: rls.OK, Header: -1, Statuses: make([]rls.Status, 1)}); out.GetResponseHeadersToAdd() != nil {
		t.Errorf("headers without Header: %v", out)
	}
}
