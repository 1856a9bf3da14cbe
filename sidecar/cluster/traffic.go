package cluster

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/traffic"
)

// The console's live view of a cluster is one node's merged view (docs/core.md, "The
// console"): the node answering the console asks the others for their own per-minute
// decision counts (sidecar/traffic) when it is read, at most once per TrafficInterval,
// and offers the keys whose counts the others report to its table of busy keys, so that
// any node answers for the whole cluster. Nobody watching, the live view costs nothing
// on the network; watched, one query and one answer per member per TrafficInterval,
// from the watched node only. Members of earlier releases, which do not announce
// featureViewQuery, neither ask nor answer: every node sends them its counts every
// TrafficInterval, as they do to everyone.
//
// A traffic message is, like the counters, state rather than increments: one origin's
// decisions of one bucket in one minute only grow, and a receiver keeps the larger of
// two reports.
//
//	traffic := trafficKind(1 byte) sentAt(varint, Unix ms) origin(string) n(uvarint) entry{n}
//	entry   := bucket(string) minute(varint, minutes before sentAt's) allowed(uvarint) denied(uvarint)
//	query   := viewQueryKind(1 byte) sentAt(varint, Unix ms) origin(string)
//
// Their first bytes are not the counters' version, so a node that does not know them
// counts them as malformed and ignores them.
const (
	trafficKind   byte = 'T'
	viewQueryKind byte = 'V'
	// featureViewQuery, in the second byte of a member's metadata, says it answers
	// view queries (and so is not sent its counts unasked).
	featureViewQuery byte = 2
)

// DefaultTrafficInterval is how often a node's live view asks the others for their
// minute counts while it is read (and sends its own to members of earlier releases).
const DefaultTrafficInterval = 5 * time.Second

// viewWait bounds how long a read of the live view waits for the members' answers.
const viewWait = 300 * time.Millisecond

type trafficEntry struct {
	bucket          string
	minuteStartMS   int64
	allowed, denied uint64
}

type trafficMessage struct {
	sentAt  int64
	origin  string
	entries []trafficEntry
}

// packTraffic encodes entries into messages of at most limit bytes: at least one.
func packTraffic(sentAt int64, origin string, entries []trafficEntry, limit int) [][]byte {
	header := func(n int) []byte {
		h := []byte{trafficKind}
		h = binary.AppendVarint(h, sentAt)
		h = appendString(h, origin)
		return binary.AppendUvarint(h, uint64(n))
	}
	var out [][]byte
	var body, tmp []byte
	n := 0
	for _, e := range entries {
		tmp = appendString(tmp[:0], e.bucket)
		tmp = binary.AppendVarint(tmp, sentAt/60_000-e.minuteStartMS/60_000)
		tmp = binary.AppendUvarint(tmp, e.allowed)
		tmp = binary.AppendUvarint(tmp, e.denied)
		if n > 0 && len(header(n+1))+len(body)+len(tmp) > limit {
			out = append(out, append(header(n), body...))
			body, n = nil, 0
		}
		body = append(body, tmp...)
		n++
	}
	if n > 0 || len(out) == 0 {
		// Without a decision to report, one empty message still tells the others this
		// node is there (the console's "last heard").
		out = append(out, append(header(n), body...))
	}
	return out
}

func decodeTraffic(b []byte) (trafficMessage, error) {
	var m trafficMessage
	if len(b) < 1 || b[0] != trafficKind {
		return m, errMalformed
	}
	r := reader{b: b[1:]}
	m.sentAt = r.varint()
	m.origin = r.string()
	n := r.uvarint()
	if r.err != nil || m.origin == "" || n > uint64(len(r.b)) {
		return m, errMalformed
	}
	m.entries = make([]trafficEntry, 0, n)
	for range n {
		e := trafficEntry{bucket: r.string()}
		back := r.varint()
		e.allowed, e.denied = r.uvarint(), r.uvarint()
		if r.err != nil || back < 0 || back > traffic.Minutes {
			return m, errMalformed
		}
		e.minuteStartMS = (m.sentAt/60_000 - back) * 60_000
		m.entries = append(m.entries, e)
	}
	if r.err != nil || len(r.b) != 0 {
		return m, errMalformed
	}
	return m, nil
}

// trafficLoop sends this node's minute counts every TrafficInterval to the live members
// that do not ask for them (earlier releases).
func (c *Cluster) trafficLoop() {
	t := time.NewTicker(c.cfg.TrafficInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		var old []memberlist.Node
		for _, n := range c.peers() {
			if !answersQueries(n) {
				old = append(old, n)
			}
		}
		c.sendTraffic(c.nowMS(), old)
	}
}

// answersQueries says member n asks for the others' minute counts and answers queries.
func answersQueries(n memberlist.Node) bool {
	return len(n.Meta) >= 2 && n.Meta[1]&featureViewQuery != 0
}

// sendTraffic sends this node's minute counts to the given members.
func (c *Cluster) sendTraffic(now int64, to []memberlist.Node) {
	if len(to) == 0 {
		return
	}
	var entries []trafficEntry
	c.cfg.Traffic.Own(func(bucket string, m traffic.Minute) {
		entries = append(entries, trafficEntry{bucket, m.StartMS, m.Allowed, m.Denied})
	})
	msgs := packTraffic(now, c.origin, entries, maxPacket)
	for _, n := range to {
		for _, msg := range msgs {
			c.send(&n, kindView, msg)
		}
	}
}

// viewRound is one round of view queries: the members not heard from yet.
type viewRound struct {
	at   int64
	left map[string]bool
	done chan struct{} // closed when left is empty
}

// RefreshView makes the live view read next hold every member's minute counts of a
// moment ago: it asks the members that answer queries for theirs, at most once per
// TrafficInterval (a read within it joins the last round), and waits for their answers,
// viewWait at most or until ctx is done. Without Config.Traffic it does nothing.
func (c *Cluster) RefreshView(ctx context.Context) {
	if c.cfg.Traffic == nil {
		return
	}
	now := c.nowMS()
	c.viewMu.Lock()
	r := c.viewRound
	var ask []memberlist.Node
	if r == nil || now-r.at >= c.cfg.TrafficInterval.Milliseconds() || now < r.at {
		r = &viewRound{at: now, left: map[string]bool{}, done: make(chan struct{})}
		for _, n := range c.peers() {
			if answersQueries(n) {
				ask = append(ask, n)
				r.left[n.Name] = true
			}
		}
		if len(r.left) == 0 {
			close(r.done)
		}
		c.viewRound = r
	}
	c.viewMu.Unlock()
	if len(ask) > 0 {
		q := encodeViewQuery(now, c.origin)
		for _, n := range ask {
			c.send(&n, kindView, q)
		}
	}
	t := time.NewTimer(viewWait)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
	case <-ctx.Done():
	case <-c.stop:
	}
}

// answered notes that member name's counts arrived, for the current round.
func (c *Cluster) answered(name string) {
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	if r := c.viewRound; r != nil && r.left[name] {
		delete(r.left, name)
		if len(r.left) == 0 {
			close(r.done)
		}
	}
}

func encodeViewQuery(sentAt int64, origin string) []byte {
	b := binary.AppendVarint([]byte{viewQueryKind}, sentAt)
	return appendString(b, origin)
}

func decodeViewQuery(b []byte) (sentAt int64, origin string, err error) {
	if len(b) < 1 || b[0] != viewQueryKind {
		return 0, "", errMalformed
	}
	r := reader{b: b[1:]}
	sentAt = r.varint()
	origin = r.string()
	if r.err != nil || origin == "" || len(r.b) != 0 {
		return 0, "", errMalformed
	}
	return sentAt, origin, nil
}

// receiveViewQuery answers a member's query with this node's minute counts.
func (c *Cluster) receiveViewQuery(b []byte) {
	_, origin, err := decodeViewQuery(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	name := nodeName(origin)
	c.membersMu.Lock()
	n, ok := c.members[name]
	c.membersMu.Unlock()
	if !ok || name == c.cfg.NodeName || c.cfg.Traffic == nil {
		return
	}
	now := c.nowMS()
	c.heard(origin, 0, now)
	// A member asks at most once per TrafficInterval: a flood of queries (or of packets
	// claiming a member's name) gets at most one answer per half of it, sent to the
	// member's own address.
	c.viewMu.Lock()
	if c.answeredAt == nil || len(c.answeredAt) > maxPeerStates {
		c.answeredAt = map[string]int64{}
	}
	at, seen := c.answeredAt[name]
	recent := seen && now >= at && now-at < c.cfg.TrafficInterval.Milliseconds()/2
	if !recent {
		c.answeredAt[name] = now
	}
	c.viewMu.Unlock()
	if !recent {
		c.sendTraffic(now, []memberlist.Node{n})
		if len(n.Meta) >= 2 && n.Meta[1]&featureRelay != 0 && !c.cfg.Broadcast {
			c.sendBusy(now, n)
		}
	}
}

func (c *Cluster) receiveTraffic(b []byte) {
	m, err := decodeTraffic(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	if m.origin == c.origin {
		return
	}
	c.heard(m.origin, 0, c.nowMS())
	if c.cfg.Traffic == nil {
		return
	}
	for _, e := range m.entries {
		c.cfg.Traffic.MergeRemote(m.origin, e.bucket, traffic.Minute{StartMS: e.minuteStartMS, Allowed: e.allowed, Denied: e.denied})
	}
	c.answered(nodeName(m.origin))
}

// offerBusy offers a key whose count another node reported to the table of busy keys,
// with every node's count: a key counted only elsewhere is still among this node's
// busiest.
func (c *Cluster) offerBusy(v value) {
	b, ok := c.lim.LookupBucket(v.bucket)
	if !ok || strings.HasSuffix(v.bucket, limiter.RefundSuffix) {
		return
	}
	k := limiter.Key{Bucket: b, ID: v.id}
	s, ok := c.lim.Lookup(k)
	if !ok || s.EndMS != v.endMS {
		return // a window that has not begun here yet
	}
	total := uint64(s.Own) + uint64(s.Remote)
	c.cfg.Traffic.Offer(k, uint32(min(total, 1<<32-1)), limiter.Limit{Count: s.Limit, Window: time.Duration(s.SizeMS) * time.Millisecond}, s.EndMS)
}

// peerState is what this node knows of another member's messages.
type peerState struct {
	heardMS     int64 // when its last sync or traffic message arrived (our clock)
	syncSentAt  int64 // when it sent its newest counter values (its clock)
	staleValues uint64
}

// maxPeerStates bounds the members whose message state is kept.
const maxPeerStates = 4096

// nodeName is the member name of an origin ("<node name>#<incarnation>").
func nodeName(origin string) string {
	if i := strings.LastIndexByte(origin, '#'); i > 0 {
		return origin[:i]
	}
	return origin
}

// peer returns the state of the member of origin; the caller holds peersMu.
func (c *Cluster) peerLocked(origin string) *peerState {
	if c.peerStates == nil {
		c.peerStates = map[string]*peerState{}
	}
	name := nodeName(origin)
	p := c.peerStates[name]
	if p == nil {
		if len(c.peerStates) >= maxPeerStates {
			clear(c.peerStates)
		}
		p = &peerState{}
		c.peerStates[name] = p
	}
	return p
}

// heard notes a message that came from origin itself, not relayed in a state transfer:
// a sync message sent at syncSentAt (its clock), or a traffic message (syncSentAt 0).
func (c *Cluster) heard(origin string, syncSentAt, now int64) {
	c.peersMu.Lock()
	p := c.peerLocked(origin)
	p.heardMS = now
	p.syncSentAt = max(p.syncSentAt, syncSentAt)
	c.peersMu.Unlock()
}

// noteStale counts origin's values that were dropped as stale.
func (c *Cluster) noteStale(origin string, n int) {
	c.peersMu.Lock()
	c.peerLocked(origin).staleValues += uint64(n)
	c.peersMu.Unlock()
}

// MemberStatus is what the console shows of a member.
type MemberStatus struct {
	Name, Address string
	Self          bool
	// HeardAgo is the time since a sync or traffic message of the member arrived;
	// SyncAge the age of its newest counter values (by its clock). -1: none yet.
	HeardAgo, SyncAge time.Duration
	// StaleDropped counts its values that arrived for windows already ended here.
	StaleDropped uint64
}

// Status returns this node and the other live members, this node first, then by name.
func (c *Cluster) Status() []MemberStatus {
	now := c.nowMS()
	self := c.ml.LocalNode()
	out := []MemberStatus{{Name: c.cfg.NodeName, Address: self.Address(), Self: true, HeardAgo: 0, SyncAge: 0}}
	peers := c.peers()
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	var others []MemberStatus
	for _, n := range peers {
		ms := MemberStatus{Name: n.Name, Address: n.Address(), HeardAgo: -1, SyncAge: -1}
		if p := c.peerStates[n.Name]; p != nil {
			if p.heardMS > 0 {
				ms.HeardAgo = time.Duration(max(now-p.heardMS, 0)) * time.Millisecond
			}
			if p.syncSentAt > 0 {
				ms.SyncAge = time.Duration(max(now-p.syncSentAt, 0)) * time.Millisecond
			}
			ms.StaleDropped = p.staleValues
		}
		others = append(others, ms)
	}
	slices.SortFunc(others, func(a, b MemberStatus) int { return strings.Compare(a.Name, b.Name) })
	return append(out, others...)
}

// SyncInterval is how often this node sends its changed counters.
func (c *Cluster) SyncInterval() time.Duration { return c.cfg.SyncInterval }

// The busiest keys in owner replication. A node hears of a key only if it counts, reads
// or owns it (relay.go), so a member's answer to a view query also carries its busiest
// keys, with their counts of every node as it knows them; the asking node reads each
// (a Peek: it asks the key's owner for the count, relay.go) and offers it to its table
// of busy keys, which the next read of the live view shows with the owner's count.
//
//	busy  := busyKind(1 byte) sentAt(varint) origin(string) n(uvarint) entry{n}
//	entry := bucket(string) id(string) sizeMS(uvarint) endMS(varint, minus sentAt) count(uvarint) limit(uvarint)
//
// It goes only to members that announce featureRelay.
const (
	busyKind byte = 'B'
	// busyTop is how many of its busiest keys per bucket a node reports.
	busyTop = 10
	// maxBusy bounds the entries of one busy message a node takes.
	maxBusy = 1024
)

// busyEntry is one of a member's busiest keys.
type busyEntry struct {
	bucket, id    string
	sizeMS, endMS int64
	count, limit  uint32
}

// packBusy encodes entries into messages of at most limit bytes.
func packBusy(sentAt int64, origin string, entries []busyEntry) [][]byte {
	items := make([][]byte, len(entries))
	for i, e := range entries {
		b := appendString(nil, e.bucket)
		b = appendString(b, e.id)
		b = binary.AppendUvarint(b, uint64(e.sizeMS))
		b = binary.AppendVarint(b, e.endMS-sentAt)
		b = binary.AppendUvarint(b, uint64(e.count))
		items[i] = binary.AppendUvarint(b, uint64(e.limit))
	}
	var out [][]byte
	head := func(n int) []byte {
		h := binary.AppendVarint([]byte{busyKind}, sentAt)
		h = appendString(h, origin)
		return binary.AppendUvarint(h, uint64(n))
	}
	var body []byte
	n := 0
	for _, it := range items {
		if n > 0 && len(head(n+1))+len(body)+len(it) > maxPacket {
			out = append(out, append(head(n), body...))
			body, n = nil, 0
		}
		body = append(body, it...)
		n++
	}
	if n > 0 {
		out = append(out, append(head(n), body...))
	}
	return out
}

func decodeBusy(b []byte) (origin string, entries []busyEntry, err error) {
	if len(b) < 1 || b[0] != busyKind {
		return "", nil, errMalformed
	}
	r := reader{b: b[1:]}
	sentAt := r.varint()
	origin = r.string()
	n := r.uvarint()
	if r.err != nil || origin == "" || n > uint64(len(r.b)) || n > maxBusy {
		return "", nil, errMalformed
	}
	entries = make([]busyEntry, 0, n)
	for range n {
		e := busyEntry{bucket: r.string(), id: r.string()}
		size := r.uvarint()
		e.endMS = sentAt + r.varint()
		count, limit := r.uvarint(), r.uvarint()
		if r.err != nil || e.id == "" || size == 0 || size > maxWindowMS || count > math.MaxUint32 || limit > math.MaxUint32 {
			return "", nil, errMalformed
		}
		e.sizeMS, e.count, e.limit = int64(size), uint32(count), uint32(limit)
		entries = append(entries, e)
	}
	if r.err != nil || len(r.b) != 0 {
		return "", nil, errMalformed
	}
	return origin, entries, nil
}

// sendBusy sends this node's busiest keys to member n (an answer to its view query).
func (c *Cluster) sendBusy(now int64, n memberlist.Node) {
	var entries []busyEntry
	for _, bb := range c.cfg.Traffic.Busiest(busyTop, nil) {
		for _, k := range bb.Keys {
			entries = append(entries, busyEntry{bucket: bb.Bucket, id: k.ID, sizeMS: k.Limit.Window.Milliseconds(),
				endMS: k.WindowEndMS, count: k.Count, limit: k.Limit.Count})
		}
	}
	for _, msg := range packBusy(now, c.origin, entries) {
		c.send(&n, kindBusy, msg)
	}
}

// receiveBusy reads a member's busiest keys here, so that their owners send their counts
// (a Peek), and offers them to the table of busy keys.
func (c *Cluster) receiveBusy(b []byte) {
	origin, entries, err := decodeBusy(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	if origin == c.origin || c.cfg.Traffic == nil {
		return
	}
	now := c.nowMS()
	for _, e := range entries {
		if e.endMS <= now || e.sizeMS <= 0 || strings.HasSuffix(e.bucket, limiter.RefundSuffix) {
			continue
		}
		bucket, ok := c.slots.bucket(e.bucket)
		if !ok || len(e.id) > maxString {
			continue
		}
		k := limiter.Key{Bucket: bucket, ID: e.id}
		lim := limiter.Limit{Count: e.limit, Window: time.Duration(e.sizeMS) * time.Millisecond}
		c.lim.Peek(k, lim)
		c.cfg.Traffic.Offer(k, e.count, lim, e.endMS)
	}
}
