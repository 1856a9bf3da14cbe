package authzcheck_test

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/sidecar/envoywire"
	"github.com/converger/edge/sidecar/service"
)

// overloadedAuthz refuses every Check as an overloaded sidecar refuses one it cannot
// decide in time (envoywire.ErrTooLate, before decoding it), counting the Checks.
type overloadedAuthz struct {
	authv3.UnimplementedAuthorizationServer
	calls chan struct{}
}

func (o *overloadedAuthz) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	o.calls <- struct{}{}
	return nil, envoywire.ErrTooLate
}

// With the sidecar overloaded (refusing Checks as too late) or hung (a listener that
// accepts and never answers), the routes that protect credentials are refused with 503
// and retry-after, the others fail open and are counted; a route no bucket counts is
// not asked about at all.
func TestOverloadedOrHungSidecar(t *testing.T) {
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)

	o := &overloadedAuthz{calls: make(chan struct{}, 100)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(service.GRPCServerOptions()...)
	authv3.RegisterAuthorizationServer(s, o)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)

	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	go func() {
		var held []net.Conn // accepted, never read or answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()

	for _, tc := range []struct{ name, addr string }{{"overloaded", ln.Addr().String()}, {"hung", hung.Addr().String()}} {
		t.Run(tc.name, func(t *testing.T) {
			checker := newChecker(t, tc.addr, quietLogger())
			c := startCore(t, dbURL, checker)
			key, conv := c.conversation()

			start := time.Now()
			r := c.do("POST", "/api/v1/tokens", `{}`, map[string]string{"x-request-id": "req-overload"})
			var env envelope
			if err := json.Unmarshal(r.body, &env); err != nil || r.status != 503 || env.Error.Code != "unavailable" || r.header.Get("retry-after") == "" {
				t.Fatalf("POST /api/v1/tokens: %d %s, want 503 unavailable with retry-after (fail closed)", r.status, r.body)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("the refusal took %v", el)
			}
			before := c.reached.Load()
			if s := c.rawPost("/api/v1/conversations/"+conv+"/activities", `{"type":"message","text":"x"}`, "X-Api-Key: "+key); s != 201 || c.reached.Load() != before+1 {
				t.Fatalf("an activity: %d, want 201 (fail open)", s)
			}
			if checker.FailedClosed() != 1 || checker.FailedOpen() != 1 {
				t.Fatalf("FailedClosed %d, FailedOpen %d; want 1 and 1", checker.FailedClosed(), checker.FailedOpen())
			}
			calls, skipped := len(o.calls), checker.Skipped()
			if r := c.do("GET", "/api/v1/conversations/"+conv+"/activities", "", map[string]string{"x-api-key": key}); r.status != 200 {
				t.Fatalf("GET activities: %d %s", r.status, r.body)
			}
			if len(o.calls) != calls || checker.Skipped() != skipped+1 || checker.FailedOpen() != 1 {
				t.Fatalf("a route no bucket counts was asked about: calls %d→%d, skipped %d→%d, FailedOpen %d",
					calls, len(o.calls), skipped, checker.Skipped(), checker.FailedOpen())
			}
		})
	}
	if len(o.calls) == 0 {
		t.Fatal("the overloaded sidecar was never asked")
	}
}
