package rlsload

import (
	"errors"
	"fmt"
	"math/rand/v2"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/bench/rawcheck"
)

// Method is the full name of RateLimitService/ShouldRateLimit.
const Method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// Domain and Rules are the sidecar's rules in the load test: per client address (a
// second's window) and per route and client address (a minute's), both far above what a
// client sends, as Envoy's remote_address and a path-and-address rate limit send them; and
// a limit of one an hour for the over-limit scenario's addresses.
const (
	Domain = "bench"
	Rules  = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: path
    value: /api/*
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 4000000000}
  - key: blocked_address
    rate_limit: {unit: hour, requests_per_unit: 1}
`
)

// A scenario is one request sequence.
type scenario struct {
	Name, Summary string
}

var scenarios = []scenario{
	{"hot", "one client address in every request: one hot counter per rule"},
	{"keys", "client addresses in a shuffled round robin: a counter per address and rule"},
	{"over", "client addresses over their limit: every request after an address's first is OVER_LIMIT"},
}

// Workload is one scenario's pre-marshaled requests: a prologue that sends every key once,
// then a body, a shuffled order of the keys, that repeats.
type Workload struct {
	Prologue int
	keys     int
	data     []byte
	off      []int
	key      []int32
}

// BuildWorkload builds the requests of a scenario with n keys (1 for hot).
func BuildWorkload(name string, n int, seed uint64) (*Workload, error) {
	if name == "hot" {
		n = 1
	}
	rng := rand.New(rand.NewPCG(seed, 0x715))
	w := &Workload{Prologue: n, keys: n, off: []int{0}}
	add := func(k int) error {
		var err error
		w.data, err = proto.MarshalOptions{}.MarshalAppend(w.data, request(name, k))
		if err != nil {
			return err
		}
		w.off = append(w.off, len(w.data))
		w.key = append(w.key, int32(k))
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
	return w, nil
}

// address is the client address of key k: 10.0.0.0/8 for many keys, 172.16.0.0/12 for
// those over their limit, so that the scenarios' counters never meet.
func address(name string, k int) string {
	switch name {
	case "over":
		return fmt.Sprintf("172.16.%d.%d", k/250, k%250+1)
	case "keys":
		return fmt.Sprintf("10.%d.%d.%d", k/62500, k/250%250, k%250+1)
	}
	return "192.0.2.1"
}

// request is what Envoy sends for a request of client k: its address, and its route and
// address (the over-limit scenario limits its address to one an hour).
func request(name string, k int) *rlsv3.RateLimitRequest {
	ip := address(name, k)
	first := "remote_address"
	if name == "over" {
		first = "blocked_address"
	}
	entry := func(k, v string) *rlv3.RateLimitDescriptor_Entry {
		return &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	return &rlsv3.RateLimitRequest{Domain: Domain, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{entry(first, ip)}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("path", fmt.Sprintf("/api/v1/conversations/%d/activities", k%97)), entry("remote_address", ip)}},
	}}
}

// Len is the number of pre-built requests.
func (w *Workload) Len() int { return len(w.key) }

// Position returns the position of the i-th request sent: the prologue once, then the
// body over and over.
func (w *Workload) Position(i uint64) int {
	if i < uint64(w.Prologue) {
		return int(i)
	}
	return w.Prologue + int((i-uint64(w.Prologue))%uint64(w.Len()-w.Prologue))
}

// Bytes returns the marshaled request at a position.
func (w *Workload) Bytes(pos int) []byte { return w.data[w.off[pos]:w.off[pos+1]:w.off[pos+1]] }

// Class is 0: a scenario is one class of requests.
func (*Workload) Class(int) int { return 0 }

// Classes is 1.
func (*Workload) Classes() int { return 1 }

// Key returns the key of the request at a position.
func (w *Workload) Key(pos int) int { return int(w.key[pos]) }

// Keys returns the number of keys.
func (w *Workload) Keys() int { return w.keys }

var errMalformed = errors.New("malformed RateLimitResponse")

// Reply is what the load generator reads of a RateLimitResponse: its overall code.
type Reply struct{ Code rlsv3.RateLimitResponse_Code }

// Parse reads RateLimitResponse.overall_code (field 1).
func (r *Reply) Parse(b []byte) error {
	code, ok := rawcheck.VarintField(b, protowire.Number(1))
	if !ok {
		return errMalformed
	}
	r.Code = rlsv3.RateLimitResponse_Code(code)
	return nil
}

// Allowed reports OK.
func (r *Reply) Allowed() bool { return r.Code == rlsv3.RateLimitResponse_OK }

// RateLimited reports OVER_LIMIT.
func (r *Reply) RateLimited() bool { return r.Code == rlsv3.RateLimitResponse_OVER_LIMIT }
