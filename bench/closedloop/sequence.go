package closedloop

import "math/rand/v2"

// Sequence is a workload of one request per key, pre-marshaled: a prologue that sends
// every key once (so that the warm-up sees every key), then a body, the keys in a
// shuffled order, that repeats. Its requests are of one class.
type Sequence struct {
	Prologue int
	keys     int
	data     []byte
	off      []int
	key      []int32
}

// NewSequence builds the sequence of keys 0 to n-1, request(k) being key k's request
// (asked for twice: prologue and body); seed shuffles the body.
func NewSequence(n int, seed uint64, request func(key int) ([]byte, error)) (*Sequence, error) {
	rng := rand.New(rand.NewPCG(seed, 0x715))
	s := &Sequence{Prologue: n, keys: n, off: []int{0}}
	add := func(k int) error {
		b, err := request(k)
		if err != nil {
			return err
		}
		s.data = append(s.data, b...)
		s.off = append(s.off, len(s.data))
		s.key = append(s.key, int32(k))
		return nil
	}
	for k := range n {
		if err := add(k); err != nil {
			return nil, err
		}
	}
	for _, k := range rng.Perm(n) {
		if err := add(k); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Len is the number of pre-built requests.
func (s *Sequence) Len() int { return len(s.key) }

// Position returns the position of the i-th request sent: the prologue once, then the
// body over and over.
func (s *Sequence) Position(i uint64) int {
	if i < uint64(s.Prologue) {
		return int(i)
	}
	return s.Prologue + int((i-uint64(s.Prologue))%uint64(s.Len()-s.Prologue))
}

// Bytes returns the marshaled request at a position.
func (s *Sequence) Bytes(pos int) []byte { return s.data[s.off[pos]:s.off[pos+1]:s.off[pos+1]] }

// Class is 0: a sequence is one class of requests.
func (*Sequence) Class(int) int { return 0 }

// Classes is 1.
func (*Sequence) Classes() int { return 1 }

// Key returns the key of the request at a position.
func (s *Sequence) Key(pos int) int { return int(s.key[pos]) }

// Keys returns the number of keys.
func (s *Sequence) Keys() int { return s.keys }
