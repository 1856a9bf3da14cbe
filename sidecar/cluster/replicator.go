package cluster

import (
	"slices"
	"sync"

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
	// Owner replication (relay.go): the owners and the mode of the last flush, the owned
	// keys whose summaries wait (by when due), and those planned at every flush (a member
	// holds more than it counted, or is bound in the next window).
	lastNames  []string
	lastRelay  bool
	sumWaiting map[limiter.Key]int64
	sumRecheck map[limiter.Key]struct{}
	// packetTo is when this node last sent each member values or summaries: what only
	// waited goes to a member at most every paceMS (relay.go), with what the member gets
	// anyway, values and summaries in one packet (sync bundles, bundle.go).
	packetTo map[string]int64
	// awaiting holds the keys this node sent a first value or request for room of a
	// window to their owner and has had no summary of since; silent the owners that let
	// one wait longer than ownerWait (by when noticed), until they are heard from.
	awaitMu  sync.Mutex
	awaiting map[limiter.Key]awaited
	silent   map[string]int64
}

// awaited is a key's window whose owner's summary a node waits for, since at.
type awaited struct{ at, sizeMS, endMS int64 }

func newReplicator(lim *limiter.Limiter, origin string, share bool) *replicator {
	return &replicator{lim: lim, origin: origin, slots: newSlots(lim, origin), share: share,
		sent: map[limiter.Key]sentAt{}, waiting: map[limiter.Key]int64{},
		sumWaiting: map[limiter.Key]int64{}, sumRecheck: map[limiter.Key]struct{}{},
		packetTo: map[string]int64{},
		awaiting: map[limiter.Key]awaited{}, silent: map[string]int64{}}
}

// flushResult is what one flush did.
type flushResult struct {
	values  []value // this node's values to send (to every member, or to their owners)
	changed int     // counters counted (or refused) since the last flush
	capped  int     // counters share mode bound
	// Owner replication (relay.go): this node's values by the owner they go to, the
	// summaries by the member they go to, and other origins' counts relayed to new
	// owners, by owner and origin.
	routed    map[string][]value
	summaries map[string][]summaryEntry
	relays    map[string]map[string][]value
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
	if env.relay != r.lastRelay || !slices.Equal(env.names, r.lastNames) {
		// The owners changed: this node's values go again, to the new owners.
		var again []limiter.Key
		again, res.relays = r.reroute(env)
		keys = append(keys, again...)
	}
	// In owner replication the keys this node owns are not sent: its summaries tell
	// their members (summarize).
	var owned map[limiter.Key]struct{}
	if env.relay {
		owned = map[limiter.Key]struct{}{}
		theirs := keys[:0:0]
		for _, k := range keys {
			if env.owned(k, r.lim) {
				owned[k] = struct{}{}
			} else {
				theirs = append(theirs, k)
			}
		}
		keys = theirs
		for k := range touched {
			if env.owned(k, r.lim) {
				owned[k] = struct{}{}
			}
		}
		for k := range r.sumRecheck {
			owned[k] = struct{}{}
		}
	}
	// The counted keys whose value can wait (lazy.go) are sent later, at the latest
	// lazyAfter after their last value; those whose wait is over are due now.
	urgent := keys[:0:0]
	for _, k := range keys {
		if !r.lazy(k, env) {
			urgent = append(urgent, k)
		}
	}
	due, to := r.dueWaiting(env, slices.Concat(urgent, r.resend))
	var bounds []limiter.Key // share mode's bounds to send, counted or not
	if r.share {
		changed := make(map[limiter.Key]struct{}, len(urgent)+len(due))
		for _, k := range keys {
			touched[k] = struct{}{}
		}
		for _, k := range slices.Concat(urgent, due) {
			changed[k] = struct{}{} // sent by this flush
		}
		for k := range owned {
			touched[k] = struct{}{}
		}
		res.capped, bounds = r.slots.shareTick(touched, changed, env)
		// Under planMu, as grants are applied (answer): one applied from now on is
		// not in the values this flush sends after its request's deadline, and is not
		// applied at all.
		r.slots.planMu.Lock()
		bounds = append(bounds, r.asks.due(env.now)...)
		r.slots.planMu.Unlock()
		r.asks.sweep(env.now)
	}
	if env.relay {
		res.summaries = r.summarize(owned, env, to)
		// A member that gets a summary and no values: its waiting values due soon go
		// along, in the same packet.
		var extra map[string]struct{}
		for m := range res.summaries {
			if _, ok := to[m]; !ok {
				if extra == nil {
					extra = map[string]struct{}{}
				}
				extra[m] = struct{}{}
			}
		}
		if len(extra) > 0 {
			due = append(due, r.takeAlong(env, extra)...)
		}
	}
	done := make(map[limiter.Key]struct{}, len(keys)+len(r.resend)+len(bounds)+len(due))
	var resend []limiter.Key
	for i, k := range slices.Concat(bounds, urgent, r.resend, due) {
		if _, dup := done[k]; dup {
			continue
		}
		done[k] = struct{}{}
		if env.relay && env.owned(k, r.lim) {
			continue // its members hear of it from the summaries
		}
		s, ok := r.lim.Lookup(k)
		if !ok || s.SizeMS <= 0 {
			continue
		}
		end := windowEnd(env.now, s.SizeMS)
		read := s.ReadEndMS == end
		if s.EndMS != end {
			// Nothing counted here in the current window.
			s = limiter.Snapshot{SizeMS: s.SizeMS, EndMS: end, Limit: s.Limit}
		}
		if s.Own == 0 && s.Refused == 0 {
			switch {
			case i < len(bounds):
				// A bound sent alone.
				s.Cap, s.Capped = r.lim.CapIn(k, s.SizeMS, end)
			case env.relay && read && !r.slots.known(k, s.SizeMS, end):
				// Read here (Peek), not counted: a value of 0 asks the owner for the
				// count (relay.go). (Not for a count of the window before, changed
				// after its last flush: nothing here wants this window's.)
				s.Cap, s.Capped = r.lim.CapIn(k, s.SizeMS, end)
			default:
				continue // nothing of ours to send
			}
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
	if env.relay {
		res.routed = map[string][]value{}
		for _, v := range res.values {
			to := env.ownerOf(v.bucket, v.id)
			res.routed[to] = append(res.routed[to], v)
		}
		r.awaitOwners(res.values, env)
	}
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
