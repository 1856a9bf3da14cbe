package service

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/tap"

	"github.com/converger/edge/sidecar/envoywire"
	"github.com/converger/edge/sidecar/metrics"
)

// overloadOptions are the gRPC server's defences against more calls than it can decide:
// a Check or ShouldRateLimit that arrives with less than envoywire.MinBudget to its
// deadline is refused as its headers are read (before a goroutine, a read of its message
// or a decision), and the ones that waited in the server until their deadline was that
// close are refused by envoywire before they are decoded; and each connection carries at
// most MaxStreamsPerConn calls at once.
func overloadOptions(m *metrics.Metrics) []grpc.ServerOption {
	shed := m.Shed()
	opts := []grpc.ServerOption{grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if info.FullMethodName != envoywire.CheckMethod && info.FullMethodName != envoywire.ShouldRateLimitMethod {
			return ctx, nil
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < envoywire.MinBudget {
			shed.Inc()
			return nil, envoywire.ErrTooLate
		}
		return ctx, nil
	})}
	return append(opts, grpc.MaxConcurrentStreams(MaxStreamsPerConn))
}

// MaxStreamsPerConn bounds the calls in flight on one connection to the gRPC server
// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a client past it waits on its side, where
// its own deadline applies, instead of piling work into the sidecar. 1,024 Checks are
// about 40 ms of one CPU at bench authz's capacity, well inside Envoy's 250 ms, and
// above the 512 in flight that the shipped Envoy configs' circuit breakers allow.
const MaxStreamsPerConn = 1024
