package rls

import (
	"fmt"
	"testing"

	"github.com/converger/edge/sidecar/limiter"
)

// benchRules are rules as an Envoy front typically has them: a per-client-IP limit, a
// per-route-and-client limit under a wildcard, and a per-API-key limit with several
// limits.
const benchRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: path
    value: /api/*
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 100000000}
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 1000000}
      - {unit: day, requests_per_unit: 4000000000}
  - key: generic_key
    value: healthcheck
    rate_limit: {unlimited: true}
`

// BenchmarkDecide measures matching and counting one request of 1, 2 and 3 descriptors
// over 10,000 keys: the decision without the gRPC message (rlsapi converts it). It must
// not allocate.
func BenchmarkDecide(b *testing.B) {
	rules, err := ParseFiles(map[string]string{"edge.yaml": benchRules})
	if err != nil {
		b.Fatal(err)
	}
	for _, replicated := range []bool{false, true} {
		svc := New(limiter.New(limiter.Options{Replicated: replicated}), rules, Options{ResponseHeaders: true})
		const keys = 10_000
		reqs := make([][3]Descriptor, keys)
		for i := range reqs {
			ip := fmt.Sprintf("198.51.%d.%d", i/250, i%250)
			reqs[i] = [3]Descriptor{
				{Entries: []Entry{{"remote_address", ip}}},
				{Entries: []Entry{{"path", fmt.Sprintf("/api/v1/orders/%d", i%50)}, {"remote_address", ip}}},
				{Entries: []Entry{{"api_key", fmt.Sprintf("key-%05d", i)}}},
			}
		}
		mode := "local"
		if replicated {
			mode = "replicated"
		}
		for n := 1; n <= 3; n++ {
			b.Run(fmt.Sprintf("%s/descriptors=%d", mode, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					var resp Response
					req := Request{Domain: "edge"}
					i := 0
					for pb.Next() {
						req.Descriptors = reqs[i%keys][:n]
						if err := svc.Decide(&req, &resp); err != nil {
							b.Fatal(err)
						}
						i++
					}
				})
			})
		}
	}
}

// The decision allocates nothing once its Response is warm, whatever the rules use.
func TestDecideDoesNotAllocate(t *testing.T) {
	rules, err := ParseFiles(map[string]string{"edge.yaml": benchRules + `  - key: careful
    count_denied: false
    allow_refunds: true
    rate_limit: {unit: minute, requests_per_unit: 1000000000, name: c}
  - key: promo
    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: c}]}
`})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(limiter.New(limiter.Options{Replicated: true}), rules, Options{ResponseHeaders: true, Metrics: NewMetrics(newRegistry())})
	req := Request{Domain: "edge", Descriptors: []Descriptor{
		{Entries: []Entry{{"remote_address", "192.0.2.1"}}},
		{Entries: []Entry{{"path", "/api/x"}, {"remote_address", "192.0.2.1"}}},
		{Entries: []Entry{{"api_key", "k"}}},
		{Entries: []Entry{{"generic_key", "healthcheck"}}},
		{Entries: []Entry{{"careful", "x"}}},
		{Entries: []Entry{{"careful", "y"}}, Refund: true, HasHits: true, Hits: 1},
		{Entries: []Entry{{"careful", "z"}}, HasOverride: true, Override: Override{PerUnit: 5, Unit: Hour}},
	}}
	var resp Response
	if err := svc.Decide(&req, &resp); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = svc.Decide(&req, &resp) }); n != 0 {
		t.Fatalf("%v allocations per decision", n)
	}
	// With a replacement too.
	req.Descriptors = append(req.Descriptors, Descriptor{Entries: []Entry{{"promo", "p"}}})
	_ = svc.Decide(&req, &resp)
	if n := testing.AllocsPerRun(1000, func() { _ = svc.Decide(&req, &resp) }); n != 0 {
		t.Fatalf("%v allocations per decision with replaces", n)
	}
}
