package cluster

import (
	"math"
	"slices"
	"strings"
)

// Share mode divides a counter's limit among the nodes that are counting it, so that a
// window holds the limit however fast the budget goes and however the checks bunch at
// the start of a window, before any node has heard of another's count in it.
//
// Every sync interval each node works out, for each key it counts or hears of, a bound
// on its own count (its claim) for the current window and for the next, and sends the
// claim with its count and with what it was asked for (its demand: the count plus the
// hits its bound refused). The bound is what is left of the limit once the claims the
// others reported are set aside, divided among the nodes by what they are projected to
// need until the window ends (max-min fair: a node needing less than an equal part gets
// its need, the others share the rest equally); what nobody needs is split evenly over
// every live member, as headroom for a node that gets checks it did not expect. Since
// every node sets aside the others' claims and takes only its own part, the claims add
// up to the limit at most; since the next window's claims are set before it begins, from
// the demand of the last window's length, a burst at a window's start finds every node
// holding only its part.
//
// A node that is the only one with demand on a key (the others idle in this window and
// the last, as their reports say) is not bound and gets the whole limit; the others then
// set aside for it all it is projected to need. A node the others do not know as busy
// yet gets only the headroom until its demand is reported and the busy ones make room
// (a sync interval or two). A member that left, or an earlier incarnation of a
// restarted one, keeps its count in the total but is given nothing more.
//
// What share mode cannot bound: the first window of a key that no node counted in the
// window before (every node sees itself alone, as without share mode), and demand that
// moves between nodes faster than the sync interval within a window (a node's claim
// follows its demand one report later).
//
// The owner's grants (grant.go). Dividing what is left among the members leaves nothing
// to anyone when the remainder is small (2 of 10 on 3 members, 1 of 5 on 20), and a node
// that divides what it takes to be free may take what another took a moment before:
// two deciders of one room overshoot. So when every live member runs the grants, the
// part of a key's limit that no node holds belongs to one node, the key's owner (the
// highest rendezvous hash of member name and key among the live members: every node
// with the same members picks the same one), and only the owner gives it out:
//
//   - The only node with demand in this window and the last stays unbound, as without
//     grants (a node cut off from the owner by a netsplit not yet detected serves its
//     limit alone); the owner sets aside what it may count in the next needHorizon
//     intervals, and it is bound at its count once another node's demand reaches it.
//   - Within a window a node's bound never rises but by a grant. Its plan, made at every
//     flush for each key it holds more of than it counted (not only when a message
//     arrives), lowers it to what it is projected to count in the next needHorizon
//     intervals, to its count once its demand has not grown for silentIntervals, and to
//     its max-min fair part when the bounds add up to more than the limit (set before
//     the nodes knew of each other). A fall is sent at once, so the owner learns of the
//     room from the node itself, never by guessing that a node has gone idle.
//   - The next window's bound, set before it begins, is the node's max-min fair part of
//     the limit by this window's demand (with needMargin), without headroom: what
//     nobody needs stays with the owner.
//   - A check refused by the node's bound while the count it knows is below the limit
//     asks the owner at once (a packet) and waits for the answer, at most GrantWait.
//     Checks of the key meanwhile wait on the same request; after an answer of 0 (or
//     none) the node asks again only after a sync interval; no request is sent when the
//     known count leaves no room. No answer in time: while the nodes are projected to
//     need less than a releaseShare-th of the limit (farBelow), the node takes a
//     member's part of what nobody holds, as a node first bound does (takePart), and
//     sends its bound with the next flush; nearer the limit the check is refused, as
//     without grants.
//   - The owner merges the asker's value carried by the request, and grants, one request
//     at a time (planMu), from what nobody holds as it knows (unheld: the limit less
//     each node's bound, or count when larger; a node not heard from in this window holds
//     the most its start bound can be; one that counts unbound, what it may count soon):
//     the request, or a member's part of what is free, whichever is more. It answers
//     even 0. It holds the grant as the asker's floor until a value the asker sent after
//     the request's deadline (its time plus the wait, on the asker's clock) shows its
//     bound, or one of the asker's values shows a bound as high; the asker applies a
//     grant only before its first flush after the deadline, raising its bound to the one
//     its request carried plus the grant (what the owner holds for it, even if its own
//     plan lowered the bound meanwhile), and sends it to every member with its next
//     flush. An answer after the wait decides the check that asked if that check has not
//     given up on it yet (held up on a busy machine), else it raises the bound for the
//     next. Whatever the answer, the asker sends its value again at the first flush after
//     the deadline, so that the owner lets go of a grant that came late or not at all.
//
// The races, and why the limit holds through them:
//   - A grant and a sync crossing: a value the asker sent before it applied the grant
//     lowers its bound at the owner, but the floor holds the grant until a value sent
//     after the asker could still apply it. An answer after that flush is dropped by the
//     asker; the owner's floor ends with the value it sent. The asker applies an answer
//     and a flush notes the requests whose deadline it is past one at a time (planMu),
//     so a grant is either in the first value sent after the deadline or not applied.
//   - A grant the asker let go (the answer came too late) and a summary the owner
//     planned while it held the grant: the summary carries the bound with the grant in
//     it, and may cross the asker's next value, which shows the bound without it. The
//     owner holds the floor until the asker could no longer apply the summary (its
//     sentAt plus raiseMS, relay.go), so that value does not free the room the asker
//     may still take by the summary. The asker sends its value at its next flush after
//     a summary that would raise its bound in a window it asked in, applied or not, so
//     that the room does not stay held for an asker with no more demand to report.
//   - Two borrowers: the owner grants serially, each from what is left after the last.
//   - A node's own plan lowering a bound a grant just raised only gives room back; plans
//     and grants are serialized, so no bound is set from a view older than a grant.
//   - The owner changing (a member joins, leaves or is declared dead): a new owner knows
//     the bounds the borrowers sent, but not grants of the old owner still on their way.
//     So a node owns a key only settleMove after the members last changed (an interval,
//     the wait and a quarter of an interval), unless it owned it before the change too. Members whose
//     views differ may meanwhile both own a key; that lasts while memberlist's gossip
//     settles, and is bounded by what is free.
//   - A node restarted is a new incarnation: its old one holds its count; as an owner it
//     grants nothing for settleStart after its start (silentIntervals, the wait and half
//     an interval), by when every node holding a bound it does not count has sent it or
//     its fall; a node not heard from in a window holds its start bound until then.
//   - The owner stopped but not yet declared dead: requests go unanswered and the checks
//     that need more than their node holds are refused until memberlist declares it dead
//     and another member owns the key.
//   - A member of an earlier release (no grants announced): nobody asks or grants, and
//     share mode divides as before, headroom included.
//   - A node not yet bound counts unbound: alone with demand, in a key's first window,
//     and for at most a sync interval after another's demand reaches it; the owner sets
//     aside what such a node may count soon, but that is a projection, not a bound.

// Share mode's projections.
const (
	// needMargin is how much more than its projected demand a node is given room for.
	needMargin = 1.25
	// silentIntervals is how long, in sync intervals, a node whose demand did not grow
	// is taken to need no more in the current window (every node sends the counters
	// it counted or refused at each interval): it keeps what it counted and gives the
	// rest of its bound back.
	silentIntervals = 2
	// releaseShare is the part of the limit a bound must fall by for the node to send
	// it at once, so that the others can take it.
	releaseShare = 16
	// freeShare: with the owner's grants, while at least a freeShare-th of the limit is
	// left to grant beyond what the nodes are projected to need soon, a node keeps the
	// room it is projected to need until the window ends (contended).
	freeShare = 4
)

// shareNode is share mode's view of one node for one key.
type shareNode struct {
	name string // origin: orders the remainders of a division, the same on every node
	live bool   // a live member's current incarnation
	// count and demand (count and refused hits) in the current window; prevDemand in
	// the window before.
	count, demand, prevDemand int64
	// claim is its bound in the current window, when claimed; capped says whether it
	// is bound there (a node without share mode, or alone with demand, is not).
	claim   int64
	claimed bool
	capped  bool
	// shares says the node runs share mode (it sent version 2 values).
	shares bool
	// at is when the values were sent (now, for this node); grewAt when its demand in
	// the current window last grew, as seen here (0: never).
	at, grewAt int64
	// floor is what the key's owner granted it on top of what it held, until a value
	// it sent after the grant could have used it shows its bound (grant.go).
	floor int64
}

// shareView is what one node knows of one key at one moment.
type shareView struct {
	now        int64 // Unix ms
	startMS    int64 // the current window's start
	sizeMS     int64
	intervalMS int64 // the sync interval
	limit      int64
	members    int // live members, this node included
	self       shareNode
	peers      []shareNode
	// sending says this node sends its value of the key at this flush anyway (it
	// counted or refused since the last).
	sending bool
	// grants says every live member runs the owner's grants (grant.go): no bound rises
	// within a window but by a grant, and what nobody holds is the owner's to give.
	grants bool
}

// sharePlan is share mode's decision for one key: this node's bound in the current
// window and in the next (capped false: no bound), and whether to send the current one
// now, counted or not.
type sharePlan struct {
	cur, next             int64
	curCapped, nextCapped bool
	send                  bool
}

// active reports demand in the current window or the one before.
func (n shareNode) active() bool { return n.demand > 0 || n.prevDemand > 0 }

// held is what the node may have counted in the current window: its claim when it is
// a live member bound by share mode, else its count.
func (n shareNode) held() int64 {
	if n.live && n.capped && n.claimed {
		return max(n.count, n.claim)
	}
	return n.count
}

// rate is the node's demand per millisecond, projected from its values at time at:
// the demand of the last window's length (the window before weighted by the part of it
// still within that length), or, when faster, the current window's demand over the
// time it took (at least a millisecond).
func (v shareView) rate(n shareNode) float64 {
	elapsed := min(max(n.at-v.startMS, 0), v.sizeMS)
	e := float64(elapsed) / float64(v.sizeMS)
	r := (float64(n.prevDemand)*(1-e) + float64(n.demand)) / float64(v.sizeMS)
	if n.demand > 0 {
		span := max(elapsed, 1)
		r = max(r, float64(n.demand)/float64(span))
	}
	return r
}

// silent reports a node whose demand has not grown for silentIntervals.
func (v shareView) silent(n shareNode) bool {
	return v.now-max(n.grewAt, v.startMS) >= silentIntervals*v.intervalMS
}

// need is the count the node is projected to reach in the current window: its count
// and, with the margin, its demand until the window ends; only its count once it is
// silent.
func (v shareView) need(n shareNode) int64 {
	if v.silent(n) {
		return n.count
	}
	return v.needRest(n)
}

// needRest is the count the node is projected to reach in the current window at its
// rate, silent or not: a node whose checks come further apart than silentIntervals
// still gets them.
func (v shareView) needRest(n shareNode) int64 {
	left := max(v.startMS+v.sizeMS-n.at, 0)
	return n.count + v.ceil(v.rate(n)*float64(left)*needMargin)
}

// needNext is the node's projected count in the next window.
func (v shareView) needNext(n shareNode) int64 {
	return v.ceil(v.rate(n) * float64(v.sizeMS) * needMargin)
}

// ceil rounds up, bounded by the limit (no node needs more than all of it).
func (v shareView) ceil(f float64) int64 {
	if f <= 0 {
		return 0
	}
	return int64(min(math.Ceil(f), float64(v.limit)))
}

// plan decides this node's bounds.
func (v shareView) plan() sharePlan {
	var p sharePlan
	if v.limit <= 0 {
		return p
	}
	if v.grants {
		return v.planGrants()
	}
	busy := 0 // live peers with demand in this window or the last
	for _, n := range v.peers {
		if n.live && n.active() {
			busy++
		}
	}
	if busy > 0 {
		p.cur, p.curCapped = v.bound(), true
		// The others set aside what this node last sent (or, before it sent anything
		// of the window, the bound it set before the window began): a bound that rose
		// must reach them before it is used up, and one that fell helps them only once
		// they know of it; a small fall is not worth a message, and the node keeps its
		// bound instead, so that its view and theirs stay the same. A node that is not
		// busy is set aside only as headroom.
		if c := v.self; c.claimed && c.active() && !v.sending {
			switch {
			case p.cur > c.claim && p.cur-c.claim < max(v.limit/releaseShare, 1) && v.needSoon(c) < c.claim:
				// A small rise the node will not need before its next value (the
				// headroom moving with the others' projections): not worth a message.
				p.cur = c.claim
			case p.cur > c.claim:
				p.send = true
			case c.claim-p.cur >= max(v.limit/releaseShare, 1):
				p.send = true
			case p.cur < c.claim:
				p.cur = c.claim
			}
		}
	}
	next := 0 // live peers with demand in this window: busy in the next one
	for _, n := range v.peers {
		if n.live && n.demand > 0 {
			next++
		}
	}
	if next > 0 {
		p.next, p.nextCapped = v.boundNext(next), true
	}
	return p
}

// bound is this node's bound in the current window: its count and its part of the limit
// left once the others' claims (or counts) are set aside.
func (v shareView) bound() int64 {
	var start map[string]int64 // the bounds set before the window began, by node
	// This node keeps its bound, or the part of it it is projected to need: giving up
	// more would hand it to nodes that may not be asked for it before the window ends.
	// Without one (it did not set one before the window began), it keeps what that
	// would have been.
	need := v.need(v.self)
	keep := v.self.count
	switch {
	case v.self.claimed:
		keep = max(keep, min(v.self.claim, need))
	case v.self.prevDemand > 0:
		start = v.startBounds()
		keep = max(keep, min(start[v.self.name], need))
	}
	budget := v.limit - keep
	cs := []claimant{{name: v.self.name, unmet: max(need-keep, 0), capped: true}}
	for _, n := range v.peers {
		held := n.held()
		capped := n.capped
		if n.live && n.active() && !n.claimed {
			// No value of this window from it yet: it holds the bound it set before the
			// window began, if it runs share mode and someone else was busy in the
			// last window.
			capped = n.shares && v.othersBusy(n, func(o shareNode) bool { return o.prevDemand > 0 })
			if capped {
				if start == nil {
					start = v.startBounds()
				}
				held = max(held, start[n.name])
			}
		}
		budget -= held
		if n.live && n.active() {
			cs = append(cs, claimant{name: n.name, unmet: max(v.need(n)-held, 0), capped: capped})
		}
	}
	parts, headroom := allocate(budget, cs, v.members)
	return keep + parts[0] + headroom
}

// startBounds are the bounds the nodes set for the current window before it began, as
// boundNext set them from the last window's demand, by node name.
func (v shareView) startBounds() map[string]int64 {
	type node struct {
		n      shareNode
		capped bool
	}
	var ns []node
	busy := func(n shareNode) bool { return n.prevDemand > 0 }
	if busy(v.self) || v.othersBusy(v.self, busy) {
		ns = append(ns, node{v.self, true})
	}
	for _, n := range v.peers {
		if n.live && busy(n) {
			ns = append(ns, node{n, n.shares && v.othersBusy(n, busy)})
		}
	}
	cs := make([]claimant, len(ns))
	for i, n := range ns {
		cs[i] = claimant{name: n.n.name, unmet: v.ceil(float64(n.n.prevDemand) * needMargin), capped: n.capped}
	}
	parts, headroom := allocate(v.limit, cs, v.members)
	out := make(map[string]int64, len(ns))
	for i, n := range ns {
		out[n.n.name] = parts[i] + headroom
	}
	return out
}

// boundNext is this node's bound in the next window, which no node has counted in yet:
// its part of the whole limit. busy is the number of live peers with demand in the
// current window.
func (v shareView) boundNext(busy int) int64 {
	cs := []claimant{{name: v.self.name, unmet: v.needNext(v.self), capped: true}}
	selfBusy := v.self.demand > 0
	for _, n := range v.peers {
		if !n.live || n.demand == 0 {
			continue
		}
		// Bound there if it runs share mode and is not alone with demand.
		capped := n.shares && (selfBusy || busy > 1)
		cs = append(cs, claimant{name: n.name, unmet: v.needNext(n), capped: capped})
	}
	parts, headroom := allocate(v.limit, cs, v.members)
	return parts[0] + headroom
}

// othersBusy reports whether a node other than n (this one included) is busy by f.
func (v shareView) othersBusy(n shareNode, f func(shareNode) bool) bool {
	if f(v.self) {
		return true
	}
	for _, o := range v.peers {
		if o.name != n.name && o.live && f(o) {
			return true
		}
	}
	return false
}

// claimant is one node's part in a division of a budget.
type claimant struct {
	name   string
	unmet  int64 // what it is projected to need beyond what it holds
	capped bool  // false: not bound by share mode, so served first
}

// allocate divides budget among the claimants: first those that are not capped, each
// up to its need (they count regardless), then the capped ones by max-min fairness:
// in order of need, each gets its need or an equal part of what is left, whichever is
// less, the odd hits of the equal parts going to the first names. What nobody needs is
// headroom, split evenly over members nodes. It returns the claimants' parts, in their
// order, and the headroom.
func allocate(budget int64, cs []claimant, members int) (parts []int64, headroom int64) {
	parts = make([]int64, len(cs))
	if budget <= 0 {
		return parts, 0
	}
	left := budget
	for _, capped := range []bool{false, true} {
		var idx []int
		for i, c := range cs {
			if c.capped == capped {
				idx = append(idx, i)
			}
		}
		left = waterfill(left, cs, idx, parts)
	}
	return parts, left / int64(max(members, 1))
}

// waterfill gives the claimants idx of cs their max-min fair parts of budget, into
// parts, and returns what is left.
func waterfill(budget int64, cs []claimant, idx []int, parts []int64) int64 {
	slices.SortFunc(idx, func(a, b int) int {
		if cs[a].unmet != cs[b].unmet {
			return int(min(max(cs[a].unmet-cs[b].unmet, -1), 1))
		}
		return strings.Compare(cs[a].name, cs[b].name)
	})
	for j, i := range idx {
		n := int64(len(idx) - j)
		if u := max(cs[i].unmet, 0); u <= budget/n {
			parts[i] = u
			budget -= u
			continue
		}
		// Everyone from here on needs more than an equal part: each gets one.
		rest := slices.Clone(idx[j:])
		slices.SortFunc(rest, func(a, b int) int { return strings.Compare(cs[a].name, cs[b].name) })
		q, r := budget/n, budget%n
		for t, i := range rest {
			parts[i] = q
			if int64(t) < r {
				parts[i]++
			}
		}
		return 0
	}
	return budget
}

// needHorizon is how far ahead, in sync intervals, the owner's grants project a node's
// demand: a bound node asks for more when it needs it, so room it would use only later
// is better left with the owner.
const needHorizon = silentIntervals + 1

// needSoon is what the node is projected to count in the next needHorizon intervals:
// its count and, with the margin, its demand until then; only its count once silent.
func (v shareView) needSoon(n shareNode) int64 {
	if v.silent(n) {
		return n.count
	}
	left := min(max(v.startMS+v.sizeMS-n.at, 0), needHorizon*v.intervalMS)
	return n.count + v.ceil(v.rate(n)*float64(left)*needMargin)
}

// planGrants is plan when every live member runs the owner's grants. In the current
// window the bound never rises but by a grant: it falls to what the node is projected to
// need soon (to its count once it is silent), and the room goes back to the owner once
// the others know of it. The next window's bound is the node's max-min fair part of the
// limit by the demand of this window (with the margin), without headroom: what nobody
// needs is left for the owner to grant.
func (v shareView) planGrants() sharePlan {
	var p sharePlan
	self := v.self
	alone := true // no live peer with demand in this window or the last
	for _, n := range v.peers {
		alone = alone && !(n.live && n.active())
	}
	if alone && !self.claimed {
		// The only node with demand, as before grants: not bound, so that a node cut
		// off from the owner (a netsplit not yet detected) still serves its limit. The
		// owner sets aside what it may count soon.
		return p
	}
	p.curCapped = true
	held := self.count
	if self.claimed {
		held = max(held, self.claim)
	}
	p.cur = held
	switch {
	case !self.claimed:
		// Not bound until now (the key's first window here, or the others' first word
		// of it): bound at what it counted and, when the nodes are projected to need
		// a small part of the limit in the whole window (farBelow), a member's part of what nobody
		// holds (as share mode's headroom without grants: every node taking its part
		// takes what is free at most), so that a node far below the limit need not ask;
		// more is asked of the owner.
		p.cur = self.count
		if v.farBelow() {
			p.cur += max(v.limit-self.count-v.othersHold(), 0) / int64(max(v.members, 1))
		}
		p.send = self.active() && !v.sending
	case held > self.count:
		cur := max(self.count, min(held, v.needSoon(self)))
		contended := v.contended(held)
		switch {
		case held+v.othersHold() > v.limit:
			// The bounds add up to more than the limit (set before the nodes knew of
			// each other): each falls to its fair part, as the others' do.
			cur = max(self.count, min(cur, v.fairPart()))
		case !contended && v.farBelow():
			// The nodes are projected to need a small part of the limit: the node keeps
			// its bound, its first one included (a member's part of what was free),
			// though it may have no demand yet.
			cur = held
		case !contended:
			// Nobody is short of room: the node keeps what it is projected to need
			// until the window ends, rather than give it back and ask for it again a
			// few intervals (or, for a key checked seldom, one check) later.
			cur = max(cur, min(held, v.needRest(self)))
		}
		// A fall is sent when it is large, or when the node fell silent and others may
		// need the room.
		release := held-cur >= max(v.limit/releaseShare, 1) || (contended && v.silent(self))
		if cur < held && (v.sending || release) {
			p.cur, p.send = cur, !v.sending
		}
	}
	busy := false // a live peer has demand in this window: the next one is shared
	for _, n := range v.peers {
		busy = busy || (n.live && n.demand > 0)
	}
	if busy || (self.demand > 0 && !alone) {
		cs := []claimant{{name: self.name, unmet: v.ceil(float64(self.demand) * needMargin), capped: true}}
		for _, n := range v.peers {
			if n.live && n.demand > 0 {
				cs = append(cs, claimant{name: n.name, unmet: v.ceil(float64(n.demand) * needMargin), capped: true})
			}
		}
		parts, _ := allocate(v.limit, cs, v.members)
		p.next, p.nextCapped = parts[0], true
	}
	return p
}

// holds is what node n may count in the current window as this node knows (the owner's
// view when it grants): its bound when bound; what it is projected to need soon when it
// counts unbound; the most its bound set before the window began can be (its demand of
// the last window with the margin) when it has not been heard from in this window; and
// at least what it was granted lately. A member that left, or an earlier incarnation,
// holds its count, and what it was granted; one that handed its keys over to leave only
// its count (shareView).
func (v shareView) holds(n shareNode) int64 {
	h := n.count
	if n.live {
		switch {
		case n.claimed && n.capped:
			h = max(h, n.claim)
		case n.claimed || (!n.shares && n.active()):
			h = max(h, v.needSoon(n))
		case n.prevDemand > 0 && v.now < v.startMS+(silentIntervals+1)*v.intervalMS+v.intervalMS/2:
			// Not heard from in this window: it may hold the bound it set before the
			// window began, until it would have sent the fall of a bound it does not use.
			h = max(h, v.ceil(float64(n.prevDemand)*needMargin))
		case n.prevDemand > 0:
			// Still not heard from: not bound (the only one with demand before), it may
			// count what it is projected to need soon.
			h = max(h, v.needSoon(n))
		}
	}
	return max(h, n.floor)
}

// unheld is the part of the limit nobody holds, as this node knows: what the owner may
// grant.
func (v shareView) unheld() int64 {
	self := v.self
	h := self.count
	switch {
	case self.claimed:
		h = max(h, self.claim)
	case self.active():
		h = max(h, v.needSoon(self))
	}
	u := v.limit - h
	for _, n := range v.peers {
		u -= v.holds(n)
	}
	return max(u, 0)
}

// grantFor is what the owner grants a node asking for want hits: what nobody holds, up
// to want or a member's part of it, whichever is more.
func (v shareView) grantFor(want int64) int64 {
	u := v.unheld()
	if u <= 0 {
		return 0
	}
	members := int64(max(v.members, 1))
	return min(u, max(want, (u+members-1)/members))
}

// contended reports that the room the owner may grant, with this node holding held, is
// short of what the others are projected to need soon beyond what they hold, with a
// margin of a quarter of the limit for nodes not heard from yet: then a node keeps only
// what it needs soon (its count once silent), and gives the rest back.
func (v shareView) contended(held int64) bool {
	free := v.limit - held - v.othersHold()
	short := int64(0)
	for _, n := range v.peers {
		if n.live && n.active() {
			short += max(v.needSoon(n)-v.holds(n), 0)
		}
	}
	return free < short+max((v.limit+freeShare-1)/freeShare, 1)
}

// recheck says plan p of v is to be made again at the next tick though nothing is heard
// or counted: the grants divide the limit, and the node's bound is above its count or
// the next window is bound, so that an idle node's bound falls in time. (Share mode
// alone plans again on what it hears; a plan at every tick of every key it divides cost
// most of a flush with 1,000 keys.)
func (v shareView) recheck(p sharePlan) bool {
	return v.grants && ((p.curCapped && p.cur > v.self.count) || p.nextCapped)
}

// farBelow reports that the nodes with demand are projected to count less than a
// releaseShare-th of the limit in the current window, at their rates so far (needRest):
// far enough that a part of the free room kept by a node that does not use it leaves
// the owner plenty to grant. (At small limits no count is that far: a node's part there
// could be what another node needs at once.)
func (v shareView) farBelow() bool {
	t := v.needRest(v.self)
	for _, n := range v.peers {
		if n.live && n.active() {
			t += v.needRest(n)
		}
	}
	return releaseShare*t < v.limit
}

// othersHold is what the other nodes hold (holds), together.
func (v shareView) othersHold() int64 {
	t := int64(0)
	for _, n := range v.peers {
		t += v.holds(n)
	}
	return t
}

// fairPart is this node's max-min fair part of the limit among the live nodes with
// demand in this window or the last, by what each is projected to count soon (a node
// not heard from in this window: by what it may hold).
func (v shareView) fairPart() int64 {
	start := v.startParts()
	cs := []claimant{{name: v.self.name, unmet: max(v.needSoon(v.self), start[v.self.name]), capped: true}}
	for _, n := range v.peers {
		if !n.live || !n.active() {
			continue
		}
		need := v.needSoon(n)
		if !n.claimed {
			need = start[n.name]
		}
		cs = append(cs, claimant{name: n.name, unmet: need, capped: true})
	}
	parts, _ := allocate(v.limit, cs, v.members)
	return parts[0]
}

// startParts are the bounds the nodes set for the current window before it began, as
// planGrants sets them (their parts of the limit by the last window's demand), by name.
func (v shareView) startParts() map[string]int64 {
	var cs []claimant
	if v.self.prevDemand > 0 {
		cs = append(cs, claimant{name: v.self.name, unmet: v.ceil(float64(v.self.prevDemand) * needMargin), capped: true})
	}
	for _, n := range v.peers {
		if n.live && n.prevDemand > 0 {
			cs = append(cs, claimant{name: n.name, unmet: v.ceil(float64(n.prevDemand) * needMargin), capped: true})
		}
	}
	parts, _ := allocate(v.limit, cs, v.members)
	out := make(map[string]int64, len(cs))
	for i, c := range cs {
		out[c.name] = parts[i]
	}
	return out
}
