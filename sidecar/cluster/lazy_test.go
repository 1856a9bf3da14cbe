package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// TestLazyValuesShareFlushes: one node of three, 200 keys far below their limit, each
// counted every 2 s at its own moment (10 a sync interval, in turn). Their values wait,
// each from its own last one; a flush that sends some takes along those due within
// lazySlack intervals, so few flushes send and each carries many values (without it,
// about a third of the flushes would).
func TestLazyValuesShareFlushes(t *testing.T) {
	c := &testClock{}
	c.set(t0 - t0%minute) // a window's start
	lim := limiter.New(limiter.Options{Now: c.now, Replicated: true})
	r := newReplicator(lim, "a#01", true)
	l := limiter.Limit{Count: 1_000_000, Window: time.Minute}
	b := lim.Bucket("tenant")
	const keys, perTick = 200, 10
	flushes, sending, values := 0, 0, 0
	for tick := range 3 * 600 {
		now := c.ms.Load()
		for i := range perTick {
			k := limiter.Key{Bucket: b, ID: fmt.Sprintf("tenant-%03d", (tick*perTick+i)%keys)}
			if !lim.Check(k, 1, l).Allowed {
				t.Fatalf("refused far below the limit at tick %d", tick)
			}
		}
		res := r.flush(shareEnv{now: now, intervalMS: 100, live: func(string) bool { return true }, members: 3})
		if tick >= 600 { // after the first window: its first values
			flushes++
			values += len(res.values)
			if len(res.values) > 0 {
				sending++
			}
		}
		c.set(now + 100)
	}
	perKeyWindow := float64(values) / keys / 2
	t.Logf("%d of %d flushes sent values, %.1f values per key per window (each key counted 30 times a window)", sending, flushes, perKeyWindow)
	if sending > flushes/8 {
		t.Errorf("%d of %d flushes sent values: the waiting ones did not share them", sending, flushes)
	}
	if perKeyWindow > 15 || perKeyWindow < 2 {
		t.Errorf("%.1f values per key per window, want the first, the waited ones (6 s) and the last: about 10 to 13", perKeyWindow)
	}
}

// TestPacedValuesDoNotGrowWithMembers: in owner replication, one node counting 1,000
// keys far below their limit at 200 checks a second (each key every 5 s) sends its
// values to their owners, each owner only its keys. Unpaced, each flush would send a
// small packet to most owners (20 a second at 20 members, most of them the first values
// at a window's start); paced (paceMS), a node sends an owner values that waited at most
// every few seconds, and the first values of counters it counted in the window before
// wait as the others do: under 6 packets a second at 20 members, no more than at 3
// members (unpaced, where the first values of a window go at once to the two owners),
// and every key's value still reaches its owner in each window.
func TestPacedValuesDoNotGrowWithMembers(t *testing.T) {
	packets := map[int]float64{}
	for _, members := range []int{3, 20} {
		names := []string{"a"}
		for i := 1; i < members; i++ {
			names = append(names, fmt.Sprintf("n%02d", i))
		}
		names = sortedNames(names)
		c := &testClock{}
		c.set(t0 - t0%minute)
		lim := limiter.New(limiter.Options{Now: c.now, Replicated: true})
		r := newReplicator(lim, "a#01", true)
		l := limiter.Limit{Count: 1_000_000, Window: time.Minute}
		b := lim.Bucket("tenant")
		const keys, perTick = 1000, 20
		sent, reached := 0, map[string]int64{}
		for tick := range 2 * 600 {
			now := c.ms.Load()
			for i := range perTick {
				k := limiter.Key{Bucket: b, ID: fmt.Sprintf("tenant-%04d", (tick*perTick+i)%keys)}
				if !lim.Check(k, 1, l).Allowed {
					t.Fatalf("refused far below the limit at tick %d", tick)
				}
			}
			env := shareEnv{now: now, intervalMS: 100, live: func(string) bool { return true }, members: members,
				self: "a", names: names, relay: true, owns: func(limiter.Key) bool { return false }}
			res := r.flush(env)
			for to, vs := range res.routed {
				if to == "a" {
					continue
				}
				if tick >= 600 { // the second window: past its first values
					sent++
				}
				for _, v := range vs {
					reached[v.id] = now
				}
			}
			c.set(now + 100)
		}
		packets[members] = float64(sent) / 60
		t.Logf("%d members: %.1f packets of values a second", members, packets[members])
		if members == 20 {
			for i := range keys {
				id := fmt.Sprintf("tenant-%04d", i)
				if own := ownerOf("tenant", id, names); own != "a" && reached[id] < t0-t0%minute+minute {
					t.Fatalf("%s: no value in the second window", id)
				}
			}
		}
	}
	if packets[20] > 6 || packets[20] > packets[3] {
		t.Errorf("packets of values a second: %.1f at 20 members, %.1f at 3: want under 6, and no more than at 3", packets[20], packets[3])
	}
}
