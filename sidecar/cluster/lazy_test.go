package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// TestLazyValuesShareFlushes: one node of three, 200 keys far below their limit, each
// counted every 2 s at its own moment (10 a sync interval, in turn). Their values wait,
// each from its own last one; a flush that sends some takes along those due within
// lazySlack intervals, so few flushes send and each carries many values (without it,
// about a third of the flushes would).
func TestLazyValuesShareFlushes(t *testing.T) {
	c := &testClock{}
	c.set(t0 - t0%minute) // a window's start
	lim := limiter.New(limiter.Options{Now: c.now, Replicated: true})
	r := newReplicator(lim, "a#01", true)
	l := limiter.Limit{Count: 1_000_000, Window: time.Minute}
	b := lim.Bucket("tenant")
	const keys, perTick = 200, 10
	flushes, sending, values := 0, 0, 0
	for tick := range 3 * 600 {
		now := c.ms.Load()
		for i := range perTick {
			k := limiter.Key{Bucket: b, ID: fmt.Sprintf("tenant-%03d", (tick*perTick+i)%keys)}
			if !lim.Check(k, 1, l).Allowed {
				t.Fatalf("refused far below the limit at tick %d", tick)
			}
		}
		res := r.flush(shareEnv{now: now, intervalMS: 100, live: func(string) bool { return true }, members: 3})
		if tick >= 600 { // after the first window: its first values
			flushes++
			values += len(res.values)
			if len(res.values) > 0 {
				sending++
			}
		}
		c.set(now + 100)
	}
	perKeyWindow := float64(values) / keys / 2
	t.Logf("%d of %d flushes sent values, %.1f values per key per window (each key counted 30 times a window)", sending, flushes, perKeyWindow)
	if sending > flushes/8 {
		t.Errorf("%d of %d flushes sent values: the waiting ones did not share them", sending, flushes)
	}
	if perKeyWindow > 15 || perKeyWindow < 2 {
		t.Errorf("%.1f values per key per window, want the first, the waited ones (6 s) and the last: about 10 to 13", perKeyWindow)
	}
}
