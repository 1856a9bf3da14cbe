package limiter

import (
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converger/edge/shared/buckets"
)

// liveHeap is the heap in use after two forced collections (the second frees what the
// first's finalizers and cleanups released).
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// ipKey is the i-th distinct IPv4 address, as the sidecar counts client IPs.
func ipKey(i int) string {
	return "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
}

// keyCost fills a limiter with n distinct keys of one bucket (10 s windows) and returns
// its bytes per live key (heap after a forced collection, less the heap before, divided
// by n) and the heap once the windows ended and were swept, as a ratio to the baseline.
func keyCost(tb testing.TB, n int, replicated bool) (perKey float64, afterSweep float64) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC).UnixNano())
	l := New(Options{Replicated: replicated, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	lim := buckets.Limit{Count: 1000, Window: 10 * time.Second}
	b := l.Bucket("token_create")
	keys := make([]string, n)
	for i := range keys {
		keys[i] = ipKey(i)
	}
	base := liveHeap()
	for _, k := range keys {
		l.Check(Key{Bucket: b, ID: k}, 1, lim)
	}
	// A cluster's sync loop drains the changed counters every interval.
	l.DrainChanged(func(Key, Snapshot) {})
	if l.Len() != n {
		tb.Fatalf("%d counters, want %d", l.Len(), n)
	}
	full := liveHeap()
	// Past the window (and a replicated counter's keep): every counter is swept.
	now.Add(int64(time.Minute))
	if removed := l.Sweep(); removed != n {
		tb.Fatalf("swept %d counters, want %d", removed, n)
	}
	swept := liveHeap()
	runtime.KeepAlive(l)
	runtime.KeepAlive(keys)
	return float64(full-base) / float64(n), float64(swept) / float64(base)
}

// The limiter's memory per live key, and the heap back at its baseline once the
// windows are swept (docs/performance.md).
func TestMemoryPerLiveKey(t *testing.T) {
	for _, replicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("replicated=%v", replicated), func(t *testing.T) {
			perKey, ratio := keyCost(t, 100_000, replicated)
			t.Logf("100,000 keys: %.0f bytes per live key; heap after the sweep %.3f × the baseline", perKey, ratio)
			if perKey > 256 {
				t.Errorf("%.0f bytes per live key, want at most 256", perKey)
			}
			if ratio > 1.10 {
				t.Errorf("heap after the sweep %.3f × the baseline, want at most 1.10", ratio)
			}
		})
	}
}

// BenchmarkLiveKeys reports the bytes per live key at 100,000 and 1,000,000 keys
// (B/key) and the heap after the sweep as a ratio to the baseline (swept/base).
func BenchmarkLiveKeys(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		for _, replicated := range []bool{false, true} {
			b.Run(fmt.Sprintf("keys=%d/replicated=%v", n, replicated), func(b *testing.B) {
				var perKey, ratio float64
				for range b.N {
					perKey, ratio = keyCost(b, n, replicated)
				}
				b.ReportMetric(perKey, "B/key")
				b.ReportMetric(ratio, "swept/base")
			})
		}
	}
}
