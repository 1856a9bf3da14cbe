package main

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A fresh sidecar given 75,000 distinct client IPs (or as many as 20 s allow on a busy
// machine, at least 5,000) against token_create keeps
// its heap within the collector's bound from the first allocation: live heap +
// headroom + slack, with collections during the load; and once the windows are swept,
// checks that create no key keep it there.
func TestHeapBoundedFromTheStart(t *testing.T) {
	const (
		headroomMB = 32
		keys       = 75_000
		// load bounds the time to send them: about 5 s on a quiet machine, more when
		// other tests share it. The bound counts every key sent, live or expired.
		load = 20 * time.Second
		// perKey bounds the live heap a counter costs with what the sidecar keeps
		// beside it (the limiter alone: about 100 bytes, docs/performance.md).
		perKey = 256
		slack  = 24 << 20 // gRPC's buffers, the metrics' scrapes, the race detector's
	)
	yaml := writeTemp(t, "limits.yaml", "clean_period_ms: 1000\nlimits:\n  token_create: {limit: 1000, window: 5s}\n")
	n := startNode(t, "", "memory", map[string]string{
		"SIDECAR_GRPC_ADDR": "127.0.0.1:0", "SIDECAR_HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info",
		"RATE_LIMIT_CONFIG": yaml, "SIDECAR_GC_HEADROOM_MB": strconv.Itoa(headroomMB),
	})
	defer terminate(t, n)
	base := n.metric("go_memstats_heap_alloc_bytes")
	gcBase := n.metric("go_gc_duration_seconds_count")

	var sent atomic.Int64
	var peak atomic.Int64
	bound := func() float64 {
		return float64(headroomMB<<20) + base + float64(sent.Load())*perKey + slack
	}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var over atomic.Value
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			h := n.metric("go_memstats_heap_alloc_bytes")
			if int64(h) > peak.Load() {
				peak.Store(int64(h))
			}
			if b := bound(); h > b && over.Load() == nil {
				over.Store(fmt.Sprintf("heap %.1f MiB after %d keys, over the bound of %.1f MiB", h/(1<<20), sent.Load(), b/(1<<20)))
			}
		}
	})
	deadline := time.Now().Add(load)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				i := sent.Add(1)
				if i > keys {
					return
				}
				n.createToken(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
			}
		})
	}
	wg.Wait()
	keysSent := min(sent.Load(), keys)
	gcLoad := n.metric("go_gc_duration_seconds_count") - gcBase
	// The windows end within 5 s and are swept within a second; then 2 s of checks of
	// one key, which create none.
	time.Sleep(6500 * time.Millisecond)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		n.createToken("192.0.2.1")
	}
	close(stop)
	sampler.Wait()
	t.Logf("%d keys in %v: %.0f collections during the load; heap at start %.1f MiB, peak %.1f MiB (bound %.1f MiB)",
		keysSent, load, gcLoad, base/(1<<20), float64(peak.Load())/(1<<20), bound()/(1<<20))
	if keysSent < 5_000 {
		t.Fatalf("only %d keys sent in %v: the load did not happen", keysSent, load)
	}
	if gcLoad == 0 {
		t.Errorf("no collection during the load of %d keys", keysSent)
	}
	if msg := over.Load(); msg != nil {
		t.Error(msg)
	}
}
