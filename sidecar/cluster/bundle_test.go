package cluster

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

func TestBundleMessages(t *testing.T) {
	q := grantRequest{sentAt: t0, origin: "n2#0001", id: 7, want: 3, waitMS: 10,
		v: value{bucket: "token_create", id: "198.51.100.7", sizeMS: minute, endMS: t0 + minute, count: 4, share: true, limit: 10}}
	ask := encodeAsk(q)
	answer := encodeAnswer(grantAnswer{origin: "n1#0002", id: 7, bucket: "token_create", key: "198.51.100.7", endMS: t0 + minute, grant: 2})
	b := encodeBundle(bundleKind, [][]byte{ask, answer, ask})
	got, err := decodeBundle(bundleKind, b)
	if err != nil || len(got) != 3 || !bytes.Equal(got[0], ask) || !bytes.Equal(got[1], answer) || !bytes.Equal(got[2], ask) {
		t.Fatalf("bundle: %q, %v", got, err)
	}
	for i := range b {
		if _, err := decodeBundle(bundleKind, b[:i]); err == nil {
			t.Errorf("a bundle cut at %d of %d bytes decoded", i, len(b))
		}
	}
	raw := func(n uint64, msgs ...[]byte) []byte {
		out := binary.AppendUvarint([]byte{bundleKind}, n)
		for _, m := range msgs {
			out = binary.AppendUvarint(out, uint64(len(m)))
			out = append(out, m...)
		}
		return out
	}
	values := encode(message{origin: "n2#0001", sentAt: t0, values: []value{{bucket: "token_create", id: "x", sizeMS: minute, endMS: t0 + minute, count: 1}}})
	many := make([][]byte, maxBundled+1)
	for i := range many {
		many[i] = ask
	}
	for name, bad := range map[string][]byte{
		"one message":         raw(1, ask),
		"none":                raw(0),
		"too many":            raw(maxBundled+1, many...),
		"a sync message":      raw(2, ask, values),
		"a bundle in one":     raw(2, ask, encodeBundle(bundleKind, [][]byte{ask, ask})),
		"an empty message":    raw(2, ask, nil),
		"trailing bytes":      append(raw(2, ask, answer), 0),
		"a length beyond it":  append(raw(1, ask)[:1], append(binary.AppendUvarint([]byte{2}, 1<<40), ask...)...),
		"another kind's byte": append([]byte{askKind}, raw(2, ask, ask)[1:]...),
	} {
		if _, err := decodeBundle(bundleKind, bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := decode(b); err == nil {
		t.Error("a bundle decoded as a sync message")
	}
}

// TestSyncBundleMessages: a sync bundle holds values, summaries and relayed counts, and
// nothing else; a bundle of asks and answers holds none of them.
func TestSyncBundleMessages(t *testing.T) {
	v := value{bucket: "token_create", id: "x", sizeMS: minute, endMS: t0 + minute, count: 1, share: true, limit: 10}
	values := pack3(t0, "n2#0001", []value{v})[0]
	sum := packSummaries(t0, "n2#0001", 300, []summaryEntry{{bucket: "token_create", id: "x", sizeMS: minute, endMS: t0 + minute, others: 3}})[0]
	relay := packRelay(t0, map[string][]value{"n3#0002": {v}})[0]
	ask := encodeAsk(grantRequest{sentAt: t0, origin: "n2#0001", id: 7, want: 3, waitMS: 10, v: v})
	b := encodeBundle(syncBundleKind, [][]byte{values, sum, relay})
	got, err := decodeBundle(syncBundleKind, b)
	if err != nil || len(got) != 3 || !bytes.Equal(got[0], values) || !bytes.Equal(got[1], sum) || !bytes.Equal(got[2], relay) {
		t.Fatalf("sync bundle: %q, %v", got, err)
	}
	for name, bad := range map[string][]byte{
		"an ask":                   encodeBundle(syncBundleKind, [][]byte{values, ask}),
		"a sync bundle in one":     encodeBundle(syncBundleKind, [][]byte{values, b}),
		"a bundle of asks in one":  encodeBundle(syncBundleKind, [][]byte{values, encodeBundle(bundleKind, [][]byte{ask, ask})}),
		"values of an old version": encodeBundle(syncBundleKind, [][]byte{values, encode(message{origin: "n2#0001", sentAt: t0, values: []value{v}})}),
	} {
		if _, err := decodeBundle(syncBundleKind, bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := decodeBundle(bundleKind, encodeBundle(bundleKind, [][]byte{ask, values})); err == nil {
		t.Error("a bundle of asks held values")
	}
	if _, err := decodeBundle(bundleKind, b); err == nil {
		t.Error("a sync bundle decoded as a bundle of asks")
	}
}

// TestSyncBundleHostileInput: a node handed sync bundles cut short, nested, holding
// what a sync bundle may not, or holding a malformed message counts each as malformed
// and merges nothing of the bad ones; the good messages of a bundle still merge.
func TestSyncBundleHostileInput(t *testing.T) {
	a := startGrantNode(t, "a", false)
	v := value{bucket: "password_reset_ip", id: "198.51.100.9", sizeMS: minute, endMS: windowEnd(a.nowMS(), minute), count: 4, share: true, limit: 1000}
	values := pack3(a.nowMS(), "x#0001", []value{v})[0]
	sum := packSummaries(a.nowMS(), "x#0001", 300, []summaryEntry{{bucket: v.bucket, id: v.id, sizeMS: v.sizeMS, endMS: v.endMS, others: 3}})[0]
	good := encodeBundle(syncBundleKind, [][]byte{values, sum})
	ask := encodeAsk(grantRequest{sentAt: a.nowMS(), origin: "x#0001", id: 7, want: 3, waitMS: 10, v: v})
	var bad [][]byte
	for i := 1; i < len(good); i++ {
		bad = append(bad, good[:i])
	}
	many := make([][]byte, maxBundled+1)
	for i := range many {
		many[i] = values
	}
	bad = append(bad,
		encodeBundle(syncBundleKind, [][]byte{values, good}),
		encodeBundle(syncBundleKind, [][]byte{values, ask}),
		encodeBundle(syncBundleKind, many),
		append(binary.AppendUvarint([]byte{syncBundleKind}, 2), binary.AppendUvarint(nil, 1<<40)...),
		append(slices.Clone(good), 0),
	)
	before := counter(t, a.m.malformed)
	for _, b := range bad {
		a.receiveMsg(b)
	}
	if got := counter(t, a.m.malformed) - before; got != float64(len(bad)) {
		t.Errorf("%g of %d bad sync bundles counted malformed", got, len(bad))
	}
	if d := a.Debug(v.bucket, v.id); d.Remote != 0 {
		t.Fatalf("a bad sync bundle merged: %+v", d)
	}
	// A bundle that holds a good value and a summary cut short: the value merges, the
	// summary is malformed.
	before = counter(t, a.m.malformed)
	a.receiveMsg(encodeBundle(syncBundleKind, [][]byte{values, sum[:len(sum)-1]}))
	if got := counter(t, a.m.malformed) - before; got != 1 {
		t.Errorf("a summary cut short in a bundle: %g malformed, want 1", got)
	}
	if d := a.Debug(v.bucket, v.id); d.Remote != 4 {
		t.Errorf("the good value of the bundle: remote %d, want 4", d.Remote)
	}
}

func TestPackBundlesKeepsPacketsSmall(t *testing.T) {
	var msgs [][]byte
	for i := range 300 {
		msgs = append(msgs, encodeAsk(grantRequest{sentAt: t0, origin: "n2#0001", id: uint64(i + 1), want: 1, waitMS: 25,
			v: value{bucket: "token_create", id: fmt.Sprintf("198.51.%d.%d", i/250, i%250), sizeMS: minute, endMS: t0 + minute, limit: 10}}))
	}
	big := bytes.Repeat([]byte{'x'}, maxPacket)
	big[0] = askKind
	msgs = append(msgs, big, msgs[0])
	var back [][]byte
	for _, p := range packBundles(bundleKind, msgs) {
		if p[0] != bundleKind {
			back = append(back, p)
			continue
		}
		if len(p) > maxPacket {
			t.Errorf("a bundle of %d bytes, over %d", len(p), maxPacket)
		}
		got, err := decodeBundle(bundleKind, p)
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, got...)
	}
	if len(back) != len(msgs) {
		t.Fatalf("%d messages back of %d", len(back), len(msgs))
	}
	for i := range msgs {
		if !bytes.Equal(back[i], msgs[i]) {
			t.Fatalf("message %d changed or moved", i)
		}
	}
	if got := packBundles(bundleKind, msgs[:1]); len(got) != 1 || !bytes.Equal(got[0], msgs[0]) {
		t.Errorf("a message alone: %q", got)
	}
}

// TestRequestsForRoomGoInBundles: a node that needs its owner for many keys at once (a
// window's start: fresh keys of a small limit are bound at 0 on the members that do not
// own them) sends its requests in fewer packets than requests, and the owner answers
// them in bundles too; every check is allowed, none waits out the grants' wait.
func TestRequestsForRoomGoInBundles(t *testing.T) {
	a, b := grantPair(t, false)
	lim := limiter.Limit{Count: 10, Window: time.Hour}
	if left := lim.Window.Milliseconds() - a.lim.NowMS()%lim.Window.Milliseconds(); left < 20_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
	}
	var ids []string
	for i := 0; len(ids) < 40; i++ {
		if id := fmt.Sprintf("198.51.100.%d", i); ownerOf("token_create", id, []string{"a", "b"}) == "a" {
			ids = append(ids, id)
		}
	}
	var wg sync.WaitGroup
	begin := make(chan struct{})
	refused := make(chan string, len(ids))
	for _, id := range ids {
		wg.Go(func() {
			<-begin
			if r := b.lim.Check(limiter.Key{Bucket: b.lim.Bucket("token_create"), ID: id}, 1, lim); !r.Allowed {
				refused <- id
			}
		})
	}
	close(begin)
	wg.Wait()
	close(refused)
	for id := range refused {
		t.Errorf("the first check of %s refused: %+v", id, b.Debug("token_create", id))
	}
	asked := counter(t, b.m.grants.WithLabelValues("asked", "sent"))
	timedOut := counter(t, b.m.grants.WithLabelValues("asked", "timed_out"))
	asks, bundles := counter(t, b.m.kindMsgs.WithLabelValues(kindAsk)), counter(t, b.m.kindMsgs.WithLabelValues(kindBundle))
	answers, answerBundles := counter(t, a.m.kindMsgs.WithLabelValues(kindAnswer)), counter(t, a.m.kindMsgs.WithLabelValues(kindBundle))
	t.Logf("b asked %g times in %g bundles and %g packets alone; a answered in %g bundles and %g alone", asked, bundles, asks, answerBundles, answers)
	if asked < float64(len(ids)) || timedOut != 0 {
		t.Errorf("b asked %g times for %d keys, %g timed out", asked, len(ids), timedOut)
	}
	if bundles == 0 || asks+bundles >= asked {
		t.Errorf("%g requests went in %g bundles and %g alone", asked, bundles, asks)
	}
	if answerBundles == 0 || answers+answerBundles >= asked {
		t.Errorf("%g requests answered in %g bundles and %g alone", asked, answerBundles, answers)
	}
}

// TestSyncBundlesOnlyToMembersThatReadThem: in owner replication two nodes counting
// each other's keys near their limits send each other, at every flush, values and
// summaries: in one packet (a sync bundle). To a member whose metadata does not announce
// sync bundles (a release before them) they go as packets of their own, and every count
// still adds up at both.
func TestSyncBundlesOnlyToMembersThatReadThem(t *testing.T) {
	a, b := grantPair(t, false)
	lim := limiter.Limit{Count: 250, Window: time.Hour}
	if left := lim.Window.Milliseconds() - a.lim.NowMS()%lim.Window.Milliseconds(); left < 20_000 {
		time.Sleep(time.Duration(left+100) * time.Millisecond)
	}
	names := []string{"a", "b"}
	keyOf := func(owner string) string {
		for i := 0; ; i++ {
			if id := fmt.Sprintf("198.51.100.%d", i); ownerOf("password_reset_ip", id, names) == owner {
				return id
			}
		}
	}
	ids := []string{keyOf("a"), keyOf("b")}
	hits := 0
	// Each node counts both keys every 10 ms for d: 200 hits a second of a limit of 250
	// an hour (Record counts beyond it), near enough to sync every interval, and past
	// half of it by the end of each second, so that the last values do not wait
	// (lazy.go).
	count := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			for _, c := range []*Cluster{a, b} {
				for _, id := range ids {
					c.lim.Record(limiter.Key{Bucket: c.lim.Bucket("password_reset_ip"), ID: id}, 1, lim)
				}
			}
			hits++
		}
	}
	addsUp := func(when string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			var bad []string
			for _, c := range []*Cluster{a, b} {
				for _, id := range ids {
					if d := c.Debug("password_reset_ip", id); d.Own+d.Remote != uint32(2*hits) {
						bad = append(bad, fmt.Sprintf("%s counts %s: own %d remote %d", c.cfg.NodeName, id, d.Own, d.Remote))
					}
				}
			}
			if len(bad) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: want %d of each key at each node: %v", when, 2*hits, bad)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	sent := func(kind string) float64 { return counter(t, a.m.kindMsgs.WithLabelValues(kind)) }

	count(time.Second)
	addsUp("both read sync bundles")
	if n := sent(kindBundle); n == 0 {
		t.Fatalf("a sent no sync bundle to b (values %g, summaries %g)", sent(kindValues), sent(kindSummary))
	}

	// b as a release before sync bundles, in a's eyes.
	a.membersMu.Lock()
	n := a.members["b"]
	n.Meta = slices.Clone(n.Meta)
	n.Meta[1] &^= featureSyncBundle
	a.members["b"] = n
	a.membersMu.Unlock()
	time.Sleep(3 * a.cfg.SyncInterval) // flushes under way end
	bundles, values, summaries := sent(kindBundle), sent(kindValues), sent(kindSummary)
	count(time.Second)
	addsUp("b without sync bundles")
	if got := sent(kindBundle); got != bundles {
		t.Errorf("a sent %g sync bundles to a member that does not read them", got-bundles)
	}
	if sent(kindValues) == values || sent(kindSummary) == summaries {
		t.Errorf("a sent %g values and %g summaries to b without sync bundles, want both", sent(kindValues)-values, sent(kindSummary)-summaries)
	}
}
