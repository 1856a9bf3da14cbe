package limiter

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

func newReplicated(t testing.TB, startMS int64) (*Limiter, *fakeClock) {
	t.Helper()
	c := &fakeClock{}
	c.set(startMS)
	return New(Options{Now: c.now, Replicated: true}), c
}

func TestRemoteCountsAddToOwn(t *testing.T) {
	l, c := newReplicated(t, 10_000)
	k := Key{l.Bucket("b"), "x"}
	lim := Limit{Count: 10, Window: time.Second}
	// Other nodes counted 8 in the current window (10 s to 11 s).
	l.SetRemote(k, 1000, 11_000, 8)
	if r := l.Peek(k, lim); r.Count != 8 || !r.Allowed {
		t.Fatalf("peek: %+v", r)
	}
	for i := 1; i <= 2; i++ {
		if r := l.Check(k, 1, lim); !r.Allowed || r.Count != uint32(8+i) {
			t.Fatalf("check %d: %+v", i, r)
		}
	}
	if r := l.Check(k, 1, lim); r.Allowed || r.Count != 11 {
		t.Fatalf("over the shared limit: %+v", r)
	}
	// A report for another window does not count in this one.
	l.SetRemote(k, 1000, 10_000, 100)
	if r := l.Peek(k, lim); r.Count != 3 {
		t.Fatalf("a report of an ended window counted: %+v", r)
	}
	// Next window: only what is reported for it counts.
	c.set(11_000)
	if r := l.Check(k, 1, lim); !r.Allowed || r.Count != 1 {
		t.Fatalf("next window: %+v", r)
	}
	if r := l.Record(k, 1, lim); r.Count != 2 {
		t.Fatalf("record: %+v", r)
	}
}

func TestRemoteOnlyCounterIsKeptForItsWindow(t *testing.T) {
	l, c := newReplicated(t, 10_500)
	k := Key{l.Bucket("b"), "never-seen-here"}
	l.SetRemote(k, 60_000, 60_000, 5)
	if l.Sweep(); l.Len() != 1 {
		t.Fatal("a counter known only from other nodes was swept before its window ended")
	}
	if r := l.Check(k, 1, Limit{Count: 5, Window: time.Minute}); r.Allowed || r.Count != 6 {
		t.Fatalf("first local hit did not see the remote count: %+v", r)
	}
	c.set(60_000)
	l.Sweep()
	if l.Len() != 0 {
		t.Fatal("not swept after its window")
	}
	local := New(Options{Now: c.now})
	local.SetRemote(k, 60_000, 120_000, 5)
	if local.Len() != 0 {
		t.Fatal("a local limiter took a remote count")
	}
}

func TestCapBoundsOwnCount(t *testing.T) {
	l, _ := newReplicated(t, 0)
	k := Key{l.Bucket("b"), "x"}
	lim := Limit{Count: 100, Window: time.Second}
	l.SetCap(k, 1000, 1000, 3)
	for i := 1; i <= 3; i++ {
		if r := l.Check(k, 1, lim); !r.Allowed {
			t.Fatalf("hit %d within the cap denied", i)
		}
	}
	if r := l.Check(k, 1, lim); r.Allowed {
		t.Fatal("hit over the share cap allowed")
	}
	if r := l.Peek(k, lim); !r.Allowed {
		t.Fatal("the cap applies to Peek")
	}
	// The hit refused by the cap was not counted: it must not use up the budget the
	// other nodes share.
	l.ClearCap(k, 1000, 1000)
	if r := l.Check(k, 1, lim); !r.Allowed || r.Count != 4 {
		t.Fatalf("after ClearCap: %+v", r)
	}
	l.SetCap(k, 1000, 0, 0) // a cap for another window does not apply
	if r := l.Check(k, 1, lim); !r.Allowed {
		t.Fatal("a cap of another window applied")
	}
	l.SetCap(k, 1000, 1000, 0)
	if r := l.Check(k, 1, lim); r.Allowed {
		t.Fatal("cap 0 allowed a hit")
	}
}

// The bound of the next window can be set while the current one's applies; hits the
// bound refuses are noted, listed for the next sync, and not counted.
func TestCapsOfTwoWindowsAndRefusedHits(t *testing.T) {
	l, c := newReplicated(t, 10_500)
	k := Key{l.Bucket("b"), "x"}
	lim := Limit{Count: 100, Window: time.Second}
	l.SetCap(k, 1000, 11_000, 2) // this window
	l.SetCap(k, 1000, 12_000, 5) // the next
	if c, ok := l.CapIn(k, 1000, 11_000); !ok || c != 2 {
		t.Fatalf("CapIn this window: %d %v", c, ok)
	}
	if _, ok := l.CapIn(k, 1000, 13_000); ok {
		t.Fatal("a bound for a window never set")
	}
	// SetCap of the next window does not move the counter into it.
	if s, _ := l.Lookup(k); s.EndMS != 11_000 || s.Own != 0 {
		t.Fatalf("after the bounds: %+v", s)
	}
	l.DrainChanged(func(Key, Snapshot) {})
	for i := range 4 {
		if r := l.Check(k, 1, lim); r.Allowed != (i < 2) {
			t.Fatalf("hit %d: %+v", i+1, r)
		}
	}
	if r := l.Take(k, 1, lim); r.Allowed {
		t.Fatalf("Take over the bound: %+v", r)
	}
	s, _ := l.Lookup(k)
	if s.Own != 2 || s.Refused != 3 || !s.Capped || s.Cap != 2 {
		t.Fatalf("this window: %+v, want 2 counted, 3 refused, bound 2", s)
	}
	var drained []Snapshot
	l.DrainChanged(func(_ Key, s Snapshot) { drained = append(drained, s) })
	if len(drained) != 1 || drained[0].Refused != 3 {
		t.Fatalf("drained %+v", drained)
	}
	// A refused hit alone lists the counter again.
	l.Check(k, 1, lim)
	n := 0
	l.DrainChanged(func(Key, Snapshot) { n++ })
	if n != 1 {
		t.Fatalf("a refused hit listed the counter %d times", n)
	}
	// The next window: its own bound, and nothing refused yet.
	c.set(11_000)
	for i := range 6 {
		if r := l.Check(k, 1, lim); r.Allowed != (i < 5) {
			t.Fatalf("next window, hit %d: %+v", i+1, r)
		}
	}
	if s, _ := l.Lookup(k); s.Own != 5 || s.Refused != 1 || s.Cap != 5 {
		t.Fatalf("next window: %+v", s)
	}
	// ClearCap of one window leaves the other's.
	l.SetCap(k, 1000, 13_000, 7)
	l.ClearCap(k, 1000, 12_000)
	if _, ok := l.CapIn(k, 1000, 12_000); ok {
		t.Fatal("the bound was not lifted")
	}
	if c, ok := l.CapIn(k, 1000, 13_000); !ok || c != 7 {
		t.Fatal("lifting one window's bound lifted the other's")
	}
}

// A counter with a bound for the next window is kept until that window ends, and a
// bound set on a counter never counted here starts it in the current window.
func TestCapKeepsTheCounter(t *testing.T) {
	l, c := newReplicated(t, 10_500)
	k := Key{l.Bucket("b"), "x"}
	l.SetCap(k, 1000, 12_000, 3)
	if s, ok := l.Lookup(k); !ok || s.EndMS != 11_000 || s.SizeMS != 1000 {
		t.Fatalf("a bound on a new counter: %+v %v", s, ok)
	}
	c.set(11_500)
	l.Sweep()
	if l.Len() != 1 {
		t.Fatal("swept before the window of its bound ended")
	}
	if r := l.Check(k, 4, Limit{Count: 100, Window: time.Second}); r.Allowed {
		t.Fatalf("4 hits over a bound of 3: %+v", r)
	}
	c.set(12_000)
	l.Sweep()
	if l.Len() != 0 {
		t.Fatal("kept after the window of its bound")
	}
	local := New(Options{Now: c.now})
	local.SetCap(k, 1000, 13_000, 1)
	if local.Len() != 0 {
		t.Fatal("a local limiter took a bound")
	}
}

func TestDrainChanged(t *testing.T) {
	l, c := newReplicated(t, 5_250)
	b := l.Bucket("b")
	lim := Limit{Count: 10, Window: time.Second}
	for range 3 {
		l.Check(Key{b, "x"}, 1, lim)
	}
	l.Record(Key{b, "y"}, 2, lim)
	l.Peek(Key{b, "z"}, lim)
	got := map[string]Snapshot{}
	l.DrainChanged(func(k Key, s Snapshot) { got[k.ID] = s })
	if len(got) != 2 || got["x"] != (Snapshot{Own: 3, Limit: 10, SizeMS: 1000, EndMS: 6000}) || got["y"].Own != 2 {
		t.Fatalf("drained %+v", got)
	}
	l.DrainChanged(func(k Key, s Snapshot) { t.Errorf("%s drained twice", k.ID) })
	l.Check(Key{b, "x"}, 1, lim)
	n := 0
	l.DrainChanged(func(k Key, s Snapshot) {
		n++
		if k.ID != "x" || s.Own != 4 {
			t.Errorf("drained %s %+v", k.ID, s)
		}
	})
	if n != 1 {
		t.Fatalf("%d drained after one more hit", n)
	}
	// Each reports live counters only.
	c.set(6_000)
	l.SetRemote(Key{b, "r"}, 1000, 7000, 4)
	var each []string
	l.Each(func(k Key, s Snapshot) { each = append(each, fmt.Sprintf("%s %d %d", k.ID, s.Own, s.Remote)) })
	if len(each) != 1 || each[0] != "r 0 4" {
		t.Fatalf("Each: %v", each)
	}
	if s, ok := l.Lookup(Key{b, "r"}); !ok || s.Remote != 4 {
		t.Fatalf("Lookup: %+v %v", s, ok)
	}
	// A local limiter lists nothing.
	local := New(Options{})
	local.Check(Key{local.Bucket("b"), "x"}, 1, lim)
	local.DrainChanged(func(Key, Snapshot) { t.Error("a local limiter drained a counter") })
}

// BenchmarkCheckReplicated compares the hot path of a replicated limiter, drained as
// the sync loop drains it, with a local one, in the same run; and the path of a check
// that share mode's bound refuses (noted as refused, the counter listed for the sync).
func BenchmarkCheckReplicated(b *testing.B) {
	for _, mode := range []struct {
		name       string
		replicated bool
		capped     bool // every check refused by a share-mode bound
	}{{"local", false, false}, {"replicated", true, false}, {"replicated-refused", true, true}} {
		b.Run(mode.name, func(b *testing.B) {
			l := New(Options{Replicated: mode.replicated})
			bk := l.Bucket("activity_create")
			keys := make([]Key, 10_000)
			const hour = 3_600_000
			for i := range keys {
				keys[i] = Key{bk, fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)}
				l.SetRemote(keys[i], hour, (l.NowMS()/hour+1)*hour, 1)
				if mode.capped {
					l.SetCap(keys[i], hour, (l.NowMS()/hour+1)*hour, 0)
				}
			}
			lim := Limit{Count: 1 << 30, Window: time.Hour}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				t := time.NewTicker(10 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
						l.DrainChanged(func(Key, Snapshot) {})
					}
				}
			}()
			b.ReportAllocs()
			var seq atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(7919))
				for pb.Next() {
					l.Check(keys[i%len(keys)], 1, lim)
					i++
				}
			})
			close(stop)
			<-done
		})
	}
}

// TestBoundRefusedAsksForRoom: a check or take the share-mode bound refuses while the
// limit has room asks for it (OnBoundRefused), is tried again once the bound rose
// (RaiseCap), and is not noted as refused; one the limit itself refuses asks nothing.
func TestBoundRefusedAsksForRoom(t *testing.T) {
	l, _ := newReplicated(t, 10_000)
	k := Key{l.Bucket("b"), "x"}
	lim := Limit{Count: 10, Window: time.Second}
	l.SetRemote(k, 1000, 11_000, 5)
	l.SetCap(k, 1000, 11_000, 1)
	asks, grant := 0, uint32(1)
	var by, gotBy time.Time
	l.OnBoundRefused(func(got Key, n uint32, sizeMS, endMS int64, due time.Time) bool {
		asks++
		if got != k || n != 1 || sizeMS != 1000 || endMS != 11_000 {
			t.Errorf("asked for %v %d in %d ending %d", got, n, sizeMS, endMS)
		}
		gotBy = due
		return grant > 0 && l.RaiseCap(got, sizeMS, endMS, grant)
	})
	if r := l.Check(k, 1, lim); !r.Allowed || asks != 0 {
		t.Fatalf("within the bound: %+v, %d asks", r, asks)
	}
	if r := l.Check(k, 1, lim); !r.Allowed || asks != 1 {
		t.Fatalf("the bound refused, room granted: %+v, %d asks", r, asks)
	}
	if r := l.Take(k, 1, lim); !r.Allowed || asks != 2 {
		t.Fatalf("take: %+v, %d asks", r, asks)
	}
	if !gotBy.IsZero() {
		t.Fatalf("Check and Take asked with a decision due at %v, want none", gotBy)
	}
	s, _ := l.Lookup(k)
	if s.Own != 3 || s.Refused != 0 || s.Cap != 3 {
		t.Fatalf("after the grants: %+v", s)
	}
	// Nothing granted: refused, noted, asked once per try.
	grant = 0
	if r := l.Check(k, 1, lim); r.Allowed || asks != 3 {
		t.Fatalf("no grant: %+v, %d asks", r, asks)
	}
	if s, _ := l.Lookup(k); s.Own != 3 || s.Refused != 1 {
		t.Fatalf("after a refusal: %+v", s)
	}
	// CheckBy and TakeBy tell the wait when the decision is due.
	by = time.Unix(1_700_000_000, 0)
	if r := l.CheckBy(k, 1, lim, by); r.Allowed || asks != 4 || !gotBy.Equal(by) {
		t.Fatalf("CheckBy: %+v, %d asks, due %v, want %v", r, asks, gotBy, by)
	}
	gotBy = time.Time{}
	if r := l.TakeBy(k, 1, lim, by); r.Allowed || asks != 5 || !gotBy.Equal(by) {
		t.Fatalf("TakeBy: %+v, %d asks, due %v, want %v", r, asks, gotBy, by)
	}
	// The limit itself is reached: no asking.
	grant = 5
	l.SetRemote(k, 1000, 11_000, 7)
	if r := l.Check(k, 1, lim); r.Allowed || asks != 5 {
		t.Fatalf("at the limit: %+v, %d asks", r, asks)
	}
	if l.RaiseCap(Key{l.Bucket("b"), "none"}, 1000, 11_000, 1) {
		t.Fatal("raised the bound of a counter without one")
	}
}

// TestDecideBy: a decision is due a fifth of the time to the caller's deadline before
// it, at least AnswerMargin before; without a deadline, never.
func TestDecideBy(t *testing.T) {
	start := time.Now()
	if by := DecideBy(context.Background(), start); !by.IsZero() {
		t.Fatalf("no deadline: due %v", by)
	}
	for _, c := range []struct{ timeout, margin time.Duration }{
		{250 * time.Millisecond, 50 * time.Millisecond},
		{60 * time.Millisecond, AnswerMargin},
		{10 * time.Millisecond, AnswerMargin},
	} {
		ctx, cancel := context.WithDeadline(context.Background(), start.Add(c.timeout))
		if by, want := DecideBy(ctx, start), start.Add(c.timeout-c.margin); !by.Equal(want) {
			t.Errorf("timeout %v: due %v after start, want %v", c.timeout, by.Sub(start), want.Sub(start))
		}
		cancel()
	}
}

// TestPeekNotesTheWindowItRead: a read that finds nothing of this node's own in the
// current window notes that window (the cluster asks for its count then), whatever
// window the counter's own count is of; a read of a window it counted in notes nothing.
func TestPeekNotesTheWindowItRead(t *testing.T) {
	l, c := newReplicated(t, 10_500)
	l.OnUnknown(func(Key, uint32, int64, int64) {})
	k := Key{l.Bucket("b"), "x"}
	lim := Limit{Count: 5, Window: time.Second}
	l.Check(k, 1, lim)
	if s, _ := l.Lookup(k); s.ReadEndMS != 0 {
		t.Fatalf("a check noted a read: %+v", s)
	}
	c.set(11_200)
	l.Peek(k, lim)
	if s, _ := l.Lookup(k); s.ReadEndMS != 12_000 || s.EndMS != 11_000 || s.Own != 1 {
		t.Fatalf("after a read of the next window: %+v, want the read noted for the window ending at 12,000 and the count of the one before", s)
	}
	c.set(12_100)
	l.Check(k, 1, lim)
	l.Peek(k, lim)
	if s, _ := l.Lookup(k); s.ReadEndMS != 12_000 {
		t.Fatalf("a read of a window counted in here noted it: %+v", s)
	}
}
