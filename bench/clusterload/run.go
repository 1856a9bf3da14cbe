package clusterload

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/runinfo"
)

// Result is one measured load on one cluster.
type Result struct {
	Scenario string // "grid", "single", "keys", "load" or "burst"
	Nodes    int
	SyncMS   int
	Share    bool
	Offered  float64 // checks offered per window in total, × the limit
	// Burst says the checks of each window were sent at its start, as fast as they go.
	Burst   bool
	Keys    int // distinct keys the checks went to in turn
	Senders int // nodes that got checks
	// Windows are the measured windows; Allowed summarizes their allowed/limit.
	Windows []Window
	Allowed Stats
	// Starts holds each cluster start's own stats when the configuration was started
	// more than once (see Config.Repeat).
	Starts []Stats
	// TheoryMean and TheoryMax are the model's allowed/limit without share mode.
	TheoryMean, TheoryMax float64
	Traffic               Traffic
	// Sent counts the checks of the whole load (warm-up and partial windows included);
	// Late those sent more than 5 ms after their time; Errors the gRPC errors.
	Sent, Late, Errors int
	// Discarded counts the measured windows left out as disturbed (see MarkDisturbed);
	// Retries the loads measured again because too many were, or because a node lost
	// sight of another (Members, the fewest members a node saw, was under Nodes).
	Discarded, Retries int
	Members            int
	// NodeCPU is the CPUs a node used on average over the measured windows; OtherLoad
	// the CPUs the rest of the machine used meanwhile (-1 when unknown).
	NodeCPU, OtherLoad float64
	MaxLate            time.Duration
	FirstErr           string
	Elapsed            time.Duration // of the load
	// SentRate is the checks sent per second over the measured windows (what the
	// generator achieved, against Offered's plan); Span the median and the longest time
	// from a measured window's start to its last check sent (a burst's length).
	SentRate            float64
	SpanMedian, SpanMax time.Duration
}

// Report is the outcome of a run.
type Report struct {
	Config  Config
	Started time.Time
	Elapsed time.Duration
	runinfo.Machine
	LoadStart, LoadEnd string
	// SidecarSource is the work tree the sidecar binary most likely came from.
	SidecarSource string

	Grid []Result
	// Loads is the share-mode scenario (Config.Loads, then the burst), each load in each
	// mode, in that order.
	Loads  []Result
	Single Result   // all the checks on one node of 3, share mode on
	Keys   []Result // the same check rate over more keys; the last row: 1 key at a tenth of the rate
	// AimPass: every load of the share-mode scenario, share mode on, stayed within
	// AimMaxAllowed in every window.
	AimPass, SinglePass               bool
	ClusterStart                      time.Duration // longest time to start a cluster and see it formed
	GridTime, LoadsTime, ScenarioTime time.Duration
}

// Run runs the test: the grid of cluster sizes, sync intervals and modes, then the
// single-node and traffic scenarios; it writes the report and the plot. Progress goes to
// stderr. Every process it starts is stopped before it returns, also on error and when
// ctx ends (Ctrl-C).
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (*Report, error) {
	if cfg.Exact.On {
		return RunExact(ctx, cfg, stdout, stderr)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench cluster: "+format+"\n", args...) }
	root := procs.RepoRoot()
	bin, err := procs.FindSidecar(root, cfg.Sidecar)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-cluster-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	limits := filepath.Join(dir, "limits.yaml")
	yaml := fmt.Sprintf("limits: {%s: {limit: %d, window: %dms}}\n", loadBucket, cfg.Limit, cfg.Window.Milliseconds())
	if err := os.WriteFile(limits, []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg, Started: time.Now(), Machine: runinfo.Describe(ctx), LoadStart: runinfo.LoadAvg(),
		SidecarSource: runinfo.Source(ctx, root, "sidecar", "shared")}
	grid, scen, sweep := cfg.Runs()
	logf("%d cluster starts for %d configurations, %d for the share-mode scenario (%d loads each), then %d scenario loads on one cluster; %d warm-up + %d measured windows of %v each; about %v in all",
		grid, len(cfg.Nodes)*len(cfg.Intervals)*len(cfg.Modes), sweep, cfg.sweepLoads(), scen, cfg.Warmup, cfg.Windows, cfg.Window, cfg.Estimate().Round(10*time.Second))

	r := &runner{cfg: cfg, bin: bin, limits: limits, stderr: stderr, logf: logf, rep: rep}
	t0 := time.Now()
	for _, n := range cfg.Nodes {
		for _, ms := range cfg.Intervals {
			for _, share := range cfg.Modes {
				res, err := r.repeated(ctx, "grid", n, ms, share, cfg.Offered)
				if err != nil {
					return nil, err
				}
				rep.Grid = append(rep.Grid, res)
			}
		}
	}
	rep.GridTime = time.Since(t0)

	t0 = time.Now()
	if rep.Loads, err = r.loads(ctx); err != nil {
		return nil, err
	}
	rep.LoadsTime = time.Since(t0)

	t0 = time.Now()
	var steps []func(c *cluster) (Result, error)
	steps = append(steps, func(c *cluster) (Result, error) {
		return r.measure(ctx, c, "single", cfg.Offered, []int{0}, 1, false)
	})
	for _, k := range cfg.Keys {
		steps = append(steps, func(c *cluster) (Result, error) {
			return r.measure(ctx, c, "keys", cfg.Offered, allNodes(AimNodes), k, false)
		})
	}
	steps = append(steps, func(c *cluster) (Result, error) {
		return r.measure(ctx, c, "keys", cfg.Offered/10, allNodes(AimNodes), 1, false)
	})
	res, err := r.onCluster(ctx, AimNodes, cfg.TrafficSyncMS, true, steps...)
	if err != nil {
		return nil, err
	}
	rep.Single, rep.Keys = res[0], res[1:]
	rep.ScenarioTime = time.Since(t0)

	rep.AimPass = rep.loadsPass()
	rep.SinglePass = rep.Single.Allowed.Windows > 0 && rep.Single.Allowed.Min >= AimSingleMin
	rep.Elapsed = time.Since(rep.Started)
	rep.LoadEnd = runinfo.LoadAvg()

	rep.WriteText(stdout)
	if cfg.Plot != "" {
		out := procs.OutPath(root, cfg.Plot)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return rep, err
		}
		if err := rep.WritePlot(out); err != nil {
			return rep, fmt.Errorf("plot: %w", err)
		}
		logf("plot written to %s", out)
	}
	if out, err := procs.WriteReport(root, cfg.Out, rep.Markdown()); err != nil {
		return rep, err
	} else if out != "" {
		logf("report written to %s", out)
	}
	return rep, nil
}

func allNodes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// loads runs the share-mode scenario: for each mode, Repeat fresh clusters of AimNodes
// syncing every AimSyncMS, each running every load in turn (distinct keys); the
// results of a load and mode are pooled over the starts.
func (r *runner) loads(ctx context.Context) ([]Result, error) {
	type load struct {
		offered float64
		burst   bool
	}
	var ls []load
	for _, o := range r.cfg.Loads {
		ls = append(ls, load{o, false})
	}
	if r.cfg.Burst > 0 {
		ls = append(ls, load{r.cfg.Burst, true})
	}
	if len(ls) == 0 {
		return nil, nil
	}
	pooled := make(map[bool][][]Result) // by mode, by load: one result per start
	for _, share := range r.cfg.Modes {
		pooled[share] = make([][]Result, len(ls))
		for range r.cfg.Repeat {
			var steps []func(c *cluster) (Result, error)
			for _, l := range ls {
				steps = append(steps, func(c *cluster) (Result, error) {
					scenario := "load"
					if l.burst {
						scenario = "burst"
					}
					return r.measure(ctx, c, scenario, l.offered, allNodes(AimNodes), 1, l.burst)
				})
			}
			res, err := r.onCluster(ctx, AimNodes, AimSyncMS, share, steps...)
			if err != nil {
				return nil, err
			}
			for i, x := range res {
				pooled[share][i] = append(pooled[share][i], x)
			}
		}
	}
	var out []Result
	for i := range ls {
		for _, share := range r.cfg.Modes {
			out = append(out, Merge(pooled[share][i], r.cfg.Limit))
		}
	}
	return out, nil
}

// loadsPass reports the first aim: every load of the share-mode scenario in share mode
// measured, and no window over AimMaxAllowed.
func (r *Report) loadsPass() bool {
	n := 0
	for _, l := range r.Loads {
		if !l.Share {
			continue
		}
		n++
		if l.Allowed.Windows == 0 || l.Allowed.Max > AimMaxAllowed {
			return false
		}
	}
	return n > 0
}

// runner holds what every measurement needs.
type runner struct {
	cfg     Config
	bin     string
	limits  string
	stderr  io.Writer
	logf    func(string, ...any)
	rep     *Report
	keyBase int // the next unused client IP
}

// repeated measures one key from every node of a cluster, on cfg.Repeat fresh clusters
// (one when n is 1), and pools the results.
func (r *runner) repeated(ctx context.Context, scenario string, n, syncMS int, share bool, offered float64) (Result, error) {
	starts := r.cfg.Repeat
	if n == 1 {
		starts = 1
	}
	var rs []Result
	for range starts {
		res, err := r.onCluster(ctx, n, syncMS, share, func(c *cluster) (Result, error) {
			return r.measure(ctx, c, scenario, offered, allNodes(n), 1, false)
		})
		if err != nil {
			return Result{}, err
		}
		rs = append(rs, res[0])
	}
	return Merge(rs, r.cfg.Limit), nil
}

// onCluster starts a cluster, runs the steps on it in turn, and stops it.
func (r *runner) onCluster(ctx context.Context, n, syncMS int, share bool, steps ...func(*cluster) (Result, error)) ([]Result, error) {
	c, err := startCluster(ctx, clusterSpec{bin: r.bin, limitsFile: r.limits, nodes: n, syncMS: syncMS, share: share}, r.stderr)
	if err != nil {
		return nil, fmt.Errorf("starting %d sidecars (sync %d ms, share mode %s): %w", n, syncMS, modeName(share), err)
	}
	defer c.stop()
	r.rep.ClusterStart = max(r.rep.ClusterStart, c.started)
	var out []Result
	for _, step := range steps {
		var tries []Result
		for attempt := 0; ; attempt++ {
			res, err := step(c)
			if err != nil {
				return nil, err
			}
			if err := c.exited(); err != nil {
				return nil, err
			}
			res.Retries = attempt
			r.logf("%s", res.progress(r.cfg.Limit))
			tries = append(tries, res)
			if res.usable(r.cfg.Windows) {
				out = append(out, res)
				break
			}
			if attempt == maxRetries {
				res = keptOf(tries, r.cfg.Limit)
				if res.Allowed.Windows > tries[len(tries)-1].Allowed.Windows {
					r.logf("  no attempt usable: %d windows kept by the attempts pooled", res.Allowed.Windows)
				}
				out = append(out, res)
				break
			}
			r.logf("  disturbed (%d of %d windows discarded, fewest members seen %d of %d, other load %.2f CPUs): measuring again",
				res.Discarded, len(res.Windows), res.Members, n, res.OtherLoad)
			if err := c.waitMembers(ctx, 30*time.Second); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// keptOf is what is kept of a load none of whose attempts was usable: on a busy machine
// each may keep only a window or two, so the windows kept by every attempt during which
// the nodes saw each other are pooled; with fewer than two such, the last attempt.
func keptOf(attempts []Result, limit int) Result {
	last := attempts[len(attempts)-1]
	var full []Result
	for _, a := range attempts {
		if a.Members >= a.Nodes {
			full = append(full, a)
		}
	}
	if len(full) < 2 {
		return last
	}
	res := Merge(full, limit)
	res.Retries = last.Retries
	return res
}

// maxRetries bounds the loads measured again after a disturbance.
const maxRetries = 2

// maxOtherLoad is the most CPU the rest of the machine may use during a load, in CPUs:
// beyond it (another build or test on a shared machine) the sidecars may be starved
// while the load generator is not, and a stalled sync loop lets windows overshoot.
const maxOtherLoad = 0.25

// usable reports a load that kept at least half its measured windows, whose nodes saw
// each other all along, and that had the machine mostly to itself.
func (r Result) usable(windows int) bool {
	return 2*r.Allowed.Windows >= windows && r.Members >= r.Nodes && r.OtherLoad <= maxOtherLoad
}

// measure runs one load on the cluster: offered × L checks per window in total over
// keys, on the senders (paced evenly, or with burst at each window's start), for the
// warm-up and the measured windows, and the traffic of the measured ones.
func (r *runner) measure(ctx context.Context, c *cluster, scenario string, offered float64, senders []int, keys int, burst bool) (Result, error) {
	cfg := r.cfg
	wms := cfg.Window.Milliseconds()
	n := len(c.nodes)
	res := Result{Scenario: scenario, Nodes: n, SyncMS: c.syncMS, Share: c.share, Offered: offered, Burst: burst, Keys: keys, Senders: len(senders),
		TheoryMean: SteadyMean(n, offered, float64(c.syncMS), float64(wms)),
		TheoryMax:  SteadyMax(n, offered, float64(c.syncMS), float64(wms))}
	if burst {
		res.TheoryMean, res.TheoryMax = BurstMax(n, offered), BurstMax(n, offered)
	}
	if len(senders) < n {
		// Only some nodes get checks: the model is for an even spread; a lone sender
		// never waits for another's report.
		res.TheoryMean, res.TheoryMax = min(1, offered), min(1, offered)
	}

	// Start 100 ms before a window begins (or now, when it is nearer), so that the first
	// whole window, the warm-up, comes soon.
	now := time.Now()
	next := time.UnixMilli((WindowOf(now.UnixMilli(), wms) + 1) * wms)
	start := next.Add(-100 * time.Millisecond)
	if start.Before(now) {
		start = now
	}
	first, _ := FullWindows(start.UnixMilli(), start.UnixMilli()+int64(cfg.Warmup+cfg.Windows+1)*wms, wms)
	mFirst := first + int64(cfg.Warmup)
	mEnd := mFirst + int64(cfg.Windows)
	end := time.UnixMilli(mEnd * wms)
	spec := loadSpec{rate: offered * float64(cfg.Limit) / cfg.Window.Seconds(), senders: senders, keys: keys,
		keyBase: r.keyBase, start: start, end: end, burst: burst, windowMS: wms}
	r.keyBase += keys

	type scrapes struct {
		before, after []Scrape
		cpu0, cpu1    cpuSample
		err           error
	}
	scraped := make(chan scrapes, 1)
	go func() {
		var s scrapes
		sleepUntil(ctx, time.UnixMilli(mFirst*wms))
		s.cpu0 = c.cpu()
		if s.before, s.err = c.scrape(ctx); s.err == nil {
			sleepUntil(ctx, end)
			s.cpu1 = c.cpu()
			s.after, s.err = c.scrape(ctx)
		}
		scraped <- s
	}()
	t0 := time.Now()
	lr, err := spec.run(ctx, c)
	res.Elapsed = time.Since(t0)
	s := <-scraped
	if err != nil {
		return res, err
	}
	if s.err != nil {
		return res, fmt.Errorf("reading the metrics: %w", s.err)
	}
	res.Windows = Tally(lr.sends, wms, mFirst, mEnd, n)
	res.Discarded = MarkDisturbed(res.Windows, spec.rate*cfg.Window.Seconds(), burst)
	res.SentRate, res.SpanMedian, res.SpanMax = sendStats(res.Windows, wms)
	res.Allowed = AllowedStats(res.Windows, cfg.Limit)
	res.OtherLoad = -1
	if perNode, other, ok := cpuLoad(s.cpu0, s.cpu1); ok {
		res.NodeCPU, res.OtherLoad = perNode, other
	}
	res.Members = n
	for _, sc := range append(s.before, s.after...) {
		res.Members = min(res.Members, int(sc.Metrics[mClusterSize]))
	}
	res.Traffic = TrafficOf(s.before, s.after)
	res.Sent, res.Late, res.Errors, res.MaxLate = len(lr.sends), lr.late, lr.errors, lr.maxLate
	if lr.firstErr != nil {
		res.FirstErr = lr.firstErr.Error()
	}
	return res, nil
}

// sendStats returns the checks sent per second over the windows, and the median and the
// longest time from a window's start to its last check.
func sendStats(ws []Window, windowMS int64) (rate float64, median, longest time.Duration) {
	if len(ws) == 0 {
		return 0, 0, 0
	}
	sent := 0
	for _, w := range ws {
		sent += w.Sent
	}
	median, longest = spans(ws)
	return float64(sent) / (float64(len(ws)) * float64(windowMS) / 1000), median, longest
}

// spans returns the median and the longest time from a window's start to its last check.
func spans(ws []Window) (median, longest time.Duration) {
	if len(ws) == 0 {
		return 0, 0
	}
	d := make([]time.Duration, len(ws))
	for i, w := range ws {
		d[i] = time.Duration(w.LastNS)
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)-1]
}

func sleepUntil(ctx context.Context, t time.Time) {
	if d := time.Until(t); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
}

// progress is a result's line of progress.
func (r Result) progress(limit int) string {
	what := fmt.Sprintf("%-6s N=%d sync=%3dms share=%-3s", r.Scenario, r.Nodes, r.SyncMS, modeName(r.Share))
	switch r.Scenario {
	case "keys", "single":
		what += fmt.Sprintf(" keys=%d senders=%d offered=%.2g×L", r.Keys, r.Senders, r.Offered)
	case "load", "burst":
		what += fmt.Sprintf(" offered=%.3g×L (%.0f checks/s sent)", r.Offered, r.SentRate)
		if r.Burst {
			what += fmt.Sprintf(" burst sent in %v (longest %v)", r.SpanMedian.Round(time.Millisecond), r.SpanMax.Round(time.Millisecond))
		}
	}
	line := fmt.Sprintf("%s  allowed/L mean %.3f max %.3f min %.3f (model without share mode: max %.3f)  per node %.1f msg/s %.0f B/s %.2f CPU  caps/s %.1f  merge lag %.2fms  late %d errors %d discarded %d  other load %.2f CPUs",
		what, r.Allowed.Mean, r.Allowed.Max, r.Allowed.Min, r.TheoryMax, r.Traffic.MsgsSent, r.Traffic.BytesSent, r.NodeCPU, r.Traffic.Caps, r.Traffic.MergeLagMS, r.Late, r.Errors, r.Discarded, r.OtherLoad)
	if r.FirstErr != "" {
		line += " (first error: " + r.FirstErr + ")"
	}
	return line
}
