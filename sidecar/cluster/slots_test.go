package cluster

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// testClock is the wall clock of a test limiter; it moves only when the test moves it.
type testClock struct{ ms atomic.Int64 }

func (c *testClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }
func (c *testClock) set(ms int64)   { c.ms.Store(ms) }

// t0 begins a minute: the windows of the tests below are [t0, t0+60 s), [t0+60 s, ...).
const (
	t0      = int64(1_700_000_040_000)
	minute  = int64(60_000)
	self    = "self#0000000000000000"
	originA = "a#1111111111111111"
	originB = "b#2222222222222222"
)

var perMinute = limiter.Limit{Count: 10, Window: time.Minute}

// newTestSlots returns the replicated half of a node whose clock is at t0+10 s.
func newTestSlots(t *testing.T) (*slots, *limiter.Limiter, *testClock) {
	t.Helper()
	c := &testClock{}
	c.set(t0 + 10_000)
	lim := limiter.New(limiter.Options{Now: c.now, Replicated: true})
	return newSlots(lim, self), lim, c
}

// val is one origin's value of login_ip/ip in the window ending at end.
func val(id string, end int64, count uint32) value {
	return value{bucket: "login_ip", id: id, sizeMS: minute, endMS: end, count: count}
}

// total is the count the limiter decides with: this node's own plus the other origins'.
func total(t *testing.T, lim *limiter.Limiter, id string) uint32 {
	t.Helper()
	return lim.Peek(limiter.Key{Bucket: lim.Bucket("login_ip"), ID: id}, perMinute).Count
}

func mustMerge(t *testing.T, s *slots, origin string, v value, now int64, want mergeResult) {
	t.Helper()
	if got := s.merge(origin, v, now); got != want {
		t.Fatalf("merge(%s, %+v) at %d = %v, want %v", origin, v, now, got, want)
	}
}

func TestMergeDuplicatesCountOnce(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	for range 3 {
		mustMerge(t, s, originA, val("ip", t0+minute, 3), now, merged)
	}
	if got := total(t, lim, "ip"); got != 3 {
		t.Fatalf("the same value three times counts %d, want 3", got)
	}
}

func TestMergeReorderingChangesNothing(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	mustMerge(t, s, originA, val("ip", t0+minute, 5), now, merged)
	// An older value of the same window, arriving late: ignored.
	mustMerge(t, s, originA, val("ip", t0+minute, 3), now, merged)
	if got := total(t, lim, "ip"); got != 5 {
		t.Fatalf("a lower count of the same window changed the total to %d, want 5", got)
	}
	// A node whose clock is ahead sent its next window, then (reordered) a value of the
	// current one: the newer window stays, the older value changes nothing.
	mustMerge(t, s, originB, val("ip", t0+2*minute, 4), now, merged)
	mustMerge(t, s, originB, val("ip", t0+minute, 9), now, merged)
	if got := total(t, lim, "ip"); got != 5 {
		t.Fatalf("an older window's value changed the total to %d, want 5", got)
	}
	for _, v := range s.view(limiter.Key{Bucket: lim.Bucket("login_ip"), ID: "ip"}) {
		if v.Origin == originB && (v.WindowEndMS != t0+2*minute || v.Count != 4) {
			t.Fatalf("an older window replaced the newer one: %+v", v)
		}
	}
}

func TestMergeLaterValueHealsALostOne(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	mustMerge(t, s, originA, val("ip", t0+minute, 1), now, merged)
	// The values 2 and 3 are lost; 4 is the origin's whole count, not an increment.
	mustMerge(t, s, originA, val("ip", t0+minute, 4), now, merged)
	if got := total(t, lim, "ip"); got != 4 {
		t.Fatalf("total %d after a lost value, want 4", got)
	}
}

func TestMergeSumsOrigins(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	mustMerge(t, s, originA, val("ip", t0+minute, 3), now, merged)
	mustMerge(t, s, originB, val("ip", t0+minute, 4), now, merged)
	mustMerge(t, s, originA, val("ip", t0+minute, 3), now, merged)
	if got := total(t, lim, "ip"); got != 7 {
		t.Fatalf("two origins 3 + 4 count %d, want 7", got)
	}
	// The limit holds on the sum: 3 own hits are allowed, the 4th is not.
	k := limiter.Key{Bucket: lim.Bucket("login_ip"), ID: "ip"}
	for i := 1; i <= 4; i++ {
		r := lim.Check(k, 1, perMinute)
		if want := i <= 3; r.Allowed != want || r.Count != uint32(7+i) {
			t.Fatalf("own hit %d: allowed %v count %d, want allowed %v count %d", i, r.Allowed, r.Count, want, 7+i)
		}
	}
	// Another key is not affected.
	if got := total(t, lim, "other"); got != 0 {
		t.Fatalf("another key counts %d", got)
	}
}

func TestMergeNewWindowReplacesOld(t *testing.T) {
	s, lim, c := newTestSlots(t)
	mustMerge(t, s, originA, val("ip", t0+minute, 5), c.ms.Load(), merged)
	mustMerge(t, s, originB, val("ip", t0+minute, 2), c.ms.Load(), merged)
	c.set(t0 + minute + 500)
	mustMerge(t, s, originA, val("ip", t0+2*minute, 1), c.ms.Load(), merged)
	if got := total(t, lim, "ip"); got != 1 {
		t.Fatalf("total %d in the new window, want only the new window's 1", got)
	}
	k := limiter.Key{Bucket: lim.Bucket("login_ip"), ID: "ip"}
	var a []SlotView
	for _, v := range s.view(k) {
		if v.Origin == originA {
			a = append(a, v)
		}
	}
	if len(a) != 1 || a[0].WindowEndMS != t0+2*minute || a[0].Count != 1 {
		t.Fatalf("origin a's slots: %+v, want one, of the new window", a)
	}
	s.sweep(c.ms.Load())
	if v := s.view(k); len(v) != 1 || v[0].Origin != originA {
		t.Fatalf("after a sweep: %+v, want only a's slot of the current window", v)
	}
}

func TestMergeDropsEndedWindows(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	// The window before, and a window that ends exactly now: both have ended here.
	mustMerge(t, s, originA, val("ip", t0, 5), now, stale)
	mustMerge(t, s, originA, value{bucket: "login_ip", id: "ip", sizeMS: 10_000, endMS: now, count: 5}, now, stale)
	if lim.Len() != 0 {
		t.Fatalf("a stale value created %d counters", lim.Len())
	}
	if got := total(t, lim, "ip"); got != 0 {
		t.Fatalf("a stale value counted: %d", got)
	}
	if v := s.view(limiter.Key{Bucket: lim.Bucket("login_ip"), ID: "ip"}); len(v) != 0 {
		t.Fatalf("a stale value was kept: %+v", v)
	}
}

func TestMergeHoldsFutureWindowsUntilTheyBegin(t *testing.T) {
	s, lim, c := newTestSlots(t)
	k := limiter.Key{Bucket: lim.Bucket("login_ip"), ID: "ip"}
	now := c.ms.Load()
	// b is in step with this node; a's clock is a minute ahead.
	mustMerge(t, s, originB, val("ip", t0+minute, 3), now, merged)
	mustMerge(t, s, originA, val("ip", t0+2*minute, 4), now, merged)
	if got := total(t, lim, "ip"); got != 3 {
		t.Fatalf("total %d: a window that has not begun counted", got)
	}
	s.tick(t0 + minute - 1)
	if got := total(t, lim, "ip"); got != 3 {
		t.Fatalf("total %d after a tick before the window began", got)
	}
	if v := s.view(k); len(v) != 2 {
		t.Fatalf("slots %+v, want b's and a's pending one", v)
	}
	s.sweep(t0 + minute - 1)
	// The window begins: the next tick publishes a's value, and b's old window is over.
	c.set(t0 + minute)
	if got := total(t, lim, "ip"); got != 0 {
		t.Fatalf("total %d at the new window before the tick", got)
	}
	s.tick(c.ms.Load())
	if got := total(t, lim, "ip"); got != 4 {
		t.Fatalf("total %d after the window began, want a's 4", got)
	}
	if _, pending := s.pending[k]; pending {
		t.Fatal("still pending after its window began")
	}
	// It counts against the limit like any other remote count.
	for i := 1; i <= 7; i++ {
		if r := lim.Check(k, 1, perMinute); r.Allowed != (i <= 6) {
			t.Fatalf("own hit %d: %+v", i, r)
		}
	}
}

func TestMergeIgnoresOwnOriginAndInvalidValues(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	before := lim.Buckets()
	mustMerge(t, s, self, val("ip", t0+minute, 5), now, ignored)
	for _, v := range []value{
		{bucket: "Login-IP", id: "ip", sizeMS: minute, endMS: t0 + minute, count: 1},
		{bucket: "", id: "ip", sizeMS: minute, endMS: t0 + minute, count: 1},
		{bucket: strings.Repeat("a", 65), id: "ip", sizeMS: minute, endMS: t0 + minute, count: 1},
		{bucket: "login_ip", id: "", sizeMS: minute, endMS: t0 + minute, count: 1},
		{bucket: "login_ip", id: strings.Repeat("x", maxString+1), sizeMS: minute, endMS: t0 + minute, count: 1},
	} {
		mustMerge(t, s, originA, v, now, ignored)
	}
	if got := lim.Buckets(); got != before {
		t.Fatalf("invalid values registered buckets: %d, want %d", got, before)
	}
	if got := total(t, lim, "ip"); got != 0 {
		t.Fatalf("own origin counted as remote: %d", got)
	}
	if lim.Len() != 0 {
		t.Fatalf("%d counters created by ignored values", lim.Len())
	}
}

func TestMergeBoundsBucketRegistration(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	lim.Bucket("login_ip")
	registered := 0
	for i := range maxBuckets + 100 {
		v := value{bucket: fmt.Sprintf("b%04d", i), id: "x", sizeMS: minute, endMS: t0 + minute, count: 1}
		if s.merge(originA, v, now) == merged {
			registered++
		}
	}
	if lim.Buckets() != maxBuckets || registered != maxBuckets-1 {
		t.Fatalf("%d buckets registered (%d by other nodes), want the bound %d", lim.Buckets(), registered, maxBuckets)
	}
	// Values of a known bucket still merge.
	mustMerge(t, s, originA, val("ip", t0+minute, 2), now, merged)
	if got := total(t, lim, "ip"); got != 2 {
		t.Fatalf("known bucket after the bound: %d", got)
	}
}

// shareNode is one node's limiter and slots in the share-mode tests, with a key
// limited to limit per minute.
type shareNode struct {
	lim   *limiter.Limiter
	slots *slots
	k     limiter.Key
	limit limiter.Limit
}

func newShareNode(c *testClock, origin string, limit uint32) *shareNode {
	lim := limiter.New(limiter.Options{Now: c.now, Replicated: true})
	return &shareNode{lim: lim, slots: newSlots(lim, origin), k: limiter.Key{Bucket: lim.Bucket("login_ip"), ID: "ip"},
		limit: limiter.Limit{Count: limit, Window: time.Minute}}
}

// tick is a flush's share-mode step, the key having been merged or counted since the
// last: it returns whether the node is capped.
func (n *shareNode) tick(now int64) bool {
	n.slots.tick(now)
	return n.slots.shareTick(map[limiter.Key]struct{}{n.k: {}}, now) > 0
}

// admit checks hits until one is denied and returns how many were allowed (at most max).
func (n *shareNode) admit(max int) int {
	for i := range max {
		if !n.lim.Check(n.k, 1, n.limit).Allowed {
			return i
		}
	}
	return max
}

func TestShareSingleNodeIsNeverCapped(t *testing.T) {
	c := &testClock{}
	c.set(t0 + 10_000)
	n := newShareNode(c, self, 100)
	// Another node counted 30 earlier in the window, before this node had a hit of its
	// own; since then only this node has traffic.
	if r := n.slots.merge(originA, val("ip", t0+minute, 30), c.ms.Load()); r != merged {
		t.Fatal(r)
	}
	if n.tick(c.ms.Load()) {
		t.Fatal("capped without a hit of its own")
	}
	for i := range 7 {
		for range 10 {
			n.lim.Record(n.k, 1, n.limit)
		}
		c.set(c.ms.Load() + 100)
		if n.tick(c.ms.Load()) {
			t.Fatalf("interval %d: capped with no traffic elsewhere (count %d of 100)", i, 30+10*(i+1))
		}
	}
	// 100 counted: the rest of the budget is all this node's.
	if got := n.admit(100); got != 0 {
		t.Fatalf("admitted %d over the limit", got)
	}
	n2 := newShareNode(c, self, 10)
	if got := n2.admit(20); got != 10 {
		t.Fatalf("alone: admitted %d, want the whole limit 10", got)
	}
	if n2.tick(c.ms.Load()) {
		t.Fatal("a key with no remote slot was capped")
	}
}

func TestShareThreeEqualNodesNearTheLimit(t *testing.T) {
	c := &testClock{}
	c.set(t0 + 10_000)
	origins := []string{"n1#01", "n2#02", "n3#03"}
	var nodes []*shareNode
	for _, o := range origins {
		nodes = append(nodes, newShareNode(c, o, 300))
	}
	// Every interval each node records 20 hits, then sends its own count to the two
	// others, then ticks. From each node's view: own rate 20, remote rate 40.
	//
	// What the others may have admitted since they reported is half an interval at
	// their rate, 20:
	//
	//	interval 1: own 20, remote 40: left 300-20-40-20 = 220 >= 2*60: not capped
	//	interval 2: own 40, remote 80: left 300-40-80-20 = 160 >= 120: not capped
	//	interval 3: own 60, remote 120: left 300-60-120-20 = 100 < 120: capped to
	//	            own + 100*20/(20+40) = 60 + 33
	want := []bool{false, false, true}
	for interval, capped := range want {
		for _, n := range nodes {
			for range 20 {
				n.lim.Record(n.k, 1, n.limit)
			}
		}
		now := c.ms.Load()
		for i, n := range nodes {
			snap, _ := n.lim.Lookup(n.k)
			v := value{bucket: "login_ip", id: "ip", sizeMS: snap.SizeMS, endMS: snap.EndMS, count: snap.Own}
			for j, m := range nodes {
				if j != i {
					if r := m.slots.merge(origins[i], v, now); r != merged {
						t.Fatal(r)
					}
				}
			}
		}
		for i, n := range nodes {
			if got := n.tick(now); got != capped {
				t.Fatalf("interval %d, node %d: capped %v, want %v", interval+1, i+1, got, capped)
			}
		}
		c.set(now + 100)
	}
	// Of the 100 left (after what the others may admit meanwhile), each node may admit
	// 33, a third; together 99, within the budget. Hits refused by the cap are not
	// counted.
	for i, n := range nodes {
		if got := n.admit(100); got != 33 {
			t.Fatalf("node %d admitted %d past its cap, want 33", i+1, got)
		}
		snap, _ := n.lim.Lookup(n.k)
		if snap.Own != 93 || snap.Remote != 120 {
			t.Fatalf("node %d: %+v", i+1, snap)
		}
	}
	// The next interval, with no new traffic anywhere else, lifts the cap.
	for _, n := range nodes {
		if n.tick(c.ms.Load()) {
			t.Fatal("still capped with no remote traffic")
		}
	}
	if got := nodes[0].admit(100); got != 300-93-120 {
		t.Fatalf("after the cap was lifted: admitted %d, want %d", got, 300-93-120)
	}
}
