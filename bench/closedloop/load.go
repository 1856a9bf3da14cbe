// Package closedloop drives pre-built requests against targets in closed loops — unary
// gRPC calls of pre-marshaled messages, or raw HTTP/1.1 requests on keep-alive
// connections — in measured phases of alternating rounds, and summarizes each target's
// throughput and latency against a baseline's. The load tests (bench authz, bench rls,
// bench forward-auth) provide the requests and how to read an answer.
package closedloop

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/converger/edge/bench/cputime"
	"github.com/converger/edge/bench/runinfo"
)

// Workload is a pre-built request sequence: a prologue sent once, then a body that
// repeats. Each request has a class (for the report) and a key (to see which keys were
// denied). How a request is sent is its target's Caller's.
type Workload interface {
	// Len is the number of pre-built requests, the prologue included.
	Len() int
	// Position returns the position of the i-th request sent.
	Position(i uint64) int
	// Class and Key return the class and the key of the request at a position, from 0 to
	// Classes()-1 and Keys()-1.
	Class(pos int) int
	Key(pos int) int
	Classes() int
	Keys() int
}

// Verdict is what the load generator reads of an answer.
type Verdict uint8

const (
	Allowed     Verdict = iota
	RateLimited         // denied for its rate limit (429, OVER_LIMIT)
	Rejected            // another denial: a credential the target refused
)

// Caller sends the request at a position of the workload for one of the closed loops
// (worker, from 0 to the runner's concurrency - 1), and reads the verdict of the answer.
// Calls of different workers run at once; a worker's calls one after the other.
type Caller interface {
	Call(ctx context.Context, worker, pos int) (Verdict, error)
	Close()
}

// Process is a target's process: its CPU time is measured, and a phase fails when it
// has exited. *procs.Proc and *proxyserver.Proxy are processes.
type Process interface {
	Pid() int
	Exited() error
}

// Target is a server under load with its caller. Sent is the number of requests sent to
// it so far, across phases: its position in the workload.
type Target struct {
	Name   string
	Addr   string
	Proc   Process
	Caller Caller
	Sent   atomic.Uint64
	// DeniedKeys marks the keys that got a rate-limit denial at least once, in any phase.
	DeniedKeys []bool
}

// NewTarget returns a target of a workload with keys keys, called through c.
func NewTarget(name, addr string, proc Process, c Caller, keys int) *Target {
	return &Target{Name: name, Addr: addr, Proc: proc, Caller: c, DeniedKeys: make([]bool, keys)}
}

// Close closes the target's caller.
func (t *Target) Close() {
	if t.Caller != nil {
		t.Caller.Close()
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
	// Denied got a rate-limit denial (429, OVER_LIMIT); Rejected another denial (401, 403,
	// 400: a credential the target refused).
	Denied, Rejected int
	// Capped is true when the phase stopped at its request cap rather than at its duration.
	Capped bool
	// ByClass counts requests and denials per request class.
	ByClass []ClassCount
	// TargetCPU and GenCPU are the CPU time (user + system) of the target's process and of
	// the load generator during the phase, per request: on a machine the two share, what
	// the target costs per call decides its throughput. Zero when unknown.
	TargetCPU, GenCPU time.Duration
	// OtherLoad is the CPU the rest of the machine used during the phase, in CPUs (1 is
	// one CPU busy all along): other processes on a shared machine, and the kernel work
	// not charged to a process. -1 when unknown.
	OtherLoad float64
}

// ClassCount counts the requests of a class and their denials.
type ClassCount struct{ Requests, Denied int }

// worker is one closed loop's state; latencies go to a slice allocated once.
type worker struct {
	lat       []time.Duration
	n         int
	errors    int
	firstErr  error
	denied    int
	rejected  int
	byClass   []ClassCount
	deniedKey []bool // by key index: denied in this phase
	end       time.Time
}

// Runner runs phases: concurrency closed loops over a target's caller.
type Runner struct {
	w         Workload
	workers   []worker
	perWorker int
	all       []time.Duration
}

// NewRunner returns a runner of concurrency loops that send at most maxRequests per
// phase. Its targets' callers serve concurrency workers.
func NewRunner(w Workload, concurrency, maxRequests int) *Runner {
	r := &Runner{w: w, workers: make([]worker, concurrency)}
	r.perWorker = (maxRequests + concurrency - 1) / concurrency
	for i := range r.workers {
		r.workers[i].lat = make([]time.Duration, 0, r.perWorker)
		r.workers[i].deniedKey = make([]bool, w.Keys())
		r.workers[i].byClass = make([]ClassCount, w.Classes())
	}
	r.all = make([]time.Duration, 0, r.perWorker*concurrency)
	return r
}

// Phase drives the target for d. Unmeasured phases (warm-ups) keep no latencies.
func (r *Runner) Phase(ctx context.Context, t *Target, d time.Duration, measured bool) PhaseResult {
	tcpu0, terr0 := cputime.Process(t.Proc.Pid())
	gcpu0, gerr0 := cputime.Self()
	mcpu0, merr0 := cputime.Machine()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range r.workers {
		wg.Go(func() { r.loop(ctx, t, i, deadline, measured) })
	}
	wg.Wait()

	res := PhaseResult{Target: t.Name, ByClass: make([]ClassCount, r.w.Classes())}
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
				t.DeniedKeys[k] = true
				w.deniedKey[k] = false
			}
		}
		r.all = append(r.all, w.lat...)
	}
	res.Elapsed = end.Sub(start)
	if res.Elapsed > 0 {
		res.RPS = float64(res.Requests) / res.Elapsed.Seconds()
	}
	tcpu1, terr1 := cputime.Process(t.Proc.Pid())
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
func (r *Runner) loop(ctx context.Context, t *Target, i int, deadline time.Time, measured bool) {
	w := &r.workers[i]
	clear(w.byClass)
	*w = worker{lat: w.lat[:0], deniedKey: w.deniedKey, byClass: w.byClass}
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
		pos := r.w.Position(t.Sent.Add(1) - 1)
		v, err := t.Caller.Call(ctx, i, pos)
		lat := time.Since(begin)
		w.n++
		c := r.w.Class(pos)
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
		case v == RateLimited:
			denied = true
			w.deniedKey[r.w.Key(pos)] = true
		case v == Rejected:
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

// Rounds configures RunRounds.
type Rounds struct {
	Rounds           int
	Warmup, Duration time.Duration
	// Prologue is how many requests the first warm-up of each target sends at least (the
	// workload's prologue), so that the target's caches hold every key before measuring.
	Prologue int
	// Logf reports progress.
	Logf func(format string, args ...any)
}

// RunRounds runs the rounds: in each, every target gets a warm-up and a measured phase,
// in an order that alternates from round to round (round 1 in the order given, round 2
// reversed, …). It returns the measured phases in the order they ran and the errors of
// the warm-ups; it stops at the first target that dies or when ctx ends.
func (r *Runner) RunRounds(ctx context.Context, targets []*Target, o Rounds) (phases []PhaseResult, warmupErrors int, err error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for round := 1; round <= o.Rounds; round++ {
		order := slices.Clone(targets)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, t := range order {
			if o.Warmup > 0 {
				w := r.Phase(ctx, t, o.Warmup, false)
				for limit := time.Now().Add(time.Minute); t.Sent.Load() < uint64(o.Prologue) && time.Now().Before(limit) && ctx.Err() == nil; {
					more := r.Phase(ctx, t, o.Warmup/4+10*time.Millisecond, false)
					w.Errors += more.Errors
					if w.FirstErr == "" {
						w.FirstErr = more.FirstErr
					}
				}
				warmupErrors += w.Errors
				if w.Errors > 0 {
					logf("round %d %s warm-up: %d errors, first: %s", round, t.Name, w.Errors, w.FirstErr)
				}
			}
			if err := phaseErr(ctx, t); err != nil {
				return phases, warmupErrors, err
			}
			res := r.Phase(ctx, t, o.Duration, true)
			if err := phaseErr(ctx, t); err != nil {
				return phases, warmupErrors, err
			}
			res.Round = round
			phases = append(phases, res)
			logf("round %d %-7s %8.0f req/s  p50 %s  p99 %s  errors %d  denied %.1f%%  CPU/req %s (generator %s)",
				round, t.Name, res.RPS, runinfo.Latency(res.P50), runinfo.Latency(res.P99), res.Errors, Pct(res.Denied, res.Requests), FmtCPU(res.TargetCPU), FmtCPU(res.GenCPU))
			if res.Errors > 0 {
				logf("round %d %s: first error: %s", round, t.Name, res.FirstErr)
			}
		}
	}
	return phases, warmupErrors, nil
}

// phaseErr reports an interruption or a target that died.
func phaseErr(ctx context.Context, t *Target) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return t.Proc.Exited()
}
