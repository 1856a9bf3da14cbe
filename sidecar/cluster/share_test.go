package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

func TestAllocate(t *testing.T) {
	for _, c := range []struct {
		name     string
		budget   int64
		cs       []claimant
		members  int
		parts    []int64
		headroom int64
	}{
		{
			// a needs less than a third (33): its need; b and c more than half of the
			// 90 left: 45 each.
			name: "max-min", budget: 100, members: 3,
			cs:    []claimant{{name: "a", unmet: 10, capped: true}, {name: "b", unmet: 50, capped: true}, {name: "c", unmet: 80, capped: true}},
			parts: []int64{10, 45, 45},
		},
		{
			// Needs met, 70 left over four members: 17 each (70 / 4, rounded down).
			name: "headroom", budget: 100, members: 4,
			cs:    []claimant{{name: "a", unmet: 10, capped: true}, {name: "b", unmet: 20, capped: true}},
			parts: []int64{10, 20}, headroom: 17,
		},
		{
			// The node that is not capped is served first (70), the rest split.
			name: "uncapped first", budget: 100, members: 3,
			cs:    []claimant{{name: "a", unmet: 50, capped: true}, {name: "u", unmet: 70}, {name: "b", unmet: 50, capped: true}},
			parts: []int64{15, 70, 15},
		},
		{
			// 10 over three: 3 each, the odd one to the first name.
			name: "remainder", budget: 10, members: 3,
			cs:    []claimant{{name: "c", unmet: 100, capped: true}, {name: "a", unmet: 100, capped: true}, {name: "b", unmet: 100, capped: true}},
			parts: []int64{3, 4, 3},
		},
		{
			name: "nothing left", budget: -5, members: 3,
			cs:    []claimant{{name: "a", unmet: 10, capped: true}},
			parts: []int64{0},
		},
		{
			// Negative needs count as none.
			name: "no need", budget: 30, members: 2,
			cs:    []claimant{{name: "a", unmet: -4, capped: true}, {name: "b", unmet: 0, capped: true}},
			parts: []int64{0, 0}, headroom: 15,
		},
	} {
		parts, headroom := allocate(c.budget, c.cs, c.members)
		if !slices.Equal(parts, c.parts) || headroom != c.headroom {
			t.Errorf("%s: parts %v headroom %d, want %v and %d", c.name, parts, headroom, c.parts, c.headroom)
		}
	}
}

// view is a window [0, 1000) with a 100 ms sync interval, limit 900 and 3 members.
func view(now int64, self shareNode, peers ...shareNode) shareView {
	self.name, self.live, self.shares, self.at = "s#0", true, true, now
	for i := range peers {
		peers[i].live, peers[i].shares = true, true
		if peers[i].name == "" {
			peers[i].name = string(rune('a'+i)) + "#0"
		}
	}
	return shareView{now: now, startMS: 0, sizeMS: 1000, intervalMS: 100, limit: 900, members: 3, self: self, peers: peers}
}

func TestShareNeed(t *testing.T) {
	v := view(500, shareNode{})
	// At 250 ms: the last window's length holds 3/4 of the window before (600 × 0.75)
	// and this one's 200: 0.65 per ms; this window alone, 200 in 250 ms: 0.8 per ms,
	// faster, so the rate. Need: the count 150 and 0.8 × 750 ms left × 1.25 = 750.
	n := shareNode{count: 150, demand: 200, prevDemand: 600, at: 250, grewAt: 450}
	if r := v.rate(n); r != 0.8 {
		t.Errorf("rate %g, want 0.8", r)
	}
	if got := v.need(n); got != 150+750 {
		t.Errorf("need %d, want 900", got)
	}
	// The next window: 0.8 × 1000 × 1.25 = 1000, bounded by the limit.
	if got := v.needNext(n); got != 900 {
		t.Errorf("next window's need %d, want the limit 900", got)
	}
	// Demand that has not grown for two intervals: only its count.
	n.grewAt = 300
	if got := v.need(n); got != 150 {
		t.Errorf("silent since 300 ms: need %d, want its count 150", got)
	}
	// A node of the last window only, at the window's start: the last window's rate.
	v = view(0, shareNode{})
	if got := v.need(shareNode{prevDemand: 400, at: 0}); got != 500 {
		t.Errorf("need at the start %d, want 400 × 1.25 = 500", got)
	}
}

func TestSharePlanLoneNodeIsNotBound(t *testing.T) {
	// The others had nothing in this window or the last: no bound, now or next.
	v := view(300, shareNode{count: 700, demand: 2000, grewAt: 300}, shareNode{}, shareNode{})
	if p := v.plan(); p.curCapped || p.nextCapped {
		t.Fatalf("alone with demand: %+v", p)
	}
	// One that is gone (not live) does not count as busy either.
	dead := shareNode{count: 100, demand: 100, prevDemand: 300, grewAt: 250}
	v = view(300, shareNode{count: 500, demand: 900, grewAt: 300}, dead)
	v.peers[0].live = false
	if p := v.plan(); p.curCapped || p.nextCapped {
		t.Fatalf("alone with a dead member: %+v", p)
	}
}

func TestSharePlanKeepsTheBoundSetBeforeTheWindow(t *testing.T) {
	// Three nodes were busy in the last window (1800 asked each). At the window's
	// start this node holds the bound it set before (300); the others have sent nothing
	// of this window yet, so they hold theirs: the bounds as set from the last window,
	// 900 divided by needs of 1800 × 1.25 each, 300. Nothing is left: 300.
	last := shareNode{prevDemand: 1800}
	self := shareNode{prevDemand: 1800, claim: 300, claimed: true, capped: true}
	v := view(0, self, last, last)
	if got := v.startBounds(); got["a#0"] != 300 || got["b#0"] != 300 || got["s#0"] != 300 {
		t.Fatalf("bounds before the window: %v", got)
	}
	if p := v.plan(); !p.curCapped || p.cur != 300 || p.send {
		t.Fatalf("at the window's start: %+v, want a bound of 300, not sent", p)
	}
	// Without a bound of its own (it set none), the same.
	v.self.claimed = false
	if p := v.plan(); p.cur != 300 {
		t.Fatalf("without a bound before the window: %+v, want 300", p)
	}
	// Its checks come at the start: 300 counted, 1200 refused. The others have not
	// sent anything yet either. Still 300: nothing is left.
	v = view(20, shareNode{count: 300, demand: 1500, prevDemand: 1800, claim: 300, claimed: true, capped: true, grewAt: 20}, last, last)
	if p := v.plan(); p.cur != 300 {
		t.Fatalf("after a burst: %+v, want 300", p)
	}
}

func TestSharePlanSetsTheNextWindow(t *testing.T) {
	// Mid-window, all three asked for 600 in 500 ms (1.2 per ms; the window before,
	// 1800 × 0.5 + 600 = 1500 in the last second: 1.5 per ms, faster): the next window's
	// need is 1.5 × 1000 × 1.25 = 1875, over the limit, for each. 900 over three: 300.
	busy := shareNode{count: 300, demand: 600, prevDemand: 1800, claim: 300, claimed: true, capped: true, at: 480, grewAt: 480}
	v := view(500, shareNode{count: 300, demand: 600, prevDemand: 1800, claim: 300, claimed: true, capped: true, grewAt: 500}, busy, busy)
	p := v.plan()
	if !p.curCapped || p.cur != 300 || !p.nextCapped || p.next != 300 {
		t.Fatalf("%+v, want 300 now and next", p)
	}
	// A node that asked for nothing in the window before and 30 in the first 480 ms of
	// this one (0.0625 per ms) needs 0.0625 × 1000 × 1.25 = 79 (rounded up) in the next:
	// it gets that, and the two busy ones share the rest, 821: 410 and 411, the odd one
	// to the first name ("a#0" is before "s#0"), so this node gets 410.
	low := shareNode{count: 30, demand: 30, claim: 30, claimed: true, capped: true, at: 480, grewAt: 480}
	v = view(500, v.self, busy, low)
	if p := v.plan(); p.next != 410 {
		t.Fatalf("next window beside a node that asks for little: %+v, want 410", p)
	}
}

func TestSharePlanReleasesAndTakes(t *testing.T) {
	// Mid-window (500 ms): this node and a are busy (demand still growing), each
	// holding 300 of 900 and wanting more; b counted 100 and has asked for nothing
	// since 200 ms. b's view: it needs only its count, keeps 100 and gives back 200.
	// The others hold 300 each: 900 − 100 − 300 − 300 = 200 is left, which the two busy
	// ones need; b gets none of it, and sends its bound at once (it fell by 200 ≥
	// 900 / 16).
	busy := shareNode{count: 300, demand: 700, prevDemand: 1800, claim: 300, claimed: true, capped: true, at: 450, grewAt: 450}
	quiet := shareNode{count: 100, demand: 100, prevDemand: 1800, claim: 300, claimed: true, capped: true, grewAt: 200}
	v := view(500, quiet, busy, busy)
	v.peers[1].name = "c#0"
	p := v.plan()
	if p.cur != 100 || !p.send {
		t.Fatalf("the quiet node: %+v, want a bound of 100, sent", p)
	}
	// Once b's 100 is known, this node (busy) takes its part of the 200 freed: half,
	// 100, and sends its bound (it rose while it has demand).
	self := shareNode{count: 300, demand: 600, prevDemand: 1800, claim: 300, claimed: true, capped: true, grewAt: 500}
	b := quiet
	b.claim = 100
	v = view(500, self, busy, b)
	if p := v.plan(); p.cur != 400 || !p.send {
		t.Fatalf("the busy node after the release: %+v, want 400, sent", p)
	}
	// Before it is known, nothing: b's 300 is still set aside.
	v = view(500, self, busy, quiet)
	if p := v.plan(); p.cur != 300 || p.send {
		t.Fatalf("the busy node before the release is known: %+v, want 300, not sent", p)
	}
}

func TestSharePlanServesAnUnboundNodeFirst(t *testing.T) {
	// a is alone with demand as far as it knows, so not bound: it counted 400 by
	// 400 ms, 1 per ms, and is projected to need 400 + 1 × 600 × 1.25 = 1150, more
	// than the 500 left. This node, without demand, gets nothing: a may count all of it.
	lone := shareNode{count: 400, demand: 400, claimed: true, at: 400, grewAt: 400}
	v := view(400, shareNode{}, lone, shareNode{})
	if p := v.plan(); !p.curCapped || p.cur != 0 {
		t.Fatalf("beside a busy node that is not bound: %+v, want 0", p)
	}
	// A slow one (40 by 400 ms: 0.1 per ms, 40 + 75 = 115): what it does not need,
	// 900 − 40 − 75 = 785, is split over the three members as headroom: 261.
	slow := shareNode{count: 40, demand: 40, claimed: true, at: 400, grewAt: 400}
	v = view(400, shareNode{}, slow, shareNode{})
	if p := v.plan(); p.cur != 261 {
		t.Fatalf("beside a slow node that is not bound: %+v, want 261", p)
	}
}

func TestSharePlanDeadMemberKeepsOnlyItsCount(t *testing.T) {
	// b left after counting 200 with a bound of 300: its 200 stays in the total, its
	// bound does not. This node and a are busy, each counted 250 of a bound of 300 and
	// needs more: each keeps its 300, and they share what is left, 900 − 200 − 300 −
	// 300 = 100: 350.
	busy := shareNode{count: 250, demand: 900, prevDemand: 1800, claim: 300, claimed: true, capped: true, at: 450, grewAt: 450}
	gone := shareNode{count: 200, demand: 200, prevDemand: 1800, claim: 300, claimed: true, capped: true, at: 300, grewAt: 300}
	v := view(500, shareNode{count: 250, demand: 900, prevDemand: 1800, claim: 300, claimed: true, capped: true, grewAt: 500}, busy, gone)
	v.peers[1].live = false
	v.members = 2
	if p := v.plan(); p.cur != 350 {
		t.Fatalf("%+v, want 350", p)
	}
}

// TestPlanAgainAtEveryTickOnlyWhereGrantsDivide: a key the grants divide is planned
// again at every tick while its next window is bound (an idle node's bound must fall
// in time); one above the grants' largest limit only when something is heard or counted.
func TestPlanAgainAtEveryTickOnlyWhereGrantsDivide(t *testing.T) {
	lim := limiter.New(limiter.Options{Replicated: true})
	r := newReplicator(lim, "a#1", true)
	size := time.Hour.Milliseconds()
	now := lim.NowMS()
	end := windowEnd(now, size)
	env := shareEnv{now: now, intervalMS: 100, live: func(n string) bool { return n == "b" }, members: 2,
		grants: true, grantMax: 100, names: []string{"a", "b"}, self: "a"}
	for _, c := range []struct {
		id      string
		limit   uint32
		recheck bool
	}{{"192.0.2.10", 10, true}, {"192.0.2.11", 1000, false}} {
		k := limiter.Key{Bucket: lim.Bucket("token_create"), ID: c.id}
		if !lim.Check(k, 1, limiter.Limit{Count: c.limit, Window: time.Hour}).Allowed {
			t.Fatalf("limit %d: first check refused", c.limit)
		}
		r.slots.merge("b#1", value{bucket: "token_create", id: c.id, sizeMS: size, endMS: end, count: 2, share: true, limit: c.limit}, now, now)
		touched := r.slots.tick(now)
		if _, ok := touched[k]; !ok {
			t.Fatalf("limit %d: the merged key is not planned", c.limit)
		}
		r.slots.shareTick(map[limiter.Key]struct{}{k: {}}, nil, env)
		if _, ok := lim.CapIn(k, size, end+size); !ok {
			t.Fatalf("limit %d: the next window is not bound", c.limit)
		}
		_, again := r.slots.tick(now + 100)[k]
		if again != c.recheck {
			t.Errorf("limit %d: planned again at the next tick with nothing heard: %v, want %v", c.limit, again, c.recheck)
		}
	}
}
