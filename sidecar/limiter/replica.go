package limiter

import (
	"math"
	"sync/atomic"
)

// replica is the replicated part of a counter: the sum the other nodes reported for a
// window, the share-mode bound on this node's own count, the hits that bound refused,
// and the changed flag that puts the counter on its shard's list for the next sync.
// Each word packs the window index (mod 2^32) in its high half, so a value for another
// window reads as absent.
type replica struct {
	id     string        // the counter's id, as stored in its shard's map
	remote atomic.Uint64 // window | sum of the other nodes' counts
	// cap holds the share-mode bound of a window in the word of its parity, so that
	// the bound of the next window can be set before it begins while the current one
	// still applies: window | own cap + 1; 0: no cap.
	cap [2]atomic.Uint64
	// refused counts the hits the bound refused (not counted in the own count): with
	// the own count, what this node was asked for, which share mode divides by.
	refused atomic.Uint64 // window | hits
	// keepMS keeps the counter from the sweeper until then: the end of the window of
	// the latest bound, which may be the next window.
	keepMS  atomic.Int64
	limit   atomic.Uint32 // the limit of the last Check or Record
	changed atomic.Uint32 // 1 while on the shard's changed list
	// probed holds the window of the last OnUnknown call: window | 1.
	probed atomic.Uint64
	// readEndMS is the end of the window of the last read (Peek) that found nothing of
	// this node's own in it.
	readEndMS atomic.Int64
}

// unknownIn reports that this node has not yet counted in e's window w of size, nor
// been told how much of it is its own: not probed there, no bound, none of its own
// count. The others' count may be known (a state transfer on join brings it, before any
// bound): knowing what the others counted is not knowing what they may still count.
func (r *replica) unknownIn(e *entry, w uint32, size int64) bool {
	if r.probed.Load() == uint64(w)<<32|1 || r.capFor(w) != math.MaxUint32 {
		return false
	}
	count, _ := e.current(w, size)
	return count == 0
}

type changedEntry struct {
	key Key
	e   *entry
}

// Snapshot is a counter's state in its current window.
type Snapshot struct {
	Own    uint32 // this node's count
	Remote uint32 // the other nodes' count, as last reported
	Limit  uint32 // the limit of the last Check or Record (0: none yet)
	SizeMS int64  // the window's length
	EndMS  int64  // the window's end, in Unix milliseconds
	// Refused is the hits share mode's bound refused in the window (not in Own).
	Refused uint32
	// Cap is share mode's bound on Own in the window, when Capped.
	Cap    uint32
	Capped bool
	// ReadEndMS is the end of the window in which the counter was last read (Peek)
	// with nothing of this node's own counted in it, whichever window the rest is of.
	ReadEndMS int64
}

func (r *replica) total(own, w uint32) uint32 {
	if v := r.remote.Load(); uint32(v>>32) == w {
		if sum := uint32(v); own <= math.MaxUint32-sum {
			return own + sum
		}
		return math.MaxUint32
	}
	return own
}

// capFor returns the share-mode bound on this node's count in window w.
func (r *replica) capFor(w uint32) uint32 {
	if v := r.cap[w&1].Load(); v != 0 && uint32(v>>32) == w {
		return uint32(v) - 1
	}
	return math.MaxUint32
}

// noteRefused adds n hits refused by the share-mode bound in window w.
func (r *replica) noteRefused(n, w uint32) {
	for {
		old := r.refused.Load()
		var c uint32
		if uint32(old>>32) == w {
			c = uint32(old)
		}
		c += min(n, math.MaxUint32-c)
		if r.refused.CompareAndSwap(old, uint64(w)<<32|uint64(c)) {
			return
		}
	}
}

// unnoteRefused takes back n hits noted as refused in window w.
func (r *replica) unnoteRefused(n, w uint32) {
	for {
		old := r.refused.Load()
		if uint32(old>>32) != w {
			return
		}
		c := uint32(old) - min(n, uint32(old))
		if r.refused.CompareAndSwap(old, uint64(w)<<32|uint64(c)) {
			return
		}
	}
}

func (r *replica) noteLimit(limit uint32) {
	if r.limit.Load() != limit {
		r.limit.Store(limit)
	}
}

// noteAdded lists a replicated counter for the next sync after an add of n hits in
// window w, and notes the hits as refused when the share-mode bound refused them.
func (s *shard) noteAdded(k Key, e *entry, ext *replica, n, w uint32, ok bool) {
	if !ok {
		ext.noteRefused(n, w)
	}
	s.noteChanged(k, e, ext)
}

// noteChanged lists a replicated counter for the next DrainChanged, once. The list keeps
// the counter's stored id, not the caller's k.ID.
func (s *shard) noteChanged(k Key, e *entry, ext *replica) {
	if ext.changed.Load() != 0 || !ext.changed.CompareAndSwap(0, 1) {
		return
	}
	s.changedMu.Lock()
	s.changed = append(s.changed, changedEntry{Key{k.Bucket, ext.id}, e})
	s.dirty.Store(true)
	s.changedMu.Unlock()
}

func (e *entry) snapshot() Snapshot {
	size := e.sizeMS.Load()
	end := e.endMS.Load()
	if size == 0 {
		return Snapshot{}
	}
	w := uint32(end/size - 1)
	snap := Snapshot{SizeMS: size, EndMS: end}
	if v := e.state.Load(); uint32(v>>32) == w {
		snap.Own = uint32(v)
	}
	if e.ext != nil {
		snap.Remote = e.ext.total(0, w)
		snap.Limit = e.ext.limit.Load()
		if v := e.ext.refused.Load(); uint32(v>>32) == w {
			snap.Refused = uint32(v)
		}
		if c := e.ext.capFor(w); c != math.MaxUint32 {
			snap.Cap, snap.Capped = c, true
		}
		snap.ReadEndMS = e.ext.readEndMS.Load()
	}
	return snap
}

// maxKeptChanged is the longest changed list of a shard DrainChanged keeps for reuse.
const maxKeptChanged = 128

// DrainChanged calls f for every counter counted since the last call, with its state,
// and clears the list. It is meant for one caller at a time (the sync loop).
func (l *Limiter) DrainChanged(f func(Key, Snapshot)) {
	for i := range l.shards {
		s := &l.shards[i]
		if !s.dirty.Load() {
			continue
		}
		s.changedMu.Lock()
		list := s.changed
		s.changed = nil
		s.dirty.Store(false)
		s.changedMu.Unlock()
		for j, c := range list {
			// Clear first: a hit after this line lists the counter again.
			c.e.ext.changed.Store(0)
			f(c.key, c.e.snapshot())
			list[j] = changedEntry{}
		}
		s.changedMu.Lock()
		// The list is kept for the next sync, unless a burst grew it: then it goes, so
		// that the burst's memory does not stay.
		if s.changed == nil && cap(list) <= maxKeptChanged {
			s.changed = list[:0]
		}
		s.changedMu.Unlock()
	}
}

// Each calls f for every counter whose window has not ended, with its state. It holds
// one shard's read lock at a time.
func (l *Limiter) Each(f func(Key, Snapshot)) {
	now := l.NowMS()
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.RLock()
		for b, m := range s.byBucket {
			for id, e := range m {
				if e.endMS.Load() > now {
					f(Key{BucketID(b), id}, e.snapshot())
				}
			}
		}
		s.mu.RUnlock()
	}
}

// Lookup returns a counter's state, and false when there is none.
func (l *Limiter) Lookup(k Key) (Snapshot, bool) {
	s := l.shard(k)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if e := s.get(k); e != nil {
		return e.snapshot(), true
	}
	return Snapshot{}, false
}

// SetRemote records the other nodes' count for k in the window of sizeMS ending at
// endMS. It does nothing in a limiter that is not replicated.
func (l *Limiter) SetRemote(k Key, sizeMS int64, endMS int64, sum uint32) {
	if e := l.replicaEntry(k, sizeMS, endMS); e != nil {
		e.ext.remote.Store(windowWord(sizeMS, endMS) | uint64(sum))
	}
}

// SetCap bounds this node's own count of k in the window of sizeMS ending at endMS to
// cap (share mode): hits over it are refused without being counted. The window may be
// the current one or the next; a bound of one window leaves the other's alone.
func (l *Limiter) SetCap(k Key, sizeMS int64, endMS int64, cap uint32) {
	if !l.replicated || sizeMS <= 0 {
		return
	}
	_, e := l.entry(k)
	if e.sizeMS.Load() == 0 {
		// A counter of its own: its window is the current one.
		now := l.now()
		e.sizeMS.Store(sizeMS)
		e.endMS.Store((now/sizeMS + 1) * sizeMS)
	}
	if e.ext.keepMS.Load() < endMS {
		e.ext.keepMS.Store(endMS)
	}
	word := windowWord(sizeMS, endMS)
	e.ext.cap[(word>>32)&1].Store(word | uint64(min(cap, math.MaxUint32-1)+1))
}

// RaiseCap raises k's share-mode bound in the window of sizeMS ending at endMS by n, and
// reports whether there was a bound to raise (none: the window is not the bound's).
func (l *Limiter) RaiseCap(k Key, sizeMS int64, endMS int64, n uint32) bool {
	return l.raiseCap(k, sizeMS, endMS, func(bound uint32) uint32 { return bound + min(n, math.MaxUint32-1-bound) })
}

// RaiseCapTo raises k's share-mode bound in the window of sizeMS ending at endMS to to,
// if it is lower, and reports whether there was a bound (a lower one counts).
func (l *Limiter) RaiseCapTo(k Key, sizeMS int64, endMS int64, to uint32) bool {
	to = min(to, math.MaxUint32-1)
	return l.raiseCap(k, sizeMS, endMS, func(bound uint32) uint32 { return max(bound, to) })
}

// raiseCap sets k's share-mode bound in the window of sizeMS ending at endMS to
// next(bound), which is never lower, and reports whether there was a bound.
func (l *Limiter) raiseCap(k Key, sizeMS int64, endMS int64, next func(bound uint32) uint32) bool {
	s := l.shard(k)
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.get(k)
	if e == nil || e.ext == nil {
		return false
	}
	word := windowWord(sizeMS, endMS)
	c := &e.ext.cap[(word>>32)&1]
	for {
		v := c.Load()
		if v == 0 || v>>32 != word>>32 {
			return false
		}
		bound := uint32(v) - 1
		nb := next(bound)
		if nb == bound || c.CompareAndSwap(v, word|uint64(nb+1)) {
			return true
		}
	}
}

// CapIn returns k's share-mode bound in the window of sizeMS ending at endMS, and false
// when there is none.
func (l *Limiter) CapIn(k Key, sizeMS int64, endMS int64) (uint32, bool) {
	s := l.shard(k)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if e := s.get(k); e != nil && e.ext != nil {
		if c := e.ext.capFor(uint32(windowWord(sizeMS, endMS) >> 32)); c != math.MaxUint32 {
			return c, true
		}
	}
	return 0, false
}

// ClearCap lifts k's share-mode bound in the window of sizeMS ending at endMS.
func (l *Limiter) ClearCap(k Key, sizeMS int64, endMS int64) {
	s := l.shard(k)
	s.mu.RLock()
	if e := s.get(k); e != nil && e.ext != nil {
		word := windowWord(sizeMS, endMS)
		c := &e.ext.cap[(word>>32)&1]
		if v := c.Load(); v != 0 && v>>32 == word>>32 {
			c.CompareAndSwap(v, 0)
		}
	}
	s.mu.RUnlock()
}

func windowWord(sizeMS int64, endMS int64) uint64 {
	return uint64(uint32(endMS/max(sizeMS, 1)-1)) << 32
}

// replicaEntry returns k's entry, creating it for a window this node has not counted
// in yet, so that its first local hit already sees the other nodes' count.
func (l *Limiter) replicaEntry(k Key, sizeMS int64, endMS int64) *entry {
	if !l.replicated || sizeMS <= 0 {
		return nil
	}
	_, e := l.entry(k)
	// A counter with no count of its own yet takes the window, so the sweeper keeps it
	// until that window ends.
	if size := e.sizeMS.Load(); size == 0 || (size == sizeMS && e.endMS.Load() < endMS && e.snapshot().Own == 0) {
		e.sizeMS.Store(sizeMS)
		e.endMS.Store(endMS)
	}
	return e
}
