package service_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A Check whose deadline is closer than envoywire.MinBudget is refused as its headers
// are read — never decided, never allowed — and counted in
// converger_sidecar_checks_shed_total; one with Envoy's 250 ms is decided.
func TestCheckTooCloseToItsDeadlineIsShed(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	req := request("POST", "/api/v1/tokens", "192.0.2.7", nil)
	if r := s.check(req); !isAllowed(r) {
		t.Fatalf("first check: %v", r)
	}
	const n = 5
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		r, err := s.authz.Check(ctx, req)
		cancel()
		if c := status.Code(err); c != codes.ResourceExhausted && c != codes.DeadlineExceeded {
			t.Fatalf("a Check with 20 ms left: %v %v, want it refused", r, err)
		}
	}
	// Each reached the server within its 20 ms on loopback, unless the machine stalled
	// the client for longer: most must have been counted.
	m := regexp.MustCompile(`(?m)^converger_sidecar_checks_shed_total (\d+)$`).FindStringSubmatch(s.metrics())
	if m == nil {
		t.Fatal("no converger_sidecar_checks_shed_total")
	}
	if got, _ := strconv.Atoi(m[1]); got < 3 || got > n {
		t.Fatalf("shed %d of %d Checks too close to their deadline", got, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	if r, err := s.authz.Check(ctx, req); err != nil || !isAllowed(r) {
		t.Fatalf("a Check with 250 ms: %v %v", r, err)
	}
}
