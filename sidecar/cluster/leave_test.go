package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// TestStopHandsCountsToTheMembers runs two real nodes in this process whose sync loop
// never fires (an hour's interval): what b knows of a's counts when a has stopped came
// only from a's handoff in Stop. Many counters, so the handoff takes several messages.
func TestStopHandsCountsToTheMembers(t *testing.T) {
	start := func(name string, join []string) *Cluster {
		c, err := Start(Config{NodeName: name, BindAddr: "127.0.0.1:0", Strategy: "static", Join: join,
			SyncInterval: time.Hour, ShareMode: true, Logger: quiet},
			limiter.New(limiter.Options{Replicated: true}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		return c
	}
	a := start("a", nil)
	b := start("b", []string{a.ml.LocalNode().Address()})
	deadline := time.Now().Add(10 * time.Second)
	for a.Members() != 2 || b.Members() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("members: a %d, b %d", a.Members(), b.Members())
		}
		time.Sleep(10 * time.Millisecond)
	}
	const keys = 300
	lim := limiter.Limit{Count: 1000, Window: time.Hour}
	if left := lim.Window.Milliseconds() - a.lim.NowMS()%lim.Window.Milliseconds(); left < 20_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
	}
	id := func(i int) string { return fmt.Sprintf("192.0.2.%d-%d", i%250, i) }
	for i := range keys {
		a.lim.Record(limiter.Key{Bucket: a.lim.Bucket("login_ip"), ID: id(i)}, uint32(i%5+1), lim)
	}
	kb := func(i int) limiter.Key { return limiter.Key{Bucket: b.lim.Bucket("login_ip"), ID: id(i)} }
	if got := b.lim.Peek(kb(0), lim).Count; got != 0 {
		t.Fatalf("b counts %d before a stopped: something synced", got)
	}
	began := time.Now()
	a.Stop()
	took := time.Since(began)
	if bound := handoffTimeout + leaveTimeout + time.Second; took > bound {
		t.Errorf("Stop took %v, bound %v", took, bound)
	}
	missing := 0
	for i := range keys {
		if b.lim.Peek(kb(i), lim).Count != uint32(i%5+1) {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d counters not handed to b", missing, keys)
	}
	// a left: b no longer counts it as a member, without waiting for a suspicion timeout.
	for b.Members() != 1 {
		if time.Since(began) > 3*time.Second {
			t.Fatalf("b still counts %d members 3 s after a left", b.Members())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("a stopped in %v; b had its %d counters", took, keys)
}
