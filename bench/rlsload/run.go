package rlsload

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/runinfo"
)

// Run runs the load test: the sidecar (with Rules in a temporary RLS_CONFIG_DIR) and the
// no-op server, each scenario's alternating rounds, the report on stdout and in cfg.Out.
// Progress goes to stderr. Every process it starts is stopped before it returns, also on
// error and when ctx ends (Ctrl-C).
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench rls: "+format+"\n", args...) }
	root := procs.RepoRoot()
	bin, err := procs.FindSidecar(root, cfg.Sidecar)
	if err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg, Started: time.Now(), Machine: runinfo.Describe(ctx), LoadStart: runinfo.LoadAvg()}

	dir, err := os.MkdirTemp("", "bench-rls-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(Rules), 0o644); err != nil {
		return nil, err
	}
	sc, scAddr, scHTTP, err := procs.StartSidecar(ctx, bin, []string{"RLS_CONFIG_DIR=" + dir, "LOG_LEVEL=warn", "LOG_FORMAT=text"}, stderr)
	if err != nil {
		return nil, err
	}
	defer sc.Stop()
	noop, noopAddr, err := procs.StartNoop(ctx, "noop", stderr)
	if err != nil {
		return nil, err
	}
	defer noop.Stop()
	logf("sidecar %s (%s) and no-op server %s ready; per scenario %d rounds of %v warm-up + %v measured per target",
		scAddr, bin, noopAddr, cfg.Rounds, cfg.Warmup, cfg.Duration)

	for _, s := range scenarios {
		n := map[string]int{"hot": 1, "keys": cfg.Keys, "over": cfg.OverKeys}[s.Name]
		w, err := BuildWorkload(s.Name, n, cfg.Seed)
		if err != nil {
			return nil, err
		}
		res, err := runScenario(ctx, cfg, w, s, scAddr, sc, noopAddr, noop, logf)
		if err != nil {
			return nil, err
		}
		rep.Scenarios = append(rep.Scenarios, res)
	}
	rep.LoadEnd = runinfo.LoadAvg()
	rep.Counters, _ = promscrape.Scrape(ctx, "http://"+scHTTP+"/metrics", []string{"converger_rls_requests_total{", "converger_rls_hits_total{", "converger_rls_over_limit_total{"})
	rep.summarize()

	rep.WriteText(stdout)
	if out, err := procs.WriteReport(root, cfg.Out, rep.Markdown()); err != nil {
		return rep, err
	} else if out != "" {
		logf("report written to %s", out)
	}
	return rep, nil
}

func runScenario(ctx context.Context, cfg Config, w *Workload, s scenario, scAddr string, sc *procs.Proc, noopAddr string, noop *procs.Proc,
	logf func(string, ...any)) (ScenarioResult, error) {
	reqs := closedloop.NewGRPCRequests(Method, w.Len(), w.Bytes, func() closedloop.Reply { return new(Reply) })
	var targets []*closedloop.Target
	for _, t := range []struct {
		name, addr string
		proc       *procs.Proc
	}{{"sidecar", scAddr, sc}, {"no-op", noopAddr, noop}} {
		c, err := closedloop.DialGRPC(ctx, t.addr, cfg.Conns, cfg.Concurrency, reqs)
		if err != nil {
			return ScenarioResult{}, fmt.Errorf("%s: %w", t.name, err)
		}
		target := closedloop.NewTarget(t.name, t.addr, t.proc, c, w.Keys())
		defer target.Close()
		targets = append(targets, target)
	}
	sidecar := targets[0]
	logf("scenario %s: %s; %d keys, %d requests", s.Name, s.Summary, w.Keys(), w.Len())
	r := closedloop.NewRunner(w, cfg.Concurrency, cfg.MaxRequests)
	phases, warmupErrors, err := r.RunRounds(ctx, targets, closedloop.Rounds{
		Rounds: cfg.Rounds, Warmup: cfg.Warmup, Duration: cfg.Duration, Prologue: w.Prologue,
		Logf: func(format string, args ...any) { logf(s.Name+": "+format, args...) },
	})
	if err != nil {
		return ScenarioResult{}, err
	}
	res := ScenarioResult{Name: s.Name, Summary: s.Summary, Keys: w.Keys(), Phases: phases, WarmupErrors: warmupErrors,
		Comparison: closedloop.Compare(phases, "sidecar", "no-op")}
	for _, d := range sidecar.DeniedKeys {
		if d {
			res.KeysDenied++
		}
	}
	res.Pass = res.Comparison.Meets(MinThroughputRatio, MaxP99Ratio) && warmupErrors == 0
	return res, nil
}
