package clusterload

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/bench/rawcheck"
)

// The route the load uses: counted per client IP in the token_create bucket.
const (
	loadMethod = "POST"
	loadPath   = "/api/v1/tokens"
	loadBucket = "token_create"
)

// clientIP returns the i-th client address, from 198.18.0.0/15 (the benchmarking range).
func clientIP(i int) string {
	n := uint32(198)<<24 | uint32(18)<<16 + uint32(i%(1<<17-2)) + 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}).String()
}

// checkRequest returns a marshaled CheckRequest for POST /api/v1/tokens from ip, as Envoy
// sends it without a proxy in front: the source address is the client.
func checkRequest(ip string, id int) ([]byte, error) {
	sock := func(addr string, port uint32) *corev3.Address {
		return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}}}
	}
	rid := "bench-cluster-" + strconv.Itoa(id)
	return proto.Marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: sock(ip, 40000+uint32(id%20000))},
		Destination: &authv3.AttributeContext_Peer{Address: sock("127.0.0.1", 10000)},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id:     rid,
			Method: loadMethod,
			Path:   loadPath,
			Host:   "api.example",
			Scheme: "https",
			Headers: map[string]string{
				":method": loadMethod, ":path": loadPath, ":authority": "api.example", ":scheme": "https",
				"content-type": "application/json", "content-length": "64", "x-request-id": rid,
				"user-agent": "bench-cluster",
			},
			Protocol: "HTTP/1.1",
			Size:     64,
		}},
	}})
}

// loadSpec is one paced load: rate checks per second in total, spread evenly over the
// sending nodes, over keys client IPs used in turn, from start until end. A burst load
// sends, at the start of each window of windowMS, rate × window checks in total, each
// sender its part as fast as it goes.
type loadSpec struct {
	rate     float64
	senders  []int // indices of the nodes that get checks
	keys     int
	keyBase  int // index of the first client IP, so that loads on one cluster use distinct keys
	start    time.Time
	end      time.Time
	burst    bool
	windowMS int64
}

// maxInFlight bounds the checks waiting for an answer, per node: past it the pacer waits,
// and the checks go out late (counted).
const maxInFlight = 512

// lateAfter is how late a check may go out before it counts as late.
const lateAfter = 5 * time.Millisecond

// loadResult is what a load did.
type loadResult struct {
	sends    []Send
	late     int           // checks sent more than lateAfter after their time
	maxLate  time.Duration // the latest one
	errors   int           // gRPC errors
	firstErr error
}

// schedule returns, for sender s of n, the offsets from the start of its checks: every
// n/rate, the senders shifted by 1/rate from each other, so that the checks of all the
// senders together are evenly spaced; only those before d.
func schedule(rate float64, s, n int, d time.Duration) []time.Duration {
	if rate <= 0 || n <= 0 {
		return nil
	}
	step := float64(time.Second) * float64(n) / rate
	first := float64(time.Second) * float64(s) / rate
	var out []time.Duration
	for k := 0; ; k++ {
		at := time.Duration(first + float64(k)*step)
		if at >= d {
			return out
		}
		out = append(out, at)
	}
}

// keyOf is the key of sender s's k-th check, of n senders and keys keys: each sender
// goes through every key in turn, from its own part of them, so that every node checks
// every key whatever n and keys are (in turn over all the senders together, a sender
// would see only the keys of its residue modulo their greatest common divisor: at 20
// nodes and 20 keys, one node per key).
func keyOf(k, s, n, keys int) int {
	return (k + s*keys/max(n, 1)) % keys
}

// burstSchedule returns, for sender s of n, the offsets from start of its checks when
// rate × window checks go out at the start of every window of windowMS that begins in
// [start, start + d): its part (the odd checks to the first senders), all at the
// window's start.
func burstSchedule(rate float64, s, n int, start time.Time, d time.Duration, windowMS int64) []time.Duration {
	if rate <= 0 || n <= 0 || windowMS <= 0 {
		return nil
	}
	total := int(math.Round(rate * float64(windowMS) / 1000))
	part := total / n
	if s < total%n {
		part++
	}
	var out []time.Duration
	ms := start.UnixMilli()
	for w := (ms + windowMS - 1) / windowMS * windowMS; w < ms+d.Milliseconds(); w += windowMS {
		at := time.UnixMilli(w).Sub(start)
		for range part {
			out = append(out, at)
		}
	}
	return out
}

// run drives the cluster with the load. Each check is sent on time, whatever the answers
// to earlier ones (an open loop), and answered within 2 seconds or counted as an error.
func (l loadSpec) run(ctx context.Context, c *cluster) (*loadResult, error) {
	reqs := make([]rawcheck.Request, l.keys)
	for k := range reqs {
		b, err := checkRequest(clientIP(l.keyBase+k), l.keyBase+k)
		if err != nil {
			return nil, err
		}
		reqs[k] = rawcheck.Request{B: b}
	}
	d := l.end.Sub(l.start)
	plans := make([][]time.Duration, len(l.senders))
	total := 0
	for s := range l.senders {
		if l.burst {
			plans[s] = burstSchedule(l.rate, s, len(l.senders), l.start, d, l.windowMS)
		} else {
			plans[s] = schedule(l.rate, s, len(l.senders), d)
		}
		total += len(plans[s])
	}
	res := &loadResult{sends: make([]Send, total)}
	ctx, cancel := context.WithDeadline(ctx, l.end.Add(3*time.Second))
	defer cancel()

	var mu sync.Mutex // guards res's counters
	var wg sync.WaitGroup
	base := 0
	for s, ni := range l.senders {
		conn := c.nodes[ni].conn
		plan := plans[s]
		sends := res.sends[base : base+len(plan)]
		base += len(plan)
		wg.Go(func() {
			sem := make(chan struct{}, maxInFlight)
			var calls sync.WaitGroup
			late, maxLate := 0, time.Duration(0)
			for k, off := range plan {
				at := l.start.Add(off)
				if w := time.Until(at); w > 0 {
					select {
					case <-time.After(w):
					case <-ctx.Done():
					}
				}
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
				}
				if ctx.Err() != nil {
					break
				}
				now := time.Now()
				lag := now.Sub(at)
				isLate := lag > lateAfter && !l.burst // a burst goes as fast as it can
				if isLate {
					late++
					maxLate = max(maxLate, lag)
				}
				key := keyOf(k, s, len(l.senders), l.keys)
				sends[k] = Send{AtNS: now.UnixNano(), Node: uint8(ni), Late: isLate}
				calls.Go(func() {
					defer func() { <-sem }()
					cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					defer cancel()
					var reply rawcheck.Reply
					err := conn.Invoke(cctx, rawcheck.Method, &reqs[key], &reply)
					sends[k].DoneNS = time.Now().UnixNano()
					switch {
					case err != nil:
						sends[k].Outcome = Other
						mu.Lock()
						res.errors++
						if res.firstErr == nil {
							res.firstErr = err
						}
						mu.Unlock()
					case reply.Allowed():
						sends[k].Outcome = Allowed
					case reply.RateLimited():
						sends[k].Outcome = RateLimited
					default:
						sends[k].Outcome = Other
					}
				})
			}
			calls.Wait()
			mu.Lock()
			res.late += late
			res.maxLate = max(res.maxLate, maxLate)
			mu.Unlock()
		})
	}
	wg.Wait()
	// Checks never sent (the run was interrupted) have no time: drop them.
	kept := res.sends[:0]
	for _, s := range res.sends {
		if s.AtNS != 0 {
			kept = append(kept, s)
		}
	}
	res.sends = kept
	if err := ctx.Err(); err != nil && time.Now().Before(l.end) {
		return res, fmt.Errorf("interrupted: %w", err)
	}
	return res, nil
}
