// Package limitapi serves the project's Limiter gRPC API (shared/limiterpb): Check, Peek
// and Record on the sidecar's counters, for the core's login lockout and password resets.
package limitapi

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/metrics"
)

// BaseLimits resolves a bucket's limit; *config.Config implements it.
type BaseLimits interface {
	BaseLimit(bucket string, route buckets.Limit) (buckets.Limit, bool)
}

// Bounds of a request.
const (
	MaxKeyLength = 512
	MaxHits      = 1_000_000
)

// Server implements limiterpb.LimiterServer.
type Server struct {
	limiterpb.UnimplementedLimiterServer
	limiter *limiter.Limiter
	limits  BaseLimits
	metrics *metrics.Metrics
}

// New returns the service over lim.
func New(lim *limiter.Limiter, limits BaseLimits, m *metrics.Metrics) *Server {
	return &Server{limiter: lim, limits: limits, metrics: m}
}

type op int

const (
	check op = iota
	peek
	record
)

// Check counts and decides.
func (s *Server) Check(_ context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(check, r)
}

// Peek decides without counting.
func (s *Server) Peek(_ context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(peek, r)
}

// Record counts without deciding.
func (s *Server) Record(_ context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(record, r)
}

func (s *Server) do(o op, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	name := r.GetBucket()
	if !buckets.ValidName(name) {
		return nil, status.Error(codes.InvalidArgument, "bucket must be 1 to 64 of a-z, 0-9 and _")
	}
	lim, ok := s.limits.BaseLimit(name, buckets.Limit{})
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "unknown bucket %q", name)
	}
	key := r.GetKey()
	if key == "" || len(key) > MaxKeyLength {
		return nil, status.Errorf(codes.InvalidArgument, "key must be 1 to %d bytes", MaxKeyLength)
	}
	hits := r.GetHits()
	if hits == 0 {
		hits = 1
	}
	if hits > MaxHits {
		return nil, status.Errorf(codes.InvalidArgument, "hits must be at most %d", MaxHits)
	}
	k := limiter.Key{Bucket: s.limiter.Bucket(name), ID: key}
	var res limiter.Result
	switch o {
	case check:
		res = s.limiter.Check(k, hits, lim)
	case peek:
		res = s.limiter.Peek(k, lim)
	case record:
		res = s.limiter.Record(k, hits, lim)
	}
	m := s.metrics.Bucket(name)
	switch {
	case o == record:
	case res.Allowed:
		m.Allowed.Inc()
	default:
		m.Denied.Inc()
		m.Exceeded.Inc()
	}
	return &limiterpb.LimitResponse{
		Allowed:      res.Allowed,
		Count:        uint64(res.Count),
		Limit:        uint64(res.Limit.Count),
		WindowMs:     uint64(res.Limit.Window.Milliseconds()),
		RetryAfterMs: uint64(res.RetryAfterMS),
	}, nil
}
