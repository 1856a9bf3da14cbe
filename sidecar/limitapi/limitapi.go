// Package limitapi serves the project's Limiter gRPC API (shared/limiterpb): Check, Peek,
// Record, Take and Refund on the sidecar's counters, for the core's login lockout,
// password resets and the activities of the legacy WebSocket; and the console's live
// view (live.go): the buckets, the minute counts, the busiest keys and the cluster.
package limitapi

import (
	"context"
	"time"

	"github.com/converger/edge/shared/ids"
	"github.com/converger/edge/sidecar/tenants"

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

// Overrides gives a tenant's limit overrides and a channel's tenant;
// *tenants.Directory implements it.
type Overrides interface {
	Overrides(tenantID string) (buckets.Overrides, tenants.Status)
	ChannelTenant(channelID string) (string, tenants.Status)
}

// Server implements limiterpb.LimiterServer.
type Server struct {
	limiterpb.UnimplementedLimiterServer
	limiter   *limiter.Limiter
	limits    BaseLimits
	overrides Overrides // nil without a database
	metrics   *metrics.Metrics

	// The console's view (live.go): set by ServeLiveView.
	live     LiveView
	prefixes map[string]string      // bucket → the key prefix of its documented keys
	per      map[string]buckets.Per // bucket → what it is counted per
}

// New returns the service over lim. overrides may be nil (no database): then only the
// installation's limits apply.
func New(lim *limiter.Limiter, limits BaseLimits, overrides Overrides, m *metrics.Metrics) *Server {
	return &Server{limiter: lim, limits: limits, overrides: overrides, metrics: m}
}

type op int

const (
	check op = iota
	peek
	record
	take
	refund
)

// Check counts and decides.
func (s *Server) Check(ctx context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(ctx, check, r)
}

// Peek decides without counting.
func (s *Server) Peek(ctx context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(ctx, peek, r)
}

// Record counts without deciding.
func (s *Server) Record(ctx context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(ctx, record, r)
}

// Take counts only what fits, and decides.
func (s *Server) Take(ctx context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(ctx, take, r)
}

// Refund forgives hits taken in the current window.
func (s *Server) Refund(ctx context.Context, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	return s.do(ctx, refund, r)
}

// limit applies the override of the key's tenant over the base limit, for the buckets
// that tenants can override: the key of a per-tenant bucket is the tenant id, that of a
// per-channel bucket a channel id, so activity_create counted here shares the tenant
// API's counter and limit.
func (s *Server) limit(name, key string, base buckets.Limit) buckets.Limit {
	b, ok := buckets.Lookup(name)
	if !ok || !b.Overridable || s.overrides == nil || !ids.IsUUID(key) {
		return base
	}
	tenant := key
	if b.Per == buckets.PerChannel {
		if tenant, _ = s.overrides.ChannelTenant(key); tenant == "" {
			return base
		}
	}
	o, _ := s.overrides.Overrides(tenant)
	if l, ok := o[name]; ok {
		return l
	}
	return base
}

func (s *Server) do(ctx context.Context, o op, r *limiterpb.LimitRequest) (*limiterpb.LimitResponse, error) {
	by := limiter.DecideBy(ctx, time.Now()) // a wait for a counter's owner ends by then
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
	lim = s.limit(name, key, lim)
	k := limiter.Key{Bucket: s.limiter.Bucket(name), ID: key}
	var res limiter.Result
	switch o {
	case check:
		res = s.limiter.CheckBy(k, hits, lim, by)
	case peek:
		res = s.limiter.Peek(k, lim)
	case record:
		res = s.limiter.Record(k, hits, lim)
	case take:
		res = s.limiter.TakeBy(k, hits, lim, by)
	case refund:
		res = s.limiter.Refund(k, hits, lim)
	}
	if (o == check || o == take) && s.live.Traffic != nil {
		s.live.Traffic.Note(k, res)
	}
	m := s.metrics.Bucket(name)
	switch {
	case o == record || o == refund:
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
