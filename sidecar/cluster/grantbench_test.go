package cluster

import (
	"fmt"
	"testing"

	"github.com/converger/edge/sidecar/limiter"
)

// BenchmarkOwnerGrant is the owner's work for one request for room: merging the asker's
// value and granting from what nobody holds, for a key counted by 3 and by 20 nodes.
func BenchmarkOwnerGrant(b *testing.B) {
	for _, n := range []int{3, 20} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			s := newSim(n, 100, []int64{0, 33, 67}, true, 1000)
			s.run(1500, mix(s, 0.5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1))
			now := s.clock.ms.Load()
			owner := ownerOf("token_create", s.key, s.liveNames())
			var o, asker int
			for i, nd := range s.nodes {
				if nd.name == owner {
					o = i
				} else {
					asker = i
				}
			}
			a := s.nodes[asker]
			snap, _ := a.lim.Lookup(limiter.Key{Bucket: a.lim.Bucket("token_create"), ID: s.key})
			q := grantRequest{sentAt: now, origin: a.rep.origin, id: 1, want: 1, waitMS: 25,
				v: value{bucket: "token_create", id: s.key, sizeMS: snap.SizeMS, endMS: snap.EndMS, count: snap.Own, share: true, limit: 1000, cap: snap.Own, capped: true}}
			env := s.envOf(o, now)
			b.ReportAllocs()
			for b.Loop() {
				s.nodes[o].rep.grant(q, env)
			}
		})
	}
}
