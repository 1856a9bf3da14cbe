package closedloop

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/bench/noop"
	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/bench/rawhttp"
)

// testWorkload is n requests, no prologue, of key pos and class pos%2.
type testWorkload struct{ n int }

func (w testWorkload) Len() int              { return w.n }
func (w testWorkload) Position(i uint64) int { return int(i % uint64(w.n)) }
func (testWorkload) Class(pos int) int       { return pos % 2 }
func (testWorkload) Key(pos int) int         { return pos }
func (testWorkload) Classes() int            { return 2 }
func (w testWorkload) Keys() int             { return w.n }

// self is the test's own process, standing for a target's.
type self struct{}

func (self) Pid() int      { return os.Getpid() }
func (self) Exited() error { return nil }

// An HTTP target's answers are read as allowed, rate limited (429) and rejected (403), per
// class and key, and every request sent is counted.
func TestRunnerOverHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/limited":
			w.WriteHeader(http.StatusTooManyRequests)
		case "/rejected":
			w.WriteHeader(http.StatusForbidden)
		}
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	var reqs [][]byte
	for _, path := range []string{"/ok", "/limited", "/rejected", "/ok"} {
		reqs = append(reqs, rawhttp.Request("GET", path, addr, nil))
	}
	w := testWorkload{len(reqs)}
	r := NewRunner(w, 2, 400)
	target := NewTarget("http", addr, self{}, NewHTTPCaller(addr, 2, reqs), w.Keys())
	defer target.Close()
	res := r.Phase(context.Background(), target, 10*time.Second, true)
	if res.Requests != 400 || !res.Capped || res.Errors != 0 {
		t.Fatalf("%d requests (capped %v), %d errors (%s); want 400 capped, none", res.Requests, res.Capped, res.Errors, res.FirstErr)
	}
	if res.Denied != 100 || res.Rejected != 100 {
		t.Errorf("denied %d, rejected %d; want 100 each", res.Denied, res.Rejected)
	}
	if c := res.ByClass[1]; c.Requests != 200 || c.Denied != 100 {
		t.Errorf("class 1: %+v, want 200 requests and 100 denied", c)
	}
	if want := []bool{false, true, false, false}; !slices.Equal(target.DeniedKeys, want) {
		t.Errorf("denied keys %v, want %v", target.DeniedKeys, want)
	}
	if got := target.Sent.Load(); got != 400 {
		t.Errorf("sent %d, want 400", got)
	}
	if res.P50 <= 0 || res.P99 < res.P50 || res.Max < res.P99 {
		t.Errorf("latencies p50 %v, p99 %v, max %v", res.P50, res.P99, res.Max)
	}
}

// A gRPC target is called with the pre-marshaled requests; the no-op server allows them all.
func TestRunnerOverGRPC(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := noop.NewGRPCServer()
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	b, err := proto.Marshal(&authv3.CheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	w := testWorkload{3}
	reqs := NewGRPCRequests(rawcheck.Method, w.Len(), func(int) []byte { return b }, func() Reply { return new(rawcheck.Reply) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := DialGRPC(ctx, l.Addr().String(), 2, 3, reqs)
	if err != nil {
		t.Fatal(err)
	}
	target := NewTarget("grpc", l.Addr().String(), self{}, c, w.Keys())
	defer target.Close()
	phases, warmupErrors, err := NewRunner(w, 3, 300).RunRounds(ctx, []*Target{target}, Rounds{Rounds: 2, Warmup: 10 * time.Millisecond, Duration: 10 * time.Second})
	if err != nil || warmupErrors != 0 || len(phases) != 2 {
		t.Fatalf("RunRounds: %d phases, %d warm-up errors, %v", len(phases), warmupErrors, err)
	}
	for _, p := range phases {
		if p.Requests != 300 || p.Errors != 0 || p.Denied != 0 || p.Rejected != 0 {
			t.Errorf("round %d: %d requests, %d errors (%s), %d denied, %d rejected; want 300 allowed", p.Round, p.Requests, p.Errors, p.FirstErr, p.Denied, p.Rejected)
		}
	}
}
