package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClusterNoRefusalBelowTheLimit: token_create at 10 a minute per client IP, three
// sidecars syncing every 100 ms. On each of 20 keys (client IPs, all at once): 4 checks
// through Envoy's ext_authz on n1, 4 on n2 600 ms later, 600 ms of nothing, then 3 on
// n3: exactly 4, 4 and 2 on every key, whichever node owns it (the key's owner grants
// what nobody holds; n1 and n2 give back what they do not use once idle for two
// intervals). On 20 more keys n2 starts right after n1, faster than a sync interval:
// then n2's and n3's checks are only counted and logged when refused, and the window
// must never go over the limit. A check refused because its request for room was
// answered after the wait (a machine too busy for a loopback round trip in time) is
// logged, not failed: never more such refusals than requests answered late.
func TestClusterNoRefusalBelowTheLimit(t *testing.T) {
	t.Parallel()
	const keys = 20
	yaml := "limits:\n  token_create: {limit: 10, window: 1m}\n"
	// 1 s into a fresh minute: the keys' checks take about two seconds.
	// The owner's answers come within a millisecond on loopback, but these sidecars
	// are race-detector builds on a shared machine, forty checks at once, beside the
	// other packages' tests: they wait up to 500 ms for them rather than the default
	// (at 200 ms, a full make test once saw three answers come late).
	nodes := startCluster(t, 3, yaml, clockOffset(time.Minute), func(_ int, env map[string]string) {
		env["RATE_LIMIT_GRANT_WAIT_MS"] = "500"
	})
	// An owner grants only once settled after its start and the last join (two and a
	// half intervals and the wait; one and a quarter and the wait).
	time.Sleep(time.Second)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	ipOf := func(i int) string { return fmt.Sprintf("203.0.113.%d", 100+i) }
	got := make([][3]int, 2*keys)
	var wg sync.WaitGroup
	for i := range 2 * keys {
		wg.Go(func() {
			for j, step := range []struct {
				n     *node
				hits  int
				pause time.Duration
			}{{n1, 4, 0}, {n2, 4, time.Duration(i/keys) * 600 * time.Millisecond}, {n3, 3, 600 * time.Millisecond}} {
				time.Sleep(step.pause)
				for range step.hits {
					if step.n.createToken(ipOf(i)) {
						got[i][j]++
					}
				}
			}
		})
	}
	wg.Wait()
	// A request for room answered after the wait leaves the check that waited on it
	// refused (the wait is a ceiling; on a machine this busy a loopback round trip
	// sometimes takes longer): each may cost one check below the limit, never more.
	timedOut := 0.0
	for _, n := range nodes {
		var line []string
		for _, r := range [][2]string{{"asked", "sent"}, {"asked", "granted"}, {"asked", "zero"}, {"asked", "timed_out"}, {"asked", "late"},
			{"answered_other", "granted"}, {"answered_other", "zero"}, {"answered_self", "granted"}, {"answered_self", "zero"}} {
			v := n.metric("converger_cluster_share_grants_total", `role="`+r[0]+`"`, `result="`+r[1]+`"`)
			line = append(line, fmt.Sprintf("%s %s %g", r[0], r[1], v))
			if r[1] == "timed_out" {
				timedOut += v
			}
		}
		t.Logf("%s grants: %s", n.name, strings.Join(line, ", "))
	}
	var bad, below []string
	short, n3short, late, refusedBelow := 0, 0, 0, 0
	for i, g := range got {
		// n1 alone gets its 4, n2 600 ms after n1 its 4, and n3 exactly what is left of
		// its 3 (on a machine slow enough to delay n1's report, one of n2's may be
		// refused: counted).
		want := [3]int{4, 4, min(3, 10-g[0]-g[1])}
		if i >= keys && g[1] < 4 {
			late++
		}
		if i < keys {
			// n2 right after n1: n2's refusals and, when n2's refused demand was
			// reported late (a slow machine), n3's are counted, not failed; the window
			// never goes over the limit.
			if g[1] < 4 {
				short++
			}
			if g[2] < want[2] {
				n3short++
			}
			want[1], want[2] = g[1], min(g[2], want[2])
		}
		if g == want {
			continue
		}
		d := n3.debug("token_create", ipOf(i))
		view, _ := json.Marshal(d)
		var ownerView []byte
		for _, n := range nodes {
			if n.name == d.Owner && n != n3 {
				ownerView, _ = json.Marshal(n.debug("token_create", ipOf(i)))
			}
		}
		line := fmt.Sprintf("key %d: allowed %v on n1, n2, n3, want %v; n3's /debug/counter: %s; the owner's: %s", i, g, want, view, ownerView)
		if g[0] <= want[0] && g[1] <= want[1] && g[2] <= want[2] {
			refusedBelow += want[0] + want[1] + want[2] - g[0] - g[1] - g[2]
			below = append(below, line)
			continue
		}
		bad = append(bad, line)
	}
	t.Logf("n2 right after n1: n2 was refused some of its 4 on %d of %d keys, n3 some of what was left on %d; n2 600 ms after n1: n2 refused some on %d", short, keys, n3short, late)
	if len(below) > 0 {
		t.Logf("%d checks refused below the limit on %d keys, with %g requests for room answered after the wait:\n%s", refusedBelow, len(below), timedOut, strings.Join(below, "\n"))
		if float64(refusedBelow) > timedOut {
			bad = append(bad, below...)
		}
	}
	if len(bad) > 0 {
		for _, n := range nodes {
			for line := range strings.Lines(n.stderr.String()) {
				if strings.Contains(line, `"WARN"`) || strings.Contains(line, `"ERROR"`) || strings.Contains(line, "GRANTDBG") {
					t.Logf("%s: %s", n.name, strings.TrimSpace(line))
				}
			}
		}
		t.Fatalf("not exact at the limit:\n%s", strings.Join(bad, "\n"))
	}
}
