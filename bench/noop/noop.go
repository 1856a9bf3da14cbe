// Package noop serves no-op counterparts of the sidecar's checks, which allow everything
// at once: over gRPC, an envoy.service.auth.v3.Authorization whose Check allows and an
// envoy.service.ratelimit.v3.RateLimitService whose ShouldRateLimit answers OK (Serve);
// over HTTP, a forward-auth check that answers 200 (ServeHTTP). The authz, rls and
// forward-auth load tests measure the sidecar against them, as the floor of gRPC and HTTP
// cost.
package noop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/converger/edge/bench/benchtls"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/sidecar/service"
)

// Server answers every Check with OK and does nothing else.
type Server struct {
	authv3.UnimplementedAuthorizationServer
}

// Check allows the request. The response is built per call, as the sidecar builds its
// allow answer.
func (Server) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)}}, nil
}

// RateLimit answers every ShouldRateLimit OK, with one OK status per descriptor.
type RateLimit struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit answers OK. The response is built per call, as the sidecar builds its
// own, with the statuses Envoy expects (one per descriptor) in one allocation.
func (RateLimit) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := len(req.GetDescriptors())
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	for i := range statuses {
		statuses[i].Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &statuses[i]
	}
	return resp, nil
}

// NewGRPCServer returns a gRPC server with the sidecar's options (or opts) and services:
// the no-op Authorization and RateLimitService, health and reflection. Serve puts it on
// mutual TLS when benchtls.DirEnv is set.
func NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	if len(opts) == 0 {
		opts = service.GRPCServerOptions()
	}
	s := grpc.NewServer(opts...)
	authv3.RegisterAuthorizationServer(s, Server{})
	rlsv3.RegisterRateLimitServiceServer(s, RateLimit{})
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s
}

// Serve listens on addr (host:port; port 0 picks a free one), calls ready with the address
// actually listened on, and serves until ctx ends.
func Serve(ctx context.Context, addr string, ready func(net.Addr)) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("noop: %w", err)
	}
	opts := service.GRPCServerOptions()
	if f := benchtls.ServerFiles(); f != nil {
		t, err := tlsconfig.NewServer(f, tlsconfig.Options{}, "h2")
		if err != nil {
			return fmt.Errorf("noop: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(t.Config())))
	}
	s := NewGRPCServer(opts...)
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(l) }()
	if ready != nil {
		ready(l.Addr())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("noop: %w", err)
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.Stop()
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("noop: %w", err)
	}
	return nil
}

// ServeFastHTTP is ServeHTTP with the server of the sidecar's HTTP port, fasthttp, set
// as the sidecar sets it: what a check costs over its transport.
func ServeFastHTTP(ctx context.Context, addr string, ready func(net.Addr)) error {
	s := &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusOK) },
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		ReadBufferSize:        service.MaxHTTPHeaderBytes,
		MaxRequestBodySize:    service.MaxHTTPBodyBytes,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		ReduceMemoryUsage:     true,
	}
	return serveHTTP(ctx, addr, ready, s.Serve, s.ShutdownWithContext)
}

// ServeHTTP listens on addr (port 0 picks a free one), calls ready with the address
// actually listened on, and answers every request 200 with an empty body, as the sidecar
// allows a forward-auth check, until ctx ends. Its server has the timeouts of the
// sidecar's HTTP server.
func ServeHTTP(ctx context.Context, addr string, ready func(net.Addr)) error {
	s := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	return serveHTTP(ctx, addr, ready, s.Serve, s.Shutdown)
}

// serveHTTP runs an HTTP server's serve on a listener of addr until ctx ends, then
// shuts it down within 5 s.
func serveHTTP(ctx context.Context, addr string, ready func(net.Addr), serve func(net.Listener) error, shutdown func(context.Context) error) error {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("noop-forward-auth: %w", err)
	}
	// Over mutual TLS as the sidecar's HTTP port is, when benchtls.DirEnv is set.
	l, err := tlsconfig.Listener(raw, benchtls.ServerFiles(), tlsconfig.Options{}, "http/1.1")
	if err != nil {
		raw.Close()
		return fmt.Errorf("noop-forward-auth: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- serve(l) }()
	if ready != nil {
		ready(l.Addr())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("noop-forward-auth: %w", err)
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = shutdown(shut)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("noop-forward-auth: %w", err)
	}
	return nil
}
