package cluster

import (
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// TestGrantsBetweenTwoNodes: two real nodes on loopback. The node that does not own a
// key, bound at its count once it has counted, asks the owner for room when its bound
// refuses a check below the limit, and gets it at once.
func TestGrantsBetweenTwoNodes(t *testing.T) {
	start := func(name string, join []string) *Cluster {
		c, err := Start(Config{NodeName: name, BindAddr: "127.0.0.1:0", Strategy: "static", Join: join,
			SyncInterval: 100 * time.Millisecond, ShareMode: true, GrantWait: 200 * time.Millisecond, Logger: quiet},
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
	on := func(c *Cluster) bool {
		c.ownersMu.Lock()
		defer c.ownersMu.Unlock()
		return len(c.owners.names) == 2 && c.nowMS() >= c.owners.changedAt+c.owners.settle
	}
	for !on(a) || !on(b) {
		if time.Now().After(deadline) {
			t.Fatalf("grants not on: a %v, b %v", a.owners, b.owners)
		}
		time.Sleep(10 * time.Millisecond)
	}
	lim := limiter.Limit{Count: 10, Window: time.Hour}
	if left := lim.Window.Milliseconds() - a.lim.NowMS()%lim.Window.Milliseconds(); left < 20_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
	}
	// A key b does not own.
	id := ""
	for i := 0; id == ""; i++ {
		if s := "192.0.2." + string(rune('a'+i%26)) + string(rune('a'+i/26)); ownerOf("token_create", s, []string{"a", "b"}) == "a" {
			id = s
		}
	}
	k := limiter.Key{Bucket: b.lim.Bucket("token_create"), ID: id}
	if !b.lim.Check(k, 1, lim).Allowed {
		t.Fatal("the first check refused")
	}
	// b's next flush bounds it at its count.
	for {
		if c, ok := b.lim.CapIn(k, lim.Window.Milliseconds(), windowEnd(b.nowMS(), lim.Window.Milliseconds())); ok && c == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b not bound at its count")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 9 {
		if r := b.lim.Check(k, 1, lim); !r.Allowed {
			t.Fatalf("check %d of 10 refused: %+v, debug %+v", i+2, r, b.Debug("token_create", id))
		}
	}
	if r := b.lim.Check(k, 1, lim); r.Allowed {
		t.Fatalf("the 11th check allowed: %+v", r)
	}
	asked := counter(t, b.m.grants.WithLabelValues("asked", "sent"))
	granted := counter(t, b.m.grants.WithLabelValues("asked", "granted"))
	given := counter(t, a.m.grants.WithLabelValues("answered_other", "granted"))
	if asked == 0 || granted == 0 || given != granted {
		t.Errorf("b asked %g and was granted %g times; a granted %g", asked, granted, given)
	}
	t.Logf("b asked %g times, granted %g; a gave %g hits", asked, granted, counter(t, a.m.grantedHits.WithLabelValues("other")))
}
