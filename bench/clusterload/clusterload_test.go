package clusterload

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/sidecar/routes"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestWindowOf(t *testing.T) {
	for _, c := range []struct{ ms, w, want int64 }{
		{0, 1000, 0}, {999, 1000, 0}, {1000, 1000, 1}, {1001, 1000, 1}, {1_764_000_000_999, 1000, 1_764_000_000},
		{249, 250, 0}, {250, 250, 1}, {-1, 1000, -1}, {-1000, 1000, -1}, {-1001, 1000, -2},
	} {
		if got := WindowOf(c.ms, c.w); got != c.want {
			t.Errorf("WindowOf(%d, %d) = %d, want %d", c.ms, c.w, got, c.want)
		}
	}
}

func TestFullWindows(t *testing.T) {
	for _, c := range []struct{ from, to, first, end int64 }{
		{1500, 5000, 2, 5}, // [1500, 2000) is partial; 2, 3, 4 are whole
		{1000, 5000, 1, 5}, // starting on a boundary: window 1 is whole
		{1001, 4999, 2, 4}, // window 4 ends at 5000, after the load
		{1999, 2000, 2, 2}, // nothing whole
		{1200, 1800, 2, 2}, // inside one window: nothing whole, and end is not before first
	} {
		first, end := FullWindows(c.from, c.to, 1000)
		if first != c.first || end != c.end {
			t.Errorf("FullWindows(%d, %d) = %d, %d; want %d, %d", c.from, c.to, first, end, c.first, c.end)
		}
	}
}

func TestTally(t *testing.T) {
	ms := int64(time.Millisecond)
	sends := []Send{
		{AtNS: 1999*ms + 999_999, Node: 0, Outcome: Allowed},                        // window 1, its last nanosecond: before the range
		{AtNS: 2000 * ms, Node: 0, Outcome: Allowed},                                // window 2, its first nanosecond
		{AtNS: 2500 * ms, DoneNS: 3001 * ms, Node: 1, Outcome: Allowed, Late: true}, // answered after the end: straddled
		{AtNS: 2600 * ms, DoneNS: 2999 * ms, Node: 2, Outcome: RateLimited},
		{AtNS: 2999 * ms, DoneNS: 3010 * ms, Node: 1, Outcome: Other}, // sent within the margin of the end
		{AtNS: 3000 * ms, Node: 1, Outcome: Allowed},                  // window 3
		{AtNS: 3100 * ms, Node: 9, Outcome: Allowed},                  // a node out of range counts in the total only
		{AtNS: 5000 * ms, Node: 0, Outcome: Allowed},                  // window 5: after the range
		{AtNS: 4500 * ms, Node: 0, Outcome: Pending},                  // window 4: unanswered counts as an error
	}
	ws := Tally(sends, 1000, 2, 5, 3)
	if len(ws) != 3 {
		t.Fatalf("%d windows, want 3 (2, 3, 4)", len(ws))
	}
	// The last check of each window, from its start.
	for i, want := range []int64{999 * ms, 100 * ms, 500 * ms} {
		if ws[i].LastNS != want {
			t.Errorf("window %d: last check %v after its start, want %v", i, time.Duration(ws[i].LastNS), time.Duration(want))
		}
	}
	want := []Window{
		{Index: 2, Sent: 4, Allowed: 2, Limited: 1, Err: 1, Late: 1, Straddled: 1, AllowedByNode: []int{1, 1, 0}},
		{Index: 3, Sent: 2, Allowed: 2, AllowedByNode: []int{0, 1, 0}},
		{Index: 4, Sent: 1, Err: 1, AllowedByNode: []int{0, 0, 0}},
	}
	for i, w := range want {
		g := ws[i]
		if g.Index != w.Index || g.Sent != w.Sent || g.Allowed != w.Allowed || g.Limited != w.Limited || g.Err != w.Err || g.Late != w.Late || g.Straddled != w.Straddled || !slices.Equal(g.AllowedByNode, w.AllowedByNode) {
			t.Errorf("window %d = %+v, want %+v", i, g, w)
		}
	}
	if Tally(sends, 1000, 3, 3, 3) != nil {
		t.Error("an empty range should give no windows")
	}
}

func TestAllowedStats(t *testing.T) {
	ws := []Window{{Allowed: 1000}, {Allowed: 1200}, {Allowed: 900}, {Allowed: 1100}}
	s := AllowedStats(ws, 1000)
	if s.Windows != 4 || !near(s.Mean, 1.05) || !near(s.Max, 1.2) || !near(s.Min, 0.9) {
		t.Errorf("AllowedStats = %+v, want 4 windows, mean 1.05, max 1.2, min 0.9", s)
	}
	if s := AllowedStats(nil, 1000); s != (Stats{}) {
		t.Errorf("no windows: %+v", s)
	}
	// Disturbed windows are left out.
	ws[1].Disturbed, ws[2].Disturbed = true, true
	if s := AllowedStats(ws, 1000); s.Windows != 2 || !near(s.Mean, 1.05) || !near(s.Max, 1.1) || !near(s.Min, 1) {
		t.Errorf("without the disturbed windows: %+v, want 2 windows, mean 1.05, max 1.1, min 1", s)
	}
	for i := range ws {
		ws[i].Disturbed = true
	}
	if s := AllowedStats(ws, 1000); s != (Stats{}) {
		t.Errorf("all disturbed: %+v", s)
	}
}

func TestMarkDisturbed(t *testing.T) {
	ws := []Window{
		{Sent: 3000},               // as planned
		{Sent: 3050, Late: 30},     // 1.7% more, 1% late: within both bounds
		{Sent: 3000, Late: 31},     // over 1% late
		{Sent: 2900},               // 3.3% fewer
		{Sent: 3100},               // 3.3% more (a catch-up burst)
		{Sent: 0, Disturbed: true}, // nothing sent: marked again
	}
	if n := MarkDisturbed(ws, 3000, false); n != 4 {
		t.Errorf("%d disturbed, want 4", n)
	}
	for i, want := range []bool{false, false, true, true, true, true} {
		if ws[i].Disturbed != want {
			t.Errorf("window %d: disturbed %v, want %v", i, ws[i].Disturbed, want)
		}
	}
	ws[2].Late = 0
	if n := MarkDisturbed(ws, 3000, false); n != 3 || ws[2].Disturbed {
		t.Errorf("marking again: %d disturbed, window 2 %v", n, ws[2].Disturbed)
	}
	// A check answered after its window ended disturbs its window and the next.
	straddled := []Window{{Sent: 3000}, {Sent: 3000, Straddled: 1}, {Sent: 3000}, {Sent: 3000}}
	if n := MarkDisturbed(straddled, 3000, true); n != 2 || straddled[0].Disturbed || !straddled[1].Disturbed || !straddled[2].Disturbed || straddled[3].Disturbed {
		t.Errorf("a straddled window: %d disturbed, want it and the next: %+v", n, straddled)
	}
	// A burst goes out as fast as it can: late checks do not disturb it, a wrong count does.
	ws[2].Late = 3000
	if n := MarkDisturbed(ws, 3000, true); n != 3 || ws[2].Disturbed || !ws[3].Disturbed {
		t.Errorf("a burst: %d disturbed, window 2 %v, window 3 %v", n, ws[2].Disturbed, ws[3].Disturbed)
	}
}

func TestUsable(t *testing.T) {
	r := Result{Nodes: 3, Members: 3, Allowed: Stats{Windows: 3}}
	if !r.usable(5) {
		t.Error("3 of 5 windows, all members: usable")
	}
	r.Allowed.Windows = 2
	if r.usable(5) {
		t.Error("2 of 5 windows kept: not usable")
	}
	r.Allowed.Windows, r.Members = 5, 2
	if r.usable(5) {
		t.Error("a node lost sight of another: not usable")
	}
	r.Members, r.OtherLoad = 3, 0.5
	if r.usable(5) {
		t.Error("half a CPU busy elsewhere: not usable")
	}
	r.OtherLoad = -1
	if !r.usable(5) {
		t.Error("other load unknown: usable")
	}
}

// TestKeptOf: when no attempt was usable, the windows kept by those during which every
// node saw the others are pooled; an attempt during which one lost sight of another is
// left out, and with only one attempt left the last is kept as it is.
func TestKeptOf(t *testing.T) {
	const limit = 100
	attempt := func(members, retries int, allowed ...int) Result {
		r := Result{Nodes: 3, Members: members, Retries: retries}
		for i, a := range allowed {
			r.Windows = append(r.Windows, Window{Index: int64(10*retries + i), Allowed: a, Disturbed: a == 0})
		}
		r.Allowed = AllowedStats(r.Windows, limit)
		return r
	}
	got := keptOf([]Result{attempt(3, 0, 0, 101, 0), attempt(2, 1, 150, 150, 150), attempt(3, 2, 0, 0, 103)}, limit)
	if got.Allowed.Windows != 2 || !near(got.Allowed.Max, 1.03) || !near(got.Allowed.Min, 1.01) || got.Retries != 2 {
		t.Errorf("pooled: %+v, retries %d; want 2 windows, max 1.03, min 1.01 (the attempt without every member left out), retries 2", got.Allowed, got.Retries)
	}
	got = keptOf([]Result{attempt(2, 0, 150, 150), attempt(3, 1, 0, 102)}, limit)
	if got.Allowed.Windows != 1 || !near(got.Allowed.Max, 1.02) || got.Retries != 1 {
		t.Errorf("one attempt with every member: %+v, retries %d; want the last as it is", got.Allowed, got.Retries)
	}
}

func TestCPULoad(t *testing.T) {
	t0 := time.Unix(100, 0)
	a := cpuSample{at: t0, self: time.Second, machine: 10 * time.Second, nodes: []time.Duration{time.Second, 2 * time.Second}, ok: true}
	// Over 2 s: this process used 0.4 s, the nodes 0.6 s and 0.2 s, the machine 1.5 s.
	b := cpuSample{at: t0.Add(2 * time.Second), self: 1400 * time.Millisecond, machine: 11500 * time.Millisecond,
		nodes: []time.Duration{1600 * time.Millisecond, 2200 * time.Millisecond}, ok: true}
	perNode, other, ok := cpuLoad(a, b)
	if !ok || !near(perNode, 0.2) || !near(other, 0.15) {
		t.Errorf("cpuLoad = %g per node, %g other, %v; want 0.2, 0.15", perNode, other, ok)
	}
	b.machine = 11 * time.Second // less than our own use (tick rounding): no negative load
	if _, other, _ := cpuLoad(a, b); other != 0 {
		t.Errorf("other load %g, want 0", other)
	}
	b.ok = false
	if _, _, ok := cpuLoad(a, b); ok {
		t.Error("an incomplete sample")
	}
}

func TestSteadyModel(t *testing.T) {
	for _, c := range []struct {
		n                 int
		offered, syncMS   float64
		wantMax, wantMean float64
	}{
		{3, 3, 100, 1.2, 1.1}, // (3−1) × 3 × 100 / (3 × 1000) = 0.2
		{3, 3, 500, 2.0, 1.5}, // 1.0 over
		{5, 3, 250, 1.6, 1.3}, // 4 × 3 × 250 / 5000 = 0.6
		{5, 3, 10, 1.024, 1.012},
		{1, 3, 500, 1, 1},       // alone: exactly L
		{3, 3, 2000, 3, 3},      // no more than offered (and N)
		{3, 3, 1000, 3, 2},      // a report a whole window old: each node allows L
		{5, 2, 5000, 2, 2},      // capped by offered
		{3, 0.5, 100, 0.5, 0.5}, // under the limit: all of it
	} {
		if got := SteadyMax(c.n, c.offered, c.syncMS, 1000); !near(got, c.wantMax) {
			t.Errorf("SteadyMax(%d, %g, %g) = %g, want %g", c.n, c.offered, c.syncMS, got, c.wantMax)
		}
		if got := SteadyMean(c.n, c.offered, c.syncMS, 1000); !near(got, c.wantMean) {
			t.Errorf("SteadyMean(%d, %g, %g) = %g, want %g", c.n, c.offered, c.syncMS, got, c.wantMean)
		}
	}
	if BurstMax(3, 3) != 3 || BurstMax(5, 3) != 3 || BurstMax(3, 10) != 3 {
		t.Error("BurstMax: min(N, offered)")
	}
	if !near(SyncMessages(3, 100), 20) || !near(SyncMessages(5, 25), 160) || SyncMessages(1, 100) != 0 {
		t.Error("SyncMessages: (N − 1) × 1000 / I")
	}
}

func TestSteadyInterval(t *testing.T) {
	// 0.1 × 3 × 1000 / (2 × 3) = 50 ms; 0.1 × 5 × 1000 / (4 × 3) ≈ 41.7 ms.
	if got := SteadyInterval(3, 3, 1000, 1.1); !near(got, 50) {
		t.Errorf("SteadyInterval(3, 3) = %g, want 50", got)
	}
	if got := SteadyInterval(5, 3, 1000, 1.1); math.Abs(got-41.667) > 0.001 {
		t.Errorf("SteadyInterval(5, 3) = %g, want 41.667", got)
	}
	// The model at that interval is at the aim.
	if got := SteadyMax(5, 3, SteadyInterval(5, 3, 1000, 1.1), 1000); !near(got, 1.1) {
		t.Errorf("SteadyMax at SteadyInterval = %g, want 1.1", got)
	}
	if !math.IsInf(SteadyInterval(1, 3, 1000, 1.1), 1) || !math.IsInf(SteadyInterval(3, 1.05, 1000, 1.1), 1) {
		t.Error("no interval goes over for one node or an offered load within the aim")
	}
}

func TestShareHolds(t *testing.T) {
	for _, c := range []struct {
		syncMS float64
		want   bool
	}{{10, true}, {100, true}, {500, true}, {501, false}, {1000, false}, {0, false}} {
		if got := ShareHolds(c.syncMS, 1000); got != c.want {
			t.Errorf("ShareHolds(%g, 1000) = %v, want %v", c.syncMS, got, c.want)
		}
	}
}

func TestBurstSchedule(t *testing.T) {
	// 3× a limit of 100 per 1 s window over 3 senders: 300 checks at each window's
	// start, 100 each; the load starts 100 ms before a window and lasts 2.5 s: the
	// windows starting at 0.1 s and 1.1 s into it; 2.1 s too.
	start := time.UnixMilli(1_700_000_000_900)
	for s := range 3 {
		p := burstSchedule(300, s, 3, start, 2500*time.Millisecond, 1000)
		if len(p) != 300 || p[0] != 100*time.Millisecond || p[99] != 100*time.Millisecond || p[100] != 1100*time.Millisecond || p[299] != 2100*time.Millisecond {
			t.Fatalf("sender %d: %d checks, %v %v %v %v", s, len(p), p[0], p[99], p[100], p[299])
		}
	}
	// 10 over 3: 4, 3, 3.
	for s, want := range []int{4, 3, 3} {
		if got := len(burstSchedule(10, s, 3, start, time.Second, 1000)); got != want {
			t.Errorf("sender %d of a burst of 10: %d checks, want %d", s, got, want)
		}
	}
	if burstSchedule(0, 0, 1, start, time.Second, 1000) != nil {
		t.Error("no rate: no checks")
	}
}

func TestSendStats(t *testing.T) {
	ms := int64(time.Millisecond)
	ws := []Window{{Sent: 300, LastNS: 20 * ms}, {Sent: 300, LastNS: 5 * ms}, {Sent: 290, LastNS: 40 * ms}}
	rate, median, longest := sendStats(ws, 1000)
	if !near(rate, 890.0/3) || median != 20*time.Millisecond || longest != 40*time.Millisecond {
		t.Errorf("sendStats = %g, %v, %v", rate, median, longest)
	}
	if r, m, l := sendStats(nil, 1000); r != 0 || m != 0 || l != 0 {
		t.Error("no windows")
	}
}

func TestValuesPerFlush(t *testing.T) {
	for _, c := range []struct {
		k       int
		c, want float64
	}{{1, 100, 1}, {10, 100, 10}, {100, 100, 100}, {150, 100, 150}, {1000, 100, 200}, {1000, 0.5, 2}, {0, 5, 0}} {
		if got := ValuesPerFlush(c.k, c.c); !near(got, c.want) {
			t.Errorf("ValuesPerFlush(%d, %g) = %g, want %g", c.k, c.c, got, c.want)
		}
	}
}

func TestTrafficOf(t *testing.T) {
	s := int64(time.Second)
	before := []Scrape{
		{AtNS: 10 * s, Metrics: map[string]float64{mMsgsSent: 100, mBytesSent: 6000, mKeysSum: 10, mKeysCount: 10}},
		{AtNS: 10 * s, Metrics: map[string]float64{}}, // a node that had sent nothing: no samples yet
	}
	after := []Scrape{
		{AtNS: 15 * s, Metrics: map[string]float64{mMsgsSent: 200, mBytesSent: 12000, mMsgsRecv: 50, mKeysSum: 110, mKeysCount: 60,
			mCaps: 25, mLagSum: 0.05, mLagCount: 100, mStale: 2}},
		{AtNS: 20 * s, Metrics: map[string]float64{mMsgsSent: 300, mBytesSent: 18000, mKeysSum: 300, mKeysCount: 100, mSendErrors: 1}},
	}
	tr := TrafficOf(before, after)
	// Node 0: 20 msg/s, 1200 B/s over 5 s; node 1: 30 msg/s, 1800 B/s over 10 s.
	if !near(tr.MsgsSent, 25) || !near(tr.BytesSent, 1500) || !near(tr.MsgsRecv, 5) || !near(tr.Seconds, 7.5) {
		t.Errorf("TrafficOf = %+v; want 25 msg/s, 1500 B/s, 5 received msg/s per node over 7.5 s", tr)
	}
	// Keys per flush over both: (100 + 300) / (50 + 100).
	if !near(tr.KeysPerFlush, 400.0/150) || !near(tr.Flushes, (10+10)/2.0) {
		t.Errorf("KeysPerFlush %g, Flushes %g; want %g, 10", tr.KeysPerFlush, tr.Flushes, 400.0/150)
	}
	if !near(tr.Caps, 2.5) || !near(tr.MergeLagMS, 0.5) || tr.Stale != 2 || tr.SendErrors != 1 {
		t.Errorf("caps %g/s, lag %gms, stale %g, send errors %g; want 2.5, 0.5, 2, 1", tr.Caps, tr.MergeLagMS, tr.Stale, tr.SendErrors)
	}
	if (TrafficOf(nil, nil) != Traffic{}) {
		t.Error("no scrapes: zero traffic")
	}
}

func TestMerge(t *testing.T) {
	a := Result{Scenario: "grid", Nodes: 3, SyncMS: 100, Share: true, Windows: []Window{{Allowed: 1000}, {Allowed: 1000}, {Allowed: 5, Disturbed: true}},
		Traffic: Traffic{MsgsSent: 20, BytesSent: 1000, Stale: 1}, Sent: 100, Late: 1, MaxLate: time.Millisecond, Discarded: 1, Members: 3,
		NodeCPU: 0.1, OtherLoad: 0.05}
	a.Allowed = AllowedStats(a.Windows, 1000)
	b := Result{Scenario: "grid", Nodes: 3, SyncMS: 100, Share: true, Windows: []Window{{Allowed: 1200}, {Allowed: 1200}},
		Traffic: Traffic{MsgsSent: 22, BytesSent: 1200, Stale: 2}, Sent: 110, Errors: 2, MaxLate: 3 * time.Millisecond, FirstErr: "boom", Retries: 1, Members: 2,
		NodeCPU: 0.2, OtherLoad: -1}
	b.Allowed = AllowedStats(b.Windows, 1000)
	m := Merge([]Result{a, b}, 1000)
	if m.Nodes != 3 || m.SyncMS != 100 || !m.Share || len(m.Windows) != 5 || m.Allowed.Windows != 4 || len(m.Starts) != 2 {
		t.Fatalf("Merge kept %+v", m)
	}
	if !near(m.Allowed.Mean, 1.1) || !near(m.Allowed.Max, 1.2) || !near(m.Starts[0].Mean, 1) || !near(m.Starts[1].Mean, 1.2) {
		t.Errorf("pooled stats %+v, starts %+v", m.Allowed, m.Starts)
	}
	if !near(m.NodeCPU, 0.15) || m.OtherLoad != 0.05 {
		t.Errorf("CPU %g, other load %g; want the mean 0.15 and the worst known 0.05", m.NodeCPU, m.OtherLoad)
	}
	if !near(m.Traffic.MsgsSent, 21) || !near(m.Traffic.BytesSent, 1100) || m.Traffic.Stale != 3 {
		t.Errorf("traffic %+v: want the mean rates and the summed totals", m.Traffic)
	}
	if m.Sent != 210 || m.Late != 1 || m.Errors != 2 || m.MaxLate != 3*time.Millisecond || m.FirstErr != "boom" || m.Discarded != 1 || m.Retries != 1 || m.Members != 2 {
		t.Errorf("counts %d %d %d %v %q %d %d %d", m.Sent, m.Late, m.Errors, m.MaxLate, m.FirstErr, m.Discarded, m.Retries, m.Members)
	}
	if one := Merge([]Result{a}, 1000); one.Allowed != a.Allowed || len(one.Starts) != 1 {
		t.Errorf("one start: %+v", one)
	}
}

func TestSchedule(t *testing.T) {
	// 3000/s over 3 senders for one second: 1000 each, together every 1/3 ms.
	var all []time.Duration
	for s := range 3 {
		p := schedule(3000, s, 3, time.Second)
		if len(p) != 1000 {
			t.Fatalf("sender %d: %d checks, want 1000", s, len(p))
		}
		if p[0] != time.Duration(s)*time.Second/3000 {
			t.Errorf("sender %d starts at %v", s, p[0])
		}
		all = append(all, p...)
	}
	slices.Sort(all)
	for i := 1; i < len(all); i++ {
		if d := all[i] - all[i-1]; d < 333*time.Microsecond || d > 334*time.Microsecond {
			t.Fatalf("checks %d and %d are %v apart, want 1/3 ms", i-1, i, d)
		}
	}
	if all[len(all)-1] >= time.Second {
		t.Error("a check past the end")
	}
	if schedule(0, 0, 1, time.Second) != nil || len(schedule(10, 0, 1, 0)) != 0 {
		t.Error("no rate or no time: no checks")
	}
}

// TestCheckRequest checks that the load's requests are counted per client IP in the
// token_create bucket by the sidecar's own route table and address rules.
func TestCheckRequest(t *testing.T) {
	table, err := routes.New(routes.BuiltIn())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range 1000 {
		ip := clientIP(i)
		if seen[ip] {
			t.Fatalf("client IP %s twice", ip)
		}
		seen[ip] = true
		if i > 3 && i%97 != 0 {
			continue
		}
		b, err := checkRequest(ip, i)
		if err != nil {
			t.Fatal(err)
		}
		var req authv3.CheckRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Fatal(err)
		}
		h := req.GetAttributes().GetRequest().GetHttp()
		route, _, ok := table.Match(h.GetMethod(), h.GetPath())
		if !ok || route.Core || len(route.Steps) != 1 || route.Steps[0].Bucket != buckets.TokenCreate || route.Steps[0].From != routes.FromIP {
			t.Fatalf("%s %s: route %+v, want the token_create IP route", h.GetMethod(), h.GetPath(), route)
		}
		src := req.GetAttributes().GetSource().GetAddress().GetSocketAddress().GetAddress()
		got, ok := (&clientip.Resolver{}).Resolve(src, h.GetHeaders()["x-forwarded-for"])
		if !ok || got.String() != ip {
			t.Errorf("request %d resolves to %v, want %s", i, got, ip)
		}
	}
	if loadBucket != buckets.TokenCreate {
		t.Error("loadBucket names another bucket")
	}
}

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if d := c.Estimate(); d > 20*time.Minute {
		t.Errorf("the default run would take about %v, more than 20 minutes", d)
	}
	grid, scen, sweep := c.Runs()
	// N=1 once per interval and mode; N=3 and N=5 -repeat times; the share-mode scenario
	// once per mode and repeat.
	if want := 6*2 + 2*3*6*2; grid != want || scen != 2+len(c.Keys) || sweep != 2*3 {
		t.Errorf("Runs = %d, %d, %d; want %d, %d, 6", grid, scen, sweep, want, 2+len(c.Keys))
	}
	c.Loads, c.Burst = nil, 0
	if _, _, sweep := c.Runs(); sweep != 0 {
		t.Errorf("no loads and no burst: %d starts for the share-mode scenario", sweep)
	}
	for name, f := range map[string]func(*Config){
		"n":         func(c *Config) { c.Nodes = []int{0} },
		"no n":      func(c *Config) { c.Nodes = nil },
		"interval":  func(c *Config) { c.Intervals = []int{0} },
		"modes":     func(c *Config) { c.Modes = nil },
		"limit":     func(c *Config) { c.Limit = 0 },
		"window":    func(c *Config) { c.Window = 1500 * time.Microsecond },
		"offered":   func(c *Config) { c.Offered = 0 },
		"rate":      func(c *Config) { c.Limit, c.Offered = 100_000, 3 },
		"load rate": func(c *Config) { c.Limit, c.Loads = 10_000, []float64{3} },
		"loads":     func(c *Config) { c.Loads = []float64{0} },
		"burst":     func(c *Config) { c.Burst = -1 },
		"windows":   func(c *Config) { c.Windows = 0 },
		"repeat":    func(c *Config) { c.Repeat = 0 },
		"keys":      func(c *Config) { c.Keys = []int{0} },
		"too long":  func(c *Config) { c.Windows, c.Repeat = 100, 20 },
		"traffic":   func(c *Config) { c.TrafficSyncMS = 0 },
		"no binary": func(c *Config) { c.Sidecar = "" },
	} {
		c := DefaultConfig()
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", name)
		}
	}
}

func TestFlags(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-n", "2,4", "-modes", "on", "-intervals", "5, 50", "-quick", "-windows", "4", "-burst", "2.5"}); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.ApplyQuick(set)
	// Given flags win over the preset; the others take it.
	if !slices.Equal(c.Nodes, []int{2, 4}) || !slices.Equal(c.Modes, []bool{true}) || !slices.Equal(c.Intervals, []int{5, 50}) || c.Windows != 4 {
		t.Errorf("given flags: %+v", c)
	}
	if c.Repeat != 1 || c.Out != "" || c.Plot != "" || !slices.Equal(c.Keys, []int{1, 1000}) || !slices.Equal(c.Loads, []float64{1.5, 10}) || c.Burst != 2.5 {
		t.Errorf("preset: repeat %d, out %q, plot %q, keys %v, loads %v, burst %g", c.Repeat, c.Out, c.Plot, c.Keys, c.Loads, c.Burst)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	bad := DefaultConfig()
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	bad.RegisterFlags(fs)
	for _, args := range [][]string{{"-n", "3,x"}, {"-modes", "maybe"}, {"-loads", "1.5,lots"}} {
		if err := fs.Parse(args); err == nil {
			t.Errorf("%v: parsed", args)
		}
	}
	if s := (*modeList)(&[]bool{false, true}).String(); s != "off,on" {
		t.Errorf("modes print as %q", s)
	}
	if s := (*floatList)(&[]float64{1.5, 3, 10}).String(); s != "1.5,3,10" {
		t.Errorf("loads print as %q", s)
	}
}

// sampleReport is a report as a run of two cluster sizes would give.
func sampleReport() *Report {
	cfg := DefaultConfig()
	cfg.Nodes, cfg.Intervals, cfg.Repeat, cfg.Limit = []int{1, 3}, []int{25, 100, 500}, 2, 1000
	cfg.Out, cfg.Plot = "bench/results/x.md", "bench/results/x.png"
	cfg.Args = []string{"-n", "1,3", "-intervals", "25,100,500", "-repeat", "2"}
	r := &Report{Config: cfg, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Elapsed: 9 * time.Minute}
	r.CPU, r.NProc, r.GoVersion = "Test CPU", 2, "go version go1.26.8 linux/amd64"
	for _, n := range cfg.Nodes {
		for _, ms := range cfg.Intervals {
			for _, share := range cfg.Modes {
				g := Result{Scenario: "grid", Nodes: n, SyncMS: ms, Share: share, Offered: 3, Keys: 1, Senders: n,
					TheoryMean: SteadyMean(n, 3, float64(ms), 1000), TheoryMax: SteadyMax(n, 3, float64(ms), 1000)}
				a := g.TheoryMean * 1000
				if share && ShareHolds(float64(ms), 1000) {
					a = 1000
				}
				g.Windows = []Window{{Allowed: int(a)}, {Allowed: int(a)}}
				g.Allowed = AllowedStats(g.Windows, 1000)
				g.Starts = []Stats{g.Allowed}
				if n > 1 {
					g.Traffic = Traffic{MsgsSent: SyncMessages(n, float64(ms)), BytesSent: 62 * SyncMessages(n, float64(ms)), Flushes: 1000 / float64(ms), KeysPerFlush: 1}
				}
				r.Grid = append(r.Grid, g)
			}
		}
	}
	// The share-mode scenario: the default loads and the burst, both modes; share mode
	// holds L but one window of the 10× load at 1.004 L.
	for i, o := range append(slices.Clone(cfg.Loads), cfg.Burst) {
		burst := i == len(cfg.Loads)
		for _, share := range cfg.Modes {
			l := Result{Scenario: "load", Nodes: 3, SyncMS: 100, Share: share, Offered: o, Burst: burst, Keys: 1, Senders: 3,
				TheoryMax: SteadyMax(3, o, 100, 1000), SentRate: o * 1000, Late: 2}
			if burst {
				l.Scenario, l.TheoryMax, l.SpanMedian, l.SpanMax, l.Late = "burst", BurstMax(3, o), 12*time.Millisecond, 31*time.Millisecond, 0
			}
			a := int(l.TheoryMax * 1000)
			if share {
				a = 1000
			}
			l.Windows = []Window{{Allowed: a}, {Allowed: a}}
			if share && o == 10 {
				l.Windows[1].Allowed = 1004
			}
			l.Allowed = AllowedStats(l.Windows, 1000)
			l.Starts = []Stats{l.Allowed}
			r.Loads = append(r.Loads, l)
		}
	}
	r.Single = Result{Scenario: "single", Nodes: 3, SyncMS: 100, Share: true, Offered: 3, Keys: 1, Senders: 1,
		Windows: []Window{{Sent: 3000, Allowed: 1000, AllowedByNode: []int{1000, 0, 0}}}}
	r.Single.Allowed = AllowedStats(r.Single.Windows, 1000)
	for _, k := range []int{1, 1000} {
		r.Keys = append(r.Keys, Result{Scenario: "keys", Nodes: 3, SyncMS: 100, Share: true, Offered: 3, Keys: k, Senders: 3,
			Traffic: Traffic{MsgsSent: 20 * float64(k), BytesSent: 31 * 200 * 20, Flushes: 10, KeysPerFlush: min(float64(k), 200)}})
	}
	r.AimPass, r.SinglePass = r.loadsPass(), r.Single.Allowed.Min >= AimSingleMin
	return r
}

func TestReport(t *testing.T) {
	r := sampleReport()
	if !r.AimPass {
		t.Fatal("the sample's share-mode loads are within the aim")
	}
	md := r.Markdown()
	for _, want := range []string{
		"| 3 nodes, sync 100 ms, share mode on, 1.5×, 3×, 8×, 10× L offered evenly, and 3× L sent at each window's start: at most 1.05× L allowed per window | max 1.004× L (10×; mean 1.002, min 1.000 there) over 10 windows of 5 loads",
		"| **PASS** |",
		"the share-mode load that allowed the most (10×) 1.000 1.004",
		"## Share mode at any offered load",
		"| 10× | off | 10000 | 10000 | 2 | — | 1.666 | **1.666** | 1.666 | 1.666 | 1.667 |", // the load's row: planned, sent, late, the model
		"| burst 3× | on | 3000 | 3000 | 0 | 12ms, 31ms | 1.000 | 1.000 | 1.000 | 1.000 | 3.000 |",
		"| 3 | 100 | off | 1.100 | **1.100** | 1.100 | 1.100 | 1.100 | 1.200 | 20.0 | 1240 | 0.000 | 0.0 | 2 | 0 |", // the model beside the measurement
		"| 3 | 100 | on | 1.000 | 1.000 | 1.000 | 1.000 | 1.100 | 1.200 |",
		"| 3 | 500 | off | 1.500 | **1.500** |",    // a max over the aim is bold
		"| 1000 | 3000 |",                          // traffic against keys
		"| 1 | 3000 | 1000 | 1.000 | [1000 0 0] |", // the single node's window
		"Test CPU, nproc 2",
		"./bin/bench cluster -n 1,3 -intervals 25,100,500 -repeat 2",
		"![max A/L against the offered load and the sync interval, and sync traffic](x.png)",
		"within the model's max in 3 of 3 configurations",
		"| 3 | off | 25 ms | 1.025 | 1.025 | 80.0 | 4960 | 25 ms |", // measured and modelled advice
		"one key fits in one message (62 bytes here",
		"| `-loads` | `1.5,3,8,10` |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the markdown lacks %q", want)
		}
	}
	var out bytes.Buffer
	r.WriteText(&out)
	for _, want := range []string{"— PASS\n", "aim: one node of 3 has all the traffic", "burst 3×"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the text lacks %q:\n%s", want, out.String())
		}
	}
	r.Loads[len(r.Loads)-1].Allowed.Max = 1.2 // the burst, share mode on, over the aim
	if r.loadsPass() {
		t.Error("a share-mode load over the aim passed")
	}
	r.AimPass = false
	out.Reset()
	r.WriteText(&out)
	if !strings.Contains(out.String(), "— FAIL\n") {
		t.Error("a missed aim should print FAIL")
	}
	if (&Report{}).loadsPass() {
		t.Error("no loads measured passed")
	}
}

func TestAdvice(t *testing.T) {
	r := sampleReport()
	// Without share mode the sample allows 1.025, 1.1 and 1.5 × L at 25, 100 and 500 ms:
	// 25 ms is the longest within 1.05. With it 1.0 at each: 500 ms.
	if g, ok := r.advice(3, false); !ok || g.SyncMS != 25 {
		t.Errorf("advice, share mode off: %d ms (%v), want 25 ms", g.SyncMS, ok)
	}
	if g, ok := r.advice(3, true); !ok || g.SyncMS != 500 {
		t.Errorf("advice, share mode on: %d ms (%v), want 500 ms", g.SyncMS, ok)
	}
	r.Grid[len(r.Grid)-1].Allowed.Max = 1.2 // 500 ms with share mode, now over the aim
	if g, ok := r.advice(3, true); !ok || g.SyncMS != 100 {
		t.Errorf("advice, share mode: %d ms (%v), want 100 ms", g.SyncMS, ok)
	}
	if _, ok := r.advice(7, true); ok {
		t.Error("advice for a size not measured")
	}
}

func TestWritePlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.png")
	if err := sampleReport().WritePlot(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) || len(b) < 10_000 {
		t.Errorf("not a PNG, or an empty one: %d bytes", len(b))
	}
	if ticks := (logTicks{}).Ticks(150, 12_000); len(ticks) != 6 || ticks[0].Label != "200" || ticks[5].Label != "10k" {
		t.Errorf("log ticks %v", ticks)
	}
	var labels []string
	for _, tk := range (linearTicks{}).Ticks(0.85, 2.1) {
		labels = append(labels, tk.Label)
	}
	if want := []string{"1", "1.2", "1.4", "1.6", "1.8", "2"}; !slices.Equal(labels, want) {
		t.Errorf("linear ticks %v, want %v", labels, want)
	}
}
