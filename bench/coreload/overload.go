package coreload

// The overload test (`bench core-overload`): the core's capacity — the highest rate of
// activity POSTs, offered open loop, at which p99 stays within a bound — over many
// conversations and on one, against the capacity of the pgx baseline found the same way
// in the same run; then an overload (over many conversations) of
// the core at a multiple of its capacity, and how long after it the core answers within
// the bound again, how much it shed, and how many writes completed after their client
// had given up.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/runinfo"
)

// OverloadConfig is the overload test's configuration, one field per flag.
type OverloadConfig struct {
	Core          string
	Conversations int
	StartRate     float64       // requests/s of the first step of the capacity search
	Growth        float64       // each step's rate is the previous one's times Growth
	Step          time.Duration // per step of the search
	P99           time.Duration // the latency bound that defines capacity
	Factor        float64       // the overload's rate, in capacities
	Overload      time.Duration // how long the overload lasts
	Timeout       time.Duration // the clients' patience
	RecoverMax    time.Duration // how long the test waits for the recovery
	Out           string
	Args          []string
}

// DefaultOverloadConfig returns the defaults of the flags.
func DefaultOverloadConfig() OverloadConfig {
	return OverloadConfig{Core: "bin/core", Conversations: 1000, StartRate: 250, Growth: 1.25, Step: 3 * time.Second,
		P99: 100 * time.Millisecond, Factor: 10, Overload: 30 * time.Second, Timeout: time.Second,
		RecoverMax: time.Minute, Out: "bench/results/core-overload.md"}
}

// RegisterFlags defines the flags of `bench core-overload` on fs.
func (c *OverloadConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Core, "core", c.Core, "core binary (relative paths: from the repository root, else the working directory)")
	fs.IntVar(&c.Conversations, "conversations", c.Conversations, "conversations the activities are spread over")
	fs.Float64Var(&c.StartRate, "start-rate", c.StartRate, "requests/s of the capacity search's first step")
	fs.Float64Var(&c.Growth, "growth", c.Growth, "factor from one step of the capacity search to the next")
	fs.DurationVar(&c.Step, "step", c.Step, "duration of each step of the capacity search")
	fs.DurationVar(&c.P99, "p99", c.P99, "capacity is the highest rate whose p99 stays within this")
	fs.Float64Var(&c.Factor, "factor", c.Factor, "the overload's rate, in capacities")
	fs.DurationVar(&c.Overload, "overload", c.Overload, "how long the overload lasts")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "the clients' patience: a request not answered within it is given up")
	fs.DurationVar(&c.RecoverMax, "recover-max", c.RecoverMax, "how long to wait for the core to answer within -p99 again")
	fs.StringVar(&c.Out, "out", c.Out, "markdown report (relative paths: from the repository root); empty: none")
}

// Validate refuses values the test cannot run with.
func (c OverloadConfig) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Core != "", "-core: required")
	check(c.Conversations >= 1 && c.Conversations <= 100_000, "-conversations %d: must be from 1 to 100000", c.Conversations)
	check(c.StartRate >= 1 && c.StartRate <= 100_000, "-start-rate %g: must be from 1 to 100000", c.StartRate)
	check(c.Growth > 1 && c.Growth <= 4, "-growth %g: must be above 1, at most 4", c.Growth)
	check(c.Step >= 500*time.Millisecond && c.Step <= time.Minute, "-step %v: must be from 500ms to 1m", c.Step)
	check(c.P99 >= time.Millisecond && c.P99 <= 10*time.Second, "-p99 %v: must be from 1ms to 10s", c.P99)
	check(c.Factor >= 1 && c.Factor <= 100, "-factor %g: must be from 1 to 100", c.Factor)
	check(c.Overload >= time.Second && c.Overload <= 5*time.Minute, "-overload %v: must be from 1s to 5m", c.Overload)
	check(c.Timeout >= 10*time.Millisecond && c.Timeout <= time.Minute, "-timeout %v: must be from 10ms to 1m", c.Timeout)
	check(c.RecoverMax >= time.Second && c.RecoverMax <= 10*time.Minute, "-recover-max %v: must be from 1s to 10m", c.RecoverMax)
	return errors.Join(errs...)
}

// Bounds of the generator: the most requests outstanding at once (beyond it a send is
// skipped and counted), and the most steps of a capacity search.
const (
	maxOutstanding = 50_000
	maxSteps       = 30
)

// step is one rate of a capacity search.
type step struct {
	Rate             float64
	Sent, OK, Failed int
	Skipped          int // not sent: the generator had maxOutstanding requests out
	Achieved         float64
	P50, P99         time.Duration
	Within           bool
}

// OverloadReport is what the test found.
type OverloadReport struct {
	Config               OverloadConfig
	Started              time.Time
	Machine              runinfo.Machine
	LoadStart, LoadEnd   string
	Source               string
	Core, Baseline       []step // over Config.Conversations conversations
	CoreCap, BaselineCap float64
	// The same on one conversation, where every writer queues on its row lock.
	HotCore, HotBaseline       []step
	HotCoreCap, HotBaselineCap float64
	Offered, Achieved          float64
	Acked, Shed, GaveUp        int
	Failed, Skipped            int
	Stored, Abandoned          int
	Recovered                  time.Duration // -1: not within RecoverMax
	Rows                       int64
}

// RunOverload runs the overload test. Every process it starts is stopped before it
// returns.
func RunOverload(ctx context.Context, cfg OverloadConfig, stdout, stderr io.Writer) (rep *OverloadReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench core-overload: "+format+"\n", args...) }
	root := procs.RepoRoot()
	coreBin, err := FindBinary(root, cfg.Core)
	if err != nil {
		return nil, err
	}
	rep = &OverloadReport{Config: cfg, Started: time.Now(), Machine: runinfo.Describe(ctx), LoadStart: runinfo.LoadAvg(),
		Source: runinfo.Source(ctx, root, "core", "shared"), Recovered: -1}
	// The generator stands for Envoy: one address with many connections, a trusted proxy
	// (exempt from CORE_MAX_CONNS_PER_IP, as TRUSTED_PROXIES makes Envoy).
	st, err := startStack(ctx, coreBin, cfg.Conversations, stderr, "TRUSTED_PROXIES=127.0.0.1")
	if err != nil {
		return nil, err
	}
	defer func() {
		if stopErr := st.stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	core, base, pool, seed := st.core, st.base, st.pool, st.seed

	tr := &http.Transport{MaxIdleConnsPerHost: maxOutstanding, IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: cfg.Timeout}
	many, hot := &picker{convs: seed.Many}, &picker{convs: []string{seed.Hot}}
	var keys atomic.Int64
	post := func(ctx context.Context, p *picker, key string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/conversations/"+p.pick()+"/activities",
			bytes.NewReader([]byte(`{"type":"message","text":"overload"}`)))
		if err != nil {
			return 0, err
		}
		req.Header.Set("content-type", "application/json")
		req.Header.Set("x-api-key", seed.APIKey)
		if key != "" {
			req.Header.Set("x-idempotency-key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	coreSend := func(p *picker) func(context.Context) bool {
		return func(ctx context.Context) bool {
			status, err := post(ctx, p, "")
			return err == nil && status == http.StatusCreated
		}
	}
	bt := &baselineTarget{pool: pool, tenantID: seed.TenantID, text: "overload"}
	baseSend := func(p *picker) func(context.Context) bool {
		return func(ctx context.Context) bool {
			ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
			return bt.create(ctx, p.pick()) == nil
		}
	}

	logf("core %s at %s; capacity: the highest rate with p99 ≤ %v, from %g req/s ×%g per %v step", coreBin, base,
		cfg.P99, cfg.StartRate, cfg.Growth, cfg.Step)
	for _, t := range []struct {
		name  string
		send  func(context.Context) bool
		steps *[]step
		cap   *float64
	}{
		{TargetCore + ", " + ScenarioMany, coreSend(many), &rep.Core, &rep.CoreCap},
		{TargetBaseline + ", " + ScenarioMany, baseSend(many), &rep.Baseline, &rep.BaselineCap},
		{TargetCore + ", " + ScenarioHot, coreSend(hot), &rep.HotCore, &rep.HotCoreCap},
		{TargetBaseline + ", " + ScenarioHot, baseSend(hot), &rep.HotBaseline, &rep.HotBaselineCap},
	} {
		for rate, i := cfg.StartRate, 0; i < maxSteps; rate, i = rate*cfg.Growth, i+1 {
			if err := phaseErr(ctx, core); err != nil {
				return nil, err
			}
			// A step out of the bound is run once more before the search ends: on a shared
			// machine one stall of the whole machine can push a step's p99 over it.
			within := false
			for try := 0; try < 2 && !within; try++ {
				s := openLoop(ctx, rate, cfg.Step, cfg.P99, t.send)
				*t.steps = append(*t.steps, s)
				logf("%-14s %7.0f req/s offered: %7.0f achieved, p50 %s, p99 %s, %d failed, %d skipped", t.name, s.Rate, s.Achieved,
					runinfo.Latency(s.P50), runinfo.Latency(s.P99), s.Failed, s.Skipped)
				within = s.Within
			}
			if !within {
				break
			}
			*t.cap = rate
		}
		time.Sleep(time.Second) // let the queues drain
	}
	if rep.CoreCap == 0 {
		return rep, errors.New("the core did not keep p99 within the bound even at the first step; lower -start-rate")
	}

	rate := rep.CoreCap * cfg.Factor
	logf("overload: %g× the capacity, %.0f req/s for %v, clients giving up after %v", cfg.Factor, rate, cfg.Overload, cfg.Timeout)
	type outcome struct {
		status int
		err    error
	}
	var mu sync.Mutex
	outcomes := map[string]outcome{}
	var wg sync.WaitGroup
	var outstanding atomic.Int64
	start := time.Now()
	sent := 0
	tick := time.NewTicker(time.Millisecond)
	for time.Since(start) < cfg.Overload && ctx.Err() == nil {
		<-tick.C
		for due := int(time.Since(start).Seconds() * rate); sent < due; sent++ {
			if outstanding.Load() >= maxOutstanding {
				rep.Skipped++
				continue
			}
			key := fmt.Sprintf("ov-%d", keys.Add(1))
			outstanding.Add(1)
			wg.Go(func() {
				defer outstanding.Add(-1)
				status, err := post(ctx, many, key)
				mu.Lock()
				outcomes[key] = outcome{status, err}
				mu.Unlock()
			})
		}
	}
	tick.Stop()
	ended := time.Now()
	rep.Offered = float64(sent) / ended.Sub(start).Seconds()
	// Recovery: five probes in a row (one every 50 ms) answered 201 within -p99.
	var streakStart time.Time
	streak := 0
	for time.Since(ended) < cfg.RecoverMax && ctx.Err() == nil {
		t0 := time.Now()
		status, err := post(ctx, many, "")
		if err == nil && status == http.StatusCreated && time.Since(t0) <= cfg.P99 {
			if streak == 0 {
				streakStart = t0
			}
			if streak++; streak == 5 {
				rep.Recovered = max(streakStart.Sub(ended), 0)
				break
			}
		} else {
			streak = 0
		}
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	if err := phaseErr(ctx, core); err != nil {
		return nil, err
	}
	stored := map[string]bool{}
	rows, err := pool.Query(ctx, `SELECT idempotency_key FROM activities WHERE idempotency_key LIKE 'ov-%'`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		stored[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rep.Stored = len(stored)
	for k, o := range outcomes {
		switch {
		case o.err != nil:
			rep.GaveUp++
			if stored[k] {
				rep.Abandoned++
			}
		case o.status == http.StatusCreated:
			rep.Acked++
			if !stored[k] {
				return rep, fmt.Errorf("acknowledged write %s is not stored", k)
			}
		case o.status == http.StatusServiceUnavailable:
			rep.Shed++
		default:
			rep.Failed++
		}
	}
	rep.Achieved = float64(rep.Acked) / cfg.Overload.Seconds()
	if rep.Rows, _, err = verify(ctx, pool, seed); err != nil {
		return rep, err
	}
	rep.LoadEnd = runinfo.LoadAvg()
	logf("overload: %.0f req/s offered; %d acknowledged, %d shed, %d given up (%d of them stored: abandoned), %d failed, %d skipped; recovered after %v",
		rep.Offered, rep.Acked, rep.Shed, rep.GaveUp, rep.Abandoned, rep.Failed, rep.Skipped, rep.Recovered)
	md := rep.Markdown()
	fmt.Fprint(stdout, md)
	if cfg.Out != "" {
		out := procs.OutPath(root, cfg.Out)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return rep, err
		}
		if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
			return rep, err
		}
		logf("report written to %s", out)
	}
	return rep, nil
}

// openLoop offers rate requests/s for d (whatever the answers), each through send, and
// measures them; Within says whether the step stayed within the bound: p99 ≤ bound,
// under 1% failed, and at least 90% of the rate achieved.
func openLoop(ctx context.Context, rate float64, d, bound time.Duration, send func(context.Context) bool) step {
	var mu sync.Mutex
	var lat []time.Duration
	s := step{Rate: rate}
	var wg sync.WaitGroup
	var outstanding atomic.Int64
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	for time.Since(start) < d && ctx.Err() == nil {
		<-tick.C
		for due := int(time.Since(start).Seconds() * rate); s.Sent+s.Skipped < due; {
			if outstanding.Load() >= maxOutstanding {
				s.Skipped++
				continue
			}
			s.Sent++
			outstanding.Add(1)
			wg.Go(func() {
				defer outstanding.Add(-1)
				t0 := time.Now()
				ok := send(ctx)
				took := time.Since(t0)
				mu.Lock()
				if ok {
					lat = append(lat, took)
				} else {
					s.Failed++
				}
				mu.Unlock()
			})
		}
	}
	tick.Stop()
	wg.Wait()
	slices.Sort(lat)
	s.OK = len(lat)
	s.Achieved = float64(s.OK) / d.Seconds()
	s.P50, s.P99 = closedloop.Percentile(lat, 0.50), closedloop.Percentile(lat, 0.99)
	s.Within = s.P99 <= bound && s.Failed*100 < max(s.Sent, 1) && s.Skipped == 0 && s.Achieved >= 0.9*rate
	return s
}

// Markdown is the report.
func (r *OverloadReport) Markdown() string {
	var b strings.Builder
	c := r.Config
	rec := "not within " + c.RecoverMax.String()
	if r.Recovered >= 0 {
		rec = r.Recovered.Round(10 * time.Millisecond).String()
	}
	fmt.Fprintf(&b, "# Core overload test: capacity, then %g× capacity for %v\n\n", c.Factor, c.Overload)
	fmt.Fprintf(&b, "Written by `bench core-overload` on %s.\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "## Result\n\n| | value |\n|---|--:|\n")
	for _, sc := range []struct {
		what       string
		core, base float64
	}{{fmt.Sprintf("%d conversations", c.Conversations), r.CoreCap, r.BaselineCap}, {"one conversation", r.HotCoreCap, r.HotBaselineCap}} {
		fmt.Fprintf(&b, "| core capacity on %s (highest rate with p99 ≤ %v) | %.0f req/s |\n", sc.what, c.P99, sc.core)
		fmt.Fprintf(&b, "| baseline capacity on %s (pgx, same pool, same run) | %.0f req/s |\n", sc.what, sc.base)
		if sc.base > 0 {
			fmt.Fprintf(&b, "| capacity core/baseline on %s | %.2f |\n", sc.what, sc.core/sc.base)
		}
	}
	fmt.Fprintf(&b, "| overload offered (target %.0f) | %.0f req/s |\n", r.CoreCap*c.Factor, r.Offered)
	fmt.Fprintf(&b, "| acknowledged during the overload | %d (%.0f req/s) |\n", r.Acked, r.Achieved)
	fmt.Fprintf(&b, "| shed (503 at once) | %d |\n| given up by their clients (%v) | %d |\n", r.Shed, c.Timeout, r.GaveUp)
	fmt.Fprintf(&b, "| stored after their client gave up | %d of %d stored |\n", r.Abandoned, r.Stored)
	fmt.Fprintf(&b, "| other failures / not sent (generator bound) | %d / %d |\n", r.Failed, r.Skipped)
	fmt.Fprintf(&b, "| **time to recover** (5 probes in a row within %v) | **%s** |\n\n", c.P99, rec)
	fmt.Fprintf(&b, "At the end: %d activities, seq gap-free in every conversation; every acknowledged write stored.\n\n", r.Rows)
	for _, t := range []struct {
		name  string
		steps []step
	}{
		{fmt.Sprintf("core, %d conversations", c.Conversations), r.Core}, {fmt.Sprintf("baseline, %d conversations", c.Conversations), r.Baseline},
		{"core, one conversation", r.HotCore}, {"baseline, one conversation", r.HotBaseline},
	} {
		fmt.Fprintf(&b, "## Capacity search: %s\n\n| offered req/s | achieved | p50 | p99 | failed | within |\n|--:|--:|--:|--:|--:|---|\n", t.name)
		for _, s := range t.steps {
			fmt.Fprintf(&b, "| %.0f | %.0f | %s | %s | %d | %v |\n", s.Rate, s.Achieved, runinfo.Latency(s.P50), runinfo.Latency(s.P99), s.Failed, s.Within)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "## Environment\n\n- go: %s; CPU: %s, nproc %d\n- load average at start / end: %s / %s\n- source: %s\n",
		r.Machine.GoVersion, r.Machine.CPU, r.Machine.NProc, r.LoadStart, r.LoadEnd, r.Source)
	fmt.Fprintf(&b, "- command: `bench core-overload %s`\n\n", strings.Join(c.Args, " "))
	b.WriteString(`## Method

- One throwaway PostgreSQL, one real ` + "`core serve`" + ` (default bounds; the generator's address in
  TRUSTED_PROXIES, as Envoy's would be, so that the per-address connection cap does not apply to it), a
  tenant and conversations as in ` + "`bench core`" + `; activity POSTs through the tenant API, spread
  round robin over the conversations, then all to one more conversation (where every writer queues on
  its row lock); the overload goes over the many conversations.
- Capacity: open loop (requests sent at a fixed rate, whatever the answers) in steps of growing rate;
  a step is within the bound when its p99 is, under 1% failed and 90% of the rate was achieved; a step
  out of the bound is run once more, and the search ends when that one is out too. The
  baseline (the generator inserting the same rows through pgx with the same pool size) is searched the
  same way in the same run, so the ratio holds on a shared machine.
- Overload: open loop at the factor times the core's capacity, each request with an idempotency key
  and the clients' timeout; then a probe every 50 ms until five in a row are answered within the
  bound. Afterwards the stored keys show which writes completed after their client had given up.
- The load generator shares the machine: at high rates it may not offer the full rate (see "offered").
`)
	return b.String()
}
