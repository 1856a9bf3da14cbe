package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// TestGrantsBetweenTwoNodes: two real nodes on loopback, both counting a key. The node
// that does not own it asks the owner for room when its bound refuses a check below the
// limit, and gets it at once: broadcasting, it is bound at its count once it hears of
// the owner's demand; in owner replication its first check already asks (it knows
// nothing of a key another node owns), and the owner binds itself at its count.
func TestGrantsBetweenTwoNodes(t *testing.T) {
	for _, broadcast := range []bool{false, true} {
		t.Run(fmt.Sprintf("broadcast=%v", broadcast), func(t *testing.T) { grantsBetweenTwoNodes(t, broadcast) })
	}
}

// startGrantNode starts a node with share mode and the grants, in owner replication or
// broadcast, joining join.
func startGrantNode(t *testing.T, name string, broadcast bool, join ...*Cluster) *Cluster {
	t.Helper()
	var addrs []string
	for _, j := range join {
		addrs = append(addrs, j.ml.LocalNode().Address())
	}
	c, err := Start(Config{NodeName: name, BindAddr: "127.0.0.1:0", Strategy: "static", Join: addrs, Broadcast: broadcast,
		SyncInterval: 100 * time.Millisecond, ShareMode: true, GrantWait: 200 * time.Millisecond, Logger: quiet},
		limiter.New(limiter.Options{Replicated: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// grantPair starts two nodes, a and b, with share mode and the grants, and waits until
// both run the grants and have settled, and neither answers for the other any more
// (handing: b owned every key alone): in owner replication each has the other's
// handover.
func grantPair(t *testing.T, broadcast bool) (a, b *Cluster) {
	a = startGrantNode(t, "a", broadcast)
	b = startGrantNode(t, "b", broadcast, a)
	deadline := time.Now().Add(10 * time.Second)
	on := func(c *Cluster, other string) bool {
		c.ownersMu.Lock()
		defer c.ownersMu.Unlock()
		return len(c.owners.names) == 2 && c.owners.grants && c.owners.relay == !broadcast &&
			c.nowMS() >= c.owners.changedAt+c.owners.settleStart && c.nowMS() >= c.owners.startedAt+c.owners.settleStart &&
			(broadcast || c.owners.handedSince(other, c.owners.startedAt))
	}
	for !on(a, "b") || !on(b, "a") {
		if time.Now().After(deadline) {
			t.Fatalf("grants not on: a %v, b %v", a.owners, b.owners)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return a, b
}

func grantsBetweenTwoNodes(t *testing.T, broadcast bool) {
	a, b := grantPair(t, broadcast)
	deadline := time.Now().Add(10 * time.Second)
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
	// a counts the key too, so that b is not the only node with demand (not bound).
	if !a.lim.Check(limiter.Key{Bucket: a.lim.Bucket("token_create"), ID: id}, 1, lim).Allowed {
		t.Fatal("a's check refused")
	}
	if !b.lim.Check(k, 1, lim).Allowed {
		t.Fatal("the first check refused")
	}
	// Their next flushes bound both: a at its count; b at its count broadcasting (it
	// hears of a's demand), at what the owner granted it in owner replication.
	ka := limiter.Key{Bucket: a.lim.Bucket("token_create"), ID: id}
	for {
		end := windowEnd(b.nowMS(), lim.Window.Milliseconds())
		cb, okb := b.lim.CapIn(k, lim.Window.Milliseconds(), end)
		ca, oka := a.lim.CapIn(ka, lim.Window.Milliseconds(), end)
		if okb && (cb == 1 || !broadcast && cb >= 1 && cb < 9) && oka && ca == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a and b not bound at their counts: a %d %v, b %d %v", ca, oka, cb, okb)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 8 {
		if r := b.lim.Check(k, 1, lim); !r.Allowed {
			t.Fatalf("check %d of 9 refused: %+v, debug %+v", i+2, r, b.Debug("token_create", id))
		}
	}
	if r := b.lim.Check(k, 1, lim); r.Allowed {
		t.Fatalf("the 11th check of the key allowed: %+v", r)
	}
	asked := counter(t, b.m.grants.WithLabelValues("asked", "sent"))
	granted := counter(t, b.m.grants.WithLabelValues("asked", "granted"))
	given := counter(t, a.m.grants.WithLabelValues("answered_other", "granted"))
	if asked == 0 || granted == 0 || given != granted {
		t.Errorf("b asked %g and was granted %g times; a granted %g", asked, granted, given)
	}
	t.Logf("b asked %g times, granted %g; a gave %g hits", asked, granted, counter(t, a.m.grantedHits.WithLabelValues("other")))
}

// TestOwnerOf: every member with the same view picks the same owner, keys spread over
// the members, and a member leaving moves only the keys it owned.
func TestOwnerOf(t *testing.T) {
	all := []string{"n1", "n2", "n3", "n4", "n5"}
	without := []string{"n1", "n2", "n4", "n5"}
	per := map[string]int{}
	for i := range 1000 {
		id := fmt.Sprintf("198.51.100.%d/%d", i%256, i)
		o := ownerOf("token_create", id, all)
		if o2 := ownerOf("token_create", id, []string{"n5", "n3", "n1", "n4", "n2"}); o2 != o {
			t.Fatalf("%s: owner %s, or %s in another order", id, o, o2)
		}
		per[o]++
		if o2 := ownerOf("token_create", id, without); o != "n3" && o2 != o {
			t.Errorf("%s moved from %s to %s when n3 left", id, o, o2)
		}
	}
	for _, m := range all {
		if per[m] < 150 || per[m] > 250 {
			t.Errorf("%s owns %d of 1000 keys: %v", m, per[m], per)
		}
	}
}

// TestOwnsAfterSettling: a node that comes to own a key by a membership change grants
// only once the previous owner's grants can have reached it; a node that owned it
// before keeps granting; a node just started grants nothing until it has heard the
// bounds.
func TestOwnsAfterSettling(t *testing.T) {
	o := newOwners("n1", 0, 100, 10)
	o.names = []string{"n1", "n2"}
	var mine, moved string
	for i := 0; mine == "" || moved == ""; i++ {
		id := fmt.Sprintf("k%d", i)
		switch {
		case ownerOf("b", id, o.names) == "n1" && ownerOf("b", id, []string{"n1", "n2", "n3"}) == "n1":
			mine = id
		case ownerOf("b", id, o.names) == "n1" && ownerOf("b", id, []string{"n1", "n2", "n3"}) == "n3":
			moved = id
		}
	}
	if o.owns("b", mine, o.settleStart-1) || !o.owns("b", mine, o.settleStart) {
		t.Errorf("a node just started owns from %d ms, want %d", o.settleStart, o.settleStart)
	}
	// n3 joins at 1000, then leaves at 2000.
	o.prev, o.names, o.changedAt = o.names, []string{"n1", "n2", "n3"}, 1000
	if !o.owns("b", mine, 1001) || o.owns("b", moved, 1001) {
		t.Errorf("after n3 joined: owns %s %v (want true), %s %v (want false: n3's)", mine, o.owns("b", mine, 1001), moved, o.owns("b", moved, 1001))
	}
	o.prev, o.names, o.changedAt = o.names, []string{"n1", "n2"}, 2000
	if o.owns("b", moved, 2000+o.settleMove-1) || !o.owns("b", moved, 2000+o.settleMove) {
		t.Errorf("after n3 left: owns %s from %d ms after, want %d", moved, o.settleMove, o.settleMove)
	}
	o.names = nil
	if o.owns("b", mine, 10_000) {
		t.Error("owns a key with grants off")
	}
}

// TestHandsNothingUntilSettledFromItsStart: a member that saw n1 come back hands n1's
// keys it owned without n1 (it answers for them while n1 settles); a member that has
// just started, and found n1 last while joining, owned none of them and hands nothing,
// though its views before and after look the same.
func TestHandsNothingUntilSettledFromItsStart(t *testing.T) {
	all, without := []string{"n1", "n2", "n3"}, []string{"n2", "n3"}
	var k string
	for i := 0; k == ""; i++ {
		if id := fmt.Sprintf("k%d", i); ownerOf("b", id, all) == "n1" && ownerOf("b", id, without) == "n2" {
			k = id
		}
	}
	settled := newOwners("n2", 0, 100, 10)
	settled.relay = true
	// n1 comes back at 10,000, long after n2 started.
	settled.prev, settled.names, settled.changedAt = without, all, 10_000
	if !settled.handing("b", k, 10_001) {
		t.Errorf("a settled member does not hand %s, which it owned before n1 came back", k)
	}
	fresh := newOwners("n2", 10_000, 100, 10)
	fresh.relay = true
	// n2 has just started: it finds n3, then n1, before it has settled.
	fresh.prev, fresh.names, fresh.changedAt = without, all, 10_000+fresh.settleStart-1
	for _, now := range []int64{fresh.changedAt, fresh.changedAt + 1, 10_000 + fresh.settleStart + 1} {
		if fresh.handing("b", k, now) {
			t.Errorf("a member started at 10,000 that found n1 before it settled hands %s at %d", k, now)
		}
	}
}

// TestGrantMessages: asks and answers round-trip; every truncation, and a zero want,
// is refused whole.
func TestGrantMessages(t *testing.T) {
	q := grantRequest{sentAt: t0, origin: "n2#0001", id: 7, want: 3, waitMS: 10,
		v: value{bucket: "token_create", id: "198.51.100.7", sizeMS: minute, endMS: t0 + minute, count: 4, share: true, refused: 2, cap: 4, capped: true, limit: 10}}
	b := encodeAsk(q)
	got, err := decodeAsk(b)
	if err != nil || got != q {
		t.Fatalf("ask: %+v, %v; want %+v", got, err, q)
	}
	for i := range b {
		if _, err := decodeAsk(b[:i]); err == nil {
			t.Errorf("an ask cut at %d of %d bytes decoded", i, len(b))
		}
	}
	zero := q
	zero.want = 0
	if _, err := decodeAsk(encodeAsk(zero)); err == nil {
		t.Error("an ask for nothing decoded")
	}
	a := grantAnswer{origin: "n1#0002", id: 7, bucket: "token_create", key: "198.51.100.7", endMS: t0 + minute, grant: 2}
	b = encodeAnswer(a)
	if got, err := decodeAnswer(b); err != nil || got != a {
		t.Fatalf("answer: %+v, %v; want %+v", got, err, a)
	}
	for i := range b {
		if _, err := decodeAnswer(b[:i]); err == nil {
			t.Errorf("an answer cut at %d of %d bytes decoded", i, len(b))
		}
	}
	if _, err := decode(encodeAsk(q)); err == nil {
		t.Error("an ask decoded as a sync message")
	}
}

// TestGrantMaxLimitIsTheSmallestAnnounced: the grants divide the counters of limits up
// to the smallest GrantMaxLimit the members announce, so that members configured
// differently still agree on which counters the owner gives out; a member of an
// earlier release announces none (every limit).
func TestGrantMaxLimitIsTheSmallestAnnounced(t *testing.T) {
	start := func(name string, maxLimit uint32, join []string) *Cluster {
		c, err := Start(Config{NodeName: name, BindAddr: "127.0.0.1:0", Strategy: "static", Join: join,
			SyncInterval: 100 * time.Millisecond, ShareMode: true, GrantMaxLimit: maxLimit, Logger: quiet},
			limiter.New(limiter.Options{Replicated: true}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		return c
	}
	a := start("a", 50, nil)
	if env := a.shareEnv(a.nowMS()); !env.grantsFor(50) || env.grantsFor(51) {
		t.Errorf("alone: grants for 50 %v, for 51 %v; want true, false", env.grantsFor(50), env.grantsFor(51))
	}
	b := start("b", 20, []string{a.ml.LocalNode().Address()})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ea, eb := a.shareEnv(a.nowMS()), b.shareEnv(b.nowMS())
		if ea.grantMax == 20 && eb.grantMax == 20 && ea.grantsFor(20) && !ea.grantsFor(21) && eb.grantsFor(20) && !eb.grantsFor(21) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's largest limit with grants %d, b's %d; want 20 on both", ea.grantMax, eb.grantMax)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range []struct {
		meta []byte
		want uint32
	}{
		{[]byte{version, featureGrants}, math.MaxUint32},
		{[]byte{version, featureGrants, 0}, math.MaxUint32},
		{binary.AppendUvarint([]byte{version, featureGrants}, 100), 100},
		{[]byte{version, featureGrants, 0x80}, math.MaxUint32}, // truncated
	} {
		if got := announcedGrantMax(c.meta); got != c.want {
			t.Errorf("announcedGrantMax(%x) = %d, want %d", c.meta, got, c.want)
		}
	}
}

// TestAnnouncedOrigin: a member's metadata ends with its incarnation; metadata of an
// earlier release, cut short or with anything but a short hex tail announces none.
func TestAnnouncedOrigin(t *testing.T) {
	head := binary.AppendUvarint([]byte{version, featureGrants}, 100)
	for _, c := range []struct {
		meta []byte
		want string
	}{
		{append(slices.Clone(head), "0a1b2c3d4e5f6071"...), "n1#0a1b2c3d4e5f6071"},
		{head, ""}, // an earlier release
		{[]byte{version, featureGrants}, ""},
		{[]byte{version, featureGrants, 0x80, 'a', 'b'}, ""}, // a grant limit cut short
		{append(slices.Clone(head), "zz"...), ""},
		{append(slices.Clone(head), "\xff\xfe"...), ""},
		{append(slices.Clone(head), strings.Repeat("ab", 17)...), ""}, // too long
	} {
		if got := announcedOrigin("n1", c.meta); got != c.want {
			t.Errorf("announcedOrigin(%x) = %q, want %q", c.meta, got, c.want)
		}
	}
	c := startGrantNode(t, "a", false)
	if got := announcedOrigin("a", (*delegate)(c).NodeMeta(512)); got != c.origin {
		t.Errorf("a node's metadata announces %q, its origin is %q", got, c.origin)
	}
}

// TestLateAnswerRaisesTheBoundUntilTheNextValue: an owner's grant that comes after the
// asker's wait still raises the bound for the checks that follow, as long as the asker
// has sent no value since its deadline (the owner holds the grant until it merges one);
// after that value, or once the node asked again, it is not applied: the owner may have
// given that room to another node.
func TestLateAnswerRaisesTheBoundUntilTheNextValue(t *testing.T) {
	lim := limiter.New(limiter.Options{Replicated: true})
	r := newReplicator(lim, "b#1", true)
	k := limiter.Key{Bucket: lim.Bucket("token_create"), ID: "192.0.2.1"}
	l := limiter.Limit{Count: 10, Window: time.Hour}
	if !lim.Check(k, 1, l).Allowed {
		t.Fatal("first check refused")
	}
	size := l.Window.Milliseconds()
	now := lim.NowMS()
	end := windowEnd(now, size)
	lim.SetCap(k, size, end, 1)
	capOf := func() uint32 {
		c, _ := lim.CapIn(k, size, end)
		return c
	}
	askAt := func(at int64) *ask {
		a, first, ok := r.asks.start(k, size, end, at, 25)
		if !ok || !first {
			t.Fatalf("no new request at %d: %v %v", at, first, ok)
		}
		r.request(k, a, 1, at, 25)
		r.asks.end(k, a, 0) // timed out
		return a
	}
	answer := func(a *ask, at int64, grant uint32) (bool, bool) {
		_, applied, late := r.answer(grantAnswer{origin: "a#1", id: a.id, bucket: "token_create", key: k.ID, endMS: end, grant: grant}, at, 100)
		return applied, late
	}

	a := askAt(now)
	if applied, late := answer(a, now+30, 3); !applied || !late || capOf() != 4 {
		t.Fatalf("late answer before the next value: applied %v, late %v, bound %d; want applied, late, 4", applied, late, capOf())
	}
	if applied, _ := answer(a, now+31, 3); applied {
		t.Fatal("the same answer applied twice")
	}

	a = askAt(now + 40)
	r.asks.due(now + 40 + 26) // a flush after the deadline sends the value
	if applied, _ := answer(a, now+70, 5); applied || capOf() != 4 {
		t.Fatalf("late answer after the next value: applied %v, bound %d; want not applied, 4", applied, capOf())
	}

	a = askAt(now + 80)
	askAt(now + 81) // asked again: its request carries the bound as it is
	if applied, _ := answer(a, now+90, 5); applied || capOf() != 4 {
		t.Fatalf("late answer to a request asked again: applied %v, bound %d", applied, capOf())
	}

	// An answer received before its request's deadline, but applied only after a flush
	// past the deadline sent this node's value (a busy machine), is not applied: the
	// owner lets go of the grant on that value, which did not show it.
	a, first, ok := r.asks.start(k, size, end, now+200, 25)
	if !ok || !first {
		t.Fatal("no new request")
	}
	r.request(k, a, 1, now+200, 25)
	r.asks.due(now + 200 + 25)
	if applied, _ := answer(a, now+210, 5); applied || capOf() != 4 {
		t.Fatalf("answer applied after a flush past its deadline: applied %v, bound %d", applied, capOf())
	}
}

// A summary and an owner's answer may cross: answers are handled as they come, other
// messages in turn. A summary the owner planned before it granted does not lower the
// bound the grant raised (the owner holds that room for the member); one planned after
// it does.
func TestSummaryPlannedBeforeAGrantDoesNotLowerIt(t *testing.T) {
	m := newMemberB()
	r, lim, k, size, end, now, env := m.r, m.lim, m.k, m.size, m.end, m.now, m.env
	if !lim.Check(k, 1, m.limit).Allowed {
		t.Fatal("first check refused")
	}
	lim.SetCap(k, size, end, 1)
	capOf := func() uint32 {
		c, _ := lim.CapIn(k, size, end)
		return c
	}
	a, first, ok := r.asks.start(k, size, end, now, 25)
	if !ok || !first {
		t.Fatal("no request")
	}
	r.request(k, a, 1, now, 25)
	if _, applied, _ := r.answer(grantAnswer{origin: "a#1", id: a.id, bucket: "token_create", key: k.ID, endMS: end, grant: 1}, now+1, 100); !applied || capOf() != 2 {
		t.Fatalf("grant not applied: bound %d, want 2", capOf())
	}
	summaryAt := func(at int64, answered uint64) summary {
		e := summaryEntry{bucket: "token_create", id: k.ID, sizeMS: size, endMS: end, others: 0, planned: true, cur: 1, curCapped: true, answered: answered}
		msgs := packSummaries(at, "a#1", 200, []summaryEntry{e})
		if len(msgs) != 1 {
			t.Fatalf("%d messages", len(msgs))
		}
		s, err := decodeSummary(msgs[0])
		if err != nil || s.answered != answered {
			t.Fatalf("summary decoded with answered %d (%v), want %d", s.answered, err, answered)
		}
		return s
	}
	r.applySummary(summaryAt(now, a.id-1), env(now+2))
	if capOf() != 2 {
		t.Fatalf("a summary planned before the grant lowered its bound to %d", capOf())
	}
	r.applySummary(summaryAt(now+3, a.id), env(now+4))
	if capOf() != 1 {
		t.Fatalf("a summary planned after the grant left the bound at %d, want 1", capOf())
	}
	// Long after the grant, an old summary's fall applies (the owner let go of what it
	// held: only refusals can follow).
	lim.SetCap(k, size, end, 2)
	r.asks.noteRaised(k, a, 2, now, 100)
	r.applySummary(summaryAt(now, a.id-1), env(now+500))
	if capOf() != 1 {
		t.Fatalf("a stale summary after the hold left the bound at %d, want 1", capOf())
	}

	// The owner's side: the newest request of the member's current origin it answered.
	var s slots
	s.noteAnswered("b#1", 7)
	s.noteAnswered("b#1", 5)
	if got := s.answeredOf("b#1"); got != 7 {
		t.Fatalf("answered %d, want 7", got)
	}
	if got := s.answeredOf("b#2"); got != 0 {
		t.Fatalf("a new incarnation's answered %d, want 0", got)
	}
	s.noteAnswered("b#2", 1)
	if got := s.answeredOf("b#1"); got != 0 {
		t.Fatalf("an old incarnation's answered %d, want 0", got)
	}
}

// boundAtZero is member b with its key bound at 0 in the current window, and a check of
// it refused.
func boundAtZero(t *testing.T) memberB {
	t.Helper()
	m := newMemberB()
	m.lim.SetCap(m.k, m.size, m.end, 0)
	if m.lim.Check(m.k, 1, m.limit).Allowed {
		t.Fatal("a check allowed beyond a bound of 0")
	}
	return m
}

// asked is b's request for one hit of its key, sent at now with a wait of 25 ms.
func (m memberB) asked(t *testing.T) *ask {
	t.Helper()
	a, first, ok := m.r.asks.start(m.k, m.size, m.end, m.now, 25)
	if !ok || !first {
		t.Fatal("no request")
	}
	m.r.request(m.k, a, 1, m.now, 25)
	return a
}

// ownerSilent has b take its key's owner a for silent.
func (m memberB) ownerSilent() {
	m.r.awaitMu.Lock()
	m.r.silent["a"] = m.now
	m.r.awaitMu.Unlock()
}

// A request for room that its owner did not answer in time takes no part of the limit
// when the node has no summary of the window and the owner is live (only slow, or
// settling): every member new to the key doing so would add up beyond the limit beside
// the owner's grants. Once the owner is silent (awaitOwners), a member's part is taken.
func TestUnansweredRequestTakesAPartOnlyFromASilentOwner(t *testing.T) {
	m := boundAtZero(t)
	r, lim, k, size, end, now := m.r, m.lim, m.k, m.size, m.end, m.now
	env := m.env(now)
	a := m.asked(t)
	if r.fallBack(k, a, end, env) {
		c, _ := lim.CapIn(k, size, end)
		t.Fatalf("took a part (bound %d) while the owner is live", c)
	}
	m.ownerSilent()
	if !r.fallBack(k, a, end, env) {
		t.Fatal("took no part while the owner is silent")
	}
	if c, _ := lim.CapIn(k, size, end); c != 5 {
		t.Fatalf("bound %d, want a member's part 5", c)
	}
}

// TestAnswerAfterTheWaitBeforeTheFlush: an answer that comes after its request's
// deadline, while the check that asked has not given up on it yet (held up on a busy
// machine) and before a flush has sent this node's value since, is applied: the owner
// holds the grant until that value. The check then takes no part of the free room
// beside the grant, whatever it takes the owner for.
func TestAnswerAfterTheWaitBeforeTheFlush(t *testing.T) {
	m := boundAtZero(t)
	r, lim, k, size, end, now := m.r, m.lim, m.k, m.size, m.end, m.now
	a := m.asked(t)
	ans := grantAnswer{origin: "a#1", id: a.id, bucket: "token_create", key: k.ID, endMS: end, grant: 1}
	if _, applied, late := r.answer(ans, now+40, 100); !applied || !late {
		t.Fatalf("an answer after the wait, before the flush: applied %v, after the deadline %v; want both", applied, late)
	}
	if granted, answered := r.asks.result(a); !granted || !answered {
		t.Fatalf("the request: granted %v, answered %v; want both", granted, answered)
	}
	m.ownerSilent() // a member's part would be taken now
	if r.fallBack(k, a, end, m.env(now+41)) {
		t.Fatal("the check took a part beside the grant")
	}
	if c, _ := lim.CapIn(k, size, end); c != 1 {
		t.Fatalf("bound %d, want the grant's 1", c)
	}
}

// TestUnansweredRequestsMakeTheOwnerSilent: a node whose bound of a window is 0 counts no
// hit there and sends no value of it; its requests for room are all its owner hears of
// it. An owner that left one unanswered for ownerWait (killed, not yet declared dead) is
// taken for silent as one that left a value waiting, and the node takes its part.
func TestUnansweredRequestsMakeTheOwnerSilent(t *testing.T) {
	m := boundAtZero(t)
	r, lim, k, size, end, now := m.r, m.lim, m.k, m.size, m.end, m.now
	ask := func(at int64) bool {
		a, _, ok := r.asks.start(k, size, end, at, 25)
		if !ok {
			t.Fatal("no request")
		}
		r.request(k, a, 1, at, 25)
		took := r.fallBack(k, a, end, m.env(at))
		r.asks.end(k, a, 0)
		return took
	}
	if ask(now) {
		t.Fatal("took a part at the first request left unanswered")
	}
	later := now + ownerWait(m.env(now))
	r.awaitOwners(nil, m.env(later))
	if !r.ownerSilent(k, m.env(later)) {
		t.Fatalf("the owner is not silent %d ms after a request it left unanswered", later-now)
	}
	if !ask(later) {
		t.Fatal("took no part while the owner is silent")
	}
	if c, _ := lim.CapIn(k, size, end); c != 5 {
		t.Fatalf("bound %d, want a member's part 5", c)
	}
}

// TestOthersCountAloneLeavesACounterBound: b has just joined and a state transfer told
// it a's count of a key (no summary of the owner's yet). Its first hit of the window is
// still bound, and asks the owner for room, rather than counted up to the limit less a
// count that may be old: a's count alone says nothing of what a may still count.
func TestOthersCountAloneLeavesACounterBound(t *testing.T) {
	m := newMemberB()
	r, lim, k, end, now := m.r, m.lim, m.k, m.end, m.now
	lim.OnUnknown(func(k limiter.Key, limit uint32, sizeMS, endMS int64) {
		r.unknown(k, limit, sizeMS, endMS, m.env(lim.NowMS()))
	})
	asked := 0
	lim.OnBoundRefused(func(limiter.Key, uint32, int64, int64, time.Time) bool { asked++; return false })
	v := value{bucket: "token_create", id: k.ID, sizeMS: m.size, endMS: end, count: 3}
	if r.slots.merge("a#1", v, now, now) != merged {
		t.Fatal("a's value not merged")
	}
	if s, _ := lim.Lookup(k); s.Remote != 3 {
		t.Fatalf("remote %d, want a's 3", s.Remote)
	}
	if lim.Check(k, 1, m.limit).Allowed || asked != 1 {
		t.Fatalf("first hit: allowed without the owner (asked %d times)", asked)
	}
	if c, ok := lim.CapIn(k, m.size, end); !ok || c != 0 {
		t.Fatalf("bound %d (set %v), want 0", c, ok)
	}
	// With the owner's summary of the window in, the counter is what the summary says.
	r.slots.setAgg(k, m.size, end, 3, 0, now)
	k2 := limiter.Key{Bucket: k.Bucket, ID: k.ID + "x"}
	for ownerOf("token_create", k2.ID, []string{"a", "b"}) != "a" {
		k2.ID += "x"
	}
	r.slots.setAgg(k2, m.size, end, 3, 0, now)
	if !lim.Check(k2, 1, m.limit).Allowed {
		t.Fatal("a key the owner summed up, unbound, refused its first hit")
	}
}

// memberB is member b of a two-member cluster in owner replication and the grants, with
// a key of token_create (10 an hour) that the other member, a, owns.
type memberB struct {
	lim            *limiter.Limiter
	r              *replicator
	k              limiter.Key
	limit          limiter.Limit
	size, end, now int64
}

func newMemberB() memberB {
	lim := limiter.New(limiter.Options{Replicated: true})
	m := memberB{lim: lim, r: newReplicator(lim, "b#1", true), limit: limiter.Limit{Count: 10, Window: time.Hour},
		k: limiter.Key{Bucket: lim.Bucket("token_create"), ID: "192.0.2.1"}}
	for ownerOf("token_create", m.k.ID, []string{"a", "b"}) != "a" {
		m.k.ID += "0"
	}
	m.size = m.limit.Window.Milliseconds()
	m.now = lim.NowMS()
	m.end = windowEnd(m.now, m.size)
	return m
}

// env is b's share-mode view at at.
func (memberB) env(at int64) shareEnv {
	return shareEnv{now: at, intervalMS: 100, live: func(n string) bool { return n == "a" }, members: 2,
		relay: true, grants: true, names: []string{"a", "b"}, self: "b", grantMax: 100,
		owns: func(limiter.Key) bool { return false }}
}

// TestRequestForRoomEndsByTheCheckDeadline: a check whose decision is due before the
// grants' wait is over waits for the owner only until then, and one with no time left
// sends no request at all.
func TestRequestForRoomEndsByTheCheckDeadline(t *testing.T) {
	a, b := grantPair(t, false)
	lim := limiter.Limit{Count: 10, Window: time.Hour}
	id := "192.0.2.1"
	for ownerOf("token_create", id, []string{"a", "b"}) != "a" {
		id += "0"
	}
	k := limiter.Key{Bucket: b.lim.Bucket("token_create"), ID: id}
	if !b.lim.Check(k, 1, lim).Allowed {
		t.Fatal("the first check refused")
	}
	size := lim.Window.Milliseconds()
	end := windowEnd(b.nowMS(), size)
	a.leaving.Store(true) // the owner answers no request
	sent := func() float64 { return counter(t, b.m.grants.WithLabelValues("asked", "sent")) }

	before := sent()
	if b.askRoom(k, 1, size, end, time.Now().Add(-time.Millisecond)) {
		t.Fatal("room granted with no time left")
	}
	if got := sent(); got != before {
		t.Fatalf("%g requests sent with no time left to wait for them", got-before)
	}

	// The wait is 200 ms (grantPair); the decision is due in 30.
	// (Unanswered, the request may still take a member's part: fallBack.)
	began := time.Now()
	b.askRoom(k, 1, size, end, began.Add(30*time.Millisecond))
	if took := time.Since(began); took >= 200*time.Millisecond {
		t.Fatalf("waited %v for the owner, past the check's decision due in 30ms", took)
	}
	if got := sent(); got != before+1 {
		t.Fatalf("%g requests sent, want 1", got-before)
	}
}

// trio is a key of limit 2 that a owns, in a cluster of a, b and c, at the moment of
// TestSummaryHoldsTheGrantItCarries's race: the owner granted b 1 hit and planned a
// summary carrying that grant as b's bound; the answer reached b too late to apply, and
// b's value sent by its flush past the deadline (bound 0) is at the owner. sum is the
// summary, not yet at b.
type trio struct {
	a, b, c   trioNode
	names     []string
	limit     limiter.Limit
	size, end int64
	now       int64
	id        string
	sum       summary
}

type trioNode struct {
	name string
	lim  *limiter.Limiter
	r    *replicator
}

func (tr *trio) env(n trioNode, at int64) shareEnv {
	return shareEnv{now: at, intervalMS: 100, live: func(m string) bool { return m != n.name && slices.Contains(tr.names, m) },
		members: 3, relay: true, grants: true, names: tr.names, self: n.name, grantMax: 100, waitMS: 25,
		owns: func(limiter.Key) bool { return n.name == "a" }}
}

func (tr *trio) key(n trioNode) limiter.Key {
	return limiter.Key{Bucket: n.lim.Bucket("token_create"), ID: tr.id}
}

// ask has n ask the owner for want hits at at, and returns the request and the answer.
func (tr *trio) ask(t *testing.T, n trioNode, want uint32, at int64) (*ask, grantAnswer) {
	t.Helper()
	q, first, ok := n.r.asks.start(tr.key(n), tr.size, tr.end, at, 25)
	if !ok || !first {
		t.Fatalf("%s: no request", n.name)
	}
	req, err := decodeAsk(encodeAsk(n.r.request(tr.key(n), q, want, at, 25)))
	if err != nil {
		t.Fatal(err)
	}
	ans, ok := tr.a.r.grant(req, tr.env(tr.a, at+1))
	if !ok {
		t.Fatalf("the owner did not answer %s", n.name)
	}
	return q, ans
}

// send delivers n's value of the key, as its flush at at sends it, to the owner.
func (tr *trio) send(t *testing.T, n trioNode, at int64) value {
	t.Helper()
	v, _ := n.r.ownValue(tr.key(n), tr.size, tr.end)
	m, err := decode(pack3(at, n.r.origin, []value{v})[0])
	if err != nil {
		t.Fatal(err)
	}
	tr.a.r.receive(m, true, at+1)
	return v
}

// allowed is how many of 2 checks each b and c allow.
func (tr *trio) allowed() int {
	n := 0
	for _, m := range []trioNode{tr.b, tr.c} {
		for range 2 {
			if m.lim.Check(tr.key(m), 1, tr.limit).Allowed {
				n++
			}
		}
	}
	return n
}

func newTrio(t *testing.T) *trio {
	t.Helper()
	mk := func(name string) trioNode {
		lim := limiter.New(limiter.Options{Replicated: true})
		return trioNode{name, lim, newReplicator(lim, name+"#1", true)}
	}
	tr := &trio{a: mk("a"), b: mk("b"), c: mk("c"), names: []string{"a", "b", "c"},
		limit: limiter.Limit{Count: 2, Window: time.Hour}}
	tr.id = keyOwned(tr.names, "a", "b")
	tr.size = tr.limit.Window.Milliseconds()
	tr.now = tr.a.lim.NowMS()
	tr.end = windowEnd(tr.now, tr.size)
	now := tr.now
	// b and c are new to the key: bound at 0, each check asks the owner (by hand here).
	for _, n := range []trioNode{tr.b, tr.c} {
		n.lim.SetCap(tr.key(n), tr.size, tr.end, 0)
		if n.lim.Check(tr.key(n), 1, tr.limit).Allowed {
			t.Fatalf("%s allowed a check beyond a bound of 0", n.name)
		}
	}
	q, ans := tr.ask(t, tr.b, 1, now)
	if ans.grant != 1 {
		t.Fatalf("the owner granted b %d, want 1", ans.grant)
	}
	// c's value tells the owner of its demand: b's next window is shared.
	tr.send(t, tr.c, now+2)
	// The summary the owner plans now, while it holds the grant for b.
	res := tr.a.r.flush(tr.env(tr.a, now+5))
	es := res.summaries["b"]
	if len(es) != 1 || !es[0].planned || !es[0].curCapped || es[0].cur != 1 {
		t.Fatalf("the owner's summary to b: %+v, want b's bound 1 (the grant it holds)", es)
	}
	sum, err := decodeSummary(packSummaries(now+5, tr.a.r.origin, tr.env(tr.a, now).raiseMS(), es)[0])
	if err != nil {
		t.Fatal(err)
	}
	tr.sum = sum
	// The answer comes after b's deadline and b's next flush (a busy machine): it is
	// not applied, and the check that asked is refused.
	tr.b.r.asks.due(now + 41)
	if _, applied, _ := tr.b.r.answer(ans, now+42, 100); applied {
		t.Fatal("an answer after the flush past the deadline was applied")
	}
	tr.b.r.asks.end(tr.key(tr.b), q, 0)
	tr.send(t, tr.b, now+41) // that flush's value: bound 0
	return tr
}

// TestSummaryHoldsTheGrantItCarries: the owner grants member b room, and holds it for b
// until b's next value; b lets the answer go (it came after b's flush past the
// request's deadline). The owner's summary, planned while it held the grant, carries
// b's bound with the grant in it, and crosses b's next value, which shows b's bound
// without it. b may still raise its bound by the summary, so the owner must keep the
// room held until b could no longer apply it: given to c too, it would be counted twice.
func TestSummaryHoldsTheGrantItCarries(t *testing.T) {
	tr := newTrio(t)
	now := tr.now
	// The summary arrives at b after its value left, and raises b's bound.
	tr.b.r.applySummary(tr.sum, tr.env(tr.b, now+43))
	if cb, _ := tr.b.lim.CapIn(tr.key(tr.b), tr.size, tr.end); cb != 1 {
		t.Fatalf("b's bound %d after the summary, want 1", cb)
	}
	// b's next flush shows the raise, though b has no demand to report.
	if due := tr.b.r.asks.due(now + 44); !slices.Contains(due, tr.key(tr.b)) {
		t.Fatalf("b's next flush sends %v, want its value of the key", due)
	}
	// c asks for the whole limit: the owner gives it what nobody holds.
	qc, ansc := tr.ask(t, tr.c, 2, now+50)
	if ansc.grant != 1 {
		t.Fatalf("the owner granted c %d, want 1: b may hold the other", ansc.grant)
	}
	if _, applied, _ := tr.c.r.answer(ansc, now+51, 100); ansc.grant > 0 && !applied {
		t.Fatalf("c did not apply a grant of %d", ansc.grant)
	}
	tr.c.r.asks.end(tr.key(tr.c), qc, 0)
	if n := tr.allowed(); n > int(tr.limit.Count) {
		t.Fatalf("b and c allowed %d, over the limit of %d", n, tr.limit.Count)
	}
}

// TestSummaryTooLateToApplyFreesItsGrant: a summary that reaches b after b could apply
// its raise has b send its value at once, and that value frees the hit the owner held
// for b, though b has no more demand to report. Without it the hit stays idle until the
// window ends.
func TestSummaryTooLateToApplyFreesItsGrant(t *testing.T) {
	tr := newTrio(t)
	late := tr.sum.sentAt + tr.sum.raiseMS + 10
	tr.b.r.applySummary(tr.sum, tr.env(tr.b, late))
	if cb, _ := tr.b.lim.CapIn(tr.key(tr.b), tr.size, tr.end); cb != 0 {
		t.Fatalf("b's bound %d after a summary too late to raise it, want 0", cb)
	}
	if due := tr.b.r.asks.due(late + 1); !slices.Contains(due, tr.key(tr.b)) {
		t.Fatalf("b's next flush sends %v, want its value of the key", due)
	}
	tr.send(t, tr.b, late+1)
	qc, ansc := tr.ask(t, tr.c, 2, late+10)
	if ansc.grant != 2 {
		t.Fatalf("the owner granted c %d, want 2: b holds nothing", ansc.grant)
	}
	if _, applied, _ := tr.c.r.answer(ansc, late+11, 100); !applied {
		t.Fatal("c did not apply its grant")
	}
	tr.c.r.asks.end(tr.key(tr.c), qc, 0)
	if n := tr.allowed(); n != int(tr.limit.Count) {
		t.Fatalf("b and c allowed %d, want the limit of %d", n, tr.limit.Count)
	}
}

// TestRaiseOfAKeyNotAskedForSendsNoValue: a summary raising the bound of a key the
// member did not ask room for leaves its value to the usual flushes (lazy values far
// from a limit): the owner holds no grant for it that the value would free.
func TestRaiseOfAKeyNotAskedForSendsNoValue(t *testing.T) {
	m := boundAtZero(t)
	sum := func(at int64) summary {
		e := summaryEntry{bucket: "token_create", id: m.k.ID, sizeMS: m.size, endMS: m.end, planned: true, cur: 3, curCapped: true}
		s, err := decodeSummary(packSummaries(at, "a#1", 200, []summaryEntry{e})[0])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	m.r.applySummary(sum(m.now), m.env(m.now+1))
	if c, _ := m.lim.CapIn(m.k, m.size, m.end); c != 3 {
		t.Fatalf("bound %d after the summary, want 3", c)
	}
	if due := m.r.asks.due(m.now + 2); slices.Contains(due, m.k) {
		t.Fatalf("a raise of a key not asked for sends its value at the next flush: %v", due)
	}
	// Once the member asked room for it in the window, a raise does.
	m.lim.SetCap(m.k, m.size, m.end, 0)
	a := m.asked(t)
	m.r.asks.end(m.k, a, 0)
	m.r.asks.due(a.deadline + 1)
	m.r.applySummary(sum(a.deadline+2), m.env(a.deadline+3))
	if due := m.r.asks.due(a.deadline + 4); !slices.Contains(due, m.k) {
		t.Fatalf("a raise of a key asked for: the next flush sends %v, want its value", due)
	}
}
