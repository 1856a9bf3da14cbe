// Package noop serves no-op Envoy services: an envoy.service.auth.v3.Authorization that
// allows every Check and an envoy.service.ratelimit.v3.RateLimitService that answers every
// ShouldRateLimit OK, at once. The authz and rls load tests measure the sidecar against
// them, as the floor of gRPC cost.
package noop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

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

// NewGRPCServer returns a gRPC server with the sidecar's options and services: the no-op
// Authorization and RateLimitService, health and reflection.
func NewGRPCServer() *grpc.Server {
	s := grpc.NewServer(service.GRPCServerOptions()...)
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
	s := NewGRPCServer()
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
