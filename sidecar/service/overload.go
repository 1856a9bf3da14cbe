package service

import (
	"context"
	"os"
	"strconv"
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
// close are refused by envoywire before they are decoded.
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
	if n, err := strconv.Atoi(os.Getenv("EXPERIMENT_MAX_STREAMS")); err == nil && n > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(uint32(n)))
	}
	return opts
}
