package limiter

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var fivePerMinute = Limit{Count: 5, Window: time.Minute}

// Parallel Takes admit exactly the limit and count nothing they refuse.
func TestTakeAdmitsAtMostTheLimitInParallel(t *testing.T) {
	l, _ := newTest(t, 1_700_000_000_000)
	k := Key{l.Bucket("login_account"), "admin:a@example.com"}
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 150 {
		wg.Go(func() {
			if l.Take(k, 1, fivePerMinute).Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 5 {
		t.Fatalf("%d of 150 parallel Takes admitted, want 5", admitted.Load())
	}
	r := l.Peek(k, fivePerMinute)
	if r.Allowed || r.Count != 5 {
		t.Fatalf("after the Takes: %+v, want denied at 5 (refused Takes are not counted)", r)
	}
}

// A refund gives its hit back to Take and Peek, never more than was taken, and ends
// with the window.
func TestRefund(t *testing.T) {
	l, c := newTest(t, 1_700_000_020_000) // 20 s left in the minute
	k := Key{l.Bucket("login_ip"), "192.0.2.1"}
	if r := l.Refund(k, 3, fivePerMinute); r.Count != 0 {
		t.Fatalf("refund of nothing: %+v", r)
	}
	for i := range 5 {
		if !l.Take(k, 1, fivePerMinute).Allowed {
			t.Fatalf("take %d refused", i+1)
		}
	}
	if r := l.Take(k, 1, fivePerMinute); r.Allowed || r.Count != 5 || r.RetryAfterMS != 20_000 {
		t.Fatalf("sixth take: %+v, want refused at 5 with 20 s left", r)
	}
	if r := l.Refund(k, 1, fivePerMinute); r.Count != 4 {
		t.Fatalf("refund: %+v, want 4", r)
	}
	if r := l.Peek(k, fivePerMinute); !r.Allowed || r.Count != 4 {
		t.Fatalf("peek after a refund: %+v", r)
	}
	if r := l.Take(k, 1, fivePerMinute); !r.Allowed || r.Count != 5 {
		t.Fatalf("take after a refund: %+v", r)
	}
	// At most what was taken: 5 taken, 1 refunded, 10 asked: 4 more.
	if r := l.Refund(k, 10, fivePerMinute); r.Count != 0 {
		t.Fatalf("over-refund: %+v", r)
	}
	for i := range 5 {
		if !l.Take(k, 1, fivePerMinute).Allowed {
			t.Fatalf("take %d after refunding everything refused", i+1)
		}
	}
	if l.Take(k, 1, fivePerMinute).Allowed {
		t.Fatal("refunds made the budget larger than the limit")
	}
	c.add(20 * time.Second)
	if r := l.Peek(k, fivePerMinute); !r.Allowed || r.Count != 0 {
		t.Fatalf("the next window: %+v", r)
	}
}

// In a replicated limiter, Take counts the other nodes' hits and their refunds, which
// arrive as a counter of the "<bucket>_refunds" bucket.
func TestTakeReplicated(t *testing.T) {
	l, _ := newReplicated(t, 1_700_000_020_000)
	k := Key{l.Bucket("login_ip"), "192.0.2.1"}
	endMS := int64(1_700_000_020_000/60_000+1) * 60_000
	l.SetRemote(k, 60_000, endMS, 4)
	if r := l.Take(k, 1, fivePerMinute); !r.Allowed || r.Count != 5 {
		t.Fatalf("take with 4 remote: %+v", r)
	}
	if l.Take(k, 1, fivePerMinute).Allowed {
		t.Fatal("a take beyond the remote hits admitted")
	}
	rk := Key{l.Bucket("login_ip" + RefundSuffix), "192.0.2.1"}
	l.SetRemote(rk, 60_000, endMS, 2)
	if r := l.Peek(k, fivePerMinute); !r.Allowed || r.Count != 3 {
		t.Fatalf("peek with 2 remote refunds: %+v", r)
	}
	for range 2 {
		if !l.Take(k, 1, fivePerMinute).Allowed {
			t.Fatal("remote refunds not deducted")
		}
	}
	if l.Take(k, 1, fivePerMinute).Allowed {
		t.Fatal("admitted past the limit")
	}
	// The local refund is listed for the next sync like any counted key.
	l.Refund(k, 1, fivePerMinute)
	found := false
	l.DrainChanged(func(key Key, s Snapshot) {
		if key == rk && s.Own == 1 {
			found = true
		}
	})
	if !found {
		t.Fatal("the refund is not listed for replication")
	}
}

// BenchmarkTake measures Take against Check in the same run: the same keys and limit.
func BenchmarkTake(b *testing.B) {
	l := New(Options{})
	bk := l.Bucket("login_ip")
	keys := make([]Key, 10_000)
	for i := range keys {
		keys[i] = Key{bk, fmt.Sprintf("198.51.%d.%d", i/256, i%256)}
	}
	lim := Limit{Count: 1 << 30, Window: time.Second}
	for _, op := range []struct {
		name string
		f    func(Key, uint32, Limit) Result
	}{{"check", l.Check}, {"take", l.Take}} {
		b.Run(op.name, func(b *testing.B) {
			b.ReportAllocs()
			var seq atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(7919))
				for pb.Next() {
					op.f(keys[i%len(keys)], 1, lim)
					i++
				}
			})
		})
	}
}
