package rlsload

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/converger/edge/bench/benchtls"
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
		reqs := closedloop.NewGRPCRequests(Method, w.Len(), w.Bytes, func() closedloop.Reply { return new(Reply) })
		for _, conns := range cfg.Conns {
			res, err := closedloop.RunGRPCScenario(ctx, cfg.Loop, conns, s.Name, s.Summary, w, w.Prologue, reqs,
				closedloop.Endpoint{Name: "sidecar", Addr: scAddr, Proc: sc}, closedloop.Endpoint{Name: "no-op", Addr: noopAddr, Proc: noop}, Aims, logf)
			if err != nil {
				return nil, err
			}
			rep.Scenarios = append(rep.Scenarios, res)
		}
	}
	rep.LoadEnd = runinfo.LoadAvg()
	rep.Counters, _ = promscrape.Scrape(ctx, benchtls.URL(scHTTP, "/metrics"), []string{"converger_rls_requests_total{", "converger_rls_hits_total{", "converger_rls_over_limit_total{"})
	rep.summarize()

	rep.WriteText(stdout)
	if out, err := procs.WriteReport(root, cfg.Out, rep.Markdown()); err != nil {
		return rep, err
	} else if out != "" {
		logf("report written to %s", out)
	}
	return rep, nil
}
