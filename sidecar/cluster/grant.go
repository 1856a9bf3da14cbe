package cluster

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// The owner's grants (share.go explains why): when every live member runs them, the
// part of a key's limit that no node holds belongs to one node, the key's owner, and
// only the owner gives it out, one request at a time.
//
//	ask    := askKind(1 byte) sentAt(varint) origin(string) id(uvarint) want(uvarint)
//	          waitMS(uvarint) value (as in a version 2 message, endMS minus sentAt)
//	answer := answerKind(1 byte) origin(string) id(uvarint) bucket(string) key(string)
//	          endMS(varint) grant(uvarint)
//
// Their first bytes are neither a counters' version nor the live view's, and a node
// asks only members that announce grants (featureGrants in the second byte of their
// metadata), so nodes of earlier releases never get them.
const (
	askKind    byte = 'Q'
	answerKind byte = 'G'
	// featureGrants, in the second byte of a member's metadata, says it asks and
	// answers grants.
	featureGrants byte = 1
	// DefaultGrantWait is how long a check refused by its bound waits for the owner's
	// answer by default: a ceiling, paid only when the owner is slow (its answer comes
	// in a round trip otherwise), and a check that does not get it is refused below the
	// limit, so it is long enough for a loaded owner's answer and well inside Envoy's
	// deadline.
	DefaultGrantWait = 100 * time.Millisecond
	// DefaultGrantMaxLimit is the largest limit, in hits per window, whose counters the
	// grants divide by default: where a member's part of what is left rounds to little
	// (logins, tokens and resets count a few a minute). Larger limits are divided by
	// share mode alone, which sends no request for room.
	DefaultGrantMaxLimit = 100
	// maxAsks bounds the keys a node waits on grants for at once.
	maxAsks = 4096
)

// ownerOf is the owner of a key among members (node names): the highest rendezvous
// hash of member and key, so that every node with the same members picks the same one
// and a member leaving moves only its own keys.
func ownerOf(bucket, id string, members []string) string {
	best, bestH := "", uint64(0)
	for _, m := range members {
		h := fnv.New64a()
		h.Write([]byte(m))
		h.Write([]byte{0})
		h.Write([]byte(bucket))
		h.Write([]byte{0})
		h.Write([]byte(id))
		x := mix64(h.Sum64())
		if best == "" || x > bestH || (x == bestH && m < best) {
			best, bestH = m, x
		}
	}
	return best
}

// mix64 spreads FNV's bits (its last bytes move the high bits little).
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// owners is a membership's grant-capable members, as the owners of keys see them.
type owners struct {
	self string
	// names are the live members, this node included, when grants or owner replication
	// run (every live member announces them); nil when neither does.
	names []string
	// grants and relay say which run.
	grants, relay bool
	// prev is the names before the last change, at changedAt. A node that comes to own
	// a key by a change grants only settleMove after it, once the grants the previous
	// owner made have reached it with the borrowers' next syncs; and none until
	// settleStart after its own start (startedAt), once every node holding a bound it
	// does not count has sent it or fallen silent.
	prev                    []string
	changedAt, startedAt    int64
	settleMove, settleStart int64
	// maxLimit is the largest limit the grants divide: the smallest the members
	// announce.
	maxLimit uint32
	// handedOver holds, by name, when members last handed their keys over to this node
	// (handover.go); never changed in place. joiners holds, by name, the members that
	// joined since this node last handed them over the keys it answered for (handover.go).
	// leftAfterHandover holds the members that handed their keys over to leave, and
	// when; never changed in place. leftOrigins holds their incarnations (origins): each
	// counts no more, and what it counted is final.
	handedOver, leftAfterHandover, leftOrigins map[string]int64
	// handedTo holds, by name, when this node last handed a member its keys; never
	// changed in place.
	handedTo map[string]int64
	joiners  map[string]joiner
}

// joiner is a member that joined: when this node hands its keys over to it, and whether
// there may be any (this node had settled when the member joined).
type joiner struct {
	at    int64
	hands bool
}

// handoverWait bounds how long after it settled a newcomer waits for the handover of
// its keys from a member that does not send one (an earlier release).
func (o *owners) handoverWait() int64 { return 2 * o.settleStart }

// newOwners returns the owners of a node starting at now, syncing every intervalMS and
// waiting waitMS for grants.
func newOwners(self string, now, intervalMS, waitMS int64) owners {
	return owners{self: self, changedAt: now, startedAt: now,
		settleMove:  intervalMS + waitMS + max(intervalMS/4, 10),
		settleStart: silentIntervals*intervalMS + waitMS + max(intervalMS/2, 10)}
}

// owns reports whether this node owns k (of the bucket named) at now, and may grant.
// A newcomer owns a key once the member that owned it before it came has handed it over
// (handover.go), which that member does as soon as it sees it join; from one that does
// not (an earlier release), once it has settled and handoverWait has passed.
func (o *owners) owns(bucket, id string, now int64) bool {
	if o.names == nil || ownerOf(bucket, id, o.names) != o.self {
		return false
	}
	if o.relay && now < o.startedAt+o.settleStart+o.handoverWait() {
		// The member that owned the key before this node came answers for it (handing)
		// until it hands it over; a key that came to this node as its owner left is not
		// one of those.
		if before := o.ownerWithout(bucket, id); before != "" {
			if p := ownerOf(bucket, id, o.prev); o.prev == nil || p == o.self || p == before {
				return o.handedSince(before, o.startedAt)
			}
		}
	}
	if now < o.startedAt+o.settleStart {
		return false
	}
	return now >= o.changedAt+o.settleMove || (o.prev != nil && ownerOf(bucket, id, o.prev) == o.self) || o.handedOverBy(bucket, id)
}

// ownerWithout is the owner of a key among the members but this node ("": none).
func (o *owners) ownerWithout(bucket, id string) string {
	return ownerOf(bucket, id, slices.DeleteFunc(slices.Clone(o.names), func(n string) bool { return n == o.self }))
}

// forwardTo is, in owner replication, the member to forward a request for room of a key
// to while this node owns the key but has not settled (owns): the one that owns it
// without this node (it did before this node joined or came back), which answers for it
// (handing). "" when there is none: a key that came to this node because its owner left
// has nobody to answer for it.
func (o *owners) forwardTo(bucket, id string, now int64) string {
	if o.names == nil || !o.relay || ownerOf(bucket, id, o.names) != o.self || o.owns(bucket, id, now) {
		return ""
	}
	before := o.ownerWithout(bucket, id)
	if o.prev != nil && ownerOf(bucket, id, o.prev) != o.self && ownerOf(bucket, id, o.prev) != before {
		return ""
	}
	return before
}

// handing reports whether this node answers requests for room of a key its owner
// forwards (forwardTo): it owned the key before its view of the members last changed,
// it would own it without the owner (a member that joined or came back), and the change
// is less than settleStart old (the owner forwards only while it has not settled). A
// member that comes to own a key another left is not handed it: nobody answers for it
// until it settles. A node hands only what it owned when its view changed: one that had
// not settled since its own start by then hands nothing (the members it saw before its
// view was whole, as a join finds them one by one, gave it keys it never owned, and it
// knows too little of the others' counts to answer for anyone).
func (o *owners) handing(bucket, id string, now int64) bool {
	if o.names == nil || o.prev == nil || !o.relay || now >= o.changedAt+o.settleStart || o.changedAt < o.startedAt+o.settleStart {
		return false
	}
	owner := ownerOf(bucket, id, o.names)
	if owner == o.self || ownerOf(bucket, id, o.prev) != o.self {
		return false
	}
	if t, ok := o.handedTo[owner]; ok && t >= o.changedAt {
		// Handed over: the owner grants.
		return false
	}
	return ownerOf(bucket, id, slices.DeleteFunc(slices.Clone(o.names), func(n string) bool { return n == owner })) == o.self
}

// grantRequest is a node's request for room of one key.
type grantRequest struct {
	sentAt int64
	origin string
	id     uint64
	want   uint32
	waitMS int64
	v      value // the asker's own value of the key
}

type grantAnswer struct {
	origin      string // the owner
	id          uint64
	bucket, key string
	endMS       int64
	grant       uint32
}

func encodeAsk(q grantRequest) []byte {
	b := []byte{askKind}
	b = binary.AppendVarint(b, q.sentAt)
	b = appendString(b, q.origin)
	b = binary.AppendUvarint(b, q.id)
	b = binary.AppendUvarint(b, uint64(q.want))
	b = binary.AppendUvarint(b, uint64(max(q.waitMS, 0)))
	v := q.v
	b = appendString(b, v.bucket)
	b = appendString(b, v.id)
	b = binary.AppendUvarint(b, uint64(v.sizeMS))
	b = binary.AppendVarint(b, v.endMS-q.sentAt)
	b = binary.AppendUvarint(b, uint64(v.count))
	capWord := uint64(0)
	if v.capped {
		capWord = uint64(v.cap) + 1
	}
	b = binary.AppendUvarint(b, uint64(v.refused))
	b = binary.AppendUvarint(b, capWord)
	return binary.AppendUvarint(b, uint64(v.limit))
}

func decodeAsk(b []byte) (grantRequest, error) {
	var q grantRequest
	if len(b) < 1 || b[0] != askKind {
		return q, errMalformed
	}
	r := reader{b: b[1:]}
	q.sentAt = r.varint()
	q.origin = r.string()
	q.id = r.uvarint()
	want, wait := r.uvarint(), r.uvarint()
	v := value{share: true, bucket: r.string(), id: r.string()}
	size := r.uvarint()
	v.endMS = q.sentAt + r.varint()
	count, refused, capWord, limit := r.uvarint(), r.uvarint(), r.uvarint(), r.uvarint()
	if r.err != nil || len(r.b) != 0 || q.origin == "" || v.id == "" || want == 0 || want > math.MaxUint32 ||
		wait > 60_000 || size == 0 || size > maxWindowMS || count > math.MaxUint32 || refused > math.MaxUint32 ||
		capWord > 1<<32 || limit > math.MaxUint32 {
		return q, errMalformed
	}
	q.want, q.waitMS = uint32(want), int64(wait)
	v.sizeMS, v.count, v.refused, v.limit = int64(size), uint32(count), uint32(refused), uint32(limit)
	if capWord > 0 {
		v.cap, v.capped = uint32(capWord-1), true
	}
	q.v = v
	return q, nil
}

func encodeAnswer(a grantAnswer) []byte {
	b := []byte{answerKind}
	b = appendString(b, a.origin)
	b = binary.AppendUvarint(b, a.id)
	b = appendString(b, a.bucket)
	b = appendString(b, a.key)
	b = binary.AppendVarint(b, a.endMS)
	return binary.AppendUvarint(b, uint64(a.grant))
}

func decodeAnswer(b []byte) (grantAnswer, error) {
	var a grantAnswer
	if len(b) < 1 || b[0] != answerKind {
		return a, errMalformed
	}
	r := reader{b: b[1:]}
	a.origin = r.string()
	a.id = r.uvarint()
	a.bucket, a.key = r.string(), r.string()
	a.endMS = r.varint()
	g := r.uvarint()
	if r.err != nil || len(r.b) != 0 || g > math.MaxUint32 {
		return a, errMalformed
	}
	a.grant = uint32(g)
	return a, nil
}

// asks is a node's side of the grants: one request per key at a time, which every
// check of the key refused meanwhile waits on, and the keys whose value is to be sent
// to every member: at the next flush once a grant raised the bound, so that all know
// it, and in any case at the first flush after the request's deadline, so that the
// owner, which holds what it granted until a value sent after it, lets go of a grant
// that came late or not at all. An answer that comes after the deadline but before
// that flush is still applied (the owner holds the grant, and the flush tells it of
// the raised bound); after the flush it is not, as the owner may have let go of it.
type asks struct {
	mu      sync.Mutex
	pending map[limiter.Key]*ask
	late    map[limiter.Key]*ask     // timed out, its value not sent yet
	soon    map[limiter.Key]struct{} // sent by the next flush
	after   map[limiter.Key]int64    // sent by the first flush after the time
	lastID  uint64
	// zero holds the keys the owner answered 0 for (or did not answer), by when the
	// node may ask again: the owner learns of more room only from syncs.
	zero map[limiter.Key]int64
	// raised holds the keys whose bound a grant raised lately: a summary planned before
	// the grant does not lower it (raisedAfter).
	raised map[limiter.Key]raise
	// asked holds the keys the node asked room for, with the end of the window it asked
	// in: the owner may hold a grant for it there that only a value of the key frees
	// (askedIn).
	asked map[limiter.Key]int64
}

// raise is a bound a grant raised: to bound, in the window ending at endMS, by the
// answer to request id, kept from a summary planned before it until the time until.
type raise struct {
	id           uint64
	endMS, until int64
	bound        uint32
}

// noteRaised notes that the answer to request a raised k's bound to bound at now.
func (as *asks) noteRaised(k limiter.Key, a *ask, bound uint32, now, holdMS int64) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.raised == nil {
		as.raised = map[limiter.Key]raise{}
	}
	if len(as.raised) >= 2*maxAsks {
		return // the summaries of the keys beyond may lower them: refusals, never more
	}
	as.raised[k] = raise{id: a.id, endMS: a.endMS, until: now + holdMS, bound: bound}
}

// raisedAfter returns the bound a grant raised k's to, in the window ending at endMS,
// when the owner of a summary had answered only requests up to answered: the summary
// was planned before the grant, and is not to lower the bound under it.
func (as *asks) raisedAfter(k limiter.Key, endMS int64, answered uint64, now int64) (uint32, bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	r, ok := as.raised[k]
	if !ok || r.endMS != endMS || answered >= r.id || now > r.until {
		return 0, false
	}
	return r.bound, true
}

// ask is one outstanding request.
type ask struct {
	id       uint64
	sentAt   int64 // the asker's clock
	sizeMS   int64
	endMS    int64
	deadline int64 // the asker's clock: a value sent after it ends the owner's hold (asks.due)
	done     chan struct{}
	grant    uint32
	answered bool
	reqCap   uint32 // the bound the request carried
	tookPart bool   // not answered in time, the node took a part of the free room
	// flushed says a flush at or after the deadline sent this node's values: the owner
	// lets go of the grant on them, so the answer is not applied (asks.due).
	flushed   bool
	closeOnce sync.Once
}

func (a *ask) finish() { a.closeOnce.Do(func() { close(a.done) }) }

// start returns k's outstanding request, or a new one (first) to be sent; ok is false
// when the node may not ask now (answered 0 lately, or too many outstanding).
func (as *asks) start(k limiter.Key, sizeMS, endMS, now, waitMS int64) (a *ask, first, ok bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if until, ok := as.zero[k]; ok && now < until {
		return nil, false, false
	}
	if a := as.pending[k]; a != nil && a.endMS == endMS && now <= a.deadline {
		return a, false, true
	}
	if as.pending == nil {
		as.pending = map[limiter.Key]*ask{}
		as.zero = map[limiter.Key]int64{}
	}
	if len(as.pending) >= maxAsks || len(as.after) >= 2*maxAsks {
		return nil, false, false
	}
	// A new request carries this node's bound: an earlier one's late grant no longer
	// adds to it as the owner will see it.
	delete(as.late, k)
	as.lastID++
	a = &ask{id: as.lastID, sentAt: now, sizeMS: sizeMS, endMS: endMS, deadline: now + waitMS, done: make(chan struct{})}
	as.pending[k] = a
	if as.asked == nil {
		as.asked = map[limiter.Key]int64{}
	}
	if _, ok := as.asked[k]; ok || len(as.asked) < 2*maxAsks {
		// Beyond, a grant held for the key may stay idle to the window's end: refusals,
		// never more.
		as.asked[k] = endMS
	}
	as.sendAfter(k, a.deadline)
	return a, true, true
}

// sendAfter has the key's value sent by the first flush after at (the caller holds mu).
func (as *asks) sendAfter(k limiter.Key, at int64) {
	if as.after == nil {
		as.after = map[limiter.Key]int64{}
	}
	as.after[k] = max(as.after[k], at)
}

// end drops k's request a (timed out or answered) and, when nothing was granted,
// keeps the node from asking again for k until zeroUntil. A request that timed out
// waits for a late answer until the flush after its deadline (due).
func (as *asks) end(k limiter.Key, a *ask, zeroUntil int64) {
	as.mu.Lock()
	if as.pending[k] == a {
		delete(as.pending, k)
		if _, unsent := as.after[k]; unsent && !a.answered {
			if as.late == nil {
				as.late = map[limiter.Key]*ask{}
			}
			as.late[k] = a
		}
	}
	if zeroUntil > 0 && as.zero != nil {
		as.zero[k] = zeroUntil
	}
	as.mu.Unlock()
	a.finish()
}

// take returns k's request of id, if it is outstanding, or if it timed out and its
// value has not been sent since (late).
func (as *asks) take(k limiter.Key, id uint64) (a *ask, late bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if a := as.pending[k]; a != nil && a.id == id {
		return a, false
	}
	if a := as.late[k]; a != nil && a.id == id {
		delete(as.late, k)
		return a, true
	}
	return nil, false
}

// flushedPast reports whether a flush at or after a's deadline sent this node's values.
func (as *asks) flushedPast(a *ask) bool {
	as.mu.Lock()
	defer as.mu.Unlock()
	return a.flushed
}

// result reports whether a's answer granted room, or the node took a part of the free
// room when it did not come (fallBack), and whether it came.
func (as *asks) result(a *ask) (granted, answered bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	return (a.answered && a.grant > 0) || a.tookPart, a.answered
}

// askedIn reports whether the node asked room for k in the window ending at endMS.
func (as *asks) askedIn(k limiter.Key, endMS int64) bool {
	as.mu.Lock()
	defer as.mu.Unlock()
	end, ok := as.asked[k]
	return ok && end == endMS
}

// noteGranted has k's value sent by the next flush: its bound rose.
func (as *asks) noteGranted(k limiter.Key) {
	as.mu.Lock()
	if as.soon == nil {
		as.soon = map[limiter.Key]struct{}{}
	}
	as.soon[k] = struct{}{}
	as.mu.Unlock()
}

// due returns the keys whose value a flush at now sends, and forgets them; a key whose
// bound rose with a request still open is sent now and once more after its deadline.
func (as *asks) due(now int64) []limiter.Key {
	as.mu.Lock()
	defer as.mu.Unlock()
	var out []limiter.Key
	for k := range as.soon {
		out = append(out, k)
	}
	clear(as.soon)
	for k, at := range as.after {
		if at < now {
			out = append(out, k)
			delete(as.after, k)
		}
	}
	// This flush's values are sent after the deadlines before now: the owner lets go of
	// those requests' grants when it merges them.
	for k, a := range as.late {
		if a.deadline <= now {
			delete(as.late, k)
		}
	}
	for _, a := range as.pending {
		if a.deadline <= now {
			a.flushed = true
		}
	}
	return out
}

// sweep forgets the requests and zero answers that are over by now.
func (as *asks) sweep(now int64) {
	as.mu.Lock()
	defer as.mu.Unlock()
	for k, until := range as.zero {
		if until <= now {
			delete(as.zero, k)
		}
	}
	for k, a := range as.pending {
		if a.endMS <= now || a.deadline+1000 < now {
			delete(as.pending, k)
			a.finish()
		}
	}
	for k, a := range as.late {
		if a.endMS <= now || a.deadline+1000 < now {
			delete(as.late, k)
		}
	}
	for k, end := range as.asked {
		if end <= now {
			delete(as.asked, k)
		}
	}
	for k, r := range as.raised {
		if r.endMS <= now || r.until < now {
			delete(as.raised, k)
		}
	}
}

// request builds this node's request for want hits of k in the window of sizeMS
// ending at endMS, with its own value of the key.
func (r *replicator) request(k limiter.Key, a *ask, want uint32, now, waitMS int64) grantRequest {
	v := value{bucket: r.lim.BucketName(k.Bucket), id: k.ID, sizeMS: a.sizeMS, endMS: a.endMS, share: true}
	if s, ok := r.lim.Lookup(k); ok && s.SizeMS == a.sizeMS && s.EndMS == a.endMS {
		// The hits asked for are noted as refused until the answer: they are not yet.
		v.count, v.refused, v.limit = s.Own, s.Refused-min(s.Refused, want), s.Limit
	} else if ok {
		v.limit = s.Limit
	}
	v.cap, v.capped = r.lim.CapIn(k, a.sizeMS, a.endMS)
	r.asks.mu.Lock()
	a.reqCap = v.cap
	r.asks.mu.Unlock()
	return grantRequest{sentAt: now, origin: r.origin, id: a.id, want: want, waitMS: waitMS, v: v}
}

// grant answers another node's request, as the key's owner: it merges the asker's
// value (state like any other) and grants from what nobody holds. Not the owner (as
// owns says at env.now): 0.
func (r *replicator) grant(q grantRequest, env shareEnv) (grantAnswer, bool) {
	ans := grantAnswer{origin: r.origin, id: q.id, bucket: q.v.bucket, key: q.v.id, endMS: q.v.endMS}
	if q.origin == r.origin || !env.grantsFor(int64(q.v.limit)) || !r.share {
		return ans, false
	}
	r.slots.planMu.Lock()
	defer r.slots.planMu.Unlock()
	if r.slots.merge(q.origin, q.v, q.sentAt, env.now) != merged {
		return ans, false
	}
	r.slots.sawDirect(q.origin)
	b, ok := r.lim.LookupBucket(q.v.bucket)
	if !ok {
		return ans, false
	}
	k := limiter.Key{Bucket: b, ID: q.v.id}
	if !env.owns(k) && !(env.handing != nil && env.handing(k)) {
		// Not the owner, or not settled yet: in owner replication no answer, so that the
		// asker falls back (fallBack) rather than take it for the limit used up.
		return ans, !env.relay
	}
	ans.grant = r.slots.grantRoom(k, q.origin, q.want, q.v.endMS, q.sentAt+q.waitMS, env)
	r.slots.noteAnswered(q.origin, q.id)
	return ans, true
}

// ownValue is this node's value of k in the window of sizeMS ending at endMS, with its
// bound; held is false when it has none there.
func (r *replicator) ownValue(k limiter.Key, sizeMS, endMS int64) (v value, held bool) {
	v = value{bucket: r.lim.BucketName(k.Bucket), id: k.ID, sizeMS: sizeMS, endMS: endMS, share: true}
	v.cap, v.capped = r.lim.CapIn(k, sizeMS, endMS)
	if s, ok := r.lim.Lookup(k); ok && s.SizeMS == sizeMS && s.EndMS == endMS {
		v.count, v.refused, v.limit = s.Own, s.Refused, s.Limit
	}
	return v, v.capped
}

// handedGrant is what a member answering for a key's new owner (handing) tells the owner
// of a grant: the asker's value with the bound the grant gives it (its request's bound
// and the grant), as of the request, so that the owner sets it aside once it settles.
func handedGrant(q grantRequest, g uint32) value {
	v := q.v
	v.share, v.capped = true, true
	v.cap = uint32(min(uint64(v.cap)+uint64(g), math.MaxUint32-1))
	return v
}

// grantSelf is the owner's grant to itself.
func (r *replicator) grantSelf(k limiter.Key, want uint32, endMS int64, env shareEnv) uint32 {
	r.slots.planMu.Lock()
	defer r.slots.planMu.Unlock()
	if !env.owns(k) && !(env.handing != nil && env.handing(k)) {
		return 0
	}
	g := r.slots.grantRoom(k, r.origin, want, endMS, env.now, env)
	if g > 0 {
		r.asks.noteGranted(k)
	}
	return g
}

// fallBack is what a node does when its request a for room of k, in the window ending
// at endMS, was not answered within the wait (an owner slow to answer, a lost packet):
// while the nodes are projected to need a small part of the limit (farBelow), it takes a
// member's part of what nobody holds as it knows, as a node first bound does, rather
// than refuse a check far below the limit, and sends its bound with the next flush.
// Nearer the limit the check is refused: only the owner gives out the last of it. In
// owner replication a node takes the part the owner's last summary offered, once, or,
// with no summary of the window yet, a member's part of the limit only when the owner is
// silent (relay.go, awaitOwners), as each member does then. An owner that is only slow
// (a busy machine) or settling after a change is live and granting: a part taken beside
// its grants by every member new to the key would add up beyond the limit, so the check
// is refused instead (the answer, if it comes before the next flush, still raises the
// bound).
func (r *replicator) fallBack(k limiter.Key, a *ask, endMS int64, env shareEnv) bool {
	relayed := env.relay && !env.owned(k, r.lim) // another member owns k
	r.slots.planMu.Lock()
	if _, answered := r.asks.result(a); answered {
		// The answer came after the wait, before this: it decides (answer).
		r.slots.planMu.Unlock()
		return false
	}
	var took bool
	switch s, _ := r.lim.Lookup(k); {
	case !relayed:
		took = r.slots.takePart(k, endMS, env)
	case r.slots.known(k, a.sizeMS, endMS):
		took = r.slots.takeAggPart(k, a.sizeMS, endMS)
	case r.ownerSilent(k, env):
		c, ok := r.lim.CapIn(k, a.sizeMS, endMS)
		part := memberPart(s.Limit, env)
		took = ok && c < part && r.lim.RaiseCapTo(k, a.sizeMS, endMS, part)
	}
	r.slots.planMu.Unlock()
	if !took {
		if relayed {
			r.awaitAnswer(k, a.sizeMS, endMS, env.now)
		}
		return false
	}
	r.asks.mu.Lock()
	a.tookPart = true
	r.asks.mu.Unlock()
	r.asks.noteGranted(k)
	return true
}

// answer applies an owner's answer at now (this node's clock): the bound of the key
// rises by the grant if no flush has sent this node's value since the request's
// deadline (the owner holds the grant until then), and its value goes to every member
// with the next flush. An answer to a request still waited on ends it, after its
// deadline too (the check that asked, held up on a busy machine, has not given up on it
// yet); one to a request that timed out raises the bound for the checks that follow.
// It returns the request, whether it was applied and whether it came after the
// deadline.
func (r *replicator) answer(ans grantAnswer, now, intervalMS int64) (a *ask, applied, late bool) {
	b, ok := r.lim.LookupBucket(ans.bucket)
	if !ok {
		return nil, false, false
	}
	k := limiter.Key{Bucket: b, ID: ans.key}
	// Taken and applied under planMu, as a flush notes the requests whose deadline it is
	// past (asks.due, flush): a grant is applied before such a flush reads the bound it
	// sends, or not at all, since the owner lets go of the grant on that value.
	r.slots.planMu.Lock()
	a, late = r.asks.take(k, ans.id)
	if a == nil || a.endMS != ans.endMS {
		r.slots.planMu.Unlock()
		return a, false, late
	}
	if late || r.asks.flushedPast(a) {
		if !late || ans.grant == 0 {
			r.slots.planMu.Unlock()
			return a, false, true
		}
		applied = r.raiseByLocked(k, a, ans.grant, now, intervalMS)
		r.slots.planMu.Unlock()
		if applied {
			r.asks.noteGranted(k)
		}
		return a, applied, true
	}
	if ans.grant > 0 {
		applied = r.raiseByLocked(k, a, ans.grant, now, intervalMS)
	}
	// Noted under planMu: a check that gave up on the request takes no part of the free
	// room once it was answered (fallBack).
	r.asks.mu.Lock()
	a.answered = true
	if applied {
		a.grant = ans.grant
	}
	r.asks.mu.Unlock()
	r.slots.planMu.Unlock()
	zeroUntil := int64(0)
	if applied {
		r.asks.noteGranted(k)
	} else {
		zeroUntil = now + intervalMS
	}
	r.asks.end(k, a, zeroUntil)
	return a, applied, now > a.deadline
}

// raiseByLocked raises k's bound to the bound request a carried and grant: the owner
// holds that much for this node (the bound may have fallen meanwhile, by its own plan).
// It is kept from the summaries planned before the grant for raiseIntervals intervals.
// The caller holds planMu.
func (r *replicator) raiseByLocked(k limiter.Key, a *ask, grant uint32, now, intervalMS int64) bool {
	r.asks.mu.Lock()
	to := uint32(min(uint64(a.reqCap)+uint64(grant), math.MaxUint32-1))
	r.asks.mu.Unlock()
	if !r.lim.RaiseCapTo(k, a.sizeMS, a.endMS, to) {
		return false
	}
	r.asks.noteRaised(k, a, to, now, raiseIntervals*intervalMS)
	return true
}

// sortedNames returns names sorted (a membership's grant-capable members).
func sortedNames(names []string) []string {
	slices.Sort(names)
	return names
}
