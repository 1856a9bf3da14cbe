package cluster

import (
	"math"
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

	mu      sync.Mutex
	origins map[string]uint32
	names   []string
	keys    map[limiter.Key]*keyState
	// pending lists keys holding a slot for a window that has not begun on this node's
	// clock (a sender whose clock is ahead); the sum goes to the limiter when it begins.
	pending map[limiter.Key]struct{}
	// touched lists keys merged since the last tick, for share mode.
	touched map[limiter.Key]struct{}
}

type keyState struct {
	slots []slot
	// Share mode's view at the previous tick.
	prevEnd             int64
	prevOwn, prevRemote uint32
}

type slot struct {
	origin uint32
	sizeMS int64
	endMS  int64
	count  uint32
}

func newSlots(lim *limiter.Limiter, self string) *slots {
	return &slots{
		lim: lim, self: self,
		origins: map[string]uint32{},
		keys:    map[limiter.Key]*keyState{},
		pending: map[limiter.Key]struct{}{},
		touched: map[limiter.Key]struct{}{},
	}
}

// mergeResult says what became of a value.
type mergeResult int

const (
	merged  mergeResult = iota
	stale               // its window has ended here
	ignored             // our own origin, or an invalid bucket or id
)

// merge applies one origin's value at time now (Unix ms).
func (s *slots) merge(origin string, v value, now int64) mergeResult {
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
			*sl = slot{oid, v.sizeMS, v.endMS, v.count}
		case v.endMS == sl.endMS && v.sizeMS == sl.sizeMS:
			sl.count = max(sl.count, v.count)
		default:
			return merged // older than what we have: nothing to do
		}
	}
	if !found {
		ks.slots = append(ks.slots, slot{oid, v.sizeMS, v.endMS, v.count})
	}
	s.touched[k] = struct{}{}
	s.publishLocked(k, ks, v.sizeMS, v.endMS, now)
	return merged
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
	s.lim.SetRemote(k, sizeMS, endMS, uint32(min(sum, math.MaxUint32)))
}

// tick publishes the windows that began since the last tick, drops the slots of ended
// windows, and returns the keys merged since the last tick.
func (s *slots) tick(now int64) map[limiter.Key]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.pending {
		ks := s.keys[k]
		future := false
		for _, sl := range ks.slots {
			if sl.endMS-sl.sizeMS > now {
				future = true
			} else if sl.endMS > now {
				s.publishLocked(k, ks, sl.sizeMS, sl.endMS, now)
			}
		}
		if !future {
			delete(s.pending, k)
		}
	}
	touched := s.touched
	s.touched = map[limiter.Key]struct{}{}
	return touched
}

// sweep drops the slots whose windows have ended, and keys left without slots.
func (s *slots) sweep(now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, ks := range s.keys {
		live := ks.slots[:0]
		for _, sl := range ks.slots {
			if sl.endMS > now {
				live = append(live, sl)
			}
		}
		ks.slots = live
		if len(live) == 0 {
			delete(s.keys, k)
			delete(s.pending, k)
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

// shareTick runs share mode for the keys merged or counted since the last tick and
// returns how many it capped.
func (s *slots) shareTick(keys map[limiter.Key]struct{}, now int64) (capped int) {
	for k := range keys {
		if snap, ok := s.lim.Lookup(k); ok && snap.EndMS > now && s.share(k, snap) {
			capped++
		}
	}
	return capped
}

// share decides share mode for one key: when the budget left, less what the other
// nodes are likely to have admitted since they last reported (half an interval at their
// rate: reports are that old on average), would run out within about two sync
// intervals at the observed rates, this node may admit at most its share of what is
// left, in proportion to its own rate. A node that is the only one with traffic is
// never bound.
func (s *slots) share(k limiter.Key, snap limiter.Snapshot) (capped bool) {
	s.mu.Lock()
	ks := s.keys[k]
	if ks == nil {
		s.mu.Unlock()
		return false
	}
	if ks.prevEnd != snap.EndMS {
		ks.prevEnd, ks.prevOwn, ks.prevRemote = snap.EndMS, 0, 0
	}
	ownRate := snap.Own - min(ks.prevOwn, snap.Own)
	remoteRate := snap.Remote - min(ks.prevRemote, snap.Remote)
	ks.prevOwn, ks.prevRemote = snap.Own, snap.Remote
	s.mu.Unlock()

	// Without a hit of its own (no limit yet) the rates are only noted, so that counts
	// the others made before this node's first hit are not taken for one interval's rate.
	if remoteRate == 0 || snap.Limit == 0 {
		s.lim.ClearCap(k)
		return false
	}
	left := int64(snap.Limit) - int64(snap.Own) - int64(snap.Remote) - int64(remoteRate)/2
	if left >= 2*int64(ownRate+remoteRate) {
		s.lim.ClearCap(k)
		return false
	}
	var mine int64
	if left > 0 {
		own := int64(max(ownRate, 1))
		mine = left * own / (own + int64(remoteRate))
	}
	s.lim.SetCap(k, snap.SizeMS, snap.EndMS, snap.Own+uint32(mine))
	return true
}

// view returns k's slots with their origins' names, for the debug endpoint.
func (s *slots) view(k limiter.Key) []SlotView {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SlotView
	if ks := s.keys[k]; ks != nil {
		for _, sl := range ks.slots {
			out = append(out, SlotView{Origin: s.names[sl.origin], WindowMS: sl.sizeMS, WindowEndMS: sl.endMS, Count: sl.count})
		}
	}
	return out
}

// SlotView is one remote origin's slot of a counter.
type SlotView struct {
	Origin      string `json:"origin"`
	WindowMS    int64  `json:"window_ms"`
	WindowEndMS int64  `json:"window_end_ms"`
	Count       uint32 `json:"count"`
}
