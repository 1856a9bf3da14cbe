package cluster

import (
	"slices"
	"sync"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// Bounds of a node's departure (Stop).
const (
	// handoffTimeout bounds the final push of this node's counts to the live members.
	handoffTimeout = 2 * time.Second
	// leaveTimeout bounds memberlist's Leave: the time its departure takes to reach the
	// others before the node stops answering probes.
	leaveTimeout = time.Second
)

// Stop leaves the cluster and stops replicating. It first hands what this node counted
// to the others: the sync loop is stopped, so the checks it counted since its last
// flush would otherwise reach nobody, and a member that missed an earlier sync message
// (UDP, best effort) would never hear of them once this node is gone. Every count of the
// current windows it holds as its own goes to every live member over TCP (handoff), at
// most handoffTimeout in all, and in owner replication what it knew of the keys it owns
// goes to their next owners (handover.go), after which it answers no more requests for
// room but forwards them to the keys' next owners, which answer from the moment they
// have its handover; then memberlist's Leave tells them it left, so they stop counting
// it as a member at once rather than after the suspicion timeout.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.leaving.Store(true)
		close(c.stop)
		c.wg.Wait()
		c.handoff(handoffTimeout)
		if err := c.ml.Leave(leaveTimeout); err != nil {
			c.log.Debug("leaving the cluster", "error", err)
		}
		_ = c.ml.Shutdown()
	})
}

// handoff sends this node's own count of every counter of a current window to every
// live member, over memberlist's reliable (TCP) path, in parallel, within timeout. A
// member that does not take them in time is left: its state is then as after a lost
// sync message, healed by its push/pulls with the others, which hold the same counts.
// In owner replication (relay.go) each count goes to the member that owns its key once
// this node is gone, with the slots this node holds as the owner of keys.
func (c *Cluster) handoff(timeout time.Duration) {
	peers := c.peers()
	if len(peers) == 0 {
		return
	}
	now := c.nowMS()
	env := c.shareEnv(now)
	var rest []string // the owners once this node is gone
	if env.relay {
		rest = slices.DeleteFunc(slices.Clone(env.names), func(n string) bool { return n == c.cfg.NodeName })
	}
	own := map[string]*packer{} // by destination ("" every member)
	relays := map[string]map[string][]value{}
	keys := 0
	c.lim.Each(func(k limiter.Key, s limiter.Snapshot) {
		if s.Own > 0 && s.EndMS > now {
			bucket := c.lim.BucketName(k.Bucket)
			to := ""
			if rest != nil {
				to = ownerOf(bucket, k.ID, rest)
			}
			if own[to] == nil {
				own[to] = newPacker(now, c.origin, maxPacket)
			}
			own[to].add(value{bucket: bucket, id: k.ID, sizeMS: s.SizeMS, endMS: s.EndMS, count: s.Own})
			keys++
		}
	})
	if rest != nil {
		c.slots.each(now, func(origin string, k limiter.Key, sl slot) {
			bucket := c.lim.BucketName(k.Bucket)
			if sl.count == 0 || ownerOf(bucket, k.ID, env.names) != c.cfg.NodeName {
				return
			}
			to := ownerOf(bucket, k.ID, rest)
			if relays[to] == nil {
				relays[to] = map[string][]value{}
			}
			relays[to][origin] = append(relays[to][origin], value{bucket: bucket, id: k.ID, sizeMS: sl.sizeMS, endMS: sl.endMS, count: sl.count})
		})
	}
	msgs := map[string][][]byte{}
	for to, p := range own {
		msgs[to] = p.messages()
	}
	for to, byOrigin := range relays {
		msgs[to] = append(msgs[to], packRelay(now, byOrigin)...)
	}
	if rest != nil {
		dest := func(bucket, id string) string {
			if ownerOf(bucket, id, env.names) != c.cfg.NodeName {
				return ""
			}
			return ownerOf(bucket, id, rest)
		}
		parts := c.slots.handover(env, true, dest)
		for _, n := range peers {
			// Every member is told, with nothing in it if it is next to own none of
			// this node's keys with a count: each stops taking this node for an owner.
			if takesHandover(n.Meta) {
				msgs[n.Name] = append(msgs[n.Name], packHandover(now, c.origin, true, parts[n.Name])...)
			}
		}
	}
	if len(msgs) == 0 {
		return
	}
	start := time.Now()
	var sent sync.WaitGroup
	var mu sync.Mutex
	reached := 0
	for _, n := range peers {
		mine := msgs[n.Name]
		if rest == nil {
			mine = msgs[""]
		}
		if len(mine) == 0 {
			continue
		}
		sent.Go(func() {
			for _, msg := range mine {
				if err := c.ml.SendReliable(&n, msg); err != nil {
					c.m.sendErrors.Inc()
					return
				}
				c.m.messages.WithLabelValues("sent").Inc()
				c.m.bytes.WithLabelValues("sent").Add(float64(len(msg)))
			}
			if rest != nil && takesHandover(n.Meta) {
				c.handedOff.Store(n.Name, struct{}{}) // its handover was the last
			}
			mu.Lock()
			reached++
			mu.Unlock()
		})
	}
	done := make(chan struct{})
	go func() { sent.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
	}
	mu.Lock()
	defer mu.Unlock()
	to := len(msgs)
	if rest == nil {
		to = len(peers)
	}
	c.log.Info("counts handed to the members before leaving", "counters", keys, "members", to,
		"reached", reached, "owner_replication", rest != nil, "took", time.Since(start).Round(time.Millisecond))
}
