package authzload

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/converger/edge/bench/cputime"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/rawcheck"
)

// target is a server under load with its connections. sent is the number of requests sent
// to it so far, across phases: it is the target's position in the mix.
type target struct {
	name  string
	addr  string
	proc  *procs.Proc
	conns []*grpc.ClientConn
	sent  atomic.Uint64
	// deniedKeys marks the keys that got a 429 at least once, in any phase.
	deniedKeys []bool
}

// dial opens n connections to the target and waits until all are ready.
func (t *target) dial(ctx context.Context, n int) error {
	conns, err := rawcheck.Dial(ctx, t.addr, n)
	if err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	t.conns = conns
	return nil
}

func (t *target) close() { rawcheck.Close(t.conns) }

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
	reply     rawcheck.Reply
}

// runner runs phases: Concurrency closed loops over a target's connections, round robin.
type runner struct {
	mix       *Mix
	reqs      []rawcheck.Request
	workers   []worker
	perWorker int
	all       []time.Duration
}

func newRunner(m *Mix, concurrency, maxRequests int) *runner {
	r := &runner{mix: m, reqs: make([]rawcheck.Request, m.Len()), workers: make([]worker, concurrency)}
	for i := range r.reqs {
		r.reqs[i] = rawcheck.Request{B: m.Bytes(i)}
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
	tcpu0, terr0 := cputime.Process(t.proc.Pid())
	gcpu0, gerr0 := cputime.Self()
	mcpu0, merr0 := cputime.Machine()
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
		err := conn.Invoke(ctx, rawcheck.Method, &r.reqs[pos], &w.reply)
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
		case w.reply.RateLimited():
			denied = true
			w.deniedKey[r.mix.Key(pos)] = true
		case !w.reply.Allowed():
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
