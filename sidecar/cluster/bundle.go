package cluster

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Bundles: the requests for room a node makes of one member within askLinger of each
// other go in one packet, and the owner's answers to a bundle go back in one. At a
// window's start every key a node counts may need its owner at once (a fresh key of a
// small limit is bound at 0 on the members that do not own it), and a packet for each
// request was hundreds of packets in a few milliseconds, each through memberlist's
// queues and handler, so that answers missed the grants' wait.
//
// Sync bundles: in owner replication a flush has, for one member, its values of the keys
// the member owns, the member's summaries of the keys this node owns and counts relayed
// to it; they go in one packet (relay.go), so that a node's packets grow with the
// members it syncs with, not with the kinds of message it has for each.
//
//	bundle := kind(1 byte: bundleKind or syncBundleKind) count(uvarint) { length(uvarint) message }*count
//
// A bundle holds asks and answers only (grant.go), a sync bundle values (version 3),
// summaries and relayed counts only; each at least two messages and at most maxBundled.
// A node sends one only to members that announce featureBundle (featureSyncBundle) in
// the second byte of their metadata, so nodes of earlier releases never get them.
const (
	bundleKind     byte = 'U'
	syncBundleKind byte = 'P'
	// featureBundle, in the second byte of a member's metadata, says it reads bundles;
	// featureSyncBundle, sync bundles.
	featureBundle     byte = 8
	featureSyncBundle byte = 32
	// askLinger is how long a request for room waits for others to the same member
	// before its bundle goes.
	askLinger = time.Millisecond
	// maxBundled bounds the messages of a bundle.
	maxBundled = 64
)

// encodeBundle puts msgs (two or more) in one bundle of kind.
func encodeBundle(kind byte, msgs [][]byte) []byte {
	size := 1 + binary.MaxVarintLen64
	for _, m := range msgs {
		size += binary.MaxVarintLen64 + len(m)
	}
	b := make([]byte, 0, size)
	b = append(b, kind)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		b = binary.AppendUvarint(b, uint64(len(m)))
		b = append(b, m...)
	}
	return b
}

// decodeBundle returns the messages (slices of b) of a bundle of kind: asks and
// answers, or for a sync bundle values, summaries and relayed counts; each decoded by
// its own kind's decoder after.
func decodeBundle(kind byte, b []byte) ([][]byte, error) {
	if len(b) < 1 || b[0] != kind {
		return nil, errMalformed
	}
	r := reader{b: b[1:]}
	n := r.uvarint()
	if r.err != nil || n < 2 || n > maxBundled {
		return nil, errMalformed
	}
	msgs := make([][]byte, 0, n)
	for range n {
		size := r.uvarint()
		if r.err != nil || size == 0 || size > uint64(len(r.b)) {
			return nil, errMalformed
		}
		m := r.b[:size:size]
		r.b = r.b[size:]
		if !bundled(kind, m[0]) {
			return nil, errMalformed
		}
		msgs = append(msgs, m)
	}
	if len(r.b) != 0 {
		return nil, errMalformed
	}
	return msgs, nil
}

// bundled reports whether a bundle of kind may hold a message of kind m.
func bundled(kind, m byte) bool {
	if kind == syncBundleKind {
		return m == version3 || m == summaryKind || m == relayKind
	}
	return m == askKind || m == answerKind
}

// packBundles splits msgs into packets of at most about maxPacket bytes: a message
// alone as itself, two or more as a bundle of kind.
func packBundles(kind byte, msgs [][]byte) [][]byte {
	var out [][]byte
	for len(msgs) > 0 {
		n, size := 1, len(msgs[0])
		for n < len(msgs) && n < maxBundled && size+len(msgs[n])+2*binary.MaxVarintLen32 <= maxPacket {
			size += len(msgs[n]) + binary.MaxVarintLen32
			n++
		}
		if n == 1 {
			out = append(out, msgs[0])
		} else {
			out = append(out, encodeBundle(kind, msgs[:n]))
		}
		msgs = msgs[n:]
	}
	return out
}

// takesBundles reports whether a member's metadata announces bundles.
func takesBundles(meta []byte) bool { return len(meta) >= 2 && meta[1]&featureBundle != 0 }

// takesSyncBundles reports whether a member's metadata announces sync bundles.
func takesSyncBundles(meta []byte) bool {
	return len(meta) >= 2 && meta[1]&featureSyncBundle != 0
}

// outbox holds the requests for room waiting askLinger for others to the same member.
type outbox struct {
	mu     sync.Mutex
	queued map[string]*outgoing // by member name
}

type outgoing struct {
	node memberlist.Node
	msgs [][]byte
}

// sendAsk sends a request for room to n: with the others to n made within askLinger,
// when n reads bundles, or else alone at once.
func (c *Cluster) sendAsk(n *memberlist.Node, msg []byte) bool {
	if !takesBundles(n.Meta) {
		return c.send(n, kindAsk, msg)
	}
	o := &c.asksOut
	o.mu.Lock()
	q := o.queued[n.Name]
	if q == nil {
		if o.queued == nil {
			o.queued = map[string]*outgoing{}
		}
		q = &outgoing{node: *n}
		o.queued[n.Name] = q
		time.AfterFunc(askLinger, func() { c.flushAsks(q) })
	}
	q.msgs = append(q.msgs, msg)
	full := len(q.msgs) >= maxBundled
	if full {
		delete(o.queued, n.Name)
	}
	o.mu.Unlock()
	if full {
		c.sendBundled(&q.node, kindAsk, q.msgs)
	}
	return true
}

// flushAsks sends the requests of q, unless they went already (a full bundle).
func (c *Cluster) flushAsks(q *outgoing) {
	o := &c.asksOut
	o.mu.Lock()
	if o.queued[q.node.Name] != q {
		o.mu.Unlock()
		return
	}
	delete(o.queued, q.node.Name)
	o.mu.Unlock()
	c.sendBundled(&q.node, kindAsk, q.msgs)
}

// sendBundled sends msgs (of one kind) to n in as few packets as they fit.
// Alone, each, to a member that does not read bundles.
func (c *Cluster) sendBundled(n *memberlist.Node, kind string, msgs [][]byte) {
	if !takesBundles(n.Meta) {
		for _, m := range msgs {
			c.send(n, kind, m)
		}
		return
	}
	for _, p := range packBundles(bundleKind, msgs) {
		if p[0] == bundleKind {
			c.send(n, kindBundle, p)
		} else {
			c.send(n, kind, p)
		}
	}
}

// receiveBundle handles a bundle's asks and answers, and answers the asks of each asker
// in one bundle.
func (c *Cluster) receiveBundle(b []byte) {
	msgs, err := decodeBundle(bundleKind, b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	var to []*outgoing
	for _, m := range msgs {
		if m[0] == answerKind {
			c.receiveAnswer(m)
			continue
		}
		n, ans, ok := c.answerAsk(m)
		if !ok {
			continue
		}
		i := 0
		for i < len(to) && to[i].node.Name != n.Name {
			i++
		}
		if i == len(to) {
			to = append(to, &outgoing{node: n})
		}
		to[i].msgs = append(to[i].msgs, ans)
	}
	for _, q := range to {
		c.sendBundled(&q.node, kindAnswer, q.msgs)
	}
}
