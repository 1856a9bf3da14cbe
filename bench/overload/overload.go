// Package overload is the open-loop overload mode of bench authz and bench rls: the
// sidecar pinned to one CPU and the load generator to another, the capacity measured
// closed loop, then checks sent at a fixed rate (1.2×, 1.5×, 3× that capacity), each
// with Envoy's deadline as its gRPC deadline, whatever the answers do. It reports what
// a proxy would see: decisions answered in time (goodput, as a share of the capacity),
// missed deadlines, the sidecar's shed answers and refusals, and the p99 of the decisions
// answered in time — for the sidecar under test and a baseline binary in the same run.
package overload

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/cputime"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/bench/runinfo"
)

// Config is the overload mode's configuration, one field per flag.
type Config struct {
	Enabled  bool
	Baseline string    // the baseline sidecar binary; "" measures the sidecar alone
	Loads    []float64 // offered loads, as multiples of the capacity
	Rounds   int       // times every load is run, each between two capacity measurements
	Deadline time.Duration
	Warmup   time.Duration // per load, not counted
	Duration time.Duration // per load, counted
	Conns    int
	// Concurrency is the closed loop's that measures the capacity.
	Concurrency int
	// Queue bounds the generator's checks in flight or waiting to what the capacity
	// answers in that time, as the shipped Envoy configs' circuit breakers
	// (max_requests + max_pending_requests ≈ capacity × 20 ms) bound them: a check
	// beyond it fails at once in the generator (overflow), as Envoy's overflow does.
	// 0: no bound but the deadline, a client without circuit breakers.
	Queue        time.Duration
	SidecarCPU   int
	GeneratorCPU int
	// SidecarShare is the part of its CPU the sidecar may use (a cgroup CPU quota), so
	// that the generator can offer a multiple of the sidecar's capacity; 1: all of it.
	SidecarShare float64
	Out          string
}

// DefaultConfig returns the defaults of the flags.
func DefaultConfig(out string) Config {
	return Config{Loads: []float64{1.2, 1.5, 3}, Rounds: 3, Deadline: 250 * time.Millisecond, Warmup: time.Second, Duration: 3 * time.Second,
		Conns: 2, Concurrency: 64, SidecarCPU: 0, GeneratorCPU: 1, SidecarShare: 0.5, Out: out}
}

// RegisterFlags defines the overload mode's flags on fs, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "overload", c.Enabled, "run the open-loop overload mode instead of the closed-loop measurements")
	fs.StringVar(&c.Baseline, "overload-baseline", c.Baseline, "baseline sidecar binary measured in the same run (e.g. one built from main); empty: none")
	fs.Func("overload-loads", "offered loads as multiples of the closed-loop capacity, comma-separated (default 1.2,1.5,3)", func(s string) error {
		var loads []float64
		for _, f := range strings.Split(s, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				return err
			}
			loads = append(loads, v)
		}
		c.Loads = loads
		return nil
	})
	fs.IntVar(&c.Rounds, "overload-rounds", c.Rounds, "times every load is run (the report gives each run and the median): the capacity of a shared machine moves")
	fs.DurationVar(&c.Deadline, "overload-deadline", c.Deadline, "gRPC deadline of every check: Envoy's timeout for the call")
	fs.DurationVar(&c.Warmup, "overload-warmup", c.Warmup, "warm-up of each load, not counted")
	fs.DurationVar(&c.Duration, "overload-duration", c.Duration, "measured time of each load")
	fs.IntVar(&c.Conns, "overload-conns", c.Conns, "gRPC connections to the sidecar (Envoy opens one per worker thread)")
	fs.IntVar(&c.Concurrency, "overload-concurrency", c.Concurrency, "closed-loop callers of the capacity measurement")
	fs.DurationVar(&c.Queue, "overload-queue", c.Queue, "bound the generator's outstanding checks to the capacity × this, as Envoy's circuit breakers (the shipped configs: about 20ms); beyond it a check fails at once; 0: no bound")
	fs.IntVar(&c.SidecarCPU, "overload-sidecar-cpu", c.SidecarCPU, "CPU the sidecar is pinned to (taskset)")
	fs.IntVar(&c.GeneratorCPU, "overload-generator-cpu", c.GeneratorCPU, "CPU the load generator is pinned to (taskset)")
	fs.Float64Var(&c.SidecarShare, "overload-sidecar-share", c.SidecarShare, "part of its CPU the sidecar may use (a cgroup CPU quota; needs root), so that the generator, which costs about as much per check as the sidecar, can offer 3× the sidecar's capacity from one core; 1: no quota")
	fs.StringVar(&c.Out, "overload-out", c.Out, "markdown report of the overload mode; empty: none")
}

// Check refuses values the overload mode cannot run with.
func (c Config) Check() []error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(len(c.Loads) >= 1 && len(c.Loads) <= 10, "-overload-loads: 1 to 10 loads")
	for _, l := range c.Loads {
		check(l > 0 && l <= 10, "-overload-loads %g: must be above 0, at most 10", l)
	}
	check(c.Rounds >= 1 && c.Rounds <= 10, "-overload-rounds %d: 1 to 10", c.Rounds)
	check(c.Deadline >= 10*time.Millisecond && c.Deadline <= 10*time.Second, "-overload-deadline %v: 10ms to 10s", c.Deadline)
	check(c.Warmup >= 0 && c.Warmup <= time.Minute, "-overload-warmup %v: at most 1m", c.Warmup)
	check(c.Duration >= 500*time.Millisecond && c.Duration <= time.Minute, "-overload-duration %v: 500ms to 1m", c.Duration)
	check(c.Conns >= 1 && c.Conns <= 64, "-overload-conns %d: 1 to 64", c.Conns)
	check(c.Concurrency >= 1 && c.Concurrency <= 4096, "-overload-concurrency %d: 1 to 4096", c.Concurrency)
	check(c.Queue >= 0 && c.Queue <= c.Deadline, "-overload-queue %v: 0 to the deadline", c.Queue)
	check(c.SidecarShare > 0 && c.SidecarShare <= 1, "-overload-sidecar-share %g: above 0, at most 1", c.SidecarShare)
	check(c.SidecarCPU >= 0 && c.GeneratorCPU >= 0 && c.SidecarCPU != c.GeneratorCPU, "-overload-sidecar-cpu and -overload-generator-cpu: two different CPUs")
	return errs
}

// Service is what the overload mode drives: one method, its pre-marshaled requests, and
// how to start a sidecar that answers them.
type Service struct {
	Name     string // "authz" or "rls"
	Method   string
	Requests []rawcheck.Request
	NewReply func() closedloop.Reply
	// Shed reports the sidecar's fast answer of overload (for a Check, 503 unavailable).
	Shed func(closedloop.Reply) bool
	// Start starts the sidecar binary bin with run as its command prefix (taskset).
	Start func(ctx context.Context, bin string, prefix []string) (p *procs.Proc, grpcAddr, httpAddr string, err error)
}

// Step is one offered load's figures, counted over the checks sent in the measured time.
type Step struct {
	Load float64 // multiple of the capacity
	// Capacity is the closed-loop checks/s measured just before the load: on a shared
	// machine the capacity moves, and the load is offered relative to the latest figure.
	// CapacityAfter is the next measurement, just after it; the goodput is reported
	// against their mean.
	Capacity, CapacityAfter float64
	Round                   int
	Rate                    float64 // offered checks/s
	Sent                    int64   // checks started (the generator may fall short of the rate)
	Elapsed                 time.Duration
	InTime                  int64 // decisions answered before the deadline: goodput
	Shed                    int64 // fast answers of overload (503), before the deadline
	Refused                 int64 // refused unread by the sidecar (ResourceExhausted)
	Missed                  int64 // deadline exceeded
	// Bound is the generator's bound on outstanding checks (Queue × capacity).
	Bound int64
	// Overflow are the checks the generator failed at once (Queue).
	Overflow int64
	Errors   int64 // any other failure
	P99      time.Duration
	// Scraped: the sidecar's converger_sidecar_checks_shed_total over the step.
	ShedCounter float64
	// CPU used over the measured time, in cores: the sidecar's, and the generator's
	// (this process); CapacitySidecarCPU and CapacityGeneratorCPU during the capacity
	// measurement. A side near 1 is the bottleneck of its phase.
	SidecarCPU, GeneratorCPU                 float64
	CapacitySidecarCPU, CapacityGeneratorCPU float64
}

// SentRate is the rate at which checks were actually started.
func (s Step) SentRate() float64 { return float64(s.Sent) / s.Elapsed.Seconds() }

// Goodput is the decisions answered in time per second.
func (s Step) Goodput() float64 { return float64(s.InTime) / s.Elapsed.Seconds() }

// Around is the capacity around the load: the mean of the measurements before and after.
func (s Step) Around() float64 {
	if s.CapacityAfter <= 0 {
		return s.Capacity
	}
	return (s.Capacity + s.CapacityAfter) / 2
}

// GoodputShare is the goodput as a share of the capacity around the load.
func (s Step) GoodputShare() float64 {
	if s.Around() <= 0 {
		return 0
	}
	return s.Goodput() / s.Around()
}

// Result is one sidecar binary's run.
type Result struct {
	Name, Bin string
	Capacity  float64 // the highest closed-loop checks/s of its loads
	Steps     []Step
}

// Report is the overload mode's report.
type Report struct {
	Config  Config
	Service string
	Machine runinfo.Machine
	Load    [2]string
	Results []Result
	Args    []string
}

// Run measures the sidecar bin and, when cfg.Baseline is set, the baseline binary, one
// after the other, each with its own capacity. It pins the calling process (the load
// generator) to cfg.GeneratorCPU for the rest of its life.
func Run(ctx context.Context, cfg Config, svc Service, bin string, args []string, stdout, stderr io.Writer) (*Report, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "bench "+svc.Name+" -overload: "+format+"\n", a...) }
	if out, err := exec.CommandContext(ctx, "taskset", "-a", "-p", "-c", strconv.Itoa(cfg.GeneratorCPU), strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pinning the load generator with taskset: %v: %s", err, out)
	}
	rep := &Report{Config: cfg, Service: svc.Name, Machine: runinfo.Describe(ctx), Args: args}
	rep.Load[0] = runinfo.LoadAvg()
	bins := []Result{{Name: "sidecar", Bin: bin}}
	if cfg.Baseline != "" {
		b, err := procs.FindSidecar(procs.RepoRoot(), cfg.Baseline)
		if err != nil {
			return nil, fmt.Errorf("-overload-baseline: %w", err)
		}
		bins = append(bins, Result{Name: "baseline", Bin: b})
	}
	for _, r := range bins {
		res, err := runOne(ctx, cfg, svc, r, logf)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.Name, err)
		}
		rep.Results = append(rep.Results, res)
	}
	rep.Load[1] = runinfo.LoadAvg()
	rep.WriteText(stdout)
	if out, err := procs.WriteReport(procs.RepoRoot(), cfg.Out, rep.Markdown()); err != nil {
		return rep, err
	} else if out != "" {
		logf("report written to %s", out)
	}
	return rep, nil
}

func runOne(ctx context.Context, cfg Config, svc Service, res Result, logf func(string, ...any)) (Result, error) {
	p, addr, httpAddr, err := svc.Start(ctx, res.Bin, []string{"taskset", "-c", strconv.Itoa(cfg.SidecarCPU)})
	if err != nil {
		return res, err
	}
	removeQuota := func() {}
	defer func() { p.Stop(); removeQuota() }()
	if cfg.SidecarShare < 1 {
		if removeQuota, err = limitCPU(p.Pid(), cfg.SidecarShare); err != nil {
			return res, fmt.Errorf("-overload-sidecar-share: %w", err)
		}
	}
	conns, err := rawcheck.Dial(ctx, addr, cfg.Conns)
	if err != nil {
		return res, err
	}
	defer rawcheck.Close(conns)
	g := &generator{cfg: cfg, svc: svc, conns: conns}
	g.prime(ctx)
	capacity, capCPU := g.capacity(ctx, p.Pid())
	for round := range cfg.Rounds {
		for _, load := range cfg.Loads {
			if capacity <= 0 {
				return res, errors.New("no check answered in the capacity measurement")
			}
			res.Capacity = max(res.Capacity, capacity)
			logf("%s (%s) on CPU %d: capacity %.0f checks/s closed loop (%d callers, %d connections)", res.Name, res.Bin, cfg.SidecarCPU, capacity, cfg.Concurrency, cfg.Conns)
			before := scrapeShed(ctx, httpAddr)
			st := g.openLoop(ctx, load, capacity*load, int64(capacity*cfg.Queue.Seconds()), p.Pid())
			st.Round, st.Capacity = round+1, capacity
			st.CapacitySidecarCPU, st.CapacityGeneratorCPU = capCPU[0], capCPU[1]
			st.ShedCounter = scrapeShed(ctx, httpAddr) - before
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			capacity, capCPU = g.capacity(ctx, p.Pid())
			st.CapacityAfter = capacity
			logf("%s at %.1f× (%.0f/s offered, %.0f/s sent): in time %.0f/s (%.0f%% of the capacity around it), missed %d, shed %d, refused %d, overflow %d, errors %d, p99 %v",
				res.Name, load, st.Rate, st.SentRate(), st.Goodput(), 100*st.GoodputShare(), st.Missed, st.Shed, st.Refused, st.Overflow, st.Errors, st.P99)
			res.Steps = append(res.Steps, st)
			if err := p.Exited(); err != nil {
				return res, fmt.Errorf("the sidecar exited: %w", err)
			}
		}
	}
	return res, nil
}

type generator struct {
	cfg   Config
	svc   Service
	conns []*grpc.ClientConn
	next  atomic.Uint64
}

func (g *generator) call(ctx context.Context) (closedloop.Reply, error) {
	i := g.next.Add(1)
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Deadline)
	defer cancel()
	reply := g.svc.NewReply()
	err := g.conns[i%uint64(len(g.conns))].Invoke(ctx, g.svc.Method, &g.svc.Requests[i%uint64(len(g.svc.Requests))], reply)
	return reply, err
}

// cpuMeter measures the cores the sidecar and this process use over an interval.
type cpuMeter struct {
	pid        int
	start      time.Time
	side, self time.Duration
}

func startCPU(pid int) cpuMeter {
	m := cpuMeter{pid: pid, start: time.Now()}
	m.side, _ = cputime.Process(pid)
	m.self, _ = cputime.Self()
	return m
}

// cores returns the sidecar's and this process's CPU since start, in cores.
func (m cpuMeter) cores() [2]float64 {
	el := time.Since(m.start).Seconds()
	side, err1 := cputime.Process(m.pid)
	self, err2 := cputime.Self()
	if err1 != nil || err2 != nil || el <= 0 {
		return [2]float64{}
	}
	return [2]float64{(side - m.side).Seconds() / el, (self - m.self).Seconds() / el}
}

// prime sends every request once, so that no measurement pays for a cold start: the
// first verification of each credential, the first counter of each key.
func (g *generator) prime(ctx context.Context) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range g.cfg.Concurrency {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(g.svc.Requests)) && ctx.Err() == nil; i = next.Add(1) - 1 {
				ctx, cancel := context.WithTimeout(ctx, g.cfg.Deadline)
				_ = g.conns[i%int64(len(g.conns))].Invoke(ctx, g.svc.Method, &g.svc.Requests[i], g.svc.NewReply())
				cancel()
			}
		})
	}
	wg.Wait()
}

// capacity is the checks answered per second by Concurrency closed loops, after a warm-up,
// and the cores the sidecar (pid) and the generator used meanwhile.
func (g *generator) capacity(ctx context.Context, pid int) (float64, [2]float64) {
	var counting atomic.Bool
	var done atomic.Int64
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range g.cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := g.call(ctx); err == nil && counting.Load() {
					done.Add(1)
				}
			}
		})
	}
	sleep(ctx, time.Second)
	counting.Store(true)
	start := time.Now()
	cpu := startCPU(pid)
	sleep(ctx, 2*time.Second)
	n := done.Load()
	elapsed := time.Since(start)
	cores := cpu.cores()
	cancel()
	wg.Wait()
	return float64(n) / elapsed.Seconds(), cores
}

// histogram of latencies in 100 µs steps up to the deadline.
type histogram struct{ b []atomic.Int64 }

const histStep = 100 * time.Microsecond

func (h *histogram) add(d time.Duration) {
	i := min(int(d/histStep), len(h.b)-1)
	h.b[i].Add(1)
}

func (h *histogram) quantile(q float64) time.Duration {
	var total int64
	for i := range h.b {
		total += h.b[i].Load()
	}
	if total == 0 {
		return 0
	}
	want := int64(q * float64(total))
	var seen int64
	for i := range h.b {
		if seen += h.b[i].Load(); seen > want {
			return time.Duration(i+1) * histStep
		}
	}
	return time.Duration(len(h.b)) * histStep
}

// openLoop sends checks at rate for Warmup + Duration, whatever the answers, and counts
// those started in the measured time; it returns once every check has ended (each ends
// by its deadline).
func (g *generator) openLoop(ctx context.Context, load, rate float64, bound int64, pid int) Step {
	st := Step{Load: load, Rate: rate}
	h := &histogram{b: make([]atomic.Int64, int(g.cfg.Deadline/histStep)+1)}
	var inTime, shed, refused, missed, overflow, errs, sent atomic.Int64
	var outstanding atomic.Int64
	// A bound on the goroutines of checks in flight whatever Queue: twice what
	// the deadline lets live at this rate.
	hardCap := int64(2*rate*g.cfg.Deadline.Seconds()) + 1000
	limit := hardCap
	if g.cfg.Queue > 0 {
		limit = min(max(bound, 1), hardCap)
	}
	st.Bound = limit
	var wg sync.WaitGroup
	start := time.Now()
	measureFrom, end := start.Add(g.cfg.Warmup), start.Add(g.cfg.Warmup+g.cfg.Duration)
	var issued int64
	var cpu cpuMeter
	metering := false
	for now := start; now.Before(end) && ctx.Err() == nil; now = time.Now() {
		// At most 64 checks per pass, so that a generator that fell behind still
		// tells warm-up from measured time by the clock.
		due := min(int64(rate*now.Sub(start).Seconds()), issued+64)
		measured := !now.Before(measureFrom)
		if measured && !metering {
			cpu, metering = startCPU(pid), true
		}
		for ; issued < due; issued++ {
			if measured {
				sent.Add(1)
			}
			if outstanding.Load() >= limit {
				if measured {
					overflow.Add(1)
				}
				continue
			}
			outstanding.Add(1)
			wg.Go(func() {
				defer outstanding.Add(-1)
				t0 := time.Now()
				reply, err := g.call(ctx)
				lat := time.Since(t0)
				if !measured {
					return
				}
				switch code := status.Code(err); {
				case err == nil && lat > g.cfg.Deadline:
					missed.Add(1)
				case err == nil && g.svc.Shed != nil && g.svc.Shed(reply):
					shed.Add(1)
				case err == nil:
					inTime.Add(1)
					h.add(lat)
				case code == codes.DeadlineExceeded:
					missed.Add(1)
				case code == codes.ResourceExhausted:
					refused.Add(1)
				default:
					errs.Add(1)
				}
			})
		}
		if issued >= int64(rate*time.Since(start).Seconds()) {
			time.Sleep(200 * time.Microsecond)
		}
	}
	st.Elapsed = min(time.Since(measureFrom), g.cfg.Duration)
	if metering {
		c := cpu.cores()
		st.SidecarCPU, st.GeneratorCPU = c[0], c[1]
	}
	wg.Wait()
	st.Sent, st.InTime, st.Shed, st.Refused, st.Missed, st.Overflow, st.Errors = sent.Load(), inTime.Load(), shed.Load(), refused.Load(), missed.Load(), overflow.Load(), errs.Load()
	st.P99 = h.quantile(0.99)
	// Let the sidecar drain what it still holds before the next load.
	time.Sleep(300 * time.Millisecond)
	return st
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
