package envoywire

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MinBudget is the least time a Check or ShouldRateLimit must have left before its
// deadline (its grpc-timeout, Envoy's timeout for the call) to be decoded and decided:
// with less, the answer could not be decided, written and read by the caller in time,
// and a late answer is work thrown away, since the caller has already given up and
// applied its failure mode. Such a call is refused unread with ErrTooLate, which costs
// a few microseconds instead of a decision's transport, decoding and answer.
const MinBudget = 25 * time.Millisecond

// ErrTooLate refuses a call whose deadline is too close to decide it in time. Its code is
// ResourceExhausted, which Envoy, like any error, treats as the failure of the service:
// it applies the route's failure mode (failure_mode_allow for ext_authz,
// failure_mode_deny for the rate limit filter).
var ErrTooLate = status.Error(codes.ResourceExhausted, "overloaded: the deadline is too close to decide in time")

// LateDropper is implemented by a server that counts the calls refused as too late
// (authz.Server and rlsapi.Server count them in converger_sidecar_checks_shed_total).
type LateDropper interface{ DroppedLate() }

// tooLate reports a call whose deadline is less than MinBudget away, and counts it.
// A call without a deadline is never too late.
func tooLate(ctx context.Context, srv any) bool {
	d, ok := ctx.Deadline()
	if !ok || time.Until(d) >= MinBudget {
		return false
	}
	if l, ok := srv.(LateDropper); ok {
		l.DroppedLate()
	}
	return true
}
