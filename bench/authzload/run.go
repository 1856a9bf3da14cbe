package authzload

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/converger/edge/bench/benchtls"
	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/bench/runinfo"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/debpkg"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/proxyserver"
)

// Run runs the load test: setup, the alternating rounds of the mix and of the scenarios,
// the report on stdout and in cfg.Out. Progress goes to stderr. Every process it starts
// is stopped before it returns, also on error and when ctx ends (Ctrl-C).
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
	noopCommand, noopArgs := "noop", []string(nil)
	if !cfg.grpc() {
		noopCommand, noopArgs = "noop-forward-auth", []string{"-server", cfg.NoopServer}
	}
	noop, noopAddr, err := procs.StartNoop(ctx, noopCommand, stderr, noopArgs...)
	if err != nil {
		return nil, err
	}
	defer noop.Stop()
	if cfg.Mix {
		if err := runMix(ctx, cfg, rep, root, sidecarBin, noop, noopAddr, stderr, logf); err != nil {
			return nil, err
		}
	}
	if cfg.grpc() && cfg.Scenarios {
		if rep.Scenarios, err = runScenarios(ctx, cfg, sidecarBin, closedloop.Endpoint{Name: "no-op", Addr: noopAddr, Proc: noop}, stderr, logf); err != nil {
			return nil, err
		}
	}
	rep.LoadEnd = runinfo.LoadAvg()
	rep.summarize()

	rep.WriteText(stdout)
	if out, err := procs.WriteReport(root, cfg.Out, rep.Markdown()); err != nil {
		return rep, err
	} else if out != "" {
		logf("report written to %s", out)
	}
	return rep, nil
}

// runMix measures the mix: a throwaway PostgreSQL seeded with its tenants and channels,
// the sidecar over it, the mix's rounds against it and the no-op, and for forward-auth
// the proxies.
func runMix(ctx context.Context, cfg Config, rep *Report, root, sidecarBin string, noop *procs.Proc, noopAddr string, stderr io.Writer, logf func(string, ...any)) (err error) {
	// PostgreSQL, schema and data.
	t0 := time.Now()
	pg, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := pg.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	if err := migrations.Up(ctx, pg.URL()); err != nil {
		return err
	}
	rep.Setup.Postgres = time.Since(t0)
	t0 = time.Now()
	pop, err := NewPopulation(cfg.Keys, cfg.Over, cfg.Seed, time.Now())
	if err != nil {
		return err
	}
	if err := Seed(ctx, pg.URL(), pop); err != nil {
		return err
	}
	rep.Setup.Seed = time.Since(t0)
	t0 = time.Now()
	mix, err := BuildMix(pop, cfg.Seed, time.Now())
	if err != nil {
		return err
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

	// The sidecar, a separate process. The forward-auth checks come from the load
	// generator, a proxy on loopback, which the sidecar must trust.
	trusted := TrustedProxies
	if !cfg.grpc() {
		trusted = TrustedProxies + ",127.0.0.1"
	}
	sc, scAddr, scHTTP, err := procs.StartSidecar(ctx, sidecarBin, []string{
		"DATABASE_URL=" + pg.URL(), "TOKEN_VERIFY_KEYS=" + pop.TokenVerifyKey, "TRUSTED_PROXIES=" + trusted,
		"LOG_LEVEL=warn", "LOG_FORMAT=text",
	}, stderr)
	if err != nil {
		return err
	}
	defer sc.Stop()
	if !cfg.grpc() {
		scAddr = scHTTP
	}
	// How the targets are called: with the mix's CheckRequests over gRPC, or with the
	// forward-auth checks a proxy sends for them over HTTP; built once for both.
	var dial func(addr string) (closedloop.Caller, error)
	if cfg.grpc() {
		reqs := closedloop.NewGRPCRequests(rawcheck.Method, mix.Len(), mix.Bytes, func() closedloop.Reply { return new(rawcheck.Reply) })
		dial = func(addr string) (closedloop.Caller, error) {
			return closedloop.DialGRPC(ctx, addr, cfg.MixConns, cfg.Concurrency, reqs)
		}
	} else {
		checks, err := forwardAuthRequests(mix)
		if err != nil {
			return err
		}
		// With -mtls, over mutual TLS to the sidecar's HTTP port and to the no-op alike.
		tlsCfg, err := benchtls.ClientConfig()
		if err != nil {
			return err
		}
		dial = func(addr string) (closedloop.Caller, error) {
			return closedloop.NewHTTPSCaller(addr, cfg.Concurrency, checks, tlsCfg), nil
		}
	}
	var targets []*closedloop.Target
	for _, t := range []struct {
		name, addr string
		proc       closedloop.Process
	}{{"sidecar", scAddr, sc}, {"no-op", noopAddr, noop}} {
		c, err := dial(t.addr)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		target := closedloop.NewTarget(t.name, t.addr, t.proc, c, len(pop.Keys))
		defer target.Close()
		targets = append(targets, target)
	}
	sidecar, noopT := targets[0], targets[1]
	logf("sidecar %s (%s) and no-op server %s ready; %d rounds of %v warm-up + %v measured per target",
		scAddr, sidecarBin, noopAddr, cfg.Rounds, cfg.Warmup, cfg.Duration)

	r := closedloop.NewRunner(workload{mix}, cfg.Concurrency, cfg.MaxRequests)
	rounds := closedloop.Rounds{Rounds: cfg.Rounds, Warmup: cfg.Warmup, Duration: cfg.Duration, Prologue: mix.Prologue, Logf: logf}
	if rep.Phases, rep.WarmupErrors, err = r.RunRounds(ctx, targets, rounds); err != nil {
		return err
	}
	if !cfg.grpc() && len(cfg.ProxyList()) > 0 {
		reqs, err := clientRequests(mix)
		if err != nil {
			return err
		}
		for _, name := range cfg.ProxyList() {
			if benchtls.Enabled() {
				// The proxies' shipped configurations ask the sidecar in plain text.
				pr := ProxyResult{Name: name, Skipped: "-mtls: the proxies' configurations ask the sidecar in plain text"}
				logf("skipping %s: %s", name, pr.Skipped)
				rep.Proxies = append(rep.Proxies, pr)
				continue
			}
			pr, err := measureProxy(ctx, cfg, root, name, scHTTP, noopAddr, r, rounds, reqs, len(pop.Keys), logf)
			if err != nil {
				return err
			}
			rep.Proxies = append(rep.Proxies, pr)
		}
	}
	for k, d := range sidecar.DeniedKeys {
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
	rep.SentSidecar, rep.SentNoop = sidecar.Sent.Load(), noopT.Sent.Load()
	rep.Counters, _ = promscrape.Scrape(ctx, benchtls.URL(scHTTP, "/metrics"), counterPrefixes) // none when it cannot
	return nil
}

// workload is the mix as the runner sends it.
type workload struct{ *Mix }

func (w workload) Class(pos int) int { return int(w.Mix.Class(pos)) }
func (workload) Classes() int        { return int(numClasses) }
func (w workload) Keys() int         { return len(w.Pop.Keys) }

// measureProxy runs the proxy with its shipped configuration (the check on every request)
// and alone (a plain reverse proxy), both in front of the no-op HTTP server, and drives
// both with the clients' requests of the mix in alternating rounds.
func measureProxy(ctx context.Context, cfg Config, root, name, sidecarHTTP, upstream string, r *closedloop.Runner, rounds closedloop.Rounds,
	reqs [][]byte, keys int, logf func(string, ...any)) (ProxyResult, error) {
	res := ProxyResult{Name: name}
	if !debpkg.IsExecutable(proxyserver.Binaries[name]) {
		res.Skipped = fmt.Sprintf("%s is not installed (%s; Debian's %s package)", name, proxyserver.Binaries[name], name)
		logf("skipping %s: %s", name, res.Skipped)
		return res, nil
	}
	var targets []*closedloop.Target
	for _, sidecar := range []string{sidecarHTTP, ""} {
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
		tname := name + " + check"
		if sidecar == "" {
			tname = name + " alone"
		}
		t := closedloop.NewTarget(tname, p.Addr, p, closedloop.NewHTTPCaller(p.Addr, cfg.Concurrency, reqs), keys)
		defer t.Close()
		targets = append(targets, t)
	}
	logf("%s with the check %s and alone %s ready, in front of the no-op server", name, targets[0].Addr, targets[1].Addr)
	var err error
	res.Phases, res.WarmupErrors, err = r.RunRounds(ctx, targets, rounds)
	if err != nil {
		return res, err
	}
	res.Comparison = closedloop.Compare(res.Phases, targets[0].Name, targets[1].Name)
	return res, nil
}

// counterPrefixes are the sidecar metrics the report shows.
var counterPrefixes = []string{
	"converger_sidecar_cache_lookups_total{",
	"converger_sidecar_db_errors_total{",
	"converger_rate_limit_exceeded_count{",
	"converger_sidecar_checks_total{",
}
