package limiter

import (
	"sync/atomic"
	"time"
)

// anchoredClock reads the wall clock as an anchor plus the monotonic time elapsed since,
// which costs one clock read instead of two. Sweep re-anchors it, so a step of the wall
// clock (an NTP correction) is followed within one clean period.
type anchoredClock struct {
	base atomic.Pointer[anchor]
}

type anchor struct {
	t  time.Time // carries a monotonic reading
	ms int64
}

func newAnchoredClock() *anchoredClock {
	c := &anchoredClock{}
	c.anchor()
	return c
}

func (c *anchoredClock) anchor() {
	now := time.Now()
	c.base.Store(&anchor{t: now, ms: now.UnixMilli()})
}

func (c *anchoredClock) nowMS() int64 {
	a := c.base.Load()
	return a.ms + time.Since(a.t).Milliseconds()
}
