package envoywire

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A Check or ShouldRateLimit whose deadline is closer than MinBudget when its handler
// starts is refused with ErrTooLate (RESOURCE_EXHAUSTED) before its message is read or
// decoded, and counted; with time to spare, or without a deadline, it is decoded and
// decided.
func TestTooLateIsRefusedUnread(t *testing.T) {
	e := newEnv(t)
	shed := prometheus.NewCounter(prometheus.CounterOpts{Name: "shed"})
	e.wireRLS.CountShed(shed)
	_, msgs := e.checkRequests(t, 20)
	_, rmsgs := e.rateLimitRequests(t, 20)
	for _, h := range []struct {
		name    string
		handler func(any, context.Context, func(any) error, any) (any, error)
		srv     any
		msg     []byte
	}{
		{"Check", func(srv any, ctx context.Context, dec func(any) error, _ any) (any, error) {
			return checkHandler(srv, ctx, dec, nil)
		}, e.wire, msgs[0]},
		{"ShouldRateLimit", func(srv any, ctx context.Context, dec func(any) error, _ any) (any, error) {
			return rateLimitHandler(srv, ctx, dec, nil)
		}, e.wireRLS, rmsgs[0]},
	} {
		read := 0
		dec := func(v any) error {
			read++
			v.(call).decode(h.msg)
			return nil
		}
		for _, d := range []time.Duration{-time.Millisecond, MinBudget / 2, MinBudget - time.Millisecond} {
			ctx, cancel := context.WithTimeout(t.Context(), d)
			_, err := h.handler(h.srv, ctx, dec, nil)
			cancel()
			if !errors.Is(err, ErrTooLate) || status.Code(err) != codes.ResourceExhausted || read != 0 {
				t.Fatalf("%s with %v to its deadline: %v, read %d times; want ErrTooLate, unread", h.name, d, err, read)
			}
		}
		for _, ctx := range []context.Context{t.Context(), withTimeout(t, 250*time.Millisecond)} {
			got, err := h.handler(h.srv, ctx, dec, nil)
			if err != nil || got == nil {
				t.Fatalf("%s with time to spare: %v", h.name, err)
			}
			got.(call).encode()
			got.(call).buffers().Free()
		}
		if read != 2 {
			t.Fatalf("%s: read %d times, want 2", h.name, read)
		}
	}
	if n := testutil.ToFloat64(shed); n != 3 {
		t.Fatalf("shed counted %v ShouldRateLimit calls, want 3", n)
	}
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
