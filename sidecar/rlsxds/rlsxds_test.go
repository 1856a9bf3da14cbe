package rlsxds_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/rlsxds"
	"github.com/converger/edge/sidecar/rlsxds/xdstest"
)

// shop is a RateLimitConfig of one rule: key client, perMinute a minute.
func shop(name string, perMinute uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: "shop", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "client", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute},
	}}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// limitOf is the limit the service applies to (client=id) in domain shop, 0 for none.
func limitOf(t *testing.T, svc *rls.Service, id string) uint32 {
	t.Helper()
	var resp rls.Response
	err := svc.Decide(&rls.Request{Domain: "shop", Descriptors: []rls.Descriptor{{
		Entries: []rls.Entry{{Key: "client", Value: id}}, HasHits: true, // checked, not counted
	}}}, &resp)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0].Limit.PerUnit
}

// The client against go-control-plane's server and snapshot cache: a valid snapshot is
// applied and ACKed, an invalid one NACKed with its problem while the rules stay, an
// empty one removes the rules, and a restarted server is followed again.
func TestFollowsManagementServer(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0")
	srv.Set("edge-1", "v1", shop("shop-rules", 5))

	reg := prometheus.NewRegistry()
	svc := rls.New(limiter.New(limiter.Options{}), nil, rls.Options{WaitForRules: true, Metrics: rls.NewMetrics(reg)})
	var resp rls.Response
	if err := svc.Decide(&rls.Request{Domain: "shop", Descriptors: []rls.Descriptor{{}}}, &resp); err != rls.ErrNoRules {
		t.Fatalf("before the first rules: %v, want %v", err, rls.ErrNoRules)
	}
	c := rlsxds.New(rlsxds.Options{
		ServerURL: srv.Addr, NodeID: "edge-1", Metadata: map[string]string{"zone": "a"},
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Registry: reg,
	}, svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, "v1 applied", func() bool { return c.Status().Version == "v1" })
	if got := limitOf(t, svc, "c1"); got != 5 {
		t.Fatalf("v1: limit %d, want 5", got)
	}
	st := c.Status()
	if !st.Connected || !st.Applied {
		t.Errorf("status %+v", st)
	}
	first := srv.Requests()[0]
	if first.GetTypeUrl() != rlsxds.TypeURL || first.GetNode().GetId() != "edge-1" || first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "a" {
		t.Errorf("subscription %v", first)
	}
	if testutil.ToFloat64(c.Versions().WithLabelValues("v1")) != 1 {
		t.Errorf("version metric not set")
	}

	// A rule without a unit: refused whole, the problem in error_detail, v1 stays.
	bad := shop("shop-rules", 9)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	other := shop("other", 7)
	other.Domain = "other"
	srv.Set("edge-1", "v2", other, bad)
	waitFor(t, "the NACK of v2", func() bool {
		for _, r := range srv.Requests() {
			if d := r.GetErrorDetail(); d != nil {
				if r.GetVersionInfo() != "v1" || r.GetResponseNonce() == "" ||
					d.GetMessage() != "shop-rules: descriptors[0].rate_limit: invalid rate limit unit 'UNKNOWN'" {
					t.Errorf("NACK %v", r)
				}
				return true
			}
		}
		return false
	})
	if got := limitOf(t, svc, "c1"); got != 5 || c.Status().Version != "v1" {
		t.Errorf("after the NACK: limit %d, version %q; want v1's 5", got, c.Status().Version)
	}
	// go-control-plane answers a NACK with the same version again: the client NACKs each
	// repeat after a growing wait (20 ms doubling to 100 ms here), not in a busy loop.
	time.Sleep(500 * time.Millisecond)
	if got := testutil.ToFloat64(c.Updates().WithLabelValues("rejected")); got < 1 || got > 20 {
		t.Errorf("rejected updates in 0.5 s: %v, want from 1 to 20", got)
	}

	// Two configs of one domain merge only with MergeDomains; here they are refused.
	srv.Set("edge-1", "v3", shop("a", 1), shop("b", 2))
	waitFor(t, "the NACK of v3", func() bool { return c.Status().Rejected == "v3" })
	if !strings.Contains(c.Status().Error, "duplicate domain 'shop'") {
		t.Errorf("v3 refused for %q", c.Status().Error)
	}

	// Removed: a snapshot with no rules leaves none.
	srv.Set("edge-1", "v4")
	waitFor(t, "v4 applied", func() bool { return c.Status().Version == "v4" })
	if got := limitOf(t, svc, "c1"); got != 0 {
		t.Errorf("after removal: limit %d", got)
	}

	// The server restarts, with a new version while it was down: followed again.
	srv.Stop()
	waitFor(t, "the stream's end seen", func() bool { return !c.Status().Connected })
	srv.Set("edge-1", "v5", shop("shop-rules", 11))
	if got := limitOf(t, svc, "c1"); got != 0 {
		t.Errorf("while the server is down: limit %d", got)
	}
	srv.Restart()
	waitFor(t, "v5 applied after the restart", func() bool { return c.Status().Version == "v5" })
	if got := limitOf(t, svc, "c1"); got != 11 {
		t.Errorf("v5: limit %d, want 11", got)
	}
	if !c.Status().Connected {
		t.Error("not connected after the restart")
	}
}
