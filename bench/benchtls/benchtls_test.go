package benchtls_test

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/converger/edge/bench/benchtls"
	"github.com/converger/edge/bench/noop"
	"github.com/converger/edge/bench/rawcheck"
)

// With -mtls the no-op serves over mutual TLS and the load generator's connections
// reach it; a plain-text client does not.
func TestMutualTLS(t *testing.T) {
	cleanup, err := benchtls.Enable()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanup(); os.Unsetenv(benchtls.DirEnv) })
	if len(benchtls.SidecarEnv()) != 4 {
		t.Errorf("sidecar variables: %v", benchtls.SidecarEnv())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() { errc <- noop.Serve(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a.String() }) }()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatal(err)
	}
	conns, err := rawcheck.Dial(ctx, addr, 1)
	if err != nil {
		t.Fatalf("the load generator over mutual TLS: %v", err)
	}
	rawcheck.Close(conns)

	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(plain).Check(cctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("a plain-text client was answered")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
