package cluster

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/converger/edge/sidecar/limiter"
)

// The wire format of cluster messages. Every value is a counter slot: one origin's own
// count of one key in one window. Values are state, never increments, so a message that
// is lost, repeated or reordered cannot make anyone count twice.
//
//	message := version(1 byte) sentAt(varint, Unix ms) origin(string) n(uvarint) value{n}
//	value   := bucket(string) id(string) sizeMS(uvarint) endMS(varint, minus sentAt) count(uvarint)
//	           [version 2: refused(uvarint) cap(uvarint, bound + 1; 0: none) limit(uvarint)]
//	string  := length(uvarint) bytes
//	state   := (length(uvarint) message)*
//
// A sync message carries the sender's own slots that changed; a state transfer (on join
// and on memberlist's periodic push/pull) carries every slot the sender knows, one
// message per origin. Version 2 adds to each of the sender's own values what share mode
// needs of it (share.go): the hits its bound refused, the bound, and the limit. A node
// sends version 2 only to members that announce it (their memberlist metadata), and state
// transfers in version 1, so that nodes of the previous release keep merging counts
// during a rolling upgrade. Version 3 (compress.go) is version 2 compressed, sent to the
// members that announce 3.
const (
	version1 byte = 1
	version2 byte = 2
	// version3 is version 2 compressed (compress.go).
	version3 byte = 3
	// version is the newest version this node speaks, announced in its metadata.
	version = version3
)

// Bounds of what a message may hold: a malformed or hostile message is rejected whole.
const (
	maxString   = 512
	maxValues   = 1 << 22
	maxWindowMS = uint64(limiter.MaxWindow / time.Millisecond)
)

// value is one slot as it travels.
type value struct {
	bucket, id string
	sizeMS     int64
	endMS      int64
	count      uint32
	// share is set on values of version 2, which carry the rest: the hits the sender's
	// share-mode bound refused in the window, the bound (when capped) and the limit the
	// sender last counted with (0: none).
	share   bool
	refused uint32
	cap     uint32
	capped  bool
	limit   uint32
}

type message struct {
	version byte
	sentAt  int64
	origin  string
	values  []value
}

// packer encodes one origin's values into messages of at most limit bytes.
type packer struct {
	version byte
	sentAt  int64
	origin  string
	limit   int
	out     [][]byte
	body    []byte // values of the message being filled
	n       int
	tmp     []byte
	counts  []int // values in each message out
}

// newPacker returns a packer of version 1 messages; newPacker2 of version 2.
func newPacker(sentAt int64, origin string, limit int) *packer {
	return &packer{version: version1, sentAt: sentAt, origin: origin, limit: limit}
}

func newPacker2(sentAt int64, origin string, limit int) *packer {
	return &packer{version: version2, sentAt: sentAt, origin: origin, limit: limit}
}

func (p *packer) header(n int) []byte {
	h := []byte{p.version}
	h = binary.AppendVarint(h, p.sentAt)
	h = appendString(h, p.origin)
	return binary.AppendUvarint(h, uint64(n))
}

// add appends v, closing the current message first when v would not fit in it.
func (p *packer) add(v value) {
	p.tmp = appendString(p.tmp[:0], v.bucket)
	p.tmp = appendString(p.tmp, v.id)
	p.tmp = binary.AppendUvarint(p.tmp, uint64(v.sizeMS))
	p.tmp = binary.AppendVarint(p.tmp, v.endMS-p.sentAt)
	p.tmp = binary.AppendUvarint(p.tmp, uint64(v.count))
	if p.version >= version2 {
		capWord := uint64(0)
		if v.capped {
			capWord = uint64(v.cap) + 1
		}
		p.tmp = binary.AppendUvarint(p.tmp, uint64(v.refused))
		p.tmp = binary.AppendUvarint(p.tmp, capWord)
		p.tmp = binary.AppendUvarint(p.tmp, uint64(v.limit))
	}
	if p.n > 0 && len(p.header(p.n+1))+len(p.body)+len(p.tmp) > p.limit {
		p.close()
	}
	p.body = append(p.body, p.tmp...)
	p.n++
}

func (p *packer) close() {
	if p.n == 0 {
		return
	}
	p.out = append(p.out, append(p.header(p.n), p.body...))
	p.counts = append(p.counts, p.n)
	p.body, p.n = nil, 0
}

// messages returns the encoded messages.
func (p *packer) messages() [][]byte {
	p.close()
	return p.out
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendState frames messages into a state transfer.
func appendState(state []byte, msgs ...[]byte) []byte {
	for _, m := range msgs {
		state = binary.AppendUvarint(state, uint64(len(m)))
		state = append(state, m...)
	}
	return state
}

var errMalformed = errors.New("malformed cluster message")

// decodeState splits a state transfer into its messages.
func decodeState(b []byte) ([]message, error) {
	var out []message
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, errMalformed
		}
		m, err := decode(b[k : k+int(n)])
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		b = b[k+int(n):]
	}
	return out, nil
}

// decode parses a message; the strings it returns are copies.
func decode(b []byte) (message, error) {
	var m message
	if len(b) > 0 && b[0] == version3 {
		inner, err := inflate3(b[1:])
		if err != nil {
			return m, err
		}
		m, err = decode(inner)
		m.version = version3
		return m, err
	}
	if len(b) < 1 || (b[0] != version1 && b[0] != version2) {
		return m, errMalformed
	}
	m.version = b[0]
	v2 := m.version == version2
	r := reader{b: b[1:]}
	m.sentAt = r.varint()
	m.origin = r.string()
	n := r.uvarint()
	if r.err != nil || m.origin == "" || n > maxValues || n > uint64(len(r.b)) {
		return m, errMalformed
	}
	m.values = make([]value, 0, n)
	for range n {
		v := value{bucket: r.string(), id: r.string()}
		size := r.uvarint()
		v.endMS = m.sentAt + r.varint()
		count := r.uvarint()
		if r.err != nil || size == 0 || size > maxWindowMS || count > 1<<32-1 {
			return m, errMalformed
		}
		v.sizeMS, v.count = int64(size), uint32(count)
		if v2 {
			refused, capWord, limit := r.uvarint(), r.uvarint(), r.uvarint()
			if r.err != nil || refused > 1<<32-1 || capWord > 1<<32 || limit > 1<<32-1 {
				return m, errMalformed
			}
			v.share, v.refused, v.limit = true, uint32(refused), uint32(limit)
			if capWord > 0 {
				v.cap, v.capped = uint32(capWord-1), true
			}
		}
		m.values = append(m.values, v)
	}
	if r.err != nil || len(r.b) != 0 {
		return m, errMalformed
	}
	return m, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errMalformed
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errMalformed
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string {
	n := r.uvarint()
	if r.err != nil || n > maxString || n > uint64(len(r.b)) {
		r.err = errMalformed
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
