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
	if got := s.merge(origin, v, now, now); got != want {
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
	// A sweep keeps the slots of the window before the current one (share mode reads
	// what the nodes were asked for in it), and drops those of earlier windows.
	s.sweep(c.ms.Load())
	if v := s.view(k); len(v) != 2 {
		t.Fatalf("after a sweep in the next window: %+v, want a's slot of it and b's of the one before", v)
	}
	s.sweep(t0 + 2*minute)
	if v := s.view(k); len(v) != 1 || v[0].Origin != originA {
		t.Fatalf("after a sweep a window later: %+v, want only a's slot", v)
	}
	s.sweep(t0 + 3*minute)
	if _, ok := s.keys[k]; ok {
		t.Fatal("a key with no slot left and no count of this node's was kept")
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
		if s.merge(originA, v, now, now) == merged {
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

// A version 2 value's share fields: the newest message's bound holds (it may go down),
// refused hits only grow, the demand of the window before is kept when a new window's
// value replaces a slot, and the time the demand last grew is noted.
func TestMergeShareFields(t *testing.T) {
	s, lim, c := newTestSlots(t)
	now := c.ms.Load()
	k := limiter.Key{Bucket: lim.Bucket("login_ip"), ID: "ip"}
	v := func(end int64, count, refused, cap uint32) value {
		return value{bucket: "login_ip", id: "ip", sizeMS: minute, endMS: end, count: count, share: true, refused: refused, cap: cap, capped: true, limit: 10}
	}
	slotOf := func() slot { return s.keys[k].slots[0] }
	mustMerge(t, s, originA, v(t0, 4, 6, 5), now-minute, merged) // the window before, merged while it ran
	s.merge(originA, v(t0, 4, 6, 5), now-minute+10, now-minute+10)
	mustMerge(t, s, originA, v(t0+minute, 2, 1, 6), now, merged)
	if sl := slotOf(); sl.prevEnd != t0 || sl.prevDemand != 10 || sl.count != 2 || sl.refused != 1 || sl.cap != 6 || sl.grewAt != now || sl.at != now {
		t.Fatalf("new window: %+v, want the last window's demand 4 + 6 kept", sl)
	}
	// A newer message lowers the bound; refused hits never go down.
	if r := s.merge(originA, v(t0+minute, 2, 0, 3), now+100, now+100); r != merged {
		t.Fatal(r)
	}
	if sl := slotOf(); sl.cap != 3 || sl.refused != 1 || sl.at != now+100 || sl.grewAt != now {
		t.Fatalf("lower bound, same demand: %+v", sl)
	}
	// An older message, arriving late, changes neither bound nor time.
	s.merge(originA, v(t0+minute, 2, 1, 9), now+50, now+150)
	if sl := slotOf(); sl.cap != 3 || sl.at != now+100 {
		t.Fatalf("a late message changed the bound: %+v", sl)
	}
	// More demand: its time is noted.
	s.merge(originA, v(t0+minute, 3, 1, 3), now+200, now+200)
	if sl := slotOf(); sl.grewAt != now+200 || sl.demand() != 4 {
		t.Fatalf("more demand: %+v", sl)
	}
	// A version 1 value (a state transfer) merges its count and leaves the rest.
	s.merge(originA, val("ip", t0+minute, 5), now+300, now+300)
	if sl := slotOf(); sl.count != 5 || sl.cap != 3 || !sl.share || sl.grewAt != now+300 {
		t.Fatalf("version 1 value: %+v", sl)
	}
}

// The node name's origin that sent last directly is its current incarnation.
func TestSawDirect(t *testing.T) {
	s, _, _ := newTestSlots(t)
	s.sawDirect("a#1111")
	s.sawDirect("a#2222")
	s.sawDirect("b#3333")
	if s.names[s.current["a"]] != "a#2222" || s.names[s.current["b"]] != "b#3333" {
		t.Fatalf("current: %v", s.current)
	}
}

// TestSmallChangeOfTheNextBoundWaitsForTheWindowsEnd: far from the limit the owner's
// plan moves each member's bound in the next window by a few hits at every report; such
// a change goes with the window's last two intervals (before the window it bounds
// begins), not in a summary of its own, while one worth a message goes at once: a rise
// of a 16th of the limit, a fall of a member's part of that (the falls that wait free
// less than a 16th of the limit together), any change of a small limit.
func TestSmallChangeOfTheNextBoundWaitsForTheWindowsEnd(t *testing.T) {
	const end, interval, members = t0 + minute, int64(100), 20
	far, last := end-30_000, end-150
	held := shareNode{capped: true, claim: 50_000}
	for _, tc := range []struct {
		name      string
		limit     int64
		next, now int64
		want      bool
	}{
		{"unchanged", 1_000_000, 50_000, far, false},
		{"falls by 1, far from the window's end", 1_000_000, 49_999, far, false},
		{"falls by a 320th of the limit less 1", 1_000_000, 50_000 - 3_124, far, false},
		{"falls by a 320th of the limit", 1_000_000, 50_000 - 3_125, far, true},
		{"rises by 1, far from the window's end", 1_000_000, 50_001, far, false},
		{"rises by a 16th of the limit less 1", 1_000_000, 50_000 + 62_499, far, false},
		{"rises by a 16th of the limit", 1_000_000, 50_000 + 62_500, far, true},
		{"falls by 1 in the window's last two intervals", 1_000_000, 49_999, last, true},
		{"rises by 1 in the window's last two intervals", 1_000_000, 50_001, last, true},
		{"falls by 1 of a limit of 10", 10, 49_999, far, true},
		{"rises by 1 of a limit of 10", 10, 50_001, far, true},
	} {
		sl := slot{sumAt: far - 10*interval, sumBounds: bounds{cur: 50_000, next: 50_000, curCapped: true, nextCapped: true}}
		e := summaryEntry{endMS: end, planned: true, cur: 50_000, curCapped: true, next: uint32(tc.next), nextCapped: true}
		if got := sl.boundsChanged(e, held, tc.limit, members, tc.now, interval); got != tc.want {
			t.Errorf("%s: boundsChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
}
