package noop

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestServeAnswersOKAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("Serve: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not report its address")
	}

	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	resp, err := authv3.NewAuthorizationClient(conn).Check(cctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/api/v1/tokens"}},
	}})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if resp.GetStatus() == nil || resp.GetStatus().GetCode() != 0 || resp.GetDeniedResponse() != nil {
		t.Errorf("Check = %v, want an OK status and no denial", resp)
	}
	rl, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}, {}}})
	if err != nil || rl.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(rl.GetStatuses()) != 2 || rl.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit = %v, %v; want OK with two OK statuses", rl, err)
	}

	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}

// Both no-op HTTP checks, net/http's and fasthttp's, answer every method 200 with an
// empty body, and stop when their context ends.
func TestServeHTTPAllowsAndStops(t *testing.T) {
	for name, serve := range map[string]func(context.Context, string, func(net.Addr)) error{
		"net/http": ServeHTTP, "fasthttp": ServeFastHTTP,
	} {
		t.Run(name, func(t *testing.T) { testServeHTTP(t, serve) })
	}
}

func testServeHTTP(t *testing.T, serve func(context.Context, string, func(net.Addr)) error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("ServeHTTP: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("ServeHTTP did not report its address")
	}
	for _, m := range []string{"GET", "POST", "DELETE"} {
		req, _ := http.NewRequest(m, "http://"+addr.String()+"/check", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) != 0 {
			t.Errorf("%s /check: %d %q, want 200 and an empty body", m, resp.StatusCode, b)
		}
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("ServeHTTP after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeHTTP did not return after its context ended")
	}
}
