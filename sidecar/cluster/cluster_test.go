package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/converger/edge/sidecar/limiter"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// counter reads a counter.
func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// newTestNode is a Cluster without memberlist, for the parts that do not send: state
// transfers and receiving.
func newTestNode(name string, c *testClock) *Cluster {
	lim := limiter.New(limiter.Options{Now: c.now, Replicated: true})
	n := &Cluster{cfg: Config{NodeName: name, Now: c.now}, lim: lim, origin: name + "#00", log: quiet, stop: make(chan struct{})}
	n.rep = newReplicator(lim, n.origin, true)
	n.slots = n.rep.slots
	n.m = newMetrics(prometheus.NewRegistry(), n.newestAge)
	return n
}

func TestStateTransferCarriesOwnAndRemoteSlots(t *testing.T) {
	c := &testClock{}
	c.set(t0 + 10_000)
	a, b := newTestNode("a", c), newTestNode("b", c)
	k := limiter.Key{Bucket: a.lim.Bucket("login_ip"), ID: "ip"}
	a.lim.Record(k, 3, perMinute)
	// a knows x's count of the same key, and a value of x's for the next window.
	a.receive(message{sentAt: t0 + 9_000, origin: "x#99", values: []value{val("ip", t0+minute, 2), val("later", t0+2*minute, 4)}}, true)

	state := (*delegate)(a).LocalState(true)
	(*delegate)(b).MergeRemoteState(state, true)
	if got := total(t, b.lim, "ip"); got != 5 {
		t.Fatalf("b counts %d after the transfer, want a's 3 + x's 2", got)
	}
	if got := total(t, b.lim, "later"); got != 0 {
		t.Fatalf("a window that has not begun counted: %d", got)
	}
	origins := map[string]uint32{}
	for _, v := range b.slots.view(limiter.Key{Bucket: b.lim.Bucket("login_ip"), ID: "ip"}) {
		origins[v.Origin] = v.Count
	}
	if len(origins) != 2 || origins["a#00"] != 3 || origins["x#99"] != 2 {
		t.Fatalf("b's slots: %v", origins)
	}
	if got := counter(t, b.m.transfers.WithLabelValues("received", "join")); got != 1 {
		t.Fatalf("received join transfers: %v", got)
	}
	// A transfer merged twice counts once.
	(*delegate)(b).MergeRemoteState(state, false)
	if got := total(t, b.lim, "ip"); got != 5 {
		t.Fatalf("b counts %d after the same transfer twice", got)
	}
	// Its own values coming back do not count as remote.
	(*delegate)(a).MergeRemoteState((*delegate)(b).LocalState(true), true)
	if got := total(t, a.lim, "ip"); got != 5 {
		t.Fatalf("a counts %d after b's transfer, want 5", got)
	}
	// A periodic push/pull carries the node's own counts only: b counted nothing, a
	// its 3 (not x's 2, which x sends itself).
	if msgs, err := decodeState((*delegate)(b).LocalState(false)); err != nil || len(msgs) > 1 || (len(msgs) == 1 && len(msgs[0].values) != 0) {
		t.Fatalf("b's periodic state: %+v, %v; want no value", msgs, err)
	}
	c2 := newTestNode("c", c)
	(*delegate)(c2).MergeRemoteState((*delegate)(a).LocalState(false), false)
	if got := total(t, c2.lim, "ip"); got != 3 {
		t.Fatalf("c counts %d after a's periodic state, want a's own 3", got)
	}
	c.set(t0 + minute)
	b.slots.tick(c.ms.Load())
	if got := total(t, b.lim, "later"); got != 4 {
		t.Fatalf("the later window counts %d once begun, want 4", got)
	}

	// A node whose clock is past the windows drops the values and counts them.
	late := newTestNode("late", &testClock{})
	late.cfg.Now = func() time.Time { return time.UnixMilli(t0 + 2*minute) }
	(*delegate)(late).MergeRemoteState(state, true)
	if got := counter(t, late.m.stale); got != 3 {
		t.Fatalf("stale values dropped: %v, want 3", got)
	}
	if late.lim.Len() != 0 {
		t.Fatal("stale values created counters")
	}
	// A malformed transfer is refused whole.
	(*delegate)(late).MergeRemoteState(state[:len(state)-1], true)
	if got := counter(t, late.m.malformed); got != 1 {
		t.Fatalf("malformed: %v", got)
	}
}

// TestSyncSplitsLargeBatches runs two real nodes in this process: a flush of many
// changed counters goes out in many UDP messages, and every counter arrives.
func TestSyncSplitsLargeBatches(t *testing.T) {
	start := func(name string, join []string) *Cluster {
		c, err := Start(Config{NodeName: name, BindAddr: "127.0.0.1:0", Strategy: "static", Join: join,
			SyncInterval: 20 * time.Millisecond, ShareMode: true, Logger: quiet},
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

	const keys = 500
	lim := limiter.Limit{Count: 1000, Window: time.Hour}
	id := func(i int) string { return fmt.Sprintf("%03d-%s", i, strings.Repeat("k", 40)) }
	ka := func(i int) limiter.Key { return limiter.Key{Bucket: a.lim.Bucket("login_ip"), ID: id(i)} }
	kb := func(i int) limiter.Key { return limiter.Key{Bucket: b.lim.Bucket("login_ip"), ID: id(i)} }
	// The hour must not end during the test.
	if left := lim.Window.Milliseconds() - a.lim.NowMS()%lim.Window.Milliseconds(); left < 20_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
	}
	sentBefore := counter(t, a.m.messages.WithLabelValues("sent"))
	for i := range keys {
		a.lim.Record(ka(i), uint32(i%7+1), lim)
	}
	for {
		missing := 0
		for i := range keys {
			if b.lim.Peek(kb(i), lim).Count != uint32(i%7+1) {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d counters did not arrive (or arrived wrong)", missing, keys)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Each value is about 60 bytes: 500 of them do not fit in one message, even
	// compressed (a packet is filled to rawPerPacket3 before compression).
	sent := counter(t, a.m.messages.WithLabelValues("sent")) - sentBefore
	if sent < keys*60/rawPerPacket3 {
		t.Fatalf("%v messages for %d values", sent, keys)
	}
	if got := counter(t, b.m.malformed); got != 0 {
		t.Fatalf("%v malformed messages", got)
	}
	// Every byte is counted at the transport, whatever the path (the sync packets,
	// compressed by memberlist, and the join's push/pull over TCP): what b received is
	// most of what a sent.
	if sentBytes, got := counter(t, a.m.bytesSent), counter(t, b.m.bytesRecv); got < sentBytes/2 || got < float64(sent*100) {
		t.Errorf("a sent %v bytes in %v messages, b received %v bytes", sentBytes, sent, got)
	}
	t.Logf("%d counters in %v messages (with the resend)", keys, sent)
}
