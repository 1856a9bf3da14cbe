package cluster

import (
	"math"
	"strings"
	"sync"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/sidecar/limiter"
)

// maxBuckets bounds the bucket names other nodes can make this node register.
const maxBuckets = 1024

// slots is the replicated half of every G-counter: for each key, one slot per remote
// origin holding that origin's own count in its latest window. Merging takes the
// maximum per origin and window, so a value applied twice, late or out of order
// changes nothing. The sum of a key's slots for the current window goes to the
// limiter, whose hot path adds it to this node's own count.
type slots struct {
	lim  *limiter.Limiter
	self string
	// planMu serializes share mode's plan of a key and the grants (grant.go), so that
	// no bound is set from a view older than a grant applied or made. It is taken per
	// key, so that a grant waits for one plan, not a whole flush.
	planMu sync.Mutex
	// answered is, by node name, the newest request for room of its current origin that
	// this node answered as a key's owner (guarded by planMu): summaries carry it.
	answered map[string]answeredRequest

	mu      sync.Mutex
	origins map[string]uint32
	names   []string
	keys    map[limiter.Key]*keyState
	// pending lists keys holding a slot for a window that has not begun on this node's
	// clock (a sender whose clock is ahead); the sum goes to the limiter when it begins.
	pending map[limiter.Key]struct{}
	// touched lists keys merged since the last tick, for share mode; recheck the keys
	// whose plan is made again at every tick though nothing was heard or counted (this
	// node holds more than it counted, or bounds the next window), so that an idle
	// node's bound falls to its count in time.
	touched map[limiter.Key]struct{}
	recheck map[limiter.Key]struct{}
	// current maps a node name to its newest origin that sent to this node directly:
	// an earlier incarnation of a restarted node is no longer a live member.
	current map[string]uint32
}

type keyState struct {
	slots []slot
	// agg is the other origins' count as the key's owner last reported it to this node
	// (relay.go), in up to two windows (a sender's clock may be ahead).
	agg [2]aggregate
	// This node's own demand (count and refused hits) as share mode last saw it: in the
	// window ending at ownEnd, and in the window before it (ownPrevEnd).
	ownSizeMS          int64
	ownEnd, ownPrevEnd int64
	ownDemand, ownPrev uint32
	ownGrewAt          int64 // when ownDemand last grew (at a tick)
}

type slot struct {
	origin uint32
	sizeMS int64
	endMS  int64
	count  uint32
	// What share mode knows of the origin in this window, from its version 2 values
	// (share): the hits its bound refused, its bound, the limit it counted with, and
	// when it sent them.
	share   bool
	refused uint32
	cap     uint32
	capped  bool
	limit   uint32
	at      int64
	grewAt  int64 // when its demand in the window last grew (the message's time)
	// The origin's demand in the window before this one, when it was known here
	// (prevEnd is that window's end).
	prevEnd    int64
	prevDemand uint32
	// floor is the bound this node, the key's owner, granted the origin, held for it
	// until a value sent after floorUntil (the origin's clock: the latest moment it
	// applies a grant), or one with a bound as high, shows its own (grant.go).
	floor      uint32
	floorUntil int64
	// What this node, the key's owner, last sent the origin in a summary (relay.go): when
	// (0: nothing yet in this window), the others' count, its own, the part offered, and
	// the bounds.
	sumAt                      int64
	sumOthers, sumOwn, sumPart uint32
	sumBounds                  bounds
	// mergedAt is when the origin's last value with share mode's fields was merged
	// here (this node's clock).
	mergedAt int64
}

// aggregate is the other origins' count of a key in one window as its owner reported
// it, and the part of the free room the owner offered (relay.go).
type aggregate struct {
	sizeMS, endMS int64
	others, part  uint32
}

// demand is what the origin was asked for in the slot's window: its count and the hits
// its bound refused.
func (sl slot) demand() uint32 {
	return uint32(min(uint64(sl.count)+uint64(sl.refused), math.MaxUint32))
}

func newSlots(lim *limiter.Limiter, self string) *slots {
	return &slots{
		lim: lim, self: self,
		origins: map[string]uint32{},
		keys:    map[limiter.Key]*keyState{},
		pending: map[limiter.Key]struct{}{},
		touched: map[limiter.Key]struct{}{},
		recheck: map[limiter.Key]struct{}{},
		current: map[string]uint32{},
	}
}

// mergeResult says what became of a value.
type mergeResult int

const (
	merged  mergeResult = iota
	stale               // its window has ended here
	ignored             // our own origin, or an invalid bucket or id
)

// merge applies one origin's value at time now (Unix ms); sentAt is when the message
// holding it was sent.
func (s *slots) merge(origin string, v value, sentAt, now int64) mergeResult {
	if v.endMS <= now {
		return stale
	}
	if origin == s.self || v.id == "" || len(v.id) > maxString {
		return ignored
	}
	b, ok := s.bucket(v.bucket)
	if !ok {
		return ignored
	}
	k := limiter.Key{Bucket: b, ID: v.id}
	s.mu.Lock()
	defer s.mu.Unlock()
	oid := s.intern(origin)
	ks := s.keys[k]
	if ks == nil {
		ks = &keyState{}
		s.keys[k] = ks
	}
	found := false
	for i := range ks.slots {
		sl := &ks.slots[i]
		if sl.origin != oid {
			continue
		}
		found = true
		switch {
		case v.endMS > sl.endMS:
			prev := slot{}
			if sl.sizeMS == v.sizeMS && sl.endMS == v.endMS-v.sizeMS {
				prev = *sl
			}
			*sl = newSlot(oid, v, sentAt)
			if prev.endMS != 0 {
				sl.prevEnd, sl.prevDemand = prev.endMS, prev.demand()
			}
		case v.endMS == sl.endMS && v.sizeMS == sl.sizeMS:
			before := sl.demand()
			sl.count = max(sl.count, v.count)
			// The bound may go down as well as up: the newest message's holds.
			if v.share && sentAt >= sl.at {
				sl.share, sl.refused, sl.cap, sl.capped, sl.limit, sl.at = true, max(sl.refused, v.refused), v.cap, v.capped, v.limit, sentAt
			}
			if sl.floor > 0 && v.share && (sentAt > sl.floorUntil || (sentAt >= sl.at && v.capped && v.cap >= sl.floor)) {
				// A value sent after the asker could still apply a grant, or one whose
				// bound holds all that was granted: its bound is what it holds.
				sl.floor = 0
			}
			if sl.demand() > before {
				sl.grewAt = max(sl.grewAt, sentAt)
			}
		default:
			return merged // older than what we have: nothing to do
		}
	}
	if !found {
		ks.slots = append(ks.slots, newSlot(oid, v, sentAt))
	}
	if v.share {
		if sl := ks.slotOf(oid, v.endMS); sl != nil {
			sl.mergedAt = now
		}
	}
	s.touched[k] = struct{}{}
	s.publishLocked(k, ks, v.sizeMS, v.endMS, now)
	return merged
}

func newSlot(origin uint32, v value, sentAt int64) slot {
	sl := slot{origin: origin, sizeMS: v.sizeMS, endMS: v.endMS, count: v.count, at: sentAt}
	if v.share {
		sl.share, sl.refused, sl.cap, sl.capped, sl.limit = true, v.refused, v.cap, v.capped, v.limit
	}
	if sl.demand() > 0 {
		sl.grewAt = sentAt
	}
	return sl
}

// answeredRequest is the newest request of an origin an owner answered.
type answeredRequest struct {
	origin string
	id     uint64
}

// maxAnswered bounds the node names whose answered request this node keeps; a name
// beyond it (members come and go) forgets them all, which makes a member's next
// summaries count as planned before its grants for a moment (raisedAfter): safe.
const maxAnswered = 4096

// noteAnswered notes that this node answered request id of origin. The caller holds
// planMu.
func (s *slots) noteAnswered(origin string, id uint64) {
	name := nodeName(origin)
	a, ok := s.answered[name]
	if ok && a.origin == origin && a.id >= id {
		return
	}
	if s.answered == nil || (!ok && len(s.answered) >= maxAnswered) {
		s.answered = map[string]answeredRequest{}
	}
	s.answered[name] = answeredRequest{origin: origin, id: id}
}

// answeredOf is the newest request of origin this node answered (0: none). The caller
// holds planMu.
func (s *slots) answeredOf(origin string) uint64 {
	if a, ok := s.answered[nodeName(origin)]; ok && a.origin == origin {
		return a.id
	}
	return 0
}

// sawDirect notes a message an origin sent to this node itself: it is its node's
// current incarnation.
func (s *slots) sawDirect(origin string) {
	name, _, _ := strings.Cut(origin, "#")
	s.mu.Lock()
	s.current[name] = s.intern(origin)
	s.mu.Unlock()
}

// bucket resolves a bucket name from another node.
func (s *slots) bucket(name string) (limiter.BucketID, bool) {
	if id, ok := s.lim.LookupBucket(name); ok {
		return id, true
	}
	if !buckets.ValidName(name) || s.lim.Buckets() >= maxBuckets {
		return 0, false
	}
	return s.lim.Bucket(name), true
}

func (s *slots) intern(origin string) uint32 {
	if id, ok := s.origins[origin]; ok {
		return id
	}
	id := uint32(len(s.names))
	s.origins[origin] = id
	s.names = append(s.names, origin)
	return id
}

// publishLocked hands the sum of k's slots for one window to the limiter if that window
// is the current one here, or remembers k until it is.
func (s *slots) publishLocked(k limiter.Key, ks *keyState, sizeMS, endMS, now int64) {
	if endMS-sizeMS > now {
		s.pending[k] = struct{}{}
		return
	}
	var sum uint64
	for _, sl := range ks.slots {
		if sl.sizeMS == sizeMS && sl.endMS == endMS {
			sum += uint64(sl.count)
		}
	}
	// The owner's count of the others and the slots held here both count only hits that
	// happened, each missing some: the larger misses fewer.
	if a := ks.aggOf(sizeMS, endMS); a != nil {
		sum = max(sum, uint64(a.others))
	}
	s.lim.SetRemote(k, sizeMS, endMS, uint32(min(sum, math.MaxUint32)))
}

// tick publishes the windows that began since the last tick, drops the slots of ended
// windows, and returns the keys merged since the last tick.
func (s *slots) tick(now int64) map[limiter.Key]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.pending {
		ks := s.keys[k]
		if ks == nil {
			delete(s.pending, k)
			continue
		}
		future := false
		for _, sl := range ks.slots {
			if sl.endMS-sl.sizeMS > now {
				future = true
			} else if sl.endMS > now {
				s.publishLocked(k, ks, sl.sizeMS, sl.endMS, now)
			}
		}
		for _, a := range ks.agg {
			if a.endMS-a.sizeMS > now {
				future = true
			} else if a.endMS > now {
				s.publishLocked(k, ks, a.sizeMS, a.endMS, now)
			}
		}
		if !future {
			delete(s.pending, k)
		}
	}
	touched := s.touched
	s.touched = map[limiter.Key]struct{}{}
	for k := range s.recheck {
		touched[k] = struct{}{}
	}
	return touched
}

// sweep drops the slots whose windows ended more than a window ago (share mode reads
// the demand of the window before the current one), and keys left with nothing.
func (s *slots) sweep(now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, ks := range s.keys {
		live := ks.slots[:0]
		for _, sl := range ks.slots {
			if sl.endMS+sl.sizeMS > now {
				live = append(live, sl)
			}
		}
		ks.slots = live
		aggLive := ks.agg[0].endMS > now || ks.agg[1].endMS > now
		if len(live) == 0 && !aggLive && ks.ownEnd+ks.ownSizeMS <= now {
			delete(s.keys, k)
			delete(s.pending, k)
			delete(s.recheck, k)
		}
	}
}

// each calls f for every live slot with its origin's name.
func (s *slots) each(now int64, f func(origin string, k limiter.Key, sl slot)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, ks := range s.keys {
		for _, sl := range ks.slots {
			if sl.endMS > now {
				f(s.names[sl.origin], k, sl)
			}
		}
	}
}

// shareEnv is what share mode needs of the cluster at a tick.
type shareEnv struct {
	now        int64
	intervalMS int64
	// live reports whether a node name is a live member other than this node;
	// members is the number of live members, this node included.
	live    func(name string) bool
	members int
	// left reports whether an origin (a member's incarnation) handed its keys over to
	// leave: what it counted is all it holds, whatever it was granted (nil: none did).
	left func(origin string) bool
	// grants says every live member runs the owner's grants (grant.go); owns reports
	// whether this node owns a key now, and may grant from it.
	grants bool
	owns   func(k limiter.Key) bool
	// grantMax is the largest limit the grants divide; share mode alone divides the
	// counters of larger ones.
	grantMax uint32
	// relay says every live member runs owner replication (relay.go); names are the live
	// members owners are chosen among (nil: neither grants nor owner replication), self
	// this node's name, and waitMS the grants' wait.
	relay  bool
	names  []string
	self   string
	waitMS int64
	// handing reports whether this node answers the requests for room of a key that
	// its new owner forwards (grant.go, owners.handing).
	handing func(k limiter.Key) bool
}

// ownerOf is the owner of a key of the bucket named among the env's owners ("": none).
func (e shareEnv) ownerOf(bucket, id string) string {
	if e.names == nil {
		return ""
	}
	return ownerOf(bucket, id, e.names)
}

// grantsFor says the grants divide a counter of the given limit.
func (e shareEnv) grantsFor(limit int64) bool {
	return e.grants && limit > 0 && limit <= int64(e.grantMax)
}

// shareTick runs share mode (share.go) for the keys merged or counted since the last
// tick; changed are those this node counted or refused, whose values the flush sends.
// It returns how many it bound, and the other keys whose bound is to be sent now.
func (s *slots) shareTick(keys, changed map[limiter.Key]struct{}, env shareEnv) (capped int, send []limiter.Key) {
	for k := range keys {
		if env.relay && !(env.owned(k, s.lim) && env.owns(k)) {
			// Owner replication: the key's owner plans this node's bounds (relay.go), and
			// a new owner only once it has settled.
			s.mu.Lock()
			delete(s.recheck, k)
			s.mu.Unlock()
			continue
		}
		// The owner's own bound goes to nobody: its plans of the members read it here.
		_, sending := changed[k]
		sending = sending || env.relay
		s.planMu.Lock()
		p, recheck := s.share(k, env, sending)
		s.planMu.Unlock()
		if p.curCapped {
			capped++
		}
		s.mu.Lock()
		if recheck {
			s.recheck[k] = struct{}{}
		} else {
			delete(s.recheck, k)
		}
		s.mu.Unlock()
		if p.send {
			send = append(send, k)
		}
	}
	return capped, send
}

// share sets or lifts k's bounds in the current window and the next; sending says the
// flush sends k's value anyway, recheck that the plan is made again at the next tick
// (shareView.recheck).
func (s *slots) share(k limiter.Key, env shareEnv, sending bool) (p sharePlan, recheck bool) {
	snap, _ := s.lim.Lookup(k)
	v, ok := s.shareView(k, snap, env)
	if !ok {
		return sharePlan{}, false
	}
	v.sending = sending
	p = v.plan()
	end := v.startMS + v.sizeMS
	apply := func(end int64, bound int64, on bool) {
		if on {
			s.lim.SetCap(k, v.sizeMS, end, uint32(min(max(bound, 0), math.MaxUint32-1)))
		} else {
			s.lim.ClearCap(k, v.sizeMS, end)
		}
	}
	apply(end, p.cur, p.curCapped)
	apply(end+v.sizeMS, p.next, p.nextCapped)
	return p, v.recheck(p)
}

// shareView gathers what share mode needs of k: this node's count and demand (from
// the limiter's snapshot), and each other origin's as last reported. ok is false when
// there is nothing to decide (no window, or no limit known).
func (s *slots) shareView(k limiter.Key, snap limiter.Snapshot, env shareEnv) (v shareView, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keys[k]
	size := snap.SizeMS
	if size == 0 && ks != nil && len(ks.slots) > 0 {
		size = ks.slots[0].sizeMS
	}
	if size <= 0 {
		return v, false
	}
	if ks == nil {
		ks = &keyState{}
		s.keys[k] = ks
	}
	start := env.now / size * size
	end := start + size
	v = shareView{now: env.now, startMS: start, sizeMS: size, intervalMS: env.intervalMS, limit: int64(snap.Limit), members: env.members, grants: env.grantsFor(int64(snap.Limit))}

	// This node: its snapshot is of the window it last counted in.
	own := uint64(snap.Own) + uint64(snap.Refused)
	demand := uint32(min(own, math.MaxUint32))
	if snap.SizeMS == size && snap.EndMS > ks.ownEnd {
		if ks.ownEnd == snap.EndMS-size && ks.ownSizeMS == size {
			ks.ownPrevEnd, ks.ownPrev = ks.ownEnd, ks.ownDemand
		} else {
			ks.ownPrevEnd, ks.ownPrev = 0, 0
		}
		ks.ownSizeMS, ks.ownEnd, ks.ownDemand, ks.ownGrewAt = size, snap.EndMS, demand, 0
		if demand > 0 {
			ks.ownGrewAt = env.now
		}
	} else if snap.SizeMS == size && snap.EndMS == ks.ownEnd && demand > ks.ownDemand {
		ks.ownDemand, ks.ownGrewAt = demand, env.now
	}
	v.self = shareNode{name: s.self, live: true, shares: true, at: env.now}
	if ks.ownEnd == end {
		v.self.grewAt = ks.ownGrewAt
	}
	if c, ok := s.lim.CapIn(k, size, end); ok {
		v.self.claim, v.self.claimed, v.self.capped = int64(c), true, true
	}
	switch {
	case ks.ownEnd == end:
		v.self.count, v.self.demand = int64(snap.Own), int64(ks.ownDemand)
		if ks.ownPrevEnd == start {
			v.self.prevDemand = int64(ks.ownPrev)
		}
	case ks.ownEnd == start:
		v.self.prevDemand = int64(ks.ownDemand)
	}
	if snap.EndMS != end {
		v.self.count = 0
	}

	selfName, _, _ := strings.Cut(s.self, "#")
	for _, sl := range ks.slots {
		if sl.sizeMS != size {
			continue
		}
		origin := s.names[sl.origin]
		name, _, _ := strings.Cut(origin, "#")
		cur, known := s.current[name]
		n := shareNode{name: origin, live: name != selfName && env.live(name) && (!known || cur == sl.origin), shares: sl.share, at: env.now}
		switch {
		case sl.endMS == end:
			n.count, n.demand, n.grewAt = int64(sl.count), int64(sl.demand()), sl.grewAt
			n.claim, n.claimed, n.capped, n.floor = int64(sl.cap), sl.share, sl.capped, int64(sl.floor)
			if sl.share {
				n.at = min(sl.at, env.now)
			}
			if sl.prevEnd == start {
				n.prevDemand = int64(sl.prevDemand)
			}
		case sl.endMS == start:
			n.prevDemand = int64(sl.demand())
		case sl.endMS == end+size && sl.prevEnd == end:
			// A clock ahead of ours: its count of our current window is gone, its
			// demand there is what it held.
			n.count, n.demand = int64(sl.prevDemand), int64(sl.prevDemand)
		default:
			continue
		}
		if env.left != nil && env.left(origin) {
			// Its count, handed over before it left, is final.
			n.live, n.floor = false, 0
		}
		if v.limit == 0 {
			v.limit = int64(sl.limit)
		}
		v.peers = append(v.peers, n)
	}
	// A key's owner may count none of it: the limit is then the others'.
	v.grants = env.grantsFor(v.limit)
	return v, v.limit > 0
}

// known reports whether k's owner has reported the others' count in the window of
// sizeMS ending at endMS (relay.go).
func (s *slots) known(k limiter.Key, sizeMS, endMS int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[k].aggOf(sizeMS, endMS) != nil
}

// aggIn returns the others' count of k its owner last reported, in the window of sizeMS
// ending at endMS (relay.go).
func (s *slots) aggIn(k limiter.Key, sizeMS, endMS int64) (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.keys[k].aggOf(sizeMS, endMS); a != nil {
		return a.others, true
	}
	return 0, false
}

// view returns k's slots with their origins' names, for the debug endpoint.
func (s *slots) view(k limiter.Key) []SlotView {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SlotView
	if ks := s.keys[k]; ks != nil {
		for _, sl := range ks.slots {
			v := SlotView{Origin: s.names[sl.origin], WindowMS: sl.sizeMS, WindowEndMS: sl.endMS, Count: sl.count, Refused: sl.refused}
			if sl.capped {
				v.Bound = &sl.cap
			}
			if sl.floor > 0 {
				v.Granted = &sl.floor
			}
			out = append(out, v)
		}
	}
	return out
}

// SlotView is one remote origin's slot of a counter, with what share mode knows of it:
// the hits its bound refused, its bound (absent: none, or not known), and what this
// node granted it as the key's owner.
type SlotView struct {
	Origin      string  `json:"origin"`
	WindowMS    int64   `json:"window_ms"`
	WindowEndMS int64   `json:"window_end_ms"`
	Count       uint32  `json:"count"`
	Refused     uint32  `json:"refused"`
	Bound       *uint32 `json:"share_bound,omitempty"`
	// Granted is the bound this node, the key's owner, granted the origin, held until
	// the origin's values show it (absent: none).
	Granted *uint32 `json:"share_granted,omitempty"`
}

// takePart raises this node's bound of k in the window ending at endMS by a member's
// part of what nobody holds, as it knows, when the nodes are projected to need a small
// part of the limit (farBelow: every node taking its part takes what is free at most,
// and the rest of the window leaves them far from the limit); it reports whether it did.
// The caller holds planMu.
func (s *slots) takePart(k limiter.Key, endMS int64, env shareEnv) bool {
	snap, _ := s.lim.Lookup(k)
	v, ok := s.shareView(k, snap, env)
	if !ok || v.startMS+v.sizeMS != endMS || !v.self.claimed || !v.farBelow() {
		return false
	}
	held := max(v.self.count, v.self.claim)
	part := max(v.limit-held-v.othersHold(), 0) / int64(max(v.members, 1))
	return part > 0 && s.lim.RaiseCap(k, v.sizeMS, endMS, uint32(min(part, math.MaxUint32-1)))
}

// grantRoom is the owner's grant (grant.go) to origin, asking for want hits of k in the
// window ending at endMS, whose value it just merged: what nobody holds, as this node
// knows, up to want or a member's part of it. The grant is held for origin (its slot's
// floor) until a value it sent after until shows its bound. A grant to this node itself
// raises its own bound at once. The caller holds planMu.
func (s *slots) grantRoom(k limiter.Key, origin string, want uint32, endMS, until int64, env shareEnv) uint32 {
	snap, _ := s.lim.Lookup(k)
	v, ok := s.shareView(k, snap, env)
	if !ok || v.startMS+v.sizeMS != endMS {
		return 0
	}
	if origin == s.self {
		if !v.self.claimed {
			// Bound at its count first: the others may hold the rest.
			s.lim.SetCap(k, v.sizeMS, endMS, uint32(min(max(v.self.count, 0), math.MaxUint32-1)))
			v.self.claim, v.self.claimed, v.self.capped = v.self.count, true, true
		}
		g := v.grantFor(int64(want))
		if g > 0 && !s.lim.RaiseCap(k, v.sizeMS, endMS, uint32(g)) {
			return 0
		}
		return uint32(g)
	}
	var asker *shareNode
	for i := range v.peers {
		if v.peers[i].name == origin {
			asker = &v.peers[i]
		}
	}
	if asker == nil || !asker.live || !asker.claimed || !asker.capped {
		return 0
	}
	g := v.grantFor(int64(want))
	if g == 0 {
		return 0
	}
	floor := v.holds(*asker) + g
	s.mu.Lock()
	defer s.mu.Unlock()
	oid := s.origins[origin]
	if ks := s.keys[k]; ks != nil {
		for i := range ks.slots {
			if sl := &ks.slots[i]; sl.origin == oid && sl.endMS == endMS {
				sl.floor = uint32(min(max(int64(sl.floor), floor), math.MaxUint32-1))
				sl.floorUntil = max(sl.floorUntil, until)
				return uint32(g)
			}
		}
	}
	return 0
}
