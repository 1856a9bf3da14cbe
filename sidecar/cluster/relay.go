package cluster

import (
	"encoding/binary"
	"maps"
	"math"
	"slices"

	"github.com/converger/edge/sidecar/limiter"
)

// Owner replication. Sending every value to every member costs each node N − 1 packets
// per value: its traffic grows with the cluster. So when every live member runs it
// (featureRelay in the second byte of its metadata), each key has one owner (ownerOf:
// the highest rendezvous hash of member name and key, the owner of the grants too), and:
//
//   - a node sends its own values of a key to the key's owner only (a report, a version 3
//     message as before, lazy as before: lazy.go), never to the others;
//   - the owner merges the reports (one slot per origin, as before), runs share mode for
//     every member counting the key (the plan each ran for itself before: the owner has
//     every member's count, demand and bound) and sends each a summary: the count of
//     every other origin (its own included), its own count, and the member's bounds in
//     the current window and the next;
//   - a member takes the summary's count as the others' (the larger of it and the sum
//     of the slots it holds: both are counts of hits that happened), and the bounds as
//     its own; it reports a bound that changed at its next flush, so that the owner sets
//     aside what it holds.
//
// A node's traffic is then its reports, one value per counted key to one owner, and its
// summaries, one per key it owns and member counting it: about two values per counted key
// whatever N. A key's owner answers a member's first value of a window at once (so a
// node new to a key learns its count within a round trip), then when the member's
// bounds change, and when the others' count changed: at every flush near the limit, else
// after a wait as lazy values do (a flush that sends the member a summary anyway takes
// along every other changed one). A member that only reads a key (Peek: the rate limit
// service's hits_addend 0, the console) reports a value of 0 to say it wants the count.
// What a flush has for one member, its values, summaries and relayed counts, goes in one
// packet (a sync bundle, bundle.go), and what waits for that member goes along when due
// soon: values and summaries share one pace per member (paceMS, packetTo).
//
// Raises and falls. A bound the owner lowers is still set aside for the member until
// the member's report shows it (the member may have used it). A raise the member
// applies only until the summary's sentAt plus raiseMS on its own clock (a summary later
// than that is not applied), and it reports the raised bound at its next flush. The
// owner plans every member of a key from one view, so a raise is room its plan gave no
// other member; it is not held as a floor, as a grant is (a floor held for a member
// whose demand stopped would keep the room from the others until its next report).
// A summary's bound that carries a floor (room held for the member: a grant, a
// handover) keeps the floor until the member could no longer apply the summary
// (summarizeKey): a member that let a grant go may still raise its bound by the summary
// after its value without the grant reached the owner.
//
// Ownership follows membership. When the owners change (a member joins, leaves, comes
// back, or the mode changes), every node sends its own values of the current windows to
// their owners at its next flush (as a window's first values), and the slots it holds
// of keys whose owner changed (a former owner holds every origin's; a member the owners'
// own counts, which summaries carry) go to the new owner as relayed values: so a node
// that dies, as owner, loses only counts that no live member held (an origin that died
// earlier in the window, known only to it). A new owner plans and summarizes a key only
// settleMove after the change (owners.owns). A sidecar stopping with SIGTERM hands its
// own counts and its owned keys' slots to the owners that follow it (leave.go).
//
//	summary := summaryKind(1 byte) flags(1 byte: bit 0 deflated) body
//	body    := sentAt(varint) origin(string) raiseMS(uvarint) answered(uvarint) n(uvarint) entry{n}
//	entry   := bucket(string) id(string) sizeMS(uvarint) endMS(varint, minus sentAt)
//	           others(uvarint) own(uvarint) bounds(1 byte) [cur(uvarint)] [next(uvarint)] part(uvarint)
//	relay   := relayKind(1 byte) flags(1 byte) state (wire.go: version 2 messages, one per origin)
//
// answered is the newest request for room of the member (its id, grant.go) the owner had
// answered when it planned the bounds: a member does not lower, by a summary planned
// before a grant it applied, the bound the grant raised (the summary and the answer may
// cross: answers are handled as they come, summaries in turn).
//
// bounds: bit 0 planned (the owner divides the key: apply the bounds), bit 1 cur present
// (bound in the current window), bit 2 next present (bound in the next one). part is what
// the member may take of the free room when a request for room goes unanswered (grant.go,
// fallBack; 0: nothing). Their first bytes are neither a counters' version nor another
// kind, and they go only to members that announce featureRelay.
const (
	summaryKind  byte = 'S'
	relayKind    byte = 'R'
	featureRelay byte = 4
	flagDeflated byte = 1
)

// summaryEntry is what a key's owner tells one member of the key.
type summaryEntry struct {
	bucket, id    string
	sizeMS, endMS int64
	// others is every origin's count but the member's, the owner's own included; own is
	// the owner's own count.
	others, own uint32
	// planned says the owner divides the key (share mode): the member's bounds are cur
	// and next, when capped, else none.
	planned               bool
	cur, next             uint32
	curCapped, nextCapped bool
	part                  uint32
	// answered is the newest request for room of the member the owner had answered
	// when it planned the entry (in the message's header: the oldest of its entries').
	answered uint64
}

// summary is one summary message.
type summary struct {
	sentAt   int64
	origin   string
	raiseMS  int64
	answered uint64
	entries  []summaryEntry
}

const (
	boundsPlanned byte = 1 << iota
	boundsCur
	boundsNext
)

// appendEntry encodes one entry of a summary sent at sentAt.
func appendEntry(b []byte, e summaryEntry, sentAt int64) []byte {
	b = appendString(b, e.bucket)
	b = appendString(b, e.id)
	b = binary.AppendUvarint(b, uint64(e.sizeMS))
	b = binary.AppendVarint(b, e.endMS-sentAt)
	b = binary.AppendUvarint(b, uint64(e.others))
	b = binary.AppendUvarint(b, uint64(e.own))
	var flags byte
	if e.planned {
		flags |= boundsPlanned
	}
	if e.curCapped {
		flags |= boundsCur
	}
	if e.nextCapped {
		flags |= boundsNext
	}
	b = append(b, flags)
	if e.curCapped {
		b = binary.AppendUvarint(b, uint64(e.cur))
	}
	if e.nextCapped {
		b = binary.AppendUvarint(b, uint64(e.next))
	}
	return binary.AppendUvarint(b, uint64(e.part))
}

// packSummaries encodes entries into summary messages of at most about maxPacket bytes.
func packSummaries(sentAt int64, origin string, raiseMS int64, entries []summaryEntry) [][]byte {
	items := make([][]byte, len(entries))
	answered := uint64(math.MaxUint64)
	for i, e := range entries {
		items[i] = appendEntry(nil, e, sentAt)
		answered = min(answered, e.answered)
	}
	head := func(n int) []byte {
		h := binary.AppendVarint(nil, sentAt)
		h = appendString(h, origin)
		h = binary.AppendUvarint(h, uint64(max(raiseMS, 0)))
		h = binary.AppendUvarint(h, answered)
		return binary.AppendUvarint(h, uint64(n))
	}
	return packItems(summaryKind, head, items)
}

// packItems packs encoded items, after head(n) for the n items of each, into messages
// of kind: filled to rawPerPacket3 and compressed, and split again at maxPacket when
// they compress too little.
func packItems(kind byte, head func(n int) []byte, items [][]byte) [][]byte {
	var out [][]byte
	pack := func(limit int, items [][]byte, f func(body []byte, n int, seg [][]byte)) {
		var body []byte
		n, from := 0, 0
		for i, it := range items {
			if n > 0 && len(head(n+1))+len(body)+len(it) > limit {
				f(append(head(n), body...), n, items[from:i])
				body, n, from = nil, 0, i
			}
			body = append(body, it...)
			n++
		}
		if n > 0 {
			f(append(head(n), body...), n, items[from:])
		}
	}
	pack(rawPerPacket3, items, func(body []byte, _ int, seg [][]byte) {
		if c := deflate([]byte{kind, flagDeflated}, body); len(c) <= maxPacket {
			out = append(out, c)
			return
		}
		pack(maxPacket, seg, func(body []byte, _ int, _ [][]byte) {
			out = append(out, deflate([]byte{kind, flagDeflated}, body))
		})
	})
	return out
}

// body returns the body of a summary or relay message of kind, inflated.
func body(b []byte, kind byte) ([]byte, error) {
	if len(b) < 2 || b[0] != kind || b[1]&^flagDeflated != 0 {
		return nil, errMalformed
	}
	if b[1]&flagDeflated == 0 {
		return b[2:], nil
	}
	return inflate(b[2:])
}

// decodeSummary parses a summary message; the strings it returns are copies.
func decodeSummary(b []byte) (summary, error) {
	var s summary
	raw, err := body(b, summaryKind)
	if err != nil {
		return s, err
	}
	r := reader{b: raw}
	s.sentAt = r.varint()
	s.origin = r.string()
	raise := r.uvarint()
	s.answered = r.uvarint()
	n := r.uvarint()
	if r.err != nil || s.origin == "" || raise > 60_000 || n > uint64(len(r.b)) {
		return s, errMalformed
	}
	s.raiseMS = int64(raise)
	s.entries = make([]summaryEntry, 0, n)
	for range n {
		e := summaryEntry{bucket: r.string(), id: r.string()}
		size := r.uvarint()
		e.endMS = s.sentAt + r.varint()
		others, own := r.uvarint(), r.uvarint()
		if r.err != nil || len(r.b) == 0 || size == 0 || size > maxWindowMS || others > math.MaxUint32 || own > math.MaxUint32 {
			return s, errMalformed
		}
		flags := r.b[0]
		r.b = r.b[1:]
		if flags&^(boundsPlanned|boundsCur|boundsNext) != 0 {
			return s, errMalformed
		}
		e.sizeMS, e.others, e.own, e.planned = int64(size), uint32(others), uint32(own), flags&boundsPlanned != 0
		if flags&boundsCur != 0 {
			c := r.uvarint()
			e.cur, e.curCapped = uint32(min(c, math.MaxUint32-1)), true
		}
		if flags&boundsNext != 0 {
			c := r.uvarint()
			e.next, e.nextCapped = uint32(min(c, math.MaxUint32-1)), true
		}
		part := r.uvarint()
		if r.err != nil || part > math.MaxUint32 {
			return s, errMalformed
		}
		e.part = uint32(part)
		s.entries = append(s.entries, e)
	}
	if r.err != nil || len(r.b) != 0 {
		return s, errMalformed
	}
	return s, nil
}

// packRelay encodes other origins' counts, by origin, into relay messages: version 1
// values (a count, none of share mode's fields: those only the origin itself sends).
func packRelay(sentAt int64, byOrigin map[string][]value) [][]byte {
	items := stateItems(byOrigin, func(o string) *packer { return newPacker(sentAt, o, maxPacket-32) })
	return packItems(relayKind, func(int) []byte { return nil }, items)
}

// stateItems packs each origin's values, the origins in the order of their names, with
// the packer pack makes for it, into state messages: the items of a packItems message.
func stateItems(byOrigin map[string][]value, pack func(origin string) *packer) [][]byte {
	var items [][]byte
	for _, origin := range slices.Sorted(maps.Keys(byOrigin)) {
		p := pack(origin)
		for _, v := range byOrigin[origin] {
			p.add(v)
		}
		for _, m := range p.messages() {
			items = append(items, appendState(nil, m))
		}
	}
	return items
}

// packRelayShare encodes one origin's value, with share mode's fields, as sent at
// sentAt (the origin's clock), into a relay message: a grant made for a key's new owner
// (grant.go, handedGrant).
func packRelayShare(sentAt int64, origin string, v value) [][]byte {
	p := newPacker2(sentAt, origin, maxPacket-32)
	p.add(v)
	var items [][]byte
	for _, m := range p.messages() {
		items = append(items, appendState(nil, m))
	}
	return packItems(relayKind, func(int) []byte { return nil }, items)
}

// decodeRelay parses a relay message into its messages.
func decodeRelay(b []byte) ([]message, error) {
	raw, err := body(b, relayKind)
	if err != nil {
		return nil, err
	}
	msgs, err := decodeState(raw)
	if err == nil && len(msgs) == 0 {
		err = errMalformed
	}
	return msgs, err
}

// relayedPackets is what a flush in owner replication sends each member, by name: its
// values of the keys the member owns, the member's summaries of the keys this node
// owns, and the counts relayed to it as their keys' new owner; each kind in as few
// messages as it fits, to be bundled for a member that reads sync bundles (bundle.go).
func relayedPackets(now int64, origin string, env shareEnv, res flushResult) map[string][][]byte {
	byName := map[string][][]byte{}
	for name, vs := range res.routed {
		byName[name] = append(byName[name], pack3(now, origin, vs)...)
	}
	for name, es := range res.summaries {
		byName[name] = append(byName[name], packSummaries(now, origin, env.raiseMS(), es)...)
	}
	for name, byOrigin := range res.relays {
		byName[name] = append(byName[name], packRelay(now, byOrigin)...)
	}
	return byName
}

// paceMS is, in owner replication, the shortest time between two packets to one member
// that carry only values or summaries that waited (lazy.go). Such values come due at
// every moment; sent as they come due, with those due within lazySlack intervals, each
// owner would get a packet about every lazySlack intervals, and a node's packets would
// grow with the number of members. So beyond 3 members a member gets them at most every
// lazySlack intervals times half the other members (a 3-member cluster's two): a node
// sends at most two such packets a second at the default interval however many members
// there are, and those values reach their owner up to that much later (the projections
// of lazy allow for it: a counter that could come near its limit before is sent at once).
// A value waits no longer than its window's last interval in any case (lazy.go), so a
// pace longer than a window only makes that window's last interval the value's time.
func (e shareEnv) paceMS() int64 {
	if e.members <= 3 {
		return 0
	}
	return lazySlack * e.intervalMS * int64(e.members-1) / 2
}

// raiseIntervals bounds, in sync intervals (and the grants' wait), how long after a
// summary was sent a member applies a raise of its bound in it.
const raiseIntervals = 2

// raiseMS is how long after a summary's sentAt a member applies a raise in it.
func (e shareEnv) raiseMS() int64 { return raiseIntervals*e.intervalMS + e.waitMS }

// owned reports that, in owner replication, k's owner is this node (settled or not).
func (e shareEnv) owned(k limiter.Key, lim *limiter.Limiter) bool {
	return e.ownerOf(lim.BucketName(k.Bucket), k.ID) == e.self
}

// reroute is run by a flush when the owners or the mode changed since the last one: it
// returns this node's keys whose values go again at once (all of a current window, to
// their new owners or, leaving owner replication, to everyone), and the slots it holds
// of keys whose owner changed, by their new owner.
func (r *replicator) reroute(env shareEnv) (again []limiter.Key, relays map[string]map[string][]value) {
	lastNames, lastRelay := r.lastNames, r.lastRelay
	r.lastNames, r.lastRelay = slices.Clone(env.names), env.relay
	moved := func(bucket, id string) bool {
		if !env.relay || !lastRelay {
			return true
		}
		return ownerOf(bucket, id, lastNames) != env.ownerOf(bucket, id)
	}
	r.lim.Each(func(k limiter.Key, s limiter.Snapshot) {
		if (s.Own > 0 || s.Refused > 0) && s.EndMS > env.now && moved(r.lim.BucketName(k.Bucket), k.ID) {
			if !env.relay || !env.owned(k, r.lim) {
				again = append(again, k)
				delete(r.sent, k) // a first value: sent at once, and once more
			}
		}
	})
	if !env.relay {
		return again, nil
	}
	relays = map[string]map[string][]value{}
	r.slots.each(env.now, func(origin string, k limiter.Key, sl slot) {
		bucket := r.lim.BucketName(k.Bucket)
		to := env.ownerOf(bucket, k.ID)
		if to == env.self || to == "" || !moved(bucket, k.ID) || sl.count == 0 {
			return
		}
		if relays[to] == nil {
			relays[to] = map[string][]value{}
		}
		relays[to][origin] = append(relays[to][origin], value{bucket: bucket, id: k.ID, sizeMS: sl.sizeMS, endMS: sl.endMS, count: sl.count})
	})
	return again, relays
}

// summarize returns the summaries due at env.now of the keys this node owns among keys
// (and of those whose lazy summaries are due), by member name; the members of along get
// a packet of values from this flush anyway.
func (r *replicator) summarize(keys map[limiter.Key]struct{}, env shareEnv, along map[string]struct{}) map[string][]summaryEntry {
	for k, at := range r.sumWaiting {
		if at <= env.now {
			keys[k] = struct{}{}
			delete(r.sumWaiting, k)
		}
	}
	var cands []candidate
	for k := range keys {
		if !env.owns(k) {
			delete(r.sumRecheck, k)
			if env.owned(k, r.lim) {
				// A new owner, settling: its summaries wait until it has.
				r.sumWaiting[k] = env.now + env.intervalMS
			}
			continue
		}
		var recheck bool
		r.slots.planMu.Lock()
		cands, recheck = r.slots.summarizeKey(k, env, r.share, "", cands)
		r.slots.planMu.Unlock()
		if recheck {
			r.sumRecheck[k] = struct{}{}
		} else {
			delete(r.sumRecheck, k)
		}
	}
	return r.choose(cands, env, along)
}

// candidate is an entry a summary may carry: must, when it is due now; else it goes
// only with a summary the member gets anyway, or at due.
type candidate struct {
	to    string // member name
	k     limiter.Key
	e     summaryEntry
	must  bool
	lazy  bool  // must only as its wait is over: paced (paceMS)
	due   int64 // when it is due, since the member's last summary (since)
	since int64
	apply func() // notes it sent (the caller holds no lock)
}

// choose keeps the candidates due now, and those of members that get a packet anyway (a
// summary, or values: along); the others wait (sumWaiting).
// Those due only as their wait is over go to a member at most every paceMS.
func (r *replicator) choose(cands []candidate, env shareEnv, along map[string]struct{}) map[string][]summaryEntry {
	pace := env.paceMS()
	sending := map[string]bool{}
	for _, c := range cands {
		if c.must && !sending[c.to] {
			last, ok := r.packetTo[c.to]
			_, withValues := along[c.to]
			sending[c.to] = withValues || !c.lazy || !ok || env.now-last >= pace
		}
	}
	var out map[string][]summaryEntry
	for _, c := range cands {
		_, withValues := along[c.to]
		// A member that gets values and no summary: the entries due soon go with them,
		// as waiting values go with a packet to their owner (lazy.go, takeAlong).
		soon := withValues && dueSoon(c.due, c.since, env)
		if !sending[c.to] && !soon {
			due := c.due
			if c.must {
				due = r.packetTo[c.to] + pace
			}
			if at, ok := r.sumWaiting[c.k]; !ok || due < at {
				r.sumWaiting[c.k] = due
			}
			continue
		}
		if out == nil {
			out = map[string][]summaryEntry{}
		}
		out[c.to] = append(out[c.to], c.e)
		r.slots.planMu.Lock()
		c.apply()
		r.slots.planMu.Unlock()
	}
	for to := range out {
		r.packetTo[to] = env.now
	}
	return out
}

// replies returns the summaries a key's owner sends at once to the origin of a message
// it merged, of the keys it owns in it: the first of the window, bounds the report moves,
// and the others' count near the limit, as a flush would send them, a flush's wait
// sooner (not what only waited: the next flush sends it).
func (r *replicator) replies(m message, env shareEnv) []summaryEntry {
	if !env.relay {
		return nil
	}
	var cands []candidate
	seen := map[limiter.Key]bool{}
	for _, v := range m.values {
		b, ok := r.lim.LookupBucket(v.bucket)
		if !ok {
			continue
		}
		k := limiter.Key{Bucket: b, ID: v.id}
		if seen[k] || !env.owns(k) {
			continue
		}
		seen[k] = true
		r.slots.planMu.Lock()
		cands, _ = r.slots.summarizeKey(k, env, r.share, m.origin, cands)
		r.slots.planMu.Unlock()
	}
	var out []summaryEntry
	for _, c := range cands {
		// An entry that only waited (paced) goes with the next flush's packet to the
		// member, which takes along what else waits for it, not in a packet of its own.
		if c.must && !c.lazy {
			out = append(out, c.e)
			r.slots.planMu.Lock()
			c.apply()
			r.slots.planMu.Unlock()
		}
	}
	return out
}

// summarizeKey adds to cands the entries of k, which this node owns, for the live
// members counting it in the current window (only the origin reply, when given: an
// answer to its report). With share mode it plans each member's bounds, as the member
// planned its own before; recheck says the key is to be planned at every flush, as a
// node with the grants plans its own bound while it holds more than it counted or is
// bound in the next window. The caller holds planMu.
func (s *slots) summarizeKey(k limiter.Key, env shareEnv, share bool, reply string, cands []candidate) (_ []candidate, recheck bool) {
	snap, _ := s.lim.Lookup(k)
	s.mu.Lock()
	ks := s.keys[k]
	if ks == nil || len(ks.slots) == 0 {
		s.mu.Unlock()
		return cands, false
	}
	size := snap.SizeMS
	if size == 0 {
		size = ks.slots[0].sizeMS
	}
	if size <= 0 {
		s.mu.Unlock()
		return cands, false
	}
	end := windowEnd(env.now, size)
	own := uint32(0)
	if snap.SizeMS == size && snap.EndMS == end {
		own = snap.Own
	}
	total := uint64(own)
	type member struct {
		origin   string
		name     string
		count    uint32
		first    bool
		reported bool // since its last summary
	}
	var members []member
	limit := int64(snap.Limit)
	for _, sl := range ks.slots {
		if sl.sizeMS != size || sl.endMS != end {
			continue
		}
		total += uint64(sl.count)
		if limit == 0 {
			limit = int64(sl.limit)
		}
		origin := s.names[sl.origin]
		name := nodeName(origin)
		if cur, known := s.current[name]; !env.live(name) || (known && cur != sl.origin) {
			continue
		}
		if reply != "" && origin != reply {
			continue
		}
		members = append(members, member{origin: origin, name: name, count: sl.count, first: sl.sumAt == 0, reported: sl.mergedAt > sl.sumAt})
	}
	s.mu.Unlock()
	// Near the limit (the count, at its rate so far, would reach half of it by the
	// window's end), a member's bound follows its reports by any amount, as a node's
	// own did when it sent its value anyway; farther, only by amounts worth a message,
	// so that a bound and the report of it do not chase each other.
	near := nearLimit(total, limit, size, end, env)
	for _, m := range members {
		e := summaryEntry{bucket: s.lim.BucketName(k.Bucket), id: k.ID, sizeMS: size, endMS: end,
			others: uint32(min(total-uint64(m.count), math.MaxUint32)), own: own, answered: s.answeredOf(m.origin)}
		var p sharePlan
		var v shareView
		if share {
			var ok bool
			if v, p, ok = s.planMember(k, snap, env, m.origin, m.reported, near); ok {
				e.planned = true
				recheck = recheck || v.recheck(p)
				e.cur, e.curCapped = uint32(min(max(p.cur, 0), math.MaxUint32-1)), p.curCapped
				e.next, e.nextCapped = uint32(min(max(p.next, 0), math.MaxUint32-1)), p.nextCapped
				limit = v.limit
				if v.grants && v.farBelow() {
					e.part = uint32(min(max(v.limit-v.self.held()-v.othersHold(), 0)/int64(max(v.members, 1)), math.MaxUint32))
				}
			}
		}
		s.mu.Lock()
		oid := s.origins[m.origin]
		sl := ks.slotOf(oid, end)
		if sl == nil {
			s.mu.Unlock()
			continue
		}
		// The bounds go only when they change: an entry without them leaves the member's
		// as they are (a grant it applied since, say).
		e.planned = e.planned && sl.boundsChanged(e, v.self, v.limit, env.members, env.now, env.intervalMS)
		c := candidate{to: m.name, k: k, due: env.now, since: sl.sumAt}
		switch {
		case m.first || e.planned:
			c.must = true
		case e.others != sl.sumOthers || e.own != sl.sumOwn || e.part != sl.sumPart:
			// The others' count moved: near the limit, in the answer to a report or once an
			// interval; else after a wait.
			snapM := limiter.Snapshot{Own: m.count, Remote: e.others, Limit: uint32(max(limit, 0)), SizeMS: size, EndMS: end}
			w := longestWait(snapM, sentAt{at: sl.sumAt, sizeMS: size, endMS: end, own: m.count}, env)
			c.due = sl.sumAt + max(w, env.intervalMS)
			c.must = (w == 0 && reply != "") || env.now >= c.due || end-env.now <= env.intervalMS
			c.lazy = w > 0 && end-env.now > env.intervalMS
		default:
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		c.e = e
		now, raiseMS := env.now, env.raiseMS()
		c.apply = func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			sl := s.keys[k].slotOf(oid, end)
			if sl == nil {
				return
			}
			sl.sumAt, sl.sumOthers, sl.sumOwn, sl.sumPart = now, e.others, e.own, e.part
			if !e.planned {
				return
			}
			sl.sumBounds = boundsOf(e)
			if e.curCapped && sl.floor > 0 && (!sl.capped || e.cur > sl.cap) {
				// The bound carries room held for the member (a grant, a handover) that
				// its reports do not show: the member may raise its bound to it until
				// raiseMS after now, so the room stays held until a value it sent after
				// that shows its bound. (A grant the member let go and a value sent
				// before it applied this summary would otherwise free the room twice.)
				sl.floorUntil = max(sl.floorUntil, now+raiseMS)
			}
		}
		cands = append(cands, c)
	}
	return cands, recheck
}

// nearLimit reports whether a key's count of every node, total, could reach half its
// limit before a value that waits (lazyAfter) would be sent and delivered, at twice its
// rate so far in the window ending at end: the projection of lazy values (lazy.go) for
// the cluster as a whole.
func nearLimit(total uint64, limit, size, end int64, env shareEnv) bool {
	if limit <= 0 {
		return false
	}
	elapsed := float64(max(env.now-(end-size), env.intervalMS))
	horizon := float64(min(lazyAfter(env, size)+2*env.intervalMS, max(end-env.now, 0)))
	return 2*(float64(total)+2*float64(total)/elapsed*horizon) >= float64(limit)
}

// slotOf is the slot of origin oid in the window ending at end (the caller holds mu).
func (ks *keyState) slotOf(oid uint32, end int64) *slot {
	if ks == nil {
		return nil
	}
	for i := range ks.slots {
		if ks.slots[i].origin == oid && ks.slots[i].endMS == end {
			return &ks.slots[i]
		}
	}
	return nil
}

// bounds are a member's bounds in the current window and the next, as a summary gives
// them (none: not capped).
type bounds struct {
	cur, next             uint32
	curCapped, nextCapped bool
}

func boundsOf(e summaryEntry) bounds {
	b := bounds{curCapped: e.curCapped, nextCapped: e.nextCapped}
	if b.curCapped {
		b.cur = e.cur
	}
	if b.nextCapped {
		b.next = e.next
	}
	return b
}

// boundsChanged reports whether the member's bounds planned in e differ from what it
// holds (self: the member as the owner planned it) or, in the next window, from what it
// was last sent; unless this node sent them lately (less than three intervals ago: the
// member's report of them may be on its way). members is how many live members divide
// the limit.
func (sl *slot) boundsChanged(e summaryEntry, self shareNode, limit int64, members int, now, intervalMS int64) bool {
	b, last := boundsOf(e), sl.sumBounds
	curHolds := b.curCapped == self.capped && (!b.curCapped || int64(b.cur) == self.claim)
	// The next window's bound: a rise goes once it is worth a message, a fall once it is
	// worth a member's part of that, else either goes in the window's last two
	// intervals, before the window it bounds begins. Far from the limit the plan moves
	// every member's next bound by a few hits at every report as their demands move:
	// sent at once, each such move would cost a summary to every member at every
	// report. The bounds of the next window divide the limit, so what the falls that
	// wait free may have gone to another member at once as a large rise; together they
	// are less than a releaseShare-th of the limit (a member's part of it each), and
	// they go before the window begins.
	var nextHolds bool
	switch {
	case b.nextCapped != last.nextCapped:
	case !b.nextCapped || b.next == last.next:
		nextHolds = true
	default:
		move, worth := int64(b.next)-int64(last.next), max(limit/releaseShare, 1)
		if move < 0 {
			move, worth = -move, max(limit/releaseShare/int64(max(members, 1)), 1)
		}
		nextHolds = move < worth && e.endMS-now > 2*intervalMS
	}
	if curHolds && nextHolds {
		return false
	}
	return sl.sumAt == 0 || last != b || now-sl.sumAt >= 3*intervalMS
}

// planMember is share mode's plan of member origin's bounds of k, by this node, its
// owner: the member's view as this node knows it (the member's count, demand and bound
// from its reports, with what this node set aside for it; this node among the others).
// reported says the member sent a value since its last summary, and near that the key is
// near its limit (nearLimit): then, as a node sending its value anyway, its bound may
// move by any amount (else only by one worth a message). Far from the limit a member's
// values wait (lazy.go): one whose demand did not grow in a while is not taken to be
// silent.
// The caller holds planMu.
func (s *slots) planMember(k limiter.Key, snap limiter.Snapshot, env shareEnv, origin string, reported, near bool) (shareView, sharePlan, bool) {
	v, ok := s.shareView(k, snap, env)
	if !ok {
		return v, sharePlan{}, false
	}
	i := slices.IndexFunc(v.peers, func(n shareNode) bool { return n.name == origin })
	if i < 0 || !v.peers[i].shares || !v.peers[i].live {
		return v, sharePlan{}, false
	}
	m := v.peers[i]
	// Bound: by its report, or by what this node set aside for it (a raise on its way).
	m.claimed = m.capped || m.floor > 0
	m.capped = m.claimed
	if m.floor > 0 {
		m.claim = max(m.claim, m.floor)
	}
	if !near && m.demand > 0 {
		m.grewAt = env.now
	}
	v.peers[i] = v.self
	v.self = m
	v.sending = reported && near
	p := v.plan()
	if m.floor > 0 && p.curCapped && p.cur < m.claim {
		// Room set aside for it lately (a grant, a raise) that its reports do not show
		// yet: its bound does not fall under it, as a node's own plan never lowered a
		// bound a grant had just raised.
		p.cur = m.claim
	}
	return v, p, true
}

// applySummary applies a key owner's summary at env.now: the others' counts, the
// owner's own count (a slot, so that a later owner hears of it), and the bounds, unless
// this node takes itself for the key's owner (the members' views of the owners differ
// for a moment after a change). A key whose bound changed is reported to the owner at
// the next flush. It returns how many entries were of windows that had ended here.
func (r *replicator) applySummary(m summary, env shareEnv) (dropped int) {
	now := env.now
	r.heard(nodeName(m.origin))
	for _, e := range m.entries {
		b, ok := r.slots.bucket(e.bucket)
		if !ok || e.id == "" || len(e.id) > maxString {
			continue
		}
		k := limiter.Key{Bucket: b, ID: e.id}
		if e.endMS <= now {
			dropped++
			continue
		}
		if e.own > 0 {
			r.slots.merge(m.origin, value{bucket: e.bucket, id: e.id, sizeMS: e.sizeMS, endMS: e.endMS, count: e.own}, m.sentAt, now)
		}
		r.slots.setAgg(k, e.sizeMS, e.endMS, e.others, e.part, now)
		if !e.planned || !r.share || (env.relay && env.owned(k, r.lim)) {
			continue
		}
		raise := now <= m.sentAt+m.raiseMS
		if g, ok := r.asks.raisedAfter(k, e.endMS, m.answered, now); ok && e.curCapped && e.cur < g {
			// Planned before a grant this node applied since: not below what it raised.
			e.cur = g
		}
		r.slots.planMu.Lock()
		before, had := r.lim.CapIn(k, e.sizeMS, e.endMS)
		r.applyBound(k, e.sizeMS, e.endMS, e.cur, e.curCapped, raise)
		r.applyBound(k, e.sizeMS, e.endMS+e.sizeMS, e.next, e.nextCapped, raise)
		after, has := r.lim.CapIn(k, e.sizeMS, e.endMS)
		r.slots.planMu.Unlock()
		switch {
		case had && (!has || after < before):
			// A fall goes to the owner at the next flush: it sets aside what this node
			// held until a report shows the fall. (A raise, or a first bound, it set
			// aside already.)
			r.asks.noteGranted(k)
		case had && e.curCapped && e.cur > before && r.asks.askedIn(k, e.endMS):
			// A raise, applied or too late to apply, where this node asked for room: the
			// owner may hold a grant for it that the summary carries until a value shows
			// the bound, and this node may have no more demand to send one for. The next
			// flush's value shows the raised bound, or was sent after the raise could be
			// applied: either lets the owner go of what it held. (Only there: a value
			// for every raise would undo the waits of lazy values.)
			r.asks.noteGranted(k)
		}
	}
	return dropped
}

// applyBound sets k's bound in the window of sizeMS ending at endMS to bound (none when
// not capped), and reports whether it changed; raise says a higher bound may be applied.
func (r *replicator) applyBound(k limiter.Key, sizeMS, endMS int64, bound uint32, capped, raise bool) bool {
	cur, had := r.lim.CapIn(k, sizeMS, endMS)
	switch {
	case !capped && had:
		r.lim.ClearCap(k, sizeMS, endMS)
		return true
	case !capped || (had && cur == bound) || (had && bound > cur && !raise):
		return false
	}
	r.lim.SetCap(k, sizeMS, endMS, bound)
	return true
}

// setAgg notes the others' count of k in the window of sizeMS ending at endMS, as its
// owner reported it, and what the member may take when a request for room goes
// unanswered; the limiter gets the larger of it and the sum of the slots.
func (s *slots) setAgg(k limiter.Key, sizeMS, endMS int64, others, part uint32, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keys[k]
	if ks == nil {
		ks = &keyState{}
		s.keys[k] = ks
	}
	a := &ks.agg[0]
	if ks.agg[1].endMS == endMS || (ks.agg[0].endMS != endMS && ks.agg[1].endMS < ks.agg[0].endMS) {
		a = &ks.agg[1]
	}
	if a.endMS != endMS || a.sizeMS != sizeMS {
		*a = aggregate{sizeMS: sizeMS, endMS: endMS}
	}
	a.others = max(a.others, others)
	a.part = part
	s.publishLocked(k, ks, sizeMS, endMS, now)
}

// aggOf is k's others' count as its owner last reported it, in the window of sizeMS
// ending at endMS (the caller holds mu).
func (ks *keyState) aggOf(sizeMS, endMS int64) *aggregate {
	if ks == nil {
		return nil
	}
	for i := range ks.agg {
		if a := &ks.agg[i]; a.endMS == endMS && a.sizeMS == sizeMS {
			return a
		}
	}
	return nil
}

// takeAggPart raises this node's bound of k in the window ending at endMS by the part of
// the free room its owner's last summary offered, once (grant.go, fallBack), and
// reports whether it did. The caller holds planMu.
func (s *slots) takeAggPart(k limiter.Key, sizeMS, endMS int64) bool {
	s.mu.Lock()
	part := uint32(0)
	if a := s.keys[k].aggOf(sizeMS, endMS); a != nil {
		part, a.part = a.part, 0
	}
	s.mu.Unlock()
	return part > 0 && s.lim.RaiseCap(k, sizeMS, endMS, part)
}

// unknown is told of a counter this node has no bound of in a window, before its first
// hit there is counted (limiter.OnUnknown). In owner replication, the counter of a limit
// the grants divide that another node owns is bound at a small part of a member's part
// (a 32nd: 0 for the small limits of logins and tokens), so that a hit beyond it asks the
// owner for room, as the owner knows every member's count, rather than be counted alone
// by a node that knows none (it would allow up to the limit). A larger limit's counter
// counts unbound until the owner's first summary, a round trip after this node's first
// value (the first window of a key, as share mode cannot bound it either). A counter
// whose owner is silent (awaitOwners) is bound at a member's part of the limit, whatever
// the limit. The others' count alone, as a state transfer brings it to a node that has
// just joined, does not keep the counter unbound: only the owner knows what the others
// hold, so the counter is bound until the owner's summary of the window (with the bound
// the owner plans for it) is in.
func (r *replicator) unknown(k limiter.Key, limit uint32, sizeMS, endMS int64, env shareEnv) {
	if !env.relay || !r.share || env.owned(k, r.lim) || r.slots.known(k, sizeMS, endMS) {
		return
	}
	switch {
	case r.ownerSilent(k, env):
		r.lim.SetCap(k, sizeMS, endMS, memberPart(limit, env))
	case env.grantsFor(int64(limit)):
		r.lim.SetCap(k, sizeMS, endMS, memberPart(limit, env)/(2*releaseShare))
	}
}

// ownerSilent reports whether k's owner let a value wait for its summary longer than
// ownerWait lately (awaitOwners): stopped or cut off, not yet declared dead.
func (r *replicator) ownerSilent(k limiter.Key, env shareEnv) bool {
	r.awaitMu.Lock()
	defer r.awaitMu.Unlock()
	_, silent := r.silent[env.ownerOf(r.lim.BucketName(k.Bucket), k.ID)]
	return silent
}

// memberPart is a member's part of a limit: what each takes while the owner is silent.
func memberPart(limit uint32, env shareEnv) uint32 {
	return limit / uint32(max(env.members, 1))
}

// ownerWait is how long a node waits for the owner's summary of a key after its first
// value of a window before it takes the owner for silent (a node that stopped, or is cut
// off, but is not yet declared dead): five sync intervals and the grants' wait, well
// beyond the owner's answer (a round trip) and its settling after a change.
func ownerWait(env shareEnv) int64 { return 5*env.intervalMS + env.waitMS }

// awaitOwners notes the values a flush sends to owners that have sent no summary of
// their keys in the window yet, and binds, at a member's part of the limit, the counters
// whose owner has let one wait longer than ownerWait: then each member serves its part
// until the owner is heard from again or the membership declares it dead (another member
// owns its keys then), so that the limit holds without it.
func (r *replicator) awaitOwners(sent []value, env shareEnv) {
	r.awaitMu.Lock()
	defer r.awaitMu.Unlock()
	for _, v := range sent {
		b, ok := r.lim.LookupBucket(v.bucket)
		if !ok {
			continue
		}
		r.await(limiter.Key{Bucket: b, ID: v.id}, v.sizeMS, v.endMS, env.now)
	}
	for k, a := range r.awaiting {
		if a.endMS <= env.now || r.slots.known(k, a.sizeMS, a.endMS) || env.owned(k, r.lim) {
			delete(r.awaiting, k)
			continue
		}
		if env.now-a.at < ownerWait(env) {
			continue
		}
		delete(r.awaiting, k)
		r.silent[env.ownerOf(r.lim.BucketName(k.Bucket), k.ID)] = env.now
		s, ok := r.lim.Lookup(k)
		if !r.share || !ok || s.Limit == 0 {
			continue
		}
		own := uint32(0)
		if s.SizeMS == a.sizeMS && s.EndMS == a.endMS {
			own = s.Own
		}
		part := max(memberPart(s.Limit, env), own)
		if c, ok := r.lim.CapIn(k, a.sizeMS, a.endMS); !ok || c > part {
			r.lim.SetCap(k, a.sizeMS, a.endMS, part)
			r.asks.noteGranted(k)
		}
	}
	for name := range r.silent {
		if !slices.Contains(env.names, name) {
			delete(r.silent, name)
		}
	}
}

// await notes, at now, that this node waits for the owner's summary of k's window of
// sizeMS ending at endMS, unless it has one or waits already. The caller holds awaitMu.
func (r *replicator) await(k limiter.Key, sizeMS, endMS, now int64) {
	if a, ok := r.awaiting[k]; (!ok || a.endMS != endMS) && !r.slots.known(k, sizeMS, endMS) {
		r.awaiting[k] = awaited{at: now, sizeMS: sizeMS, endMS: endMS}
	}
}

// awaitAnswer notes a request for room of k's window of sizeMS ending at endMS that its
// owner left unanswered, at now: a node whose bound there is too small to count a hit
// sends no value of the window, and it waits for the owner as one that did.
func (r *replicator) awaitAnswer(k limiter.Key, sizeMS, endMS, now int64) {
	r.awaitMu.Lock()
	defer r.awaitMu.Unlock()
	r.await(k, sizeMS, endMS, now)
}

// heard notes a message from the member named: it is not silent.
func (r *replicator) heard(name string) {
	r.awaitMu.Lock()
	delete(r.silent, name)
	r.awaitMu.Unlock()
}
