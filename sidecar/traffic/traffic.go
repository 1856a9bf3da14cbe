// Package traffic keeps what the operators' live view shows of the limiter: per bucket,
// the allowed and denied decisions of every minute of the last hour (a fixed ring), and
// the busiest keys of the current window (a bounded table of candidates fed while
// counting), with the other cluster members' minute counts merged in.
//
// The hot path (Note) takes no lock that a check waits for: it adds to one of a few
// striped atomic counters per bucket and, only when a key's count reaches a power of two
// or goes over its limit, offers the key to the bucket's table with a TryLock. Reading
// (Traffic, Busiest) costs work bounded by the table's size, however many keys are live.
package traffic

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/sidecar/limiter"
)

// Sizes of what is kept.
const (
	// Minutes is how many minutes of decisions are kept: the current one and the 59
	// before it.
	Minutes = 60
	// Candidates bounds each bucket's table of busy keys. The busiest keys are exact
	// while they are well above the Candidates-th busiest.
	Candidates = 512
	// MaxTop is the most keys Busiest returns per bucket.
	MaxTop = 100
	// maxBuckets bounds the buckets recorded (the limiter's ids above are ignored).
	maxBuckets = 4096
	// MaxOrigins bounds the other nodes whose minute counts are kept; MaxRemoteBuckets
	// the buckets kept per node.
	MaxOrigins       = 64
	MaxRemoteBuckets = 256
	// stripes spreads one bucket's counters over several cache lines, chosen by key,
	// so that parallel checks of different keys do not all write one line.
	stripes  = 8
	minuteMS = 60_000
)

// Minute is one minute's decisions in one bucket.
type Minute struct {
	StartMS         int64 // the minute's start, Unix milliseconds
	Allowed, Denied uint64
}

// Busy is one of a bucket's busiest keys.
type Busy struct {
	// ID is the key within the bucket: the part of the documented key after
	// "<bucket>:" and the bucket's prefix.
	ID string
	// Count is the key's hits in its current window, every node's together.
	Count uint32
	// Limit is the limit of the key's last check; WindowEndMS when its window ends.
	Limit       limiter.Limit
	WindowEndMS int64
}

// Recorder records decisions of one limiter. The zero value is not usable; call New.
type Recorder struct {
	lim *limiter.Limiter
	now func() int64 // Unix milliseconds

	mu      sync.Mutex                // grows buckets; guards remote
	buckets atomic.Pointer[[]*bucket] // by limiter.BucketID, copy-on-write
	remote  map[string]*origin
}

// New returns a recorder of lim's decisions, on lim's clock.
func New(lim *limiter.Limiter) *Recorder {
	r := &Recorder{lim: lim, now: lim.NowMS, remote: map[string]*origin{}}
	r.buckets.Store(&[]*bucket{})
	return r
}

// bucket is one bucket's minute counters and busy keys.
type bucket struct {
	stripes [stripes][Minutes]counts
	hot     hotKeys
}

// counts are one minute's decisions: each word holds the minute (mod 2^24) in its top
// 24 bits and the count in the low 40, so that a new minute replaces an old one in one
// CAS, and a word of another minute reads as zero.
type counts struct {
	allowed, denied atomic.Uint64
}

const (
	countBits = 40
	countMask = 1<<countBits - 1
	tagMask   = 1<<(64-countBits) - 1
)

func tag(minute int64) uint64 { return uint64(minute) & tagMask }

// add adds one to w for minute tag t.
func add(w *atomic.Uint64, t uint64) {
	v := w.Load()
	for v>>countBits != t {
		if w.CompareAndSwap(v, t<<countBits|1) {
			return
		}
		v = w.Load()
	}
	w.Add(1)
}

func read(w *atomic.Uint64, t uint64) uint64 {
	if v := w.Load(); v>>countBits == t {
		return v & countMask
	}
	return 0
}

func (r *Recorder) bucket(id limiter.BucketID) *bucket {
	if bs := *r.buckets.Load(); int(id) < len(bs) {
		if b := bs[id]; b != nil {
			return b
		}
	}
	if id >= maxBuckets {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	bs := *r.buckets.Load()
	if int(id) < len(bs) && bs[id] != nil {
		return bs[id]
	}
	grown := make([]*bucket, max(len(bs), int(id)+1))
	copy(grown, bs)
	b := &bucket{}
	grown[id] = b
	r.buckets.Store(&grown)
	return b
}

// stripe picks a key's stripe from two of its bytes: cheap, and spread enough for ids,
// addresses and hashes.
func stripe(id string) int {
	if id == "" {
		return 0
	}
	return int(uint(id[len(id)-1])+uint(id[len(id)/2])*7+uint(len(id))) % stripes
}

// Note records a decision of the limiter on k (a Check or a Take): allowed or denied
// in the current minute, and k as a busy candidate when its count reaches a power of two
// or first goes over its limit. It allocates nothing, except when a new key enters the
// table of busy keys.
func (r *Recorder) Note(k limiter.Key, res limiter.Result) {
	b := r.bucket(k.Bucket)
	if b == nil {
		return
	}
	// The decision's window tells the minute without reading the clock again when it
	// lies within one minute (1 s and 60 s windows always do): now is in it.
	minute := (res.WindowEndMS - 1) / minuteMS
	if w := res.Limit.Window.Milliseconds(); w <= 0 || (res.WindowEndMS-w)/minuteMS != minute {
		minute = r.now() / minuteMS
	}
	c := &b.stripes[stripe(k.ID)][minute%Minutes]
	t := tag(minute)
	if res.Allowed {
		add(&c.allowed, t)
	} else {
		add(&c.denied, t)
	}
	if n := res.Count; n&(n-1) == 0 || n == res.Limit.Count+1 {
		b.hot.offer(k.ID, n, res.Limit, res.WindowEndMS, r.now(), true)
	}
}

// Offer proposes k as a busy key with count hits in the window ending at endMS, outside
// the hot path: the cluster offers the keys whose counts other nodes reported. lim may
// be zero when no check on this node has given k a limit yet.
func (r *Recorder) Offer(k limiter.Key, count uint32, lim limiter.Limit, endMS int64) {
	if count == 0 {
		return
	}
	if b := r.bucket(k.Bucket); b != nil {
		b.hot.offer(k.ID, count, lim, endMS, r.now(), false)
	}
}

// BucketTraffic is one bucket's minutes, oldest first, the current minute last.
type BucketTraffic struct {
	Bucket  string
	Minutes [Minutes]Minute
}

// Traffic returns, for every bucket that had a decision in the last hour on this node
// or on another node that reported it, the decisions of each minute, this node's and
// the others' together, sorted by bucket name; and how many nodes' counts are in it
// (this one included).
func (r *Recorder) Traffic() ([]BucketTraffic, int) {
	now := r.now()
	cur := now / minuteMS
	byName := map[string]*BucketTraffic{}
	get := func(name string) *BucketTraffic {
		bt := byName[name]
		if bt == nil {
			bt = &BucketTraffic{Bucket: name}
			for i := range bt.Minutes {
				bt.Minutes[i].StartMS = (cur - Minutes + 1 + int64(i)) * minuteMS
			}
			byName[name] = bt
		}
		return bt
	}
	r.Own(func(name string, m Minute) {
		bt := get(name)
		i := m.StartMS/minuteMS - (cur - Minutes + 1)
		bt.Minutes[i].Allowed += m.Allowed
		bt.Minutes[i].Denied += m.Denied
	})
	r.mu.Lock()
	nodes := 1
	for name, o := range r.remote {
		if now-o.seenMS > Minutes*minuteMS {
			delete(r.remote, name)
			continue
		}
		nodes++
		for bname, rb := range o.buckets {
			var bt *BucketTraffic
			for _, m := range rb {
				i := m.minute - (cur - Minutes + 1)
				if i < 0 || i >= Minutes || m.allowed+m.denied == 0 {
					continue
				}
				if bt == nil {
					bt = get(bname)
				}
				bt.Minutes[i].Allowed += m.allowed
				bt.Minutes[i].Denied += m.denied
			}
		}
	}
	r.mu.Unlock()
	out := make([]BucketTraffic, 0, len(byName))
	for _, bt := range byName {
		out = append(out, *bt)
	}
	slices.SortFunc(out, func(a, b BucketTraffic) int { return strings.Compare(a.Bucket, b.Bucket) })
	return out, nodes
}

// Own calls f for every minute of the last hour with a decision on this node, per
// bucket: what this node sends to the others.
func (r *Recorder) Own(f func(bucket string, m Minute)) {
	cur := r.now() / minuteMS
	for id, b := range *r.buckets.Load() {
		if b == nil {
			continue
		}
		name := r.lim.BucketName(limiter.BucketID(id))
		for m := cur - Minutes + 1; m <= cur; m++ {
			t, slot := tag(m), m%Minutes
			var allowed, denied uint64
			for s := range b.stripes {
				allowed += read(&b.stripes[s][slot].allowed, t)
				denied += read(&b.stripes[s][slot].denied, t)
			}
			if allowed+denied > 0 {
				f(name, Minute{StartMS: m * minuteMS, Allowed: allowed, Denied: denied})
			}
		}
	}
}

// origin is what another node reported of its own decisions.
type origin struct {
	seenMS  int64
	buckets map[string]*[Minutes]remoteMinute
}

type remoteMinute struct {
	minute          int64
	allowed, denied uint64
}

// MergeRemote records what another node (origin: its name and incarnation) reported of
// one minute of its decisions in a bucket. Counts only grow within a minute, so the
// larger of two reports wins: a report lost, repeated or reordered changes nothing.
// Minutes outside the last hour, invalid bucket names, and nodes or buckets beyond
// MaxOrigins and MaxRemoteBuckets are ignored.
func (r *Recorder) MergeRemote(originName, bucketName string, m Minute) {
	now := r.now()
	cur, minute := now/minuteMS, m.StartMS/minuteMS
	if minute <= cur-Minutes || minute > cur+1 || m.StartMS%minuteMS != 0 || !buckets.ValidName(bucketName) || originName == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.remote[originName]
	if o == nil {
		if len(r.remote) >= MaxOrigins && !r.evictOriginLocked(now) {
			return
		}
		o = &origin{buckets: map[string]*[Minutes]remoteMinute{}}
		r.remote[originName] = o
	}
	o.seenMS = now
	rb := o.buckets[bucketName]
	if rb == nil {
		if len(o.buckets) >= MaxRemoteBuckets {
			return
		}
		rb = new([Minutes]remoteMinute)
		o.buckets[bucketName] = rb
	}
	slot := &rb[minute%Minutes]
	if slot.minute != minute {
		if slot.minute > minute {
			return
		}
		*slot = remoteMinute{minute: minute}
	}
	slot.allowed = max(slot.allowed, min(m.Allowed, math.MaxUint64/2))
	slot.denied = max(slot.denied, min(m.Denied, math.MaxUint64/2))
}

// evictOriginLocked drops the node heard from least recently, if it was not heard from
// in the last minute.
func (r *Recorder) evictOriginLocked(now int64) bool {
	oldest, at := "", int64(math.MaxInt64)
	for name, o := range r.remote {
		if o.seenMS < at {
			oldest, at = name, o.seenMS
		}
	}
	if oldest == "" || now-at < minuteMS {
		return false
	}
	delete(r.remote, oldest)
	return true
}

// BucketBusiest is one bucket's busiest keys, busiest first.
type BucketBusiest struct {
	Bucket string
	Keys   []Busy
}

// Busiest returns up to n (at most MaxTop) of the busiest keys of each bucket that want
// accepts (nil: every bucket), in their current windows, with every node's count as
// the limiter knows it. Buckets without a live key are left out. The work is bounded by
// the tables' size, never by the number of live keys; no lock of the hot path is held
// for more than one key's lookup.
func (r *Recorder) Busiest(n int, want func(bucket string) bool) []BucketBusiest {
	n = min(max(n, 1), MaxTop)
	now := r.now()
	var out []BucketBusiest
	var cands []candidateCopy
	for id, b := range *r.buckets.Load() {
		if b == nil {
			continue
		}
		name := r.lim.BucketName(limiter.BucketID(id))
		if want != nil && !want(name) {
			continue
		}
		cands = b.hot.copyLive(cands[:0], now)
		keys := make([]Busy, 0, len(cands))
		for _, c := range cands {
			snap, ok := r.lim.Lookup(limiter.Key{Bucket: limiter.BucketID(id), ID: c.id})
			if !ok || snap.EndMS <= now {
				continue
			}
			count := uint32(min(uint64(snap.Own)+uint64(snap.Remote), math.MaxUint32))
			if count == 0 {
				continue
			}
			lim := c.limit
			if lim.Count == 0 && snap.Limit > 0 {
				lim.Count = snap.Limit
			}
			if snap.SizeMS > 0 {
				lim.Window = time.Duration(snap.SizeMS) * time.Millisecond
			}
			keys = append(keys, Busy{ID: c.id, Count: count, Limit: lim, WindowEndMS: snap.EndMS})
		}
		if len(keys) == 0 {
			continue
		}
		slices.SortFunc(keys, func(a, b Busy) int {
			switch {
			case a.Count != b.Count:
				if a.Count > b.Count {
					return -1
				}
				return 1
			case a.ID < b.ID:
				return -1
			case a.ID > b.ID:
				return 1
			}
			return 0
		})
		out = append(out, BucketBusiest{Bucket: name, Keys: slices.Clip(keys[:min(n, len(keys))])})
	}
	slices.SortFunc(out, func(a, b BucketBusiest) int { return strings.Compare(a.Bucket, b.Bucket) })
	return out
}
