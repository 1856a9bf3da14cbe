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
// through Envoy's ext_authz on n1, 4 on n2, 600 ms of nothing, then 3 on n3. Share mode
// takes a node to be idle two intervals after the report that last showed its demand
// growing; n3 must then take the 2 that are left (whatever share mode's division of
// them over the members) and refuse the third, on every key.
func TestClusterNoRefusalBelowTheLimit(t *testing.T) {
	t.Parallel()
	const keys = 20
	yaml := "limits:\n  token_create: {limit: 10, window: 1m}\n"
	// 1 s into a fresh minute: the keys' checks take about a second.
	nodes := startCluster(t, 3, yaml, clockOffset(time.Minute), nil)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	got := make([][3]int, keys)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			ip := fmt.Sprintf("203.0.113.%d", 100+i)
			for _, step := range []struct {
				n    *node
				at   int
				hits int
			}{{n1, 0, 4}, {n2, 1, 4}, {n3, 2, 3}} {
				if step.n == n3 {
					time.Sleep(600 * time.Millisecond)
				}
				for range step.hits {
					if step.n.createToken(ip) {
						got[i][step.at]++
					}
				}
			}
		})
	}
	wg.Wait()
	var bad []string
	for i, g := range got {
		if g != [3]int{4, 4, 2} {
			view, _ := json.Marshal(n3.debug("token_create", fmt.Sprintf("203.0.113.%d", 100+i)))
			bad = append(bad, fmt.Sprintf("key %d: allowed %v on n1, n2, n3; n3's /debug/counter: %s", i, g, view))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("want 4, 4 and 2 allowed on every key:\n%s", strings.Join(bad, "\n"))
	}
}
