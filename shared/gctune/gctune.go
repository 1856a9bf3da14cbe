// Package gctune paces the garbage collector of a server whose live heap is small
// beside the garbage its requests make: with Go's default (GOGC=100) a sidecar holding a
// few megabytes collects many times a second under load, and each collection's marking
// work lands on the requests in flight, in their latency's tail.
package gctune

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// The bounds of the GOGC the tuner sets: never below Go's default (a live heap larger
// than the headroom), never above MaxPercent (a live heap of next to nothing).
const (
	MinPercent = 100
	MaxPercent = 10_000
)

// LiveFloor is the least live heap the tuner assumes: Go's own minimum heap (4 MiB at
// GOGC=100, scaled by GOGC). Before the first collection the live heap reads 0; taken
// as 0, GOGC would be MaxPercent and the first collection would wait for 4 MiB × 101,
// far beyond the headroom. Taken as LiveFloor, the first collection comes once about
// headroom bytes are allocated, and the bound holds from the first allocation.
const LiveFloor = 4 << 20

// Tuner keeps at least a headroom of garbage between collections.
type Tuner struct {
	headroom uint64
	stopped  atomic.Bool
	percent  atomic.Int64
	sample   []metrics.Sample
}

// Start paces the collector so that at least headroom bytes may be allocated between
// two collections: after every collection GOGC becomes headroom / live heap (in
// percent), at least MinPercent, the live heap taken as at least LiveFloor. Memory
// stays bounded by live heap + max(live heap, headroom), before the first collection
// too; GOMEMLIMIT, when set, still caps it. With GOGC set in the environment the
// operator's choice stands and Start does nothing (it returns nil).
func Start(headroom uint64) *Tuner {
	if _, set := os.LookupEnv("GOGC"); set || headroom == 0 {
		return nil
	}
	t := &Tuner{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.adjust()
	t.arm()
	return t
}

// Percent is the GOGC the tuner set last.
func (t *Tuner) Percent() int {
	if t == nil {
		return 0
	}
	return int(t.percent.Load())
}

// Stop ends the tuning after the next collection; GOGC stays as it was set last.
func (t *Tuner) Stop() {
	if t != nil {
		t.stopped.Store(true)
	}
}

// sentinel is an object the tuner drops, so that its cleanup runs after the
// collection that finds it unreachable. It is large enough not to share a tiny block.
type sentinel struct{ _ [64]byte }

func (t *Tuner) arm() {
	runtime.AddCleanup(&sentinel{}, func(t *Tuner) {
		if t.stopped.Load() {
			return
		}
		t.adjust()
		t.arm()
	}, t)
}

// adjust sets GOGC from the live heap the last collection left (LiveFloor at least:
// before any collection it reads 0). Go's heap goal is then live × (1 + GOGC/100), and
// at least LiveFloor × GOGC/100 = headroom.
func (t *Tuner) adjust() {
	metrics.Read(t.sample)
	live := uint64(0)
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		live = t.sample[0].Value.Uint64()
	}
	p := max(int64(min(t.headroom*100/max(live, LiveFloor), MaxPercent)), MinPercent)
	if p != t.percent.Load() {
		t.percent.Store(p)
		debug.SetGCPercent(int(p))
	}
}
