package cluster

import (
	"github.com/converger/edge/sidecar/limiter"
)

// Lazy values. A counter far from its limit does not need its count at every node within
// a sync interval: what the others decide from it would not change. So a node sends the
// value of a counter it counted at the next flush only when it matters soon, and
// otherwise after a wait, the longer the further the counter is from its limit: the
// longest of lazyAfter (lazyIntervals intervals at 3 members, longer in a larger
// cluster) and its halves down to two intervals that the projections below allow, and
// in the window's last interval in any case. It matters soon, and is sent at once, when:
//   - it is the node's first value of the counter in the window (the others learn of its
//     demand: share mode's bounds and the next window's parts depend on it), and once
//     more at the next flush with the count then (a short burst is complete there); in
//     owner replication beyond 3 members, only when the node sent no value of it in the
//     window before, or the projections below do not hold from the window's start;
//   - the node's bound refused hits;
//   - before the next value and its delivery (the shortest wait and two intervals,
//     within the window), the node's count would reach its bound at its rate (it will need more),
//     or the cluster's count as the node knows it half the limit, growing at twice the
//     faster of its rate so far and every member counting at this node's rate.
//
// A flush that sends values anyway takes along the waiting ones due soon (lazySlack).
// Bounds that change are sent at once whatever the count (the flush's bounds). Most
// counters of a busy cluster are far from their limits (a tenant's requests, the client
// addresses behind it), so this divides their sync traffic by up to lazyIntervals; those
// near their limits are synced every interval as before. What a node that crashes had
// not sent yet is lost to the others' views of the window, at most the wait's worth of
// counts of counters far from their limits.
const lazyIntervals = 50

// sentAt is when a node last sent its value of a counter, in the window of sizeMS
// ending at endMS, and its count then.
type sentAt struct {
	at, sizeMS, endMS int64
	own               uint32
}

// lazyAfter is the longest a value may wait, for a window of sizeMS: lazyIntervals
// intervals, a tenth of the window at most, in a cluster of 3; in a larger one, as many
// times longer as it has peers beyond a 3-node cluster's two (members−1 over 2), half the
// window at most. Every packet of values goes to every peer, so that the packets a node
// sends each second of counters far from their limits do not grow with the cluster: the
// others' views of those counters are as much older, which the projections of lazy
// allow for (their horizon is the wait).
func lazyAfter(env shareEnv, sizeMS int64) int64 {
	wait := min(lazyIntervals*env.intervalMS, sizeMS/10)
	if env.relay {
		return wait // a value goes to one owner, whatever N (relay.go)
	}
	if peers := int64(env.members - 1); peers > 2 {
		wait = min(wait*peers/2, sizeMS/2)
	}
	return wait
}

// lazy reports whether this node's value of k, counted since the last flush, can wait
// (it is then noted in waiting).
func (r *replicator) lazy(k limiter.Key, env shareEnv) bool {
	s, ok := r.current(k, env)
	if !ok {
		return false
	}
	last, ok := r.sent[k]
	if !ok || last.endMS != s.EndMS {
		if !env.relay || env.paceMS() == 0 || !ok || last.endMS != s.EndMS-s.SizeMS {
			return false // the first of the window
		}
		// In owner replication beyond 3 members (paced, relay.go), a counter this node
		// sent a value of in the window before: its owner knows the node counts it, and
		// the first value of this window may wait as the others do, when the projections
		// allow it from the window's start (else a node's first values, all at a
		// window's start, would go to every owner at once).
		last = sentAt{at: s.EndMS - s.SizeMS, sizeMS: s.SizeMS, endMS: s.EndMS}
		if longestWait(s, last, env) == 0 {
			return false
		}
		r.sent[k] = last
	}
	w := longestWait(s, last, env)
	if w == 0 {
		return false
	}
	// Due now or later: dueWaiting sends it (once, without a resend).
	due := last.at + w
	if at, ok := r.waiting[k]; ok {
		due = min(due, at)
	}
	r.waiting[k] = due
	return true
}

// current is k's snapshot when this node counted it in the current window, has a limit
// and refused nothing.
func (r *replicator) current(k limiter.Key, env shareEnv) (limiter.Snapshot, bool) {
	s, ok := r.lim.Lookup(k)
	if !ok || s.SizeMS <= 0 || s.Limit == 0 || s.EndMS != windowEnd(env.now, s.SizeMS) || s.Refused > 0 {
		return s, false
	}
	return s, true
}

// longestWait is the longest wait, halving from lazyAfter down to two intervals, for
// which, until the next value and its delivery (the wait and two intervals, and a pace
// in owner replication, within the window), the node's count at its rate stays below its bound, and the count the node
// knows of the cluster, at twice the cluster's rate, below half the limit; 0 for none.
// last is the node's last value in the window.
func longestWait(s limiter.Snapshot, last sentAt, env shareEnv) int64 {
	// The node's rate (per ms): the faster of its rate so far in the window and since
	// its last value; the cluster's: the faster of the count it knows over the window so
	// far and every member counting at the node's rate.
	elapsed := float64(max(env.now-(s.EndMS-s.SizeMS), env.intervalMS))
	own := max(float64(s.Own)/elapsed, float64(s.Own-min(last.own, s.Own))/float64(max(env.now-last.at, 1)))
	total := float64(s.Own) + float64(s.Remote)
	cluster := max(total/elapsed, own*float64(max(env.members, 1)))
	// In owner replication a value that waited may wait a pace more (relay.go, paceMS).
	late := 2 * env.intervalMS
	if env.relay {
		late += env.paceMS()
	}
	for wait := lazyAfter(env, s.SizeMS); wait >= 2*env.intervalMS; wait /= 2 {
		horizon := float64(min(wait+late, max(s.EndMS-env.now, 0)))
		if 2*(total+2*cluster*horizon) >= float64(s.Limit) || (s.Capped && float64(s.Own)+own*horizon >= float64(s.Cap)) {
			continue
		}
		return wait
	}
	return 0
}

// lazySlack is, in intervals, how much earlier than due a waiting value goes with a flush
// that sends values anyway (a quarter of its wait at most): the values of counters
// counted at different moments share packets instead of each taking its own. In owner
// replication a packet goes to one owner, so a waiting value goes early only with a
// packet to its own owner: else each flush that sends anything would send a small packet
// to every owner, and a node's packets would grow with the number of members.
const lazySlack = 10

// dueWaiting returns the waiting keys whose wait is over at env.now, and forgets them
// and the keys of ended windows. When the flush sends values anyway (the keys of
// sending, or some wait is over), those due within lazySlack intervals go too (in owner
// replication, those whose owner gets a packet anyway: to, which it returns).
func (r *replicator) dueWaiting(env shareEnv, sending []limiter.Key) (due []limiter.Key, to map[string]struct{}) {
	for k, at := range r.waiting {
		last, ok := r.sent[k]
		if !ok || last.endMS <= env.now {
			delete(r.waiting, k)
			continue
		}
		// Due after its wait, and in the window's last interval in any case, so that the
		// others know the node's demand of the whole window.
		if env.now >= at || last.endMS-env.now <= env.intervalMS {
			due = append(due, k)
			delete(r.waiting, k)
		}
	}
	if env.relay {
		to = map[string]struct{}{}
		for _, k := range sending {
			to[env.ownerOf(r.lim.BucketName(k.Bucket), k.ID)] = struct{}{}
		}
		due = r.pace(due, to, env)
	}
	if len(sending) == 0 && len(due) == 0 {
		return due, to
	}
	due = append(due, r.takeAlong(env, to)...)
	for o := range to {
		r.packetTo[o] = env.now
	}
	return due, to
}

// takeAlong returns, and forgets, the waiting keys due within lazySlack intervals (a
// quarter of their wait at most): in owner replication, of the owners in to only, which
// get a packet anyway.
func (r *replicator) takeAlong(env shareEnv, to map[string]struct{}) []limiter.Key {
	var along []limiter.Key
	for k, at := range r.waiting {
		if !dueSoon(at, r.sent[k].at, env) {
			continue
		}
		if to != nil {
			if _, ok := to[env.ownerOf(r.lim.BucketName(k.Bucket), k.ID)]; !ok {
				continue
			}
		}
		along = append(along, k)
		delete(r.waiting, k)
	}
	return along
}

// dueSoon reports whether what waits since since until at is due within lazySlack
// intervals, and within a quarter of its wait: soon enough to go with a packet that
// goes anyway.
func dueSoon(at, since int64, env shareEnv) bool {
	return at-env.now <= min(lazySlack*env.intervalMS, (at-since)/4)
}

// pace keeps, of the values whose wait is over (due), those whose owner gets a packet
// anyway (to), or has had none for paceMS (it gets one now: added to to), or whose
// window ends within an interval; the others wait until their owner's pace allows.
func (r *replicator) pace(due []limiter.Key, to map[string]struct{}, env shareEnv) []limiter.Key {
	pace := env.paceMS()
	kept := due[:0]
	for _, k := range due {
		o := env.ownerOf(r.lim.BucketName(k.Bucket), k.ID)
		_, sending := to[o]
		if last, ok := r.packetTo[o]; sending || !ok || env.now-last >= pace || r.sent[k].endMS-env.now <= env.intervalMS {
			to[o] = struct{}{}
			kept = append(kept, k)
			continue
		}
		r.waiting[k] = r.packetTo[o] + pace
	}
	if len(r.packetTo) > 2*len(env.names)+16 {
		for o, at := range r.packetTo {
			if env.now-at > 4*pace {
				delete(r.packetTo, o)
			}
		}
	}
	return kept
}

// noteSent notes the value of k sent at now.
func (r *replicator) noteSent(k limiter.Key, s limiter.Snapshot, now int64) {
	if s.Own > 0 || s.Refused > 0 {
		r.sent[k] = sentAt{at: now, sizeMS: s.SizeMS, endMS: s.EndMS, own: s.Own}
		delete(r.waiting, k)
	}
}

// sweepSent forgets the keys of windows that ended by now.
func (r *replicator) sweepSent(now int64) {
	for k, v := range r.sent {
		if v.endMS+v.sizeMS <= now { // kept a window longer: lazy asks if it was sent then
			delete(r.sent, k)
		}
	}
}
