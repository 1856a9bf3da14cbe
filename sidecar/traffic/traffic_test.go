package traffic

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// clock is a settable wall clock.
type clock struct{ ms atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	// Ten seconds into a minute, so that a 60 s window has 50 s left.
	c.ms.Store(time.Now().Truncate(time.Minute).Add(10 * time.Second).UnixMilli())
	return c
}

func (c *clock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *clock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

func newRecorder(t testing.TB, replicated bool) (*Recorder, *limiter.Limiter, *clock) {
	t.Helper()
	clk := newClock()
	lim := limiter.New(limiter.Options{Now: clk.now, Replicated: replicated})
	return New(lim), lim, clk
}

// check counts one hit on k and records the decision, as the ext_authz Check does.
func check(r *Recorder, lim *limiter.Limiter, k limiter.Key, l limiter.Limit) limiter.Result {
	res := lim.Check(k, 1, l)
	r.Note(k, res)
	return res
}

func find(ts []BucketTraffic, name string) *BucketTraffic {
	for i := range ts {
		if ts[i].Bucket == name {
			return &ts[i]
		}
	}
	return nil
}

func TestMinutesCountAllowedAndDenied(t *testing.T) {
	r, lim, clk := newRecorder(t, false)
	b := lim.Bucket("token_create")
	l := limiter.Limit{Count: 3, Window: time.Minute}
	for i := range 5 {
		check(r, lim, limiter.Key{Bucket: b, ID: "198.51.100." + strconv.Itoa(i%2)}, l)
	}
	// Both keys: 3 + 2 hits, all within 3: five allowed.
	for range 4 {
		check(r, lim, limiter.Key{Bucket: b, ID: "203.0.113.9"}, l)
	}
	ts, nodes := r.Traffic()
	if nodes != 1 || len(ts) != 1 {
		t.Fatalf("traffic of %d nodes, %d buckets: %+v", nodes, len(ts), ts)
	}
	cur := ts[0].Minutes[Minutes-1]
	if cur.Allowed != 8 || cur.Denied != 1 {
		t.Fatalf("current minute %+v, want 8 allowed and 1 denied", cur)
	}
	if want := clk.now().Truncate(time.Minute).UnixMilli(); cur.StartMS != want {
		t.Fatalf("current minute starts at %d, want %d", cur.StartMS, want)
	}
	if ts[0].Minutes[0].StartMS != cur.StartMS-59*60_000 {
		t.Fatalf("the oldest minute starts at %d, want 59 minutes before the current one", ts[0].Minutes[0].StartMS)
	}

	// A minute later the counts move one place back, and the new minute starts empty.
	clk.advance(time.Minute)
	check(r, lim, limiter.Key{Bucket: b, ID: "192.0.2.1"}, l)
	ts, _ = r.Traffic()
	m := ts[0].Minutes
	if m[Minutes-2].Allowed != 8 || m[Minutes-2].Denied != 1 || m[Minutes-1].Allowed != 1 || m[Minutes-1].Denied != 0 {
		t.Fatalf("after a minute: %+v then %+v", m[Minutes-2], m[Minutes-1])
	}

	// After an hour the ring has forgotten them: the slot of the old minute is reused.
	clk.advance(59 * time.Minute)
	check(r, lim, limiter.Key{Bucket: b, ID: "192.0.2.1"}, l)
	ts, _ = r.Traffic()
	var total uint64
	for _, mm := range ts[0].Minutes {
		total += mm.Allowed + mm.Denied
	}
	if total != 2 || ts[0].Minutes[Minutes-1].Allowed != 1 {
		t.Fatalf("an hour later the ring holds %d decisions: %+v", total, ts[0].Minutes)
	}
}

func TestMinutesUnderConcurrency(t *testing.T) {
	r, lim, _ := newRecorder(t, false)
	b := lim.Bucket("inbound")
	l := limiter.Limit{Count: 1000, Window: time.Minute}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				check(r, lim, limiter.Key{Bucket: b, ID: fmt.Sprintf("k%d-%d", g, i%7)}, l)
			}
		})
	}
	wg.Wait()
	ts, _ := r.Traffic()
	if got := ts[0].Minutes[Minutes-1]; got.Allowed+got.Denied != 4000 {
		t.Fatalf("8 × 500 decisions recorded as %+v", got)
	}
}

// The busiest keys are the ones with the most hits, with their limit and window, every
// node's hits counted; keys of ended windows drop out.
func TestBusiestKeys(t *testing.T) {
	r, lim, clk := newRecorder(t, true)
	b := lim.Bucket("activity_create")
	l := limiter.Limit{Count: 50, Window: time.Minute}
	// Keys with distinct counts 1..300, interleaved so that no key is counted in one go.
	const keys = 300
	for round := range keys {
		for k := round; k < keys; k++ {
			check(r, lim, limiter.Key{Bucket: b, ID: fmt.Sprintf("tenant-%03d", k)}, l)
		}
	}
	// Another node reports 1000 hits of one quiet key: it is the busiest.
	quiet := limiter.Key{Bucket: b, ID: "tenant-000"}
	snap, _ := lim.Lookup(quiet)
	lim.SetRemote(quiet, snap.SizeMS, snap.EndMS, 1000)
	r.Offer(quiet, 1001, limiter.Limit{}, snap.EndMS)

	got := r.Busiest(5, nil)
	if len(got) != 1 || got[0].Bucket != "activity_create" {
		t.Fatalf("busiest %+v", got)
	}
	want := []struct {
		id    string
		count uint32
	}{{"tenant-000", 1001}, {"tenant-299", 300}, {"tenant-298", 299}, {"tenant-297", 298}, {"tenant-296", 297}}
	if len(got[0].Keys) != len(want) {
		t.Fatalf("%d keys: %+v", len(got[0].Keys), got[0].Keys)
	}
	for i, w := range want {
		k := got[0].Keys[i]
		if k.ID != w.id || k.Count != w.count || k.Limit != l || k.WindowEndMS != snap.EndMS {
			t.Errorf("#%d: %+v, want %s with %d hits, limit %v, window ending at %d", i, k, w.id, w.count, l, snap.EndMS)
		}
	}
	if r.Busiest(5, func(name string) bool { return name == "upload" }) != nil {
		t.Error("a bucket filter that matches nothing returned keys")
	}

	clk.advance(time.Minute)
	if got := r.Busiest(5, nil); len(got) != 0 {
		t.Fatalf("a window later the keys are still busy: %+v", got)
	}
}

// With far more keys than the table holds, the busiest are still found and the table
// stays bounded.
func TestBusiestAmongManyKeys(t *testing.T) {
	r, lim, _ := newRecorder(t, false)
	b := lim.Bucket("inbound")
	l := limiter.Limit{Count: 100, Window: time.Minute}
	for i := range 50_000 {
		check(r, lim, limiter.Key{Bucket: b, ID: fmt.Sprintf("channel-%05d", i)}, l)
	}
	for range 40 {
		check(r, lim, limiter.Key{Bucket: b, ID: "channel-07777"}, l)
	}
	for range 140 { // over its limit from the 101st hit on
		check(r, lim, limiter.Key{Bucket: b, ID: "channel-31337"}, l)
	}
	got := r.Busiest(2, nil)
	if len(got) != 1 || len(got[0].Keys) != 2 || got[0].Keys[0].ID != "channel-31337" || got[0].Keys[0].Count != 141 ||
		got[0].Keys[1].ID != "channel-07777" || got[0].Keys[1].Count != 41 {
		t.Fatalf("busiest %+v", got)
	}
	bs := *r.buckets.Load()
	bs[b].hot.mu.Lock()
	n := len(bs[b].hot.keys)
	bs[b].hot.mu.Unlock()
	if n > Candidates {
		t.Fatalf("the table holds %d keys, more than %d", n, Candidates)
	}
}

// Another node's minutes are merged by taking the larger report of each minute, and
// summed with this node's.
func TestMergeRemote(t *testing.T) {
	r, lim, clk := newRecorder(t, false)
	b := lim.Bucket("upload")
	check(r, lim, limiter.Key{Bucket: b, ID: "t1"}, limiter.Limit{Count: 10, Window: time.Second})
	start := clk.now().Truncate(time.Minute).UnixMilli()
	r.MergeRemote("node-b#1", "upload", Minute{StartMS: start, Allowed: 5, Denied: 2})
	r.MergeRemote("node-b#1", "upload", Minute{StartMS: start, Allowed: 3, Denied: 4}) // reordered: max per count
	r.MergeRemote("node-c#1", "upload", Minute{StartMS: start - 60_000, Allowed: 7})
	r.MergeRemote("node-c#1", "login_ip", Minute{StartMS: start, Denied: 1})
	// Ignored: too old, not on a minute, an invalid bucket name, no origin.
	r.MergeRemote("node-c#1", "upload", Minute{StartMS: start - 60*60_000, Allowed: 100})
	r.MergeRemote("node-c#1", "upload", Minute{StartMS: start + 1, Allowed: 100})
	r.MergeRemote("node-c#1", "Upload!", Minute{StartMS: start, Allowed: 100})
	r.MergeRemote("", "upload", Minute{StartMS: start, Allowed: 100})

	ts, nodes := r.Traffic()
	if nodes != 3 {
		t.Fatalf("%d nodes, want 3", nodes)
	}
	up := find(ts, "upload")
	if up == nil || up.Minutes[Minutes-1] != (Minute{StartMS: start, Allowed: 6, Denied: 4}) || up.Minutes[Minutes-2].Allowed != 7 {
		t.Fatalf("upload %+v", up)
	}
	if li := find(ts, "login_ip"); li == nil || li.Minutes[Minutes-1].Denied != 1 {
		t.Fatalf("login_ip %+v", li)
	}
	// Own is what this node sends: its decisions only.
	var own []Minute
	r.Own(func(name string, m Minute) { own = append(own, m) })
	if len(own) != 1 || own[0].Allowed != 1 {
		t.Fatalf("own %+v", own)
	}

	// A node not heard from for an hour is forgotten.
	clk.advance(61 * time.Minute)
	if _, nodes := r.Traffic(); nodes != 1 {
		t.Fatalf("an hour later %d nodes", nodes)
	}
}

func TestMergeRemoteIsBounded(t *testing.T) {
	r, _, clk := newRecorder(t, false)
	start := clk.now().Truncate(time.Minute).UnixMilli()
	for o := range MaxOrigins + 10 {
		for b := range 3 {
			r.MergeRemote(fmt.Sprintf("node-%d#1", o), fmt.Sprintf("b%d", b), Minute{StartMS: start, Allowed: 1})
		}
	}
	for b := range MaxRemoteBuckets + 10 {
		r.MergeRemote("node-0#1", fmt.Sprintf("bucket_%d", b), Minute{StartMS: start, Allowed: 1})
	}
	r.mu.Lock()
	origins, bucketsOf0 := len(r.remote), len(r.remote["node-0#1"].buckets)
	r.mu.Unlock()
	if origins != MaxOrigins || bucketsOf0 != MaxRemoteBuckets {
		t.Fatalf("%d origins and %d buckets of one, want at most %d and %d", origins, bucketsOf0, MaxOrigins, MaxRemoteBuckets)
	}
}

// Busiest allocates the same whatever the number of live keys: its work is bounded by
// the table, not by the limiter.
func TestBusiestAllocationIsBounded(t *testing.T) {
	allocs := func(keys int) float64 {
		r, lim, _ := newRecorder(t, false)
		b := lim.Bucket("inbound")
		fill(r, lim, b, keys)
		return testing.AllocsPerRun(20, func() { r.Busiest(10, nil) })
	}
	small, large := allocs(2*Candidates), allocs(100_000)
	if large > small+2 {
		t.Fatalf("Busiest allocates %.0f times with 100,000 keys and %.0f with %d", large, small, 2*Candidates)
	}
}

// fill counts keys distinct keys, one hit each, and some of them more.
func fill(r *Recorder, lim *limiter.Limiter, b limiter.BucketID, keys int) {
	l := limiter.Limit{Count: 1000, Window: time.Hour}
	id := make([]byte, 0, 32)
	for i := range keys {
		id = strconv.AppendInt(append(id[:0], "channel-"...), int64(i), 10)
		k := limiter.Key{Bucket: b, ID: string(id)}
		check(r, lim, k, l)
		for range i % 7 {
			check(r, lim, k, l)
		}
	}
}

// BenchmarkBusiest1M asks for the busiest keys with a million live keys in the limiter.
func BenchmarkBusiest1M(b *testing.B) {
	r, lim, _ := newRecorder(b, false)
	fill(r, lim, lim.Bucket("inbound"), 1_000_000)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if got := r.Busiest(10, nil); len(got) != 1 || len(got[0].Keys) != 10 {
			b.Fatalf("busiest %+v", got)
		}
	}
}

// BenchmarkNote is the cost of recording one decision on the hot path, over 10,000 keys.
func BenchmarkNote(b *testing.B) {
	r, lim, _ := newRecorder(b, false)
	bk := lim.Bucket("inbound")
	keys := make([]limiter.Key, 10_000)
	for i := range keys {
		keys[i] = limiter.Key{Bucket: bk, ID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i)}
	}
	l := limiter.Limit{Count: 1 << 30, Window: time.Second}
	res := make([]limiter.Result, len(keys))
	for i, k := range keys {
		res[i] = lim.Check(k, 1, l)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			rr := res[i%len(res)]
			rr.Count = 3 // not an offer point: the common case
			r.Note(keys[i%len(keys)], rr)
			i++
		}
	})
}

// BenchmarkLimiterCheck is the limiter's own Check over 10,000 keys with 1 s windows, with
// the recorder's Note after each (note=on) and without (note=off): the recorder's cost
// beside the counter it records, the smallest part of the ext_authz Check (whose whole
// cost with and without the recorder is sidecar/authz's BenchmarkCheck).
func BenchmarkLimiterCheck(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "note=off"
		if on {
			name = "note=on"
		}
		b.Run(name, func(b *testing.B) {
			lim := limiter.New(limiter.Options{})
			r := New(lim)
			bk := lim.Bucket("inbound")
			keys := make([]limiter.Key, 10_000)
			for i := range keys {
				keys[i] = limiter.Key{Bucket: bk, ID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i)}
			}
			l := limiter.Limit{Count: 1 << 30, Window: time.Second}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					k := keys[i%len(keys)]
					res := lim.Check(k, 1, l)
					if on {
						r.Note(k, res)
					}
					i++
				}
			})
		})
	}
}
