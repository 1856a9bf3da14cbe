package authzload

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/converger/edge/bench/cputime"
	"github.com/converger/edge/bench/rawcheck"
)

// target is a server under load with the client that calls it. sent is the number of
// requests sent to it so far, across phases: it is the target's position in the mix.
type target struct {
	name   string
	addr   string
	proc   process
	client caller
	sent   atomic.Uint64
	// deniedKeys marks the keys that got a 429 at least once, in any phase.
	deniedKeys []bool
}

func (t *target) close() {
	if t.client != nil {
		t.client.close()
	}
}

// process is a target's process: its CPU time is measured, and a phase fails when it
// has exited. *procs.Proc and *proxyserver.Proxy are processes.
type process interface {
	Pid() int
	Exited() error
}

// verdict is what the load generator reads of an answer.
type verdict uint8

const (
	allowed     verdict = iota
	rateLimited         // 429
	rejected            // another denial: a credential the sidecar refused
)

// caller sends the request at a position of the mix, for one of the closed loops, and
// reads the verdict of the answer: over gRPC (Check) or HTTP (forward-auth).
type caller interface {
	call(ctx context.Context, worker, pos int) (verdict, error)
	close()
}

// grpcCaller sends pre-marshaled CheckRequests over a few connections, round robin by
// worker.
type grpcCaller struct {
	conns   []*grpc.ClientConn
	reqs    []rawcheck.Request
	replies []rawcheck.Reply // by worker
}

// dialGRPC opens n connections to addr and waits until all are ready.
func dialGRPC(ctx context.Context, addr string, n, workers int, m *Mix) (*grpcCaller, error) {
	conns, err := rawcheck.Dial(ctx, addr, n)
	if err != nil {
		return nil, err
	}
	c := &grpcCaller{conns: conns, reqs: make([]rawcheck.Request, m.Len()), replies: make([]rawcheck.Reply, workers)}
	for i := range c.reqs {
		c.reqs[i] = rawcheck.Request{B: m.Bytes(i)}
	}
	return c, nil
}

func (c *grpcCaller) call(ctx context.Context, worker, pos int) (verdict, error) {
	reply := &c.replies[worker]
	if err := c.conns[worker%len(c.conns)].Invoke(ctx, rawcheck.Method, &c.reqs[pos], reply); err != nil {
		return 0, err
	}
	switch {
	case reply.RateLimited():
		return rateLimited, nil
	case !reply.Allowed():
		return rejected, nil
	}
	return allowed, nil
}

func (c *grpcCaller) close() { rawcheck.Close(c.conns) }

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
}

// runner runs phases: Concurrency closed loops over a target's client.
type runner struct {
	mix       *Mix
	workers   []worker
	perWorker int
	all       []time.Duration
}

func newRunner(m *Mix, concurrency, maxRequests int) *runner {
	r := &runner{mix: m, workers: make([]worker, concurrency)}
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
	tcpu0, terr0 := cputime.Process(t.proc.Pid())
	gcpu0, gerr0 := cputime.Self()
	mcpu0, merr0 := cputime.Machine()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range r.workers {
		wg.Go(func() { r.loop(ctx, t, i, deadline, measured) })
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
	tcpu1, terr1 := cputime.Process(t.proc.Pid())
	gcpu1, gerr1 := cputime.Self()
	mcpu1, merr1 := cputime.Machine()
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
func (r *runner) loop(ctx context.Context, t *target, i int, deadline time.Time, measured bool) {
	w := &r.workers[i]
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
		v, err := t.client.call(ctx, i, pos)
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
		case v == rateLimited:
			denied = true
			w.deniedKey[r.mix.Key(pos)] = true
		case v == rejected:
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
