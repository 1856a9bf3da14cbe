package limitapi

import (
	"context"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/sidecar/cluster"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/routes"
	"github.com/converger/edge/sidecar/traffic"
)

// LiveView is what the console's RPCs (Buckets, Traffic, Busiest, Cluster) read.
type LiveView struct {
	// Traffic records the decisions; nil: Traffic and Busiest answer Unavailable.
	Traffic *traffic.Recorder
	// Installation is the installation's limits by bucket (RATE_LIMIT_CONFIG).
	Installation map[string]buckets.Limit
	// Routes is the route table, for the buckets of configured routes and what they
	// are counted per.
	Routes []routes.Route
	// Cluster is the node's cluster; nil with the local backend.
	Cluster *cluster.Cluster
}

// ServeLiveView answers the console's RPCs from v, and records the decisions of Check
// and Take in v.Traffic. Call it before serving.
func (s *Server) ServeLiveView(v LiveView) {
	s.live = v
	s.prefixes = map[string]string{}
	s.per = map[string]buckets.Per{}
	for _, b := range buckets.BuiltIn {
		s.prefixes[b.Name], s.per[b.Name] = b.KeyPrefix, b.Per
	}
	for _, r := range v.Routes {
		for _, st := range r.Steps {
			for _, name := range []string{st.Bucket, st.PublishableBucket} {
				if _, known := s.prefixes[name]; name != "" && !known {
					s.prefixes[name], s.per[name] = string(st.Per)+":", st.Per
				}
			}
		}
	}
}

// DocumentedKey is the key as the documentation writes it: "<bucket>:<prefix><id>".
func (s *Server) DocumentedKey(bucket, id string) string {
	return bucket + ":" + s.prefixes[bucket] + id
}

func pbLimit(l buckets.Limit) *limiterpb.Limit {
	return &limiterpb.Limit{Limit: uint64(l.Count), WindowMs: uint64(l.Window.Milliseconds())}
}

// Buckets lists the built-in buckets, then those of configured routes, with their
// built-in and installation limits.
func (s *Server) Buckets(context.Context, *limiterpb.BucketsRequest) (*limiterpb.BucketsResponse, error) {
	resp := &limiterpb.BucketsResponse{}
	seen := map[string]bool{}
	for _, b := range buckets.BuiltIn {
		seen[b.Name] = true
		pb := &limiterpb.Bucket{Name: b.Name, Per: string(b.Per), KeyPrefix: b.KeyPrefix, Overridable: b.Overridable, BuiltIn: pbLimit(b.Default)}
		if l, ok := s.live.Installation[b.Name]; ok {
			pb.Installation = pbLimit(l)
		}
		resp.Buckets = append(resp.Buckets, pb)
	}
	var extra []string
	for name := range s.prefixes {
		if !seen[name] {
			extra = append(extra, name)
		}
	}
	slices.Sort(extra)
	for _, name := range extra {
		pb := &limiterpb.Bucket{Name: name, Per: string(s.per[name]), KeyPrefix: s.prefixes[name]}
		if l, ok := s.live.Installation[name]; ok {
			pb.Installation = pbLimit(l)
		}
		resp.Buckets = append(resp.Buckets, pb)
	}
	return resp, nil
}

var errNoLiveView = status.Error(codes.Unavailable, "this sidecar does not record its decisions")

// Traffic answers the minute counts of the last hour.
func (s *Server) Traffic(ctx context.Context, _ *limiterpb.TrafficRequest) (*limiterpb.TrafficResponse, error) {
	if s.live.Traffic == nil {
		return nil, errNoLiveView
	}
	if s.live.Cluster != nil {
		s.live.Cluster.RefreshView(ctx) // the other members' minutes of a moment ago
	}
	ts, nodes := s.live.Traffic.Traffic()
	resp := &limiterpb.TrafficResponse{NowMs: s.limiter.NowMS(), Nodes: uint32(nodes)}
	for _, bt := range ts {
		pb := &limiterpb.BucketTraffic{Bucket: bt.Bucket, Minutes: make([]*limiterpb.MinuteCount, 0, len(bt.Minutes))}
		for _, m := range bt.Minutes {
			pb.Minutes = append(pb.Minutes, &limiterpb.MinuteCount{StartMs: m.StartMS, Allowed: m.Allowed, Denied: m.Denied})
		}
		resp.Buckets = append(resp.Buckets, pb)
	}
	return resp, nil
}

// DefaultTop is how many keys per bucket Busiest answers when the request says 0.
const DefaultTop = 10

// Busiest answers the busiest keys of the current windows, with their limit as a check
// now resolves it (a tenant's new override shows at once).
func (s *Server) Busiest(_ context.Context, r *limiterpb.BusiestRequest) (*limiterpb.BusiestResponse, error) {
	if s.live.Traffic == nil {
		return nil, errNoLiveView
	}
	top := int(r.GetTop())
	if top == 0 {
		top = DefaultTop
	}
	if top > traffic.MaxTop {
		return nil, status.Errorf(codes.InvalidArgument, "top must be at most %d", traffic.MaxTop)
	}
	only := r.GetBucket()
	if only != "" && !buckets.ValidName(only) {
		return nil, status.Error(codes.InvalidArgument, "bucket must be 1 to 64 of a-z, 0-9 and _")
	}
	var want func(string) bool
	if only != "" {
		want = func(name string) bool { return name == only }
	}
	resp := &limiterpb.BusiestResponse{NowMs: s.limiter.NowMS()}
	for _, bb := range s.live.Traffic.Busiest(top, want) {
		if strings.HasSuffix(bb.Bucket, limiter.RefundSuffix) {
			continue // the refunds of Take, counted beside their bucket
		}
		_, refunds := s.limiter.LookupBucket(bb.Bucket + limiter.RefundSuffix)
		pb := &limiterpb.BucketBusiest{Bucket: bb.Bucket, Keys: make([]*limiterpb.BusyKey, 0, len(bb.Keys))}
		for _, k := range bb.Keys {
			lim := s.currentLimit(bb.Bucket, k.ID, k.Limit)
			count := k.Count
			if refunds {
				// What Take and Peek count: the hits less what was given back (a login
				// that succeeded).
				count = min(count, s.limiter.Peek(limiter.Key{Bucket: s.limiter.Bucket(bb.Bucket), ID: k.ID}, lim).Count)
				if count == 0 {
					continue
				}
			}
			pb.Keys = append(pb.Keys, &limiterpb.BusyKey{Key: s.DocumentedKey(bb.Bucket, k.ID), Count: uint64(count),
				Limit: uint64(lim.Count), WindowMs: uint64(lim.Window.Milliseconds()), WindowEndMs: k.WindowEndMS})
		}
		resp.Buckets = append(resp.Buckets, pb)
	}
	return resp, nil
}

// currentLimit is the limit a check of the key would have now: the tenant's override
// for the overridable buckets, else the limit of the key's last check (a configured
// route's own limit included), or the installation's or built-in one.
func (s *Server) currentLimit(bucket, id string, recorded limiter.Limit) limiter.Limit {
	b, builtIn := buckets.Lookup(bucket)
	if builtIn && b.Overridable {
		if base, ok := s.limits.BaseLimit(bucket, buckets.Limit{}); ok {
			return s.limit(bucket, id, base)
		}
	}
	if recorded.Count == 0 {
		if base, ok := s.limits.BaseLimit(bucket, buckets.Limit{}); ok {
			return base
		}
	}
	return recorded
}

// Cluster answers the backend and the members.
func (s *Server) Cluster(ctx context.Context, _ *limiterpb.ClusterRequest) (*limiterpb.ClusterResponse, error) {
	resp := &limiterpb.ClusterResponse{Backend: "local", NowMs: s.limiter.NowMS()}
	c := s.live.Cluster
	if c == nil {
		return resp, nil
	}
	c.RefreshView(ctx) // every member heard from a moment ago
	resp.Backend = "cluster"
	resp.SyncIntervalMs = uint64(c.SyncInterval().Milliseconds())
	for _, m := range c.Status() {
		if m.Self {
			resp.Node = m.Name
		}
		resp.Members = append(resp.Members, &limiterpb.Member{Name: m.Name, Address: m.Address, Self: m.Self,
			HeardAgoMs: agoMS(m.HeardAgo), SyncAgeMs: agoMS(m.SyncAge), StaleDropped: m.StaleDropped})
	}
	return resp, nil
}

// agoMS is a duration in milliseconds, -1 for none.
func agoMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}
