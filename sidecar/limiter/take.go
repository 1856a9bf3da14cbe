package limiter

import (
	"math"
	"time"
)

// Take and Refund make an attempt and its outcome one decision: Take counts hits only
// when they fit within the limit, so that parallel attempts are never admitted beyond
// it (a Check counts denied hits too, and a Peek followed by a Record lets every
// parallel attempt through before the first is recorded); Refund then forgives the hits
// of an attempt that should not count (a login that succeeded).
//
// Refunds are a second counter of the same key in the bucket "<bucket>_refunds", so
// that a replicated limiter replicates them like any other counter (a G-counter only
// grows: subtracting from the first would be undone by the other nodes' maximum).
// Take and Peek deduct them; Check and Record ignore them (a caller that counts denied
// hits and allows refunds too, such as the rate limit service's rules, deducts Refunded).

// RefundSuffix names a bucket's refund counter: "<bucket>_refunds".
const RefundSuffix = "_refunds"

// Take adds n hits to k only if the count after adding, less the hits refunded in the
// window, is within lim, and reports whether it did. A refused Take counts nothing; Count
// is the count after adding, or the count that refused the hits, less refunds. In a
// replicated limiter the count is this node's plus what the other nodes reported, and
// share mode may bound this node's part further.
func (l *Limiter) Take(k Key, n uint32, lim Limit) Result {
	return l.TakeBy(k, n, lim, time.Time{})
}

// TakeBy is Take for a caller that must have its decision by the time by (zero: no such
// time), as CheckBy.
func (l *Limiter) TakeBy(k Key, n uint32, lim Limit, by time.Time) Result {
	now, w, end := l.window(lim)
	size := windowMS(lim)
	budget := lim.Count
	if r := l.refunded(k, w, size); r > 0 {
		budget = uint32(min(uint64(budget)+uint64(r), math.MaxUint32-1))
	}
	s, e := l.entry(k)
	if e.ext != nil && l.unknown.Load() != nil && e.ext.unknownIn(e, w, size) {
		l.probe(k, e.ext, lim.Count, w, size, end)
	}
	var remote uint32
	maxOwn := budget
	if e.ext != nil {
		remote = e.ext.total(0, w)
		maxOwn = min(budget-min(budget, remote), e.ext.capFor(w))
		e.ext.noteLimit(lim.Count)
	}
	own, ok := e.add(n, w, end, size, maxOwn)
	if e.ext != nil {
		s.noteAdded(k, e, e.ext, n, w, ok)
		room := budget - min(budget, remote)
		for try := 0; !ok && try < maxAsks && own <= room && n <= room-own; try++ {
			// The bound refused, not the limit: ask for room, and try once more.
			if !l.askRoom(k, n, size, end, by) {
				break
			}
			if own, ok = e.add(n, w, end, size, min(room, e.ext.capFor(w))); ok {
				e.ext.unnoteRefused(n, w)
				s.noteChanged(k, e, e.ext)
			}
		}
	}
	count := own + remote
	if count < own {
		count = math.MaxUint32
	}
	count -= min(count, budget-lim.Count)
	return decide(ok, count, lim, now, end)
}

// Refund forgives n hits taken from k in the current window: Take and Peek deduct them.
// It never forgives more than was counted, and answers the count after forgiving.
func (l *Limiter) Refund(k Key, n uint32, lim Limit) Result {
	now, w, end := l.window(lim)
	size := windowMS(lim)
	taken := l.count(k, w, size)
	rk := Key{Bucket: l.refundBucket(k.Bucket), ID: k.ID}
	already := l.count(rk, w, size)
	n = min(n, taken-min(taken, already))
	if n > 0 {
		ext, _, _, _ := l.add(rk, n, w, end, size, false, false)
		if ext != nil {
			ext.noteLimit(lim.Count)
		}
	}
	return Result{Allowed: true, Count: taken - min(taken, already+n), Limit: lim, WindowEndMS: end, NowMS: now}
}

// Refunded returns the hits refunded from k in the current window of lim.
func (l *Limiter) Refunded(k Key, lim Limit) uint32 {
	_, w, _ := l.window(lim)
	return l.refunded(k, w, windowMS(lim))
}

// entry returns k's shard and entry, creating the entry when there is none.
func (l *Limiter) entry(k Key) (*shard, *entry) {
	s := l.shard(k)
	s.mu.RLock()
	e := s.get(k)
	s.mu.RUnlock()
	if e == nil {
		s.mu.Lock()
		if e = s.get(k); e == nil {
			e = s.insert(k, l.replicated)
		}
		s.mu.Unlock()
	}
	return s, e
}

// refundBucket returns the id of bucket b's refund counter, registering it.
func (l *Limiter) refundBucket(b BucketID) BucketID {
	if id, ok := l.refunds.Load(b); ok {
		return id.(BucketID)
	}
	id := l.Bucket(l.BucketName(b) + RefundSuffix)
	l.refunds.Store(b, id)
	return id
}

// refunded returns the hits refunded from k in window w. The refund bucket is
// registered on first use, also when a refund made on another node has not arrived yet:
// a name registered here and by a remote merge is one id.
func (l *Limiter) refunded(k Key, w uint32, size int64) uint32 {
	return l.count(Key{Bucket: l.refundBucket(k.Bucket), ID: k.ID}, w, size)
}

// count returns k's count in window w: this node's plus, when replicated, the others'.
func (l *Limiter) count(k Key, w uint32, size int64) uint32 {
	s := l.shard(k)
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.get(k)
	if e == nil {
		return 0
	}
	c, _ := e.current(w, size)
	if e.ext != nil {
		c = e.ext.total(c, w)
	}
	return c
}
