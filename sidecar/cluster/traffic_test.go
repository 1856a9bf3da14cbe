package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/traffic"
)

func TestTrafficMessagesRoundTripAndSplit(t *testing.T) {
	now := int64(1_800_000_000_000 + 30_000)
	cur := now / 60_000 * 60_000
	var entries []trafficEntry
	for b := range 12 {
		for m := range traffic.Minutes {
			entries = append(entries, trafficEntry{fmt.Sprintf("bucket_%02d", b), cur - int64(m)*60_000, uint64(m * 1_000_003), uint64(b)})
		}
	}
	msgs := packTraffic(now, "node-a#0011223344556677", entries, maxPacket)
	if len(msgs) < 2 {
		t.Fatalf("%d entries in %d messages", len(entries), len(msgs))
	}
	var got []trafficEntry
	for _, m := range msgs {
		if len(m) > maxPacket {
			t.Fatalf("a message of %d bytes, more than %d", len(m), maxPacket)
		}
		d, err := decodeTraffic(m)
		if err != nil || d.origin != "node-a#0011223344556677" || d.sentAt != now {
			t.Fatalf("decode: %+v, %v", d, err)
		}
		got = append(got, d.entries...)
	}
	if len(got) != len(entries) {
		t.Fatalf("%d entries arrived of %d", len(got), len(entries))
	}
	for i := range got {
		if got[i] != entries[i] {
			t.Fatalf("entry %d: %+v, want %+v", i, got[i], entries[i])
		}
	}
	// With nothing to report, one empty message tells the others the node is there.
	if empty := packTraffic(now, "a#1", nil, maxPacket); len(empty) != 1 {
		t.Fatalf("%d messages without entries", len(empty))
	} else if d, err := decodeTraffic(empty[0]); err != nil || d.origin != "a#1" || len(d.entries) != 0 {
		t.Fatalf("an empty message: %+v, %v", d, err)
	}
	// Malformed: another kind, truncated, trailing bytes, a minute too far back.
	bad := [][]byte{nil, {version}, msgs[0][:len(msgs[0])-1], append(append([]byte{}, msgs[0]...), 0),
		packTraffic(now, "x", []trafficEntry{{"b", cur - 61*60_000, 1, 1}}, maxPacket)[0]}
	for i, b := range bad {
		if _, err := decodeTraffic(b); err == nil {
			t.Errorf("malformed message %d decoded", i)
		}
	}
	q := encodeViewQuery(now, "node-a#01")
	if at, origin, err := decodeViewQuery(q); err != nil || at != now || origin != "node-a#01" {
		t.Fatalf("a view query: %d %q %v", at, origin, err)
	}
	for i, b := range [][]byte{nil, {viewQueryKind}, q[:len(q)-1], append(append([]byte{}, q...), 0), encodeViewQuery(now, "")} {
		if _, _, err := decodeViewQuery(b); err == nil {
			t.Errorf("malformed query %d decoded", i)
		}
	}
}

// TestTrafficIsMergedAcrossNodes runs two real nodes in this process: decisions and a
// key counted on one show in the other's minute counts, busiest keys and member status.
func TestTrafficIsMergedAcrossNodes(t *testing.T) {
	a, recA, b, recB := startTrafficPair(t, 50*time.Millisecond)

	l := limiter.Limit{Count: 5, Window: time.Hour}
	// The hour must not end during the test.
	if left := l.Window.Milliseconds() - a.lim.NowMS()%l.Window.Milliseconds(); left < 20_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
	}
	k := limiter.Key{Bucket: a.lim.Bucket("token_create"), ID: "198.51.100.7"}
	for range 8 { // 5 allowed, 3 denied
		recA.Note(k, a.lim.Check(k, 1, l))
	}
	waitFor(t, func() bool {
		b.RefreshView(context.Background())
		ts, nodes := recB.Traffic()
		if nodes != 2 || len(ts) != 1 || ts[0].Bucket != "token_create" {
			return false
		}
		m := ts[0].Minutes[traffic.Minutes-1]
		return m.Allowed == 5 && m.Denied == 3
	}, "a's decisions in b's minute counts")
	waitFor(t, func() bool {
		busy := recB.Busiest(5, nil)
		return len(busy) == 1 && len(busy[0].Keys) == 1 && busy[0].Keys[0].ID == "198.51.100.7" && busy[0].Keys[0].Count == 8
	}, "a's key among b's busiest with a's count")

	st := b.Status()
	if len(st) != 2 || !st[0].Self || st[0].Name != "b" || st[1].Name != "a" || st[1].HeardAgo < 0 || st[1].HeardAgo > 5*time.Second ||
		st[1].SyncAge < 0 || st[1].SyncAge > time.Minute || st[1].StaleDropped != 0 {
		t.Fatalf("b's status %+v", st)
	}
}

// TestLiveViewCostsNothingUnwatched: two nodes count decisions and nobody reads their
// live view: no minute counts cross the network. Read, one query and one answer per
// member per TrafficInterval, however often it is read, and the reader's view holds the
// other's decisions.
func TestLiveViewCostsNothingUnwatched(t *testing.T) {
	const every = time.Second
	a, recA, b, recB := startTrafficPair(t, every)
	views := func(c *Cluster) float64 { return testutil.ToFloat64(c.m.kindMsgs.WithLabelValues(kindView)) }
	l := limiter.Limit{Count: 1000, Window: time.Hour}
	k := limiter.Key{Bucket: a.lim.Bucket("token_create"), ID: "198.51.100.8"}
	for range 10 {
		recA.Note(k, a.lim.Check(k, 1, l))
		time.Sleep(every / 4)
	}
	if va, vb := views(a), views(b); va != 0 || vb != 0 {
		t.Fatalf("unwatched, the nodes sent %v and %v live-view messages over %v", va, vb, 10*every/4)
	}
	allowed := func() uint64 {
		var n uint64
		ts, _ := recB.Traffic()
		for _, bt := range ts {
			for _, m := range bt.Minutes {
				n += m.Allowed
			}
		}
		return n
	}
	// An hour's window may have begun during the loop: count what a allowed itself.
	var want uint64
	ts, _ := recA.Traffic()
	for _, bt := range ts {
		for _, m := range bt.Minutes {
			want += m.Allowed
		}
	}
	b.RefreshView(context.Background()) // waits up to viewWait for a's answer
	waitFor(t, func() bool { return allowed() == want && want > 0 }, "a's decisions in b's view after one read")
	// The counts of a message sent are taken once the send returns: let them settle.
	settled := func(n float64, what string) {
		t.Helper()
		waitFor(t, func() bool { return views(a) >= n && views(b) >= n }, what)
		time.Sleep(50 * time.Millisecond)
		if va, vb := views(a), views(b); va != n || vb != n {
			t.Fatalf("%s: a sent %v and b %v live-view messages, want %v each", what, va, vb, n)
		}
	}
	settled(1, "one read")
	// Read 20 times within the interval: still the one round (b's query, a's answer).
	for range 20 {
		b.RefreshView(context.Background())
	}
	settled(1, "20 reads within the interval")
	time.Sleep(every)
	b.RefreshView(context.Background())
	settled(2, "a read in the next interval")
	// A flood of queries in b's name, half an interval after a answered b's last: one
	// answer.
	time.Sleep(every / 2)
	q := encodeViewQuery(b.nowMS(), b.origin)
	for range 200 {
		a.receiveViewQuery(q)
	}
	time.Sleep(50 * time.Millisecond)
	if va := views(a); va != 3 {
		t.Fatalf("200 queries at once: a sent %v live-view messages in all, want 3 (one answer)", va)
	}
}

// startTrafficPair starts two real nodes in this process, b joining a, each recording
// its decisions for the live view, and waits until both list both.
func startTrafficPair(t *testing.T, every time.Duration) (a *Cluster, recA *traffic.Recorder, b *Cluster, recB *traffic.Recorder) {
	t.Helper()
	start := func(name string, join []string) (*Cluster, *traffic.Recorder) {
		lim := limiter.New(limiter.Options{Replicated: true})
		rec := traffic.New(lim)
		c, err := Start(Config{NodeName: name, BindAddr: "127.0.0.1:0", Strategy: "static", Join: join,
			SyncInterval: 20 * time.Millisecond, Traffic: rec, TrafficInterval: every, Logger: quiet}, lim)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		return c, rec
	}
	a, recA = start("a", nil)
	b, recB = start("b", []string{a.ml.LocalNode().Address()})
	waitFor(t, func() bool { return a.Members() == 2 && b.Members() == 2 }, "both members")
	return a, recA, b, recB
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Values dropped as stale are counted per member, the name without its incarnation.
func TestStaleDropsAreCountedPerMember(t *testing.T) {
	c := &testClock{}
	c.set(t0 + 2*minute + 10_000)
	n := newTestNode("a", c)
	n.receive(message{sentAt: t0, origin: "x#01", values: []value{val("ip", t0+minute, 2), val("ip2", t0+minute, 1)}}, true)
	n.receive(message{sentAt: t0, origin: "x#02", values: []value{val("ip", t0+minute, 2)}}, true)
	n.receive(message{sentAt: t0 + 2*minute, origin: "y#01", values: []value{val("ip", t0+3*minute, 2)}}, true)
	if got := n.peerStates["x"]; got == nil || got.staleValues != 3 {
		t.Fatalf("x: %+v, want 3 stale values", got)
	}
	if got := n.peerStates["y"]; got != nil && got.staleValues != 0 {
		t.Fatalf("y: %+v, want none stale", got)
	}
}
