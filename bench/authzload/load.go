package authzload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// checkMethod is the full name of Authorization/Check.
const checkMethod = "/envoy.service.auth.v3.Authorization/Check"

// rawRequest is a pre-marshaled CheckRequest.
type rawRequest struct{ b []byte }

// checkReply is what the load test reads of a CheckResponse.
type checkReply struct {
	code int32 // status.code: 0 allows
	http int32 // denied_response.status.code, 0 when absent
}

// rawCodec sends pre-marshaled requests as they are and decodes only the two status codes
// of the reply, so that the generator costs the same, and little, for both targets. Its
// name is "proto": on the wire nothing distinguishes it from the proto codec.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*rawRequest)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(r.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*checkReply)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	if len(data) == 1 {
		return r.parse(data[0].ReadOnlyData())
	}
	return r.parse(data.Materialize())
}

var errMalformed = errors.New("malformed CheckResponse")

// parse reads CheckResponse.status.code (fields 1.1) and
// CheckResponse.denied_response.status.code (fields 2.1.1).
func (r *checkReply) parse(b []byte) error {
	*r = checkReply{}
	status, ok := field(b, 1)
	if !ok {
		return errMalformed
	}
	if status != nil {
		code, ok := varintField(status, 1)
		if !ok {
			return errMalformed
		}
		r.code = int32(code)
	}
	denied, ok := field(b, 2)
	if !ok {
		return errMalformed
	}
	if denied != nil {
		st, ok := field(denied, 1)
		if !ok {
			return errMalformed
		}
		code, ok := varintField(st, 1)
		if !ok {
			return errMalformed
		}
		r.http = int32(code)
	}
	return nil
}

// field returns the last occurrence of the length-delimited field num of message b (nil
// when absent); ok is false when b is malformed.
func field(b []byte, num protowire.Number) (v []byte, ok bool) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, false
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			x, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return nil, false
			}
			v = x
			if v == nil {
				v = []byte{}
			}
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return nil, false
		}
		b = b[l:]
	}
	return v, true
}

// varintField returns the varint field num of message b, 0 when absent.
func varintField(b []byte, num protowire.Number) (v uint64, ok bool) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return 0, false
		}
		b = b[l:]
		if n == num && typ == protowire.VarintType {
			x, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return 0, false
			}
			v, b = x, b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return 0, false
		}
		b = b[l:]
	}
	return v, true
}

// target is a server under load with its connections. sent is the number of requests sent
// to it so far, across phases: it is the target's position in the mix.
type target struct {
	name  string
	addr  string
	proc  *proc
	conns []*grpc.ClientConn
	sent  atomic.Uint64
	// deniedKeys marks the keys that got a 429 at least once, in any phase.
	deniedKeys []bool
}

// dial opens n connections to the target and waits until all are ready.
func (t *target) dial(ctx context.Context, n int) error {
	for range n {
		c, err := grpc.NewClient(t.addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		t.conns = append(t.conns, c)
		c.Connect()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, c := range t.conns {
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				return fmt.Errorf("%s: connection not ready (%v): %w", t.name, s, ctx.Err())
			}
		}
	}
	return nil
}

func (t *target) close() {
	for _, c := range t.conns {
		c.Close()
	}
}

// PhaseResult is the outcome of one measured phase of one target.
type PhaseResult struct {
	Target   string
	Round    int // from 1
	Requests int
	Elapsed  time.Duration
	RPS      float64
	P50, P90 time.Duration
	P99      time.Duration
	P999     time.Duration
	Max      time.Duration
	Errors   int
	FirstErr string
	// Denied got a 429 (rate limited); Rejected another denial (401, 403, 400: a
	// credential the sidecar refused — none are expected).
	Denied, Rejected int
	// Capped is true when the phase stopped at -max-requests rather than at its duration.
	Capped bool
	// ByClass counts requests and 429s per request class.
	ByClass [numClasses]ClassCount
	// TargetCPU and GenCPU are the CPU time (user + system) of the target's process and of
	// the load generator during the phase, per request: on a machine the two share, what
	// the target costs per check decides its throughput. Zero when unknown.
	TargetCPU, GenCPU time.Duration
	// OtherLoad is the CPU the rest of the machine used during the phase, in CPUs (1 is
	// one CPU busy all along): other processes on a shared machine, and the kernel work
	// not charged to a process. -1 when unknown.
	OtherLoad float64
}

// ClassCount counts the requests of a class and their 429s.
type ClassCount struct{ Requests, Denied int }

// worker is one closed loop's state; latencies go to a slice allocated once.
type worker struct {
	lat       []time.Duration
	n         int
	errors    int
	firstErr  error
	denied    int
	rejected  int
	byClass   [numClasses]ClassCount
	deniedKey []bool // by key index: got a 429 in this phase
	end       time.Time
	reply     checkReply
}

// runner runs phases: Concurrency closed loops over a target's connections, round robin.
type runner struct {
	mix       *Mix
	reqs      []rawRequest
	workers   []worker
	perWorker int
	all       []time.Duration
}

func newRunner(m *Mix, concurrency, maxRequests int) *runner {
	r := &runner{mix: m, reqs: make([]rawRequest, m.Len()), workers: make([]worker, concurrency)}
	for i := range r.reqs {
		r.reqs[i] = rawRequest{m.Bytes(i)}
	}
	r.perWorker = (maxRequests + concurrency - 1) / concurrency
	for i := range r.workers {
		r.workers[i].lat = make([]time.Duration, 0, r.perWorker)
		r.workers[i].deniedKey = make([]bool, len(m.Pop.Keys))
	}
	r.all = make([]time.Duration, 0, r.perWorker*concurrency)
	return r
}

// phase drives the target for d. Unmeasured phases (warm-up) keep no latencies.
func (r *runner) phase(ctx context.Context, t *target, d time.Duration, measured bool) PhaseResult {
	tcpu0, terr0 := processCPU(t.proc.cmd.Process.Pid)
	gcpu0, gerr0 := selfCPU()
	mcpu0, merr0 := machineCPU()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range r.workers {
		w := &r.workers[i]
		conn := t.conns[i%len(t.conns)]
		wg.Go(func() { r.loop(ctx, t, conn, w, deadline, measured) })
	}
	wg.Wait()

	res := PhaseResult{Target: t.name}
	end := start
	r.all = r.all[:0]
	for i := range r.workers {
		w := &r.workers[i]
		if w.end.After(end) {
			end = w.end
		}
		res.Requests += w.n
		res.Errors += w.errors
		if w.firstErr != nil && res.FirstErr == "" {
			res.FirstErr = w.firstErr.Error()
		}
		res.Denied += w.denied
		res.Rejected += w.rejected
		res.Capped = res.Capped || w.n >= r.perWorker
		for c := range res.ByClass {
			res.ByClass[c].Requests += w.byClass[c].Requests
			res.ByClass[c].Denied += w.byClass[c].Denied
		}
		for k, d := range w.deniedKey {
			if d {
				t.deniedKeys[k] = true
				w.deniedKey[k] = false
			}
		}
		r.all = append(r.all, w.lat...)
	}
	res.Elapsed = end.Sub(start)
	if res.Elapsed > 0 {
		res.RPS = float64(res.Requests) / res.Elapsed.Seconds()
	}
	tcpu1, terr1 := processCPU(t.proc.cmd.Process.Pid)
	gcpu1, gerr1 := selfCPU()
	mcpu1, merr1 := machineCPU()
	if res.Requests > 0 && terr0 == nil && terr1 == nil {
		res.TargetCPU = (tcpu1 - tcpu0) / time.Duration(res.Requests)
	}
	if res.Requests > 0 && gerr0 == nil && gerr1 == nil {
		res.GenCPU = (gcpu1 - gcpu0) / time.Duration(res.Requests)
	}
	res.OtherLoad = -1
	if terr0 == nil && terr1 == nil && gerr0 == nil && gerr1 == nil && merr0 == nil && merr1 == nil && res.Elapsed > 0 {
		other := (mcpu1 - mcpu0) - (tcpu1 - tcpu0) - (gcpu1 - gcpu0)
		res.OtherLoad = max(0, other.Seconds()/res.Elapsed.Seconds())
	}
	slices.Sort(r.all)
	res.P50 = Percentile(r.all, 0.50)
	res.P90 = Percentile(r.all, 0.90)
	res.P99 = Percentile(r.all, 0.99)
	res.P999 = Percentile(r.all, 0.999)
	res.Max = Percentile(r.all, 1)
	return res
}

// loop is one closed loop: send, wait for the answer, record, repeat, until the deadline,
// perWorker requests, or ctx ends.
func (r *runner) loop(ctx context.Context, t *target, conn *grpc.ClientConn, w *worker, deadline time.Time, measured bool) {
	*w = worker{lat: w.lat[:0], deniedKey: w.deniedKey}
	done := ctx.Done()
	for w.n < r.perWorker {
		select {
		case <-done:
			w.end = time.Now()
			return
		default:
		}
		begin := time.Now()
		if !begin.Before(deadline) {
			break
		}
		pos := r.mix.Position(t.sent.Add(1) - 1)
		err := conn.Invoke(ctx, checkMethod, &r.reqs[pos], &w.reply)
		lat := time.Since(begin)
		w.n++
		c := r.mix.Class(pos)
		denied := false
		switch {
		case err != nil:
			if ctx.Err() != nil {
				w.n--
				continue
			}
			w.errors++
			if w.firstErr == nil {
				w.firstErr = err
			}
		case w.reply.code != 0 && w.reply.http == 429:
			denied = true
			w.deniedKey[r.mix.Key(pos)] = true
		case w.reply.code != 0:
			w.rejected++
		}
		if !measured {
			continue
		}
		w.lat = append(w.lat, lat)
		w.byClass[c].Requests++
		if denied {
			w.denied++
			w.byClass[c].Denied++
		}
	}
	w.end = time.Now()
}
