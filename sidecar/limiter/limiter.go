// Package limiter counts hits in fixed windows aligned to the wall clock, per bucket and
// key, in memory: Check counts and decides, Peek decides without counting, Record counts,
// Take counts only what fits and Refund forgives what was taken (see take.go). A
// replicated limiter also holds what other nodes counted (see replica.go).
package limiter

import (
	"context"
	"hash/maphash"
	"maps"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/converger/edge/shared/buckets"
)

// Limit is a number of hits allowed per fixed window.
type Limit = buckets.Limit

// Key names one counter: a bucket and the identity it is counted for within the bucket
// (a tenant id, a channel id, an IP or an account key).
type Key struct {
	Bucket BucketID
	ID     string
}

// BucketID is a registered bucket name; see Limiter.Bucket.
type BucketID uint32

// Result is the outcome of an operation.
type Result struct {
	// Allowed is the decision: for Check, the count after adding is within the limit;
	// for Peek, the count has not reached it; Record always allows.
	Allowed bool
	// Count is the number of hits in the current window, after the operation.
	Count uint32
	Limit Limit
	// WindowEndMS is the wall-clock end of the current window in Unix milliseconds.
	WindowEndMS int64
	// NowMS is the limiter's clock when it decided, in Unix milliseconds.
	NowMS int64
	// RetryAfterMS is the time left in the window when denied, else 0.
	RetryAfterMS int64
}

// RetryAfterSeconds returns RetryAfterMS in whole seconds, rounded up, at least 1: the
// value of a retry-after header.
func (r Result) RetryAfterSeconds() int64 {
	s := (r.RetryAfterMS + 999) / 1000
	return max(s, 1)
}

const numShards = 256

// Limiter holds the counters. The zero value is not usable; call New.
type Limiter struct {
	now        func() int64 // Unix milliseconds
	clock      *anchoredClock
	seed       maphash.Seed
	replicated bool
	shards     [numShards]shard

	// The bucket registry, copy-on-write: lookups take no lock.
	namesMu sync.Mutex
	names   atomic.Pointer[[]string]            // BucketID → name
	ids     atomic.Pointer[map[string]BucketID] // name → BucketID
	// refunds maps a BucketID to the BucketID of its refunds (take.go), once one was made.
	refunds sync.Map
	// boundRefused, when set, is asked for more room when share mode's bound refuses
	// hits the limit would allow (OnBoundRefused).
	boundRefused atomic.Pointer[func(k Key, n uint32, sizeMS, endMS int64, by time.Time) bool]
	// unknown, when set, is told of a counter before its first hit of a window that
	// this node has no bound of (OnUnknown).
	unknown atomic.Pointer[func(k Key, limit uint32, sizeMS, endMS int64)]
}

type shard struct {
	mu sync.RWMutex
	// byBucket holds a map per BucketID, created on the bucket's first counter.
	byBucket []map[string]*entry
	peak     int
	// changed lists the counters of a replicated limiter counted since the last
	// DrainChanged; each is listed once, while its changed flag is set.
	changedMu sync.Mutex
	changed   []changedEntry
	// dirty is set while changed is not empty, so that DrainChanged passes the shards
	// with nothing to drain without taking their lock.
	dirty atomic.Bool
	_     [36]byte // 128 bytes: a shard is two whole cache lines, its lock never split
}

func (s *shard) get(k Key) *entry {
	if int(k.Bucket) < len(s.byBucket) {
		return s.byBucket[k.Bucket][k.ID]
	}
	return nil
}

// insert adds an entry for k; the caller holds the write lock.
func (s *shard) insert(k Key, replicated bool) *entry {
	for int(k.Bucket) >= len(s.byBucket) {
		s.byBucket = append(s.byBucket, nil)
	}
	m := s.byBucket[k.Bucket]
	if m == nil {
		m = make(map[string]*entry)
		s.byBucket[k.Bucket] = m
	}
	e := new(entry)
	id := strings.Clone(k.ID)
	if replicated {
		e.ext = &replica{id: id}
	}
	m[id] = e
	return e
}

func (s *shard) len() int {
	n := 0
	for _, m := range s.byBucket {
		n += len(m)
	}
	return n
}

// entry is one counter. state packs the window index (high 32 bits, modulo 2^32) and
// the count (low 32 bits), so that a window change and an increment are one CAS.
type entry struct {
	state atomic.Uint64
	// endMS is when the current window ends; the sweeper removes entries past it.
	endMS atomic.Int64
	// sizeMS is the window length the count was made with: a limit whose window
	// changes starts a fresh count.
	sizeMS atomic.Int64
	// ext holds the other nodes' part of a replicated counter; nil when local.
	ext *replica
}

// Options configure a limiter.
type Options struct {
	// Now is the wall clock (time.Now when nil): tests move it instead of sleeping.
	Now func() time.Time
	// Replicated limiters add the other nodes' counts (SetRemote) to their own and keep
	// the list of changed counters for DrainChanged.
	Replicated bool
}

// New returns an empty limiter.
func New(o Options) *Limiter {
	now := o.Now
	l := &Limiter{seed: maphash.MakeSeed(), replicated: o.Replicated}
	if now == nil {
		l.clock = newAnchoredClock()
		l.now = l.clock.nowMS
	} else {
		l.now = func() int64 { return now().UnixMilli() }
	}
	l.names.Store(&[]string{})
	l.ids.Store(&map[string]BucketID{})
	return l
}

// Bucket returns the id of a bucket name, registering it on first use.
func (l *Limiter) Bucket(name string) BucketID {
	if id, ok := l.LookupBucket(name); ok {
		return id
	}
	l.namesMu.Lock()
	defer l.namesMu.Unlock()
	if id, ok := (*l.ids.Load())[name]; ok {
		return id
	}
	old := *l.names.Load()
	id := BucketID(len(old))
	names := append(old[:len(old):len(old)], name)
	ids := maps.Clone(*l.ids.Load())
	ids[name] = id
	l.names.Store(&names)
	l.ids.Store(&ids)
	return id
}

// LookupBucket returns the id of a registered bucket name.
func (l *Limiter) LookupBucket(name string) (BucketID, bool) {
	id, ok := (*l.ids.Load())[name]
	return id, ok
}

// Buckets returns the number of registered buckets.
func (l *Limiter) Buckets() int { return len(*l.names.Load()) }

// BucketName returns the name of a registered bucket.
func (l *Limiter) BucketName(id BucketID) string {
	names := *l.names.Load()
	if int(id) < len(names) {
		return names[id]
	}
	return ""
}

// NowMS returns the limiter's clock in Unix milliseconds.
func (l *Limiter) NowMS() int64 { return l.now() }

// Check adds n hits to k and allows them iff the count after adding is within lim.
// Denied hits are counted too. In a replicated limiter the count is this node's plus
// what the other nodes reported, and share mode may bound this node's part.
//
// No operation keeps a reference to k.ID once it returns (a new counter stores a copy),
// so the caller may build it in a buffer it reuses.
func (l *Limiter) Check(k Key, n uint32, lim Limit) Result {
	return l.CheckBy(k, n, lim, time.Time{})
}

// CheckBy is Check for a caller that must have its decision by the time by (zero: no
// such time): a wait for more room (OnBoundRefused) ends by then.
func (l *Limiter) CheckBy(k Key, n uint32, lim Limit, by time.Time) Result {
	now, w, end := l.window(lim)
	ext, own, ok, unknown := l.add(k, n, w, end, windowMS(lim), true, l.unknown.Load() != nil)
	if unknown {
		// The counter has no bound in this window: it may be bound first.
		l.probe(k, ext, lim.Count, w, windowMS(lim), end)
		ext, own, ok, _ = l.add(k, n, w, end, windowMS(lim), true, false)
	}
	if ext == nil {
		return decide(own <= lim.Count, own, lim, now, end)
	}
	total := ext.total(own, w)
	ext.noteLimit(lim.Count)
	for try := 0; !ok && try < maxAsks && total <= lim.Count && n <= lim.Count-total; try++ {
		// The bound refused what the limit allows: ask for room, and try once more.
		if !l.askRoom(k, n, windowMS(lim), end, by) {
			break
		}
		own, ok = l.addAgain(k, ext, n, w, end, windowMS(lim))
		total = ext.total(own, w)
	}
	if !ok && (total > lim.Count || n > lim.Count-total) {
		// The limit refuses them too: counted, as denied hits are without a bound (they
		// take nobody's room: none is left).
		_, own, _, _ = l.add(k, n, w, end, windowMS(lim), false, false)
		ext.unnoteRefused(n, w)
		total = ext.total(own, w)
	}
	return decide(ok && total <= lim.Count, total, lim, now, end)
}

// maxAsks bounds how often one check asks for room (a grant another check of the key
// took first is asked for again).
const maxAsks = 3

// addAgain adds n hits to k again after room was granted, and takes back the note of
// the first try that they were refused.
func (l *Limiter) addAgain(k Key, ext *replica, n, w uint32, end, size int64) (uint32, bool) {
	_, own, ok, _ := l.add(k, n, w, end, size, true, false)
	// Refused or not this time, the first try noted the hits as refused once too many.
	ext.unnoteRefused(n, w)
	return own, ok
}

// OnBoundRefused sets f to be called, on the checking goroutine, whenever share mode's
// bound refuses n hits of k in the window of sizeMS ending at endMS that the count known
// here would allow. f may wait (briefly: the check waits with it, and never past by
// when by is not zero) for more room and raise the bound (RaiseCap); it reports whether
// it did, and the hits are then tried once more.
func (l *Limiter) OnBoundRefused(f func(k Key, n uint32, sizeMS, endMS int64, by time.Time) bool) {
	l.boundRefused.Store(&f)
}

func (l *Limiter) askRoom(k Key, n uint32, sizeMS, endMS int64, by time.Time) bool {
	if f := l.boundRefused.Load(); f != nil {
		return (*f)(k, n, sizeMS, endMS, by)
	}
	return false
}

// DecideBy is when a call that must be answered by ctx's deadline must have its decision,
// so that the answer still reaches the caller in time: a fifth of the time from start to
// the deadline before it, and at least AnswerMargin. It is zero without a deadline.
func DecideBy(ctx context.Context, start time.Time) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	return d.Add(-max(AnswerMargin, d.Sub(start)/5))
}

// AnswerMargin is the least time DecideBy keeps for an answer to travel.
const AnswerMargin = 25 * time.Millisecond

// Record adds n hits to k without deciding: the result is always allowed.
func (l *Limiter) Record(k Key, n uint32, lim Limit) Result {
	now, w, end := l.window(lim)
	ext, own, _, _ := l.add(k, n, w, end, windowMS(lim), false, false)
	if ext != nil {
		own = ext.total(own, w)
		ext.noteLimit(lim.Count)
	}
	return Result{Allowed: true, Count: own, Limit: lim, WindowEndMS: end, NowMS: now}
}

// Peek decides without counting: denied iff the count, less what was refunded
// (Refund), has reached lim.
func (l *Limiter) Peek(k Key, lim Limit) Result {
	now, w, end := l.window(lim)
	var count uint32
	s := l.shard(k)
	s.mu.RLock()
	e := s.get(k)
	counted := false
	if e != nil {
		count, _ = e.current(w, windowMS(lim))
		counted = count > 0
		if e.ext != nil {
			count = e.ext.total(count, w)
		}
	}
	s.mu.RUnlock()
	if !counted && l.replicated && l.unknown.Load() != nil {
		l.interest(k, lim, end)
	}
	count -= min(count, l.refunded(k, w, windowMS(lim)))
	return decide(count < lim.Count, count, lim, now, end)
}

// interest lists k for the next sync (DrainChanged) with nothing counted: read here, not
// counted, so that the cluster asks for its count if it has not yet (a node that only
// reads a counter is sent the others' counts of it).
func (l *Limiter) interest(k Key, lim Limit, end int64) {
	e := l.replicaEntry(k, windowMS(lim), end)
	if e == nil {
		return
	}
	e.ext.noteLimit(lim.Count)
	e.ext.readEndMS.Store(end)
	l.shard(k).noteChanged(k, e, e.ext)
}

func decide(allowed bool, count uint32, lim Limit, now, end int64) Result {
	r := Result{Allowed: allowed, Count: count, Limit: lim, WindowEndMS: end, NowMS: now}
	if !allowed {
		r.RetryAfterMS = end - now
	}
	return r
}

// MaxWindow is the longest window a limit may have: the cluster's wire format and the
// window arithmetic assume no more.
const MaxWindow = 100 * 365 * 24 * time.Hour

// windowMS returns the window length in milliseconds, from 1 to MaxWindow.
func windowMS(lim Limit) int64 {
	return min(max(lim.Window.Milliseconds(), 1), MaxWindow.Milliseconds())
}

// window returns the time, the current window's index (mod 2^32) and its end.
func (l *Limiter) window(lim Limit) (now int64, w uint32, end int64) {
	now = l.now()
	size := windowMS(lim)
	idx := now / size
	return now, uint32(idx), (idx + 1) * size
}

func (l *Limiter) shard(k Key) *shard {
	h := maphash.String(l.seed, k.ID) ^ uint64(k.Bucket)*0x9E3779B97F4A7C15
	return &l.shards[h%numShards]
}

// add adds n to k's count in window w and returns its replica (nil when local) and new count. With
// capped, a share-mode bound on this node's count applies: hits over it are refused
// without counting (ok false), so they do not use up the other nodes' budget, and are
// noted as refused, so that share mode knows what this node was asked for. With probe,
// a replicated counter nothing is known of in window w, not probed there yet, is left
// as it is (unknown): the caller probes it (OnUnknown) and adds again.
//
// The entry's line is contended when many requests share a key: everything the caller
// needs of it (ext, immutable) is read before the CAS, nothing after.
func (l *Limiter) add(k Key, n uint32, w uint32, end int64, size int64, capped, probe bool) (ext *replica, count uint32, ok, unknown bool) {
	s := l.shard(k)
	s.mu.RLock()
	e := s.get(k)
	if e != nil {
		ext = e.ext
		if probe && ext != nil && ext.unknownIn(e, w, size) {
			s.mu.RUnlock()
			return ext, 0, false, true
		}
		count, ok = e.add(n, w, end, size, maxOwn(ext, w, capped))
		if ext != nil {
			s.noteAdded(k, e, ext, n, w, ok)
		}
		s.mu.RUnlock()
		return ext, count, ok, false
	}
	s.mu.RUnlock()

	s.mu.Lock()
	e = s.get(k)
	if e == nil {
		e = s.insert(k, l.replicated)
	}
	ext = e.ext
	if probe && ext != nil && ext.unknownIn(e, w, size) {
		s.mu.Unlock()
		return ext, 0, false, true
	}
	count, ok = e.add(n, w, end, size, maxOwn(ext, w, capped))
	if ext != nil {
		s.noteAdded(k, e, ext, n, w, ok)
	}
	s.mu.Unlock()
	return ext, count, ok, false
}

// OnUnknown sets f to be called, on the checking goroutine, before the first hit of a
// window is counted (Check, Take) on a replicated counter that has no share-mode bound
// and none of this node's own count in that window, whether or not the other nodes'
// count is known. f may bound the counter there (SetCap; at 0, the hit then asks for
// room: OnBoundRefused). It is called at most once per counter and window.
func (l *Limiter) OnUnknown(f func(k Key, limit uint32, sizeMS, endMS int64)) {
	l.unknown.Store(&f)
}

// probe calls the OnUnknown function for k in window w, once.
func (l *Limiter) probe(k Key, ext *replica, limit uint32, w uint32, sizeMS, endMS int64) {
	word := uint64(w)<<32 | 1
	if old := ext.probed.Load(); old == word || !ext.probed.CompareAndSwap(old, word) {
		return
	}
	ext.noteLimit(limit)
	if f := l.unknown.Load(); f != nil {
		(*f)(k, limit, sizeMS, endMS)
	}
}

func maxOwn(ext *replica, w uint32, capped bool) uint32 {
	if !capped || ext == nil {
		return math.MaxUint32
	}
	return ext.capFor(w)
}

// current returns the count of window w and the window index it belongs to. A window
// later than w (seen by a caller that read the clock a moment earlier) counts as current,
// so a late caller adds to it instead of resetting it.
func (e *entry) current(w uint32, size int64) (count, window uint32) {
	v := e.state.Load()
	sw := uint32(v >> 32)
	if sw == w || (int32(sw-w) > 0 && e.sizeMS.Load() == size) {
		return uint32(v), sw
	}
	return 0, w
}

// add adds n to the count of window w unless that would take it over maxOwn, and
// returns the count and whether it added.
func (e *entry) add(n, w uint32, end int64, size int64, maxOwn uint32) (uint32, bool) {
	for {
		old := e.state.Load()
		sw := uint32(old >> 32)
		var count uint32
		if sw == w || (int32(sw-w) > 0 && e.sizeMS.Load() == size) {
			count, w = uint32(old), sw
		}
		if maxOwn != math.MaxUint32 && (count >= maxOwn || n > maxOwn-count) {
			return count, false
		}
		if count > math.MaxUint32-n {
			count = math.MaxUint32
		} else {
			count += n
		}
		if e.state.CompareAndSwap(old, uint64(w)<<32|uint64(count)) {
			if sw != w || e.sizeMS.Load() != size {
				e.sizeMS.Store(size)
				e.endMS.Store(end)
			}
			return count, true
		}
	}
}

// shrinkPeak is the least peak of a shard whose maps Sweep rebuilds once they hold less
// than a quarter of it.
const shrinkPeak = 64

// Sweep removes the counters whose window ended before now and returns how many it
// removed. Maps that shrank to a quarter of their peak are rebuilt to free memory.
func (l *Limiter) Sweep() int {
	if l.clock != nil {
		l.clock.anchor()
	}
	now := l.NowMS()
	removed := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		// The peak is taken before the deletions: a burst of keys that all end between
		// two sweeps must still shrink the maps it grew (Go's maps never shrink).
		s.peak = max(s.peak, s.len())
		for _, m := range s.byBucket {
			for id, e := range m {
				if e.endMS.Load() <= now && (e.ext == nil || e.ext.keepMS.Load() <= now) {
					delete(m, id)
					removed++
				}
			}
		}
		if n := s.len(); s.peak > shrinkPeak && n < s.peak/4 {
			for b, m := range s.byBucket {
				if m != nil {
					// A new map sized for what is left: maps.Clone keeps the old one's
					// capacity.
					s.byBucket[b] = make(map[string]*entry, len(m))
					maps.Copy(s.byBucket[b], m)
				}
			}
			s.peak = n
		}
		s.mu.Unlock()
	}
	return removed
}

// Len returns the number of live counters.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.RLock()
		n += s.len()
		s.mu.RUnlock()
	}
	return n
}

// RunSweeper calls Sweep every period until stop is closed.
func (l *Limiter) RunSweeper(period time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			l.Sweep()
		}
	}
}
