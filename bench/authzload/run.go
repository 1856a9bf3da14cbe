package authzload

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/runinfo"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/debpkg"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/proxyserver"
)

// Run runs the load test: setup, the alternating rounds, the report on stdout and in
// cfg.Out. Progress goes to stderr. Every process it starts is stopped before it returns,
// also on error and when ctx ends (Ctrl-C).
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (rep *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench "+cfg.Name()+": "+format+"\n", args...) }
	root := procs.RepoRoot()
	sidecarBin, err := procs.FindSidecar(root, cfg.Sidecar)
	if err != nil {
		return nil, err
	}
	rep = &Report{Config: cfg, Started: time.Now(), Machine: runinfo.Describe(ctx), LoadStart: runinfo.LoadAvg()}

	// PostgreSQL, schema and data.
	t0 := time.Now()
	pg, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		return nil, err
	}
	defer func() {
		if stopErr := pg.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	if err := migrations.Up(ctx, pg.URL()); err != nil {
		return nil, err
	}
	rep.Setup.Postgres = time.Since(t0)
	t0 = time.Now()
	pop, err := NewPopulation(cfg.Keys, cfg.Over, cfg.Seed, time.Now())
	if err != nil {
		return nil, err
	}
	if err := Seed(ctx, pg.URL(), pop); err != nil {
		return nil, err
	}
	rep.Setup.Seed = time.Since(t0)
	t0 = time.Now()
	mix, err := BuildMix(pop, cfg.Seed, time.Now())
	if err != nil {
		return nil, err
	}
	rep.Setup.Mix = time.Since(t0)
	rep.Setup.Tenants, rep.Setup.Channels, rep.Setup.Keys, rep.Setup.HotKeys = len(pop.Tenants), len(pop.Channels), len(pop.Keys), pop.HotKeys()
	rep.Setup.Requests, rep.Setup.Prologue, rep.Setup.Bytes = mix.Len(), mix.Prologue, mix.Size()
	for k := range numKinds {
		rep.Setup.Kinds[k][0], rep.Setup.Kinds[k][1] = pop.KindCount(k)
	}
	logf("PostgreSQL ready in %v; seeded %d tenants and %d channels, issued %d tokens in %v; built %d requests (%.0f MB) in %v",
		rep.Setup.Postgres.Round(time.Millisecond), len(pop.Tenants), len(pop.Channels), len(pop.Normal[KindToken])+len(pop.Hot[KindToken]),
		rep.Setup.Seed.Round(time.Millisecond), mix.Len(), float64(mix.Size())/1e6, rep.Setup.Mix.Round(time.Millisecond))

	// The two targets, each a separate process. The forward-auth checks come from the
	// load generator, a proxy on loopback, which the sidecar must trust.
	http := cfg.Interface == "http"
	trusted, noopCommand := TrustedProxies, "noop-authz"
	if http {
		trusted, noopCommand = TrustedProxies+",127.0.0.1", "noop-forward-auth"
	}
	sc, scAddr, scHTTP, err := startSidecar(ctx, sidecarBin, pg.URL(), pop.TokenVerifyKey, trusted, stderr)
	if err != nil {
		return nil, err
	}
	defer sc.Stop()
	noop, noopAddr, err := startNoop(ctx, noopCommand, stderr)
	if err != nil {
		return nil, err
	}
	defer noop.Stop()
	if http {
		scAddr = scHTTP
	}
	sidecar := &target{name: "sidecar", addr: scAddr, proc: sc, deniedKeys: make([]bool, len(pop.Keys))}
	noopT := &target{name: "no-op", addr: noopAddr, proc: noop, deniedKeys: make([]bool, len(pop.Keys))}
	var checks [][]byte
	if http {
		if checks, err = forwardAuthRequests(mix); err != nil {
			return nil, err
		}
	}
	for _, t := range []*target{sidecar, noopT} {
		defer t.close()
		if http {
			t.client = newHTTPCaller(t.addr, cfg.Concurrency, checks)
			continue
		}
		c, err := dialGRPC(ctx, t.addr, cfg.Conns, cfg.Concurrency, mix)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
		t.client = c
	}
	logf("sidecar %s (%s) and no-op server %s ready; %d rounds of %v warm-up + %v measured per target",
		scAddr, sidecarBin, noopAddr, cfg.Rounds, cfg.Warmup, cfg.Duration)

	r := newRunner(mix, cfg.Concurrency, cfg.MaxRequests)
	var warmupErrs int
	if rep.Phases, warmupErrs, err = rounds(ctx, cfg, r, sidecar, noopT, logf); err != nil {
		return nil, err
	}
	rep.WarmupErrors += warmupErrs
	if http && len(cfg.ProxyList()) > 0 {
		reqs, err := clientRequests(mix)
		if err != nil {
			return nil, err
		}
		for _, name := range cfg.ProxyList() {
			pr, err := measureProxy(ctx, cfg, root, name, scHTTP, noopAddr, r, reqs, len(pop.Keys), logf)
			if err != nil {
				return nil, err
			}
			rep.Proxies = append(rep.Proxies, pr)
		}
	}
	rep.LoadEnd = runinfo.LoadAvg()
	for k, d := range sidecar.deniedKeys {
		if !d {
			continue
		}
		rep.KeysDenied++
		if pop.Keys[k].Hot {
			rep.HotKeysDenied++
			rep.DeniedByKind[pop.Keys[k].Kind][1]++
		} else {
			rep.DeniedByKind[pop.Keys[k].Kind][0]++
		}
	}
	rep.SentSidecar, rep.SentNoop = sidecar.sent.Load(), noopT.sent.Load()
	rep.Counters, _ = promscrape.Scrape(ctx, "http://"+scHTTP+"/metrics", counterPrefixes) // none when it cannot
	rep.summarize()

	rep.WriteText(stdout)
	if cfg.Out != "" {
		out := procs.OutPath(root, cfg.Out)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return rep, err
		}
		if err := os.WriteFile(out, []byte(rep.Markdown()), 0o644); err != nil {
			return rep, err
		}
		logf("report written to %s", out)
	}
	return rep, nil
}

// rounds runs cfg.Rounds rounds of a target and its baseline, in alternating order,
// and returns their measured phases and the errors of the warm-ups.
func rounds(ctx context.Context, cfg Config, r *runner, t, base *target, logf func(string, ...any)) (phases []PhaseResult, warmupErrors int, err error) {
	for round := 1; round <= cfg.Rounds; round++ {
		order := []*target{t, base}
		if round%2 == 0 {
			order[0], order[1] = order[1], order[0]
		}
		for _, t := range order {
			if cfg.Warmup > 0 {
				w := r.phase(ctx, t, cfg.Warmup, false)
				// The first warm-up goes on until the prologue, every key once, has been
				// sent, so that the sidecar's caches hold every key before measuring.
				for limit := time.Now().Add(time.Minute); t.sent.Load() < uint64(r.mix.Prologue) && time.Now().Before(limit) && ctx.Err() == nil; {
					more := r.phase(ctx, t, cfg.Warmup/4+10*time.Millisecond, false)
					w.Errors += more.Errors
					if w.FirstErr == "" {
						w.FirstErr = more.FirstErr
					}
				}
				warmupErrors += w.Errors
				if w.Errors > 0 {
					logf("round %d %s warm-up: %d errors, first: %s", round, t.name, w.Errors, w.FirstErr)
				}
			}
			if err := phaseErr(ctx, t); err != nil {
				return nil, 0, err
			}
			res := r.phase(ctx, t, cfg.Duration, true)
			if err := phaseErr(ctx, t); err != nil {
				return nil, 0, err
			}
			res.Round = round
			phases = append(phases, res)
			logf("round %d %-7s %8.0f req/s  p50 %v  p99 %v  errors %d  429 %.1f%%  CPU/req %s (generator %s)",
				round, t.name, res.RPS, runinfo.Latency(res.P50), runinfo.Latency(res.P99), res.Errors, pct(res.Denied, res.Requests), fmtCPU(res.TargetCPU), fmtCPU(res.GenCPU))
			if res.Errors > 0 {
				logf("round %d %s: first error: %s", round, t.name, res.FirstErr)
			}
		}
	}
	return phases, warmupErrors, nil
}

// measureProxy runs the proxy with its shipped configuration (the check on every request)
// and alone (a plain reverse proxy), both in front of the no-op HTTP server, and drives
// both with the clients' requests of the mix in alternating rounds.
func measureProxy(ctx context.Context, cfg Config, root, name, sidecarHTTP, upstream string, r *runner, reqs [][]byte, keys int, logf func(string, ...any)) (ProxyResult, error) {
	res := ProxyResult{Name: name}
	if !debpkg.IsExecutable(proxyserver.Binaries[name]) {
		res.Skipped = fmt.Sprintf("%s is not installed (%s; Debian's %s package)", name, proxyserver.Binaries[name], name)
		logf("skipping %s: %s", name, res.Skipped)
		return res, nil
	}
	var targets [2]*target
	for i, sidecar := range []string{sidecarHTTP, ""} {
		dir, err := os.MkdirTemp("", "bench-"+name+"-")
		if err != nil {
			return res, err
		}
		defer os.RemoveAll(dir)
		p, err := proxyserver.Start(ctx, proxyserver.Options{Proxy: name, Root: root, Sidecar: sidecar, Upstream: upstream, Dir: dir})
		if err != nil {
			return res, err
		}
		defer p.Stop()
		t := &target{name: name + " + check", addr: p.Addr, proc: p, deniedKeys: make([]bool, keys)}
		if sidecar == "" {
			t.name = name + " alone"
		}
		t.client = newHTTPCaller(p.Addr, cfg.Concurrency, reqs)
		defer t.close()
		targets[i] = t
	}
	logf("%s with the check %s and alone %s ready, in front of the no-op server", name, targets[0].addr, targets[1].addr)
	var err error
	res.Phases, res.WarmupErrors, err = rounds(ctx, cfg, r, targets[0], targets[1], logf)
	if err != nil {
		return res, err
	}
	res.pair = summarizePair(res.Phases, cfg.Rounds, targets[0].name, targets[1].name)
	return res, nil
}

// phaseErr reports an interruption or a target that died.
func phaseErr(ctx context.Context, t *target) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return t.proc.Exited()
}

// counterPrefixes are the sidecar metrics the report shows.
var counterPrefixes = []string{
	"converger_sidecar_cache_lookups_total{",
	"converger_sidecar_db_errors_total{",
	"converger_rate_limit_exceeded_count{",
	"converger_sidecar_checks_total{",
}
