package limiter

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a settable wall clock, so tests never sleep across windows.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time      { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) set(ms int64)        { c.ms.Store(ms) }
func (c *fakeClock) add(d time.Duration) { c.ms.Add(d.Milliseconds()) }

func newTest(t testing.TB, startMS int64) (*Limiter, *fakeClock) {
	t.Helper()
	c := &fakeClock{}
	c.set(startMS)
	return New(Options{Now: c.now}), c
}

var perSecond = Limit{Count: 3, Window: time.Second}

func TestCheckAllowsUpToLimitThenDenies(t *testing.T) {
	l, _ := newTest(t, 1_700_000_000_250)
	k := Key{l.Bucket("activity_create"), "t1"}
	for i := 1; i <= 3; i++ {
		r := l.Check(k, 1, perSecond)
		if !r.Allowed || r.Count != uint32(i) || r.RetryAfterMS != 0 {
			t.Fatalf("hit %d: %+v, want allowed with count %d", i, r, i)
		}
	}
	r := l.Check(k, 1, perSecond)
	if r.Allowed || r.Count != 4 {
		t.Fatalf("4th hit: %+v, want denied with count 4", r)
	}
	if r.RetryAfterMS != 750 || r.WindowEndMS != 1_700_000_001_000 {
		t.Fatalf("retry after %d ms, window end %d; want 750 and the next whole second", r.RetryAfterMS, r.WindowEndMS)
	}
	if r.RetryAfterSeconds() != 1 {
		t.Fatalf("retry-after seconds = %d, want 1", r.RetryAfterSeconds())
	}
}

func TestCheckCountsSeveralHitsAtOnce(t *testing.T) {
	l, _ := newTest(t, 0)
	k := Key{l.Bucket("b"), "x"}
	if r := l.Check(k, 3, perSecond); !r.Allowed || r.Count != 3 {
		t.Fatalf("3 hits of 3: %+v", r)
	}
	if r := l.Check(k, 2, perSecond); r.Allowed || r.Count != 5 {
		t.Fatalf("2 more hits: %+v, want denied at 5", r)
	}
}

func TestWindowsAreAlignedToTheWallClock(t *testing.T) {
	// A window of 60 s starts at a whole minute, whenever the first hit comes.
	l, c := newTest(t, 120_000+59_500)
	lim := Limit{Count: 1, Window: time.Minute}
	k := Key{l.Bucket("b"), "x"}
	l.Check(k, 1, lim)
	r := l.Check(k, 1, lim)
	if r.Allowed || r.RetryAfterMS != 500 || r.RetryAfterSeconds() != 1 {
		t.Fatalf("denied hit 500 ms before the minute: %+v", r)
	}
	c.set(180_000) // the next minute begins
	if r := l.Check(k, 1, lim); !r.Allowed || r.Count != 1 {
		t.Fatalf("first hit of the next window: %+v", r)
	}
}

func TestWindowRollover(t *testing.T) {
	l, c := newTest(t, 5_000)
	k := Key{l.Bucket("b"), "x"}
	for range 5 {
		l.Check(k, 1, perSecond)
	}
	c.add(999 * time.Millisecond)
	if r := l.Check(k, 1, perSecond); r.Allowed || r.RetryAfterMS != 1 {
		t.Fatalf("last millisecond of the window: %+v", r)
	}
	c.add(time.Millisecond)
	if r := l.Check(k, 1, perSecond); !r.Allowed || r.Count != 1 {
		t.Fatalf("first millisecond of the next window: %+v", r)
	}
}

func TestRetryAfterSecondsRoundsUpAndIsAtLeastOne(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want int64
	}{{0, 1}, {1, 1}, {999, 1}, {1000, 1}, {1001, 2}, {59_001, 60}, {3_600_000, 3600}} {
		if got := (Result{RetryAfterMS: tc.ms}).RetryAfterSeconds(); got != tc.want {
			t.Errorf("RetryAfterSeconds(%d ms) = %d, want %d", tc.ms, got, tc.want)
		}
	}
	// And through the limiter: 59.001 s left in a minute window is 60 s.
	l, _ := newTest(t, 60_000+999)
	lim := Limit{Count: 1, Window: time.Minute}
	k := Key{l.Bucket("b"), "x"}
	l.Check(k, 1, lim)
	if r := l.Check(k, 1, lim); r.RetryAfterMS != 59_001 || r.RetryAfterSeconds() != 60 {
		t.Fatalf("%+v: want 59001 ms, 60 s", r)
	}
}

func TestPeekNeverCounts(t *testing.T) {
	l, _ := newTest(t, 0)
	k := Key{l.Bucket("login_ip"), "192.0.2.1"}
	for range 10 {
		if r := l.Peek(k, perSecond); !r.Allowed || r.Count != 0 {
			t.Fatalf("peek on an empty counter: %+v", r)
		}
	}
	l.Record(k, 2, perSecond)
	if r := l.Peek(k, perSecond); !r.Allowed || r.Count != 2 {
		t.Fatalf("peek at 2 of 3: %+v", r)
	}
	l.Record(k, 1, perSecond)
	r := l.Peek(k, perSecond)
	if r.Allowed || r.Count != 3 || r.RetryAfterMS != 1000 {
		t.Fatalf("peek at 3 of 3: %+v, want denied", r)
	}
	if r := l.Peek(k, perSecond); r.Count != 3 {
		t.Fatalf("peek counted: %+v", r)
	}
}

func TestRecordCountsWithoutDeciding(t *testing.T) {
	l, _ := newTest(t, 0)
	k := Key{l.Bucket("login_account"), "admin:a@example.com"}
	for i := 1; i <= 5; i++ {
		if r := l.Record(k, 1, perSecond); !r.Allowed || r.Count != uint32(i) {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	if r := l.Check(k, 1, perSecond); r.Allowed || r.Count != 6 {
		t.Fatalf("check after 5 records: %+v", r)
	}
}

func TestKeysAndBucketsAreIsolated(t *testing.T) {
	l, _ := newTest(t, 0)
	a, b := l.Bucket("a"), l.Bucket("b")
	if a == b || l.Bucket("a") != a || l.BucketName(b) != "b" {
		t.Fatalf("bucket registry: a=%d b=%d name(b)=%q", a, b, l.BucketName(b))
	}
	for range 3 {
		l.Check(Key{a, "x"}, 1, perSecond)
	}
	if r := l.Check(Key{a, "x"}, 1, perSecond); r.Allowed {
		t.Fatal("a/x should be used up")
	}
	if r := l.Check(Key{a, "y"}, 1, perSecond); !r.Allowed || r.Count != 1 {
		t.Fatalf("a/y shares a/x's count: %+v", r)
	}
	if r := l.Check(Key{b, "x"}, 1, perSecond); !r.Allowed || r.Count != 1 {
		t.Fatalf("b/x shares a/x's count: %+v", r)
	}
}

func TestChangedWindowStartsAFreshCount(t *testing.T) {
	l, c := newTest(t, 10_000)
	k := Key{l.Bucket("inbound"), "ch"}
	for range 3 {
		l.Check(k, 1, Limit{Count: 3, Window: time.Minute})
	}
	// An override changes the window to 1 s: the minute's count does not carry over.
	if r := l.Check(k, 1, Limit{Count: 3, Window: time.Second}); !r.Allowed || r.Count != 1 {
		t.Fatalf("after the window changed: %+v", r)
	}
	c.add(time.Second)
	if r := l.Check(k, 1, Limit{Count: 3, Window: time.Second}); r.Count != 1 {
		t.Fatalf("next second: %+v", r)
	}
}

func TestLateCallerDoesNotResetANewerWindow(t *testing.T) {
	l, _ := newTest(t, 0)
	k := Key{l.Bucket("b"), "x"}
	size := windowMS(perSecond)
	// Window 7 has 2 hits; a caller that read the clock in window 6 adds to window 7.
	e := l.shard(k).insert(k, false)
	e.add(2, 7, 8000, size, math.MaxUint32)
	if got, _ := e.add(1, 6, 7000, size, math.MaxUint32); got != 3 {
		t.Fatalf("late add = %d, want 3 (counted in the newer window)", got)
	}
	if got, w := e.current(7, size); got != 3 || w != 7 {
		t.Fatalf("current = %d in %d", got, w)
	}
}

func TestCountSaturates(t *testing.T) {
	l, _ := newTest(t, 0)
	k := Key{l.Bucket("b"), "x"}
	l.Record(k, 1<<32-2, perSecond)
	if r := l.Record(k, 5, perSecond); r.Count != 1<<32-1 {
		t.Fatalf("count = %d, want saturated", r.Count)
	}
}

func TestSweepRemovesEndedWindows(t *testing.T) {
	l, c := newTest(t, 0)
	b := l.Bucket("b")
	for i := range 3000 {
		l.Check(Key{b, strconv.Itoa(i)}, 1, perSecond)
	}
	l.Check(Key{b, "minute"}, 1, Limit{Count: 1, Window: time.Minute})
	if n := l.Sweep(); n != 0 || l.Len() != 3001 {
		t.Fatalf("swept %d live counters, %d left", n, l.Len())
	}
	c.add(time.Second)
	if n := l.Sweep(); n != 3000 || l.Len() != 1 {
		t.Fatalf("swept %d, %d left; want 3000 swept and the minute counter kept", n, l.Len())
	}
	// The minute counter still holds its count.
	if r := l.Peek(Key{b, "minute"}, Limit{Count: 1, Window: time.Minute}); r.Allowed {
		t.Fatalf("minute counter lost its count: %+v", r)
	}
	c.add(time.Minute)
	l.Sweep()
	if l.Len() != 0 {
		t.Fatalf("%d counters left after every window ended", l.Len())
	}
}

func TestRunSweeperStops(t *testing.T) {
	l, c := newTest(t, 0)
	l.Check(Key{l.Bucket("b"), "x"}, 1, perSecond)
	c.add(time.Second)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.RunSweeper(time.Millisecond, stop); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for l.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	<-done
	if l.Len() != 0 {
		t.Fatal("sweeper did not remove the ended window")
	}
}

// Concurrent checks on one key allow exactly the limit.
func TestConcurrentChecksAllowExactlyTheLimit(t *testing.T) {
	l, _ := newTest(t, 0)
	k := Key{l.Bucket("b"), "hot"}
	lim := Limit{Count: 1000, Window: time.Minute}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				if l.Check(k, 1, lim).Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 1000 {
		t.Fatalf("allowed %d of 4000 concurrent hits, want exactly 1000", allowed.Load())
	}
}

func BenchmarkCheck(b *testing.B) {
	l := New(Options{})
	bk := l.Bucket("activity_create")
	keys := make([]Key, 10_000)
	for i := range keys {
		keys[i] = Key{bk, fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)}
	}
	lim := Limit{Count: 1 << 30, Window: time.Second}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.Check(keys[i%len(keys)], 1, lim)
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(7919))
			for pb.Next() {
				l.Check(keys[i%len(keys)], 1, lim)
				i++
			}
		})
	})
	b.Run("parallel-one-key", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Check(keys[0], 1, lim)
			}
		})
	})
}

func BenchmarkPeek(b *testing.B) {
	l := New(Options{})
	k := Key{l.Bucket("login_ip"), "192.0.2.1"}
	lim := Limit{Count: 5, Window: time.Minute}
	l.Record(k, 1, lim)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Peek(k, lim)
		}
	})
}

// BenchmarkMemoryPerKey reports the heap held per live counter with 1M keys shaped like
// "activity_create:tenant:<uuid>" (the id is a 36-byte UUID).
func BenchmarkMemoryPerKey(b *testing.B) {
	const n = 1_000_000
	lim := Limit{Count: 100, Window: time.Minute}
	for b.Loop() {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		l := New(Options{})
		bk := l.Bucket("activity_create")
		for _, id := range ids {
			l.Check(Key{bk, id}, 1, lim)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/key")
		runtime.KeepAlive(l)
		runtime.KeepAlive(ids)
	}
}

// Windows longer than 2^32 ms (49.7 days), such as the RLS's 365-day year, are aligned
// to the epoch like every other.
func TestLongWindows(t *testing.T) {
	const year = 365 * 24 * time.Hour
	start := 3*year.Milliseconds() + 5_000 // 5 s into the fourth year since 1970
	l, c := newTest(t, start)
	k := Key{l.Bucket("b"), "x"}
	lim := Limit{Count: 2, Window: year}
	for i := 1; i <= 2; i++ {
		if r := l.Check(k, 1, lim); !r.Allowed || r.Count != uint32(i) || r.WindowEndMS != 4*year.Milliseconds() || r.NowMS != start {
			t.Fatalf("hit %d: %+v", i, r)
		}
	}
	c.add(year - 10*time.Second)
	if r := l.Check(k, 1, lim); r.Allowed || r.Count != 3 {
		t.Fatalf("near the end of the year: %+v", r)
	}
	c.add(5 * time.Second) // the next year begins
	if r := l.Check(k, 1, lim); !r.Allowed || r.Count != 1 || r.WindowEndMS != 5*year.Milliseconds() {
		t.Fatalf("first hit of the next year: %+v", r)
	}
	if lim := (Limit{Count: 1, Window: 200 * year}); windowMS(lim) != MaxWindow.Milliseconds() {
		t.Fatalf("a window beyond MaxWindow is %d ms", windowMS(lim))
	}
}

// Take refuses hits that would go over the limit and does not count them.
func TestTakeCountsOnlyWithinTheLimit(t *testing.T) {
	l, _ := newTest(t, 0)
	k := Key{l.Bucket("b"), "x"}
	lim := Limit{Count: 5, Window: time.Minute}
	if r := l.Take(k, 3, lim); !r.Allowed || r.Count != 3 {
		t.Fatalf("3 of 5: %+v", r)
	}
	if r := l.Take(k, 3, lim); r.Allowed || r.Count != 3 || r.RetryAfterMS != 60_000 {
		t.Fatalf("3 more: %+v, want refused at 3", r)
	}
	if r := l.Take(k, 2, lim); !r.Allowed || r.Count != 5 {
		t.Fatalf("2 more: %+v, want allowed at 5", r)
	}
	if r := l.Take(k, 1, lim); r.Allowed || r.Count != 5 {
		t.Fatalf("one over: %+v", r)
	}
	// Check still counts denied hits.
	if r := l.Check(k, 1, lim); r.Allowed || r.Count != 6 {
		t.Fatalf("check: %+v", r)
	}
	// A replicated limiter takes the other nodes' count into account.
	lr, _ := newReplicated(t, 0)
	k = Key{lr.Bucket("b"), "x"}
	lr.SetRemote(k, 60_000, 60_000, 4)
	if r := lr.Take(k, 2, lim); r.Allowed || r.Count != 4 {
		t.Fatalf("2 with 4 elsewhere: %+v", r)
	}
	if r := lr.Take(k, 1, lim); !r.Allowed || r.Count != 5 {
		t.Fatalf("1 with 4 elsewhere: %+v", r)
	}
}

// The limiter keeps no reference to the id it is called with: a caller may build ids in
// a buffer it reuses.
func TestIDsAreCopied(t *testing.T) {
	l, _ := newReplicated(t, 0)
	b := l.Bucket("b")
	buf := []byte("first")
	id := unsafeString(buf)
	l.Check(Key{b, id}, 1, perSecond)
	copy(buf, "other")
	var drained []string
	l.DrainChanged(func(k Key, _ Snapshot) { drained = append(drained, k.ID) })
	if len(drained) != 1 || drained[0] != "first" {
		t.Fatalf("changed list holds %q, want [first]", drained)
	}
	if _, ok := l.Lookup(Key{b, "first"}); !ok {
		t.Fatal("the counter is not stored under a copy of its id")
	}
}
