package cluster

import (
	"slices"

	"github.com/converger/edge/sidecar/limiter"
)

// replicator is a node's replication without the network: the values each flush sends,
// share mode's bounds set before them, and the merging of what others sent. Cluster
// runs it over memberlist; a test runs several over a simulated network.
type replicator struct {
	lim    *limiter.Limiter
	origin string
	slots  *slots
	share  bool
	resend []limiter.Key // sent in the last flush, sent once more in the next
	// asks is the asking side of the grants (grant.go).
	asks asks
	// merged, when set, is told of every value of another node merged here (the live
	// view's busy keys).
	merged func(value)
	// sent holds, for each key counted in a current window, when this node last sent
	// its value; waiting, the keys counted since whose value can wait (lazy.go).
	sent    map[limiter.Key]sentAt
	waiting map[limiter.Key]int64 // when due
	sweptAt int64
}

func newReplicator(lim *limiter.Limiter, origin string, share bool) *replicator {
	return &replicator{lim: lim, origin: origin, slots: newSlots(lim, origin), share: share,
		sent: map[limiter.Key]sentAt{}, waiting: map[limiter.Key]int64{}}
}

// flushResult is what one flush did.
type flushResult struct {
	values  []value // this node's values to send
	changed int     // counters counted (or refused) since the last flush
	capped  int     // counters share mode bound
}

// flush returns the values to send at env.now: this node's own value of every counter
// counted or refused since the last flush, and of those of the last flush once more
// (so that one lost packet is healed at once). Before reading them it publishes the
// windows that began and, in share mode, sets the bounds of the counters merged or
// changed since the last flush, so that the values carry the bounds they will be held
// to until the next.
func (r *replicator) flush(env shareEnv) flushResult {
	var keys []limiter.Key
	r.lim.DrainChanged(func(k limiter.Key, _ limiter.Snapshot) { keys = append(keys, k) })
	touched := r.slots.tick(env.now)
	var res flushResult
	res.changed = len(keys)
	// The counted keys whose value can wait (lazy.go) are sent later, at the latest
	// lazyAfter after their last value; those whose wait is over are due now.
	urgent := keys[:0:0]
	for _, k := range keys {
		if !r.lazy(k, env) {
			urgent = append(urgent, k)
		}
	}
	due := r.dueWaiting(env, len(urgent) > 0 || len(r.resend) > 0)
	var bounds []limiter.Key // share mode's bounds to send, counted or not
	if r.share {
		changed := make(map[limiter.Key]struct{}, len(urgent)+len(due))
		for _, k := range keys {
			touched[k] = struct{}{}
		}
		for _, k := range slices.Concat(urgent, due) {
			changed[k] = struct{}{} // sent by this flush
		}
		res.capped, bounds = r.slots.shareTick(touched, changed, env)
		bounds = append(bounds, r.asks.due(env.now)...)
		r.asks.sweep(env.now)
	}
	done := make(map[limiter.Key]struct{}, len(keys)+len(r.resend)+len(bounds)+len(due))
	var resend []limiter.Key
	for i, k := range slices.Concat(bounds, urgent, r.resend, due) {
		if _, dup := done[k]; dup {
			continue
		}
		done[k] = struct{}{}
		s, ok := r.lim.Lookup(k)
		if !ok || s.SizeMS <= 0 {
			continue
		}
		end := windowEnd(env.now, s.SizeMS)
		if s.EndMS != end {
			// Nothing counted here in the current window.
			s = limiter.Snapshot{SizeMS: s.SizeMS, EndMS: end, Limit: s.Limit}
		}
		if s.Own == 0 && s.Refused == 0 {
			if i >= len(bounds) {
				continue // nothing of ours to send
			}
			// A bound sent alone.
			s.Cap, s.Capped = r.lim.CapIn(k, s.SizeMS, end)
		}
		res.values = append(res.values, value{
			bucket: r.lim.BucketName(k.Bucket), id: k.ID, sizeMS: s.SizeMS, endMS: s.EndMS, count: s.Own,
			share: true, refused: s.Refused, cap: s.Cap, capped: s.Capped, limit: s.Limit,
		})
		r.noteSent(k, s, env.now)
		if i < len(bounds)+len(urgent) {
			// Sent once more at the next flush, so that one lost packet is healed at
			// once; a value that could wait is healed by the next one.
			resend = append(resend, k)
		}
	}
	r.resend = resend
	if env.now-r.sweptAt >= 1000 {
		r.sweepSent(env.now)
		r.sweptAt = env.now
	}
	return res
}

// windowEnd is the end of the window of sizeMS holding now.
func windowEnd(now, sizeMS int64) int64 {
	return (now/max(sizeMS, 1) + 1) * max(sizeMS, 1)
}

// receive merges a message; direct says it came from its origin itself (a sync
// message), not relayed in a state transfer. It returns how many values were stale.
func (r *replicator) receive(m message, direct bool, now int64) (dropped int) {
	if m.origin == r.origin {
		return 0
	}
	if direct {
		r.slots.sawDirect(m.origin)
	}
	for _, v := range m.values {
		switch r.slots.merge(m.origin, v, m.sentAt, now) {
		case stale:
			dropped++
		case merged:
			if r.merged != nil {
				r.merged(v)
			}
		}
	}
	return dropped
}
