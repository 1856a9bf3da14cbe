// Package xdstest runs a go-control-plane management server on loopback for tests: it
// serves rate limit rules (RateLimitConfig) over ADS from a snapshot cache and records
// what its clients ask, ACKs and NACKs.
package xdstest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// Server is a management server.
type Server struct {
	Addr   string // host:port it listens on
	t      testing.TB
	cache  cachev3.SnapshotCache
	grpc   *grpc.Server
	cancel context.CancelFunc

	mu       sync.Mutex
	requests []*discoveryv3.DiscoveryRequest
}

// Start starts a server on addr ("127.0.0.1:0" for any port), stopped at the test's end.
func Start(t testing.TB, addr string) *Server {
	t.Helper()
	s := &Server{t: t, cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	s.listen(addr)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) listen(addr string) {
	var l net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port of a restarted server may take a moment to free
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	srv := serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			s.mu.Lock()
			s.requests = append(s.requests, r)
			s.mu.Unlock()
			return nil
		},
	})
	s.grpc = grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, srv)
	s.Addr = l.Addr().String()
	go func() { _ = s.grpc.Serve(l) }()
}

// Set gives node the rules of version: each config one resource, none removes them all.
func (s *Server) Set(node, version string, configs ...*rlsconfv3.RateLimitConfig) {
	s.t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		s.t.Fatal(err)
	}
}

// Stop stops the server, closing its streams; the snapshots stay for Restart.
func (s *Server) Stop() {
	if s.grpc != nil {
		s.grpc.Stop()
		s.cancel()
		s.grpc = nil
	}
}

// Restart stops the server and starts it again on the same address.
func (s *Server) Restart() {
	s.Stop()
	s.listen(s.Addr)
}

// Requests returns what the clients have sent so far.
func (s *Server) Requests() []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), s.requests...)
}
