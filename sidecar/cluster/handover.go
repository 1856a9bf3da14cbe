package cluster

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// The handover: a member that stops granting for a key tells the key's new owner what
// it knew of it: every origin's count in the current window and what that origin may
// hold (its bound, the grants and the bounds planned for it), as an owner counts them
// when it grants. The new owner holds each origin's part as it was told (a grant's
// floor, until the origin's own values show its bound). Two moments call for it:
//
//   - A key's owner that stops (Stop) hands its keys to the members that own them once
//     it is gone (and every other member a handover with nothing in it), and leaves.
//     A member that has its handover takes it for no owner from then on, before its
//     Leave arrives (updateOwners): the new owner grants at once, rather than refuse
//     every request until the members' values have come to it (settleMove), so a key
//     near its limit loses no admission when its owner leaves gracefully. The leaver
//     answers no more requests for room, and forwards those that still reach it to the
//     keys' next owners. A member that stops without a handover (killed) still costs
//     that wait.
//
//   - A member that answered for a newcomer's keys (handing) hands them to it when it
//     stops answering; one that answered for none tells it so at once (a handover with
//     nothing in it). A newcomer grants for a key only once the member that owned it
//     before has handed it over (or handoverWait after it settled, from one that never
//     does): two members never grant from the same room at once, whatever the time
//     their messages take.
//
//     handover := handoverKind(1 byte) flags(1 byte) [deflated] leaving(1 byte) origin(string)
//     state (as in a relay message: version 2 messages, one per origin, whose
//     values' bound is what the origin may hold)
//
// Only members that announce featureHandover get it; the others get the counts alone,
// as a relay message.
const (
	handoverKind byte = 'H'
	// featureHandover, in the second byte of a member's metadata, says it takes a
	// handover.
	featureHandover byte = 16
)

// takesHandover reports whether a member's metadata announces featureHandover.
func takesHandover(meta []byte) bool {
	return len(meta) >= 2 && meta[1]&featureHandover != 0
}

// packHandover encodes, as sent at sentAt by origin, the parts of the origins of the
// keys origin hands over (byOrigin: their values, the bound being what each may hold);
// leaving says origin is leaving the cluster.
func packHandover(sentAt int64, origin string, leaving bool, byOrigin map[string][]value) [][]byte {
	items := stateItems(byOrigin, func(o string) *packer { return newPacker2(sentAt, o, maxPacket-64) })
	head := appendString([]byte{0}, origin)
	if leaving {
		head[0] = 1
	}
	if len(items) == 0 {
		return [][]byte{append([]byte{handoverKind, 0}, head...)}
	}
	return packItems(handoverKind, func(int) []byte { return head }, items)
}

// handover is a decoded handover message.
type handover struct {
	from    string // the origin that sent it
	leaving bool
	msgs    []message
}

// decodeHandover parses a handover message.
func decodeHandover(b []byte) (handover, error) {
	var h handover
	raw, err := body(b, handoverKind)
	if err != nil {
		return h, err
	}
	if len(raw) == 0 || raw[0] > 1 {
		return h, errMalformed
	}
	h.leaving = raw[0] == 1
	r := reader{b: raw[1:]}
	h.from = r.string()
	if r.err != nil || h.from == "" || len(h.from) > maxString {
		return h, errMalformed
	}
	if h.msgs, err = decodeState(r.b); err != nil {
		return handover{}, err
	}
	for _, m := range h.msgs {
		if m.version != version2 {
			return handover{}, errMalformed
		}
	}
	return h, nil
}

// handover returns, by destination, the parts of the keys of a current window that
// dest maps to a member ("": none): by origin, each origin's value with the bound it may
// hold as this node counts it when it grants (its bound, grants and the bounds lately
// planned for it), this node's own among them. Only live origins are included: the
// others hold their count, which the counts handed with it carry.
// A leaving node's own part is its count: it counts no more.
func (s *slots) handover(env shareEnv, leaving bool, dest func(bucket, id string) string) map[string]map[string][]value {
	s.mu.Lock()
	keys := make(map[limiter.Key]struct{}, len(s.keys))
	for k := range s.keys {
		keys[k] = struct{}{}
	}
	s.mu.Unlock()
	s.lim.Each(func(k limiter.Key, snap limiter.Snapshot) {
		if snap.EndMS > env.now {
			keys[k] = struct{}{}
		}
	})
	out := map[string]map[string][]value{}
	for k := range keys {
		bucket := s.lim.BucketName(k.Bucket)
		to := dest(bucket, k.ID)
		if to == "" {
			continue
		}
		snap, _ := s.lim.Lookup(k)
		v, ok := s.shareView(k, snap, env)
		if !ok {
			continue
		}
		end := v.startMS + v.sizeMS
		self := v.self
		self.name, self.claim = s.self, max(self.claim, self.count)
		for _, p := range append(v.peers, self) {
			if !p.live {
				continue
			}
			hold := max(p.count, s.claimOf(k, p.name, v.sizeMS, end, env))
			if p.name == s.self {
				hold = self.claim
				if leaving {
					hold = self.count
				}
			}
			val := value{bucket: bucket, id: k.ID, sizeMS: v.sizeMS, endMS: end, count: uint32(min(max(p.count, 0), math.MaxUint32)),
				share: true, capped: true, cap: uint32(min(max(hold, 0), math.MaxUint32-1)), limit: uint32(min(v.limit, math.MaxUint32))}
			if out[to] == nil {
				out[to] = map[string][]value{}
			}
			out[to][p.name] = append(out[to][p.name], val)
		}
	}
	return out
}

// claimOf is what origin may hold of k in the window of sizeMS ending at endMS as this
// node, its owner, knows: the bound it reported, what this node granted it, and the
// bound this node planned for it in a summary (of this window, sent less than raiseMS
// ago; of the window before, for this one), which it may still apply. What share mode
// only projects an origin to need is not a claim: the new owner projects for itself.
func (s *slots) claimOf(k limiter.Key, origin string, sizeMS, endMS int64, env shareEnv) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	oid, ok := s.origins[origin]
	ks := s.keys[k]
	if !ok || ks == nil {
		return 0
	}
	var c int64
	for _, sl := range ks.slots {
		if sl.origin != oid || sl.sizeMS != sizeMS {
			continue
		}
		switch sl.endMS {
		case endMS:
			if sl.capped {
				c = max(c, int64(sl.cap))
			}
			c = max(c, int64(sl.floor))
			if sl.sumAt > 0 && env.now-sl.sumAt < env.raiseMS() && sl.sumBounds.curCapped {
				c = max(c, int64(sl.sumBounds.cur))
			}
		case endMS - sizeMS:
			if sl.sumBounds.nextCapped {
				c = max(c, int64(sl.sumBounds.next))
			}
		}
	}
	return c
}

// holdFor sets aside, as k's owner, floor hits of the window of sizeMS ending at endMS
// for origin, until a value it sends after until shows its bound (as a grant does).
func (s *slots) holdFor(k limiter.Key, origin string, endMS int64, floor uint32, until int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	oid, ok := s.origins[origin]
	if !ok {
		return
	}
	if sl := s.keys[k].slotOf(oid, endMS); sl != nil {
		sl.floor = max(sl.floor, floor)
		sl.floorUntil = max(sl.floorUntil, until)
	}
}

// takeHandover applies a handover, at env.now: each
// origin's count, and what it may hold as a floor until its own values show its bound.
// It returns how many values were of windows that had ended here.
func (r *replicator) takeHandover(msgs []message, env shareEnv) (dropped int) {
	for _, m := range msgs {
		if m.origin == r.origin {
			continue
		}
		for _, v := range m.values {
			hold := v.cap
			v.share, v.capped, v.cap, v.refused = false, false, 0, 0
			switch r.slots.merge(m.origin, v, m.sentAt, env.now) {
			case stale:
				dropped++
				continue
			case ignored:
				continue
			}
			b, ok := r.lim.LookupBucket(v.bucket)
			if !ok {
				continue
			}
			r.slots.holdFor(limiter.Key{Bucket: b, ID: v.id}, m.origin, v.endMS, hold, m.sentAt+env.raiseMS())
		}
	}
	return dropped
}

// sendHandovers hands the members that joined, once due (noteJoiners), the keys this node
// answered for them: over TCP, as a lost handover would hold the newcomer's grants up
// until handoverWait.
func (c *Cluster) sendHandovers() {
	select {
	case <-c.stop:
		return
	default:
	}
	if !c.created.Load() {
		// A member joined while memberlist.Create ran.
		time.AfterFunc(10*time.Millisecond, c.sendHandovers)
		return
	}
	now := c.nowMS()
	c.ownersMu.Lock()
	due := map[string]joiner{}
	for name, j := range c.owners.joiners {
		if j.at <= now {
			due[name] = j
			delete(c.owners.joiners, name)
		}
	}
	if len(due) > 0 {
		// From now on this node answers for none of their keys (owners.handing).
		m := make(map[string]int64, len(c.owners.handedTo)+len(due))
		if len(c.owners.handedTo) < maxGone {
			maps.Copy(m, c.owners.handedTo)
		}
		for name := range due {
			m[name] = now
		}
		c.owners.handedTo = m
	}
	c.ownersMu.Unlock()
	if len(due) == 0 {
		return
	}
	env := c.shareEnv(now)
	var parts map[string]map[string][]value
	if slices.ContainsFunc(slices.Collect(maps.Values(due)), func(j joiner) bool { return j.hands }) && env.relay {
		// After every grant this node made while it answered for them.
		c.slots.planMu.Lock()
		parts = c.slots.handover(env, false, func(bucket, id string) string {
			to := ownerOf(bucket, id, env.names)
			if j, ok := due[to]; ok && j.hands && c.ownerWithout(bucket, id, env.names, to) == c.cfg.NodeName {
				return to
			}
			return ""
		})
		c.slots.planMu.Unlock()
	}
	for name := range due {
		c.membersMu.Lock()
		n, ok := c.members[name]
		c.membersMu.Unlock()
		if !ok || !takesHandover(n.Meta) {
			continue
		}
		for _, msg := range packHandover(now, c.origin, false, parts[name]) {
			if err := c.ml.SendReliable(&n, msg); err != nil {
				c.m.sendErrors.Inc()
				break
			}
			c.m.kindMsgs.WithLabelValues(kindHandover).Inc()
			c.m.kindBytes.WithLabelValues(kindHandover).Add(float64(len(msg)))
		}
	}
}

// ownerWithout is the owner of a key among names but the member named.
func (c *Cluster) ownerWithout(bucket, id string, names []string, name string) string {
	return ownerOf(bucket, id, slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == name }))
}

// receiveHandover takes a handover (takeHandover) and notes that the member handed over
// what it knew: the keys it answered for are this node's to grant from (owners.owns).
// A member that hands its keys over to leave is no owner from then on, though its Leave
// has not arrived (updateOwners), for at most leaveTimeout: its next owners answer for
// its keys at once, and it forwards them the requests of the members it has not reached.
func (c *Cluster) receiveHandover(b []byte) {
	h, err := decodeHandover(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	now := c.nowMS()
	c.m.stale.Add(float64(c.rep.takeHandover(h.msgs, c.shareEnv(now))))
	c.ownersMu.Lock()
	c.owners.noteHandover(h.from, h.leaving, now)
	c.ownersMu.Unlock()
	if h.leaving {
		reown := func() {
			c.membersMu.Lock()
			c.updateOwners()
			c.membersMu.Unlock()
		}
		reown()
		// Listed still when that has passed (it came back at once, or its Leave never
		// reached this node), it owns its keys again.
		time.AfterFunc(leaveTimeout+time.Millisecond, reown)
	}
}

// noteHandover notes that the member whose incarnation is origin handed over its keys
// at now, leaving the cluster or not. The maps are replaced, not changed: the owners
// copied into a shareEnv read them without the lock.
func (o *owners) noteHandover(origin string, leaving bool, now int64) {
	with := func(old map[string]int64, key string) map[string]int64 {
		m := make(map[string]int64, len(old)+1)
		if len(old) < maxGone {
			maps.Copy(m, old)
		}
		m[key] = now
		return m
	}
	name := nodeName(origin)
	if leaving {
		o.leftAfterHandover = with(o.leftAfterHandover, name)
		o.leftOrigins = with(o.leftOrigins, origin)
	} else {
		o.handedOver = with(o.handedOver, name)
	}
}

// originLeft reports whether origin, a member's incarnation, handed its keys over
// to leave: it counts no more, and it sent its final counts to the keys' next owners
// before (leave.go, handoff).
func (o *owners) originLeft(origin string) bool {
	_, ok := o.leftOrigins[origin]
	return ok
}

// forgetLeave forgets that a member handed its keys over to leave, when it joins again:
// its next leave may have no handover.
func (o *owners) forgetLeave(name string) {
	if _, ok := o.leftAfterHandover[name]; !ok {
		return
	}
	m := maps.Clone(o.leftAfterHandover)
	delete(m, name)
	o.leftAfterHandover = m
}

// handedToLeave reports whether the member named, still listed, handed its keys over to
// leave less than leaveTimeout before now: it owns none and counts no more.
func (o *owners) handedToLeave(name string, now int64) bool {
	t, ok := o.leftAfterHandover[name]
	return ok && now < t+leaveTimeout.Milliseconds()
}

// handedSince reports whether the member named handed its keys over to this node at or
// after at.
func (o *owners) handedSince(name string, at int64) bool {
	t, ok := o.handedOver[name]
	return ok && t >= at
}

// handedOverBy reports whether k's owner before the last change of the members was a
// member that has left after handing its keys over.
func (o *owners) handedOverBy(bucket, id string) bool {
	if o.prev == nil || len(o.leftAfterHandover) == 0 {
		return false
	}
	p := ownerOf(bucket, id, o.prev)
	_, handed := o.leftAfterHandover[p]
	return handed && !slices.Contains(o.names, p)
}
