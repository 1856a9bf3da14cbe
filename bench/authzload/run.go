package authzload

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/converger/edge/bench/grpcload"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/bench/runinfo"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
)

// Run runs the load test: setup, the alternating rounds, the report on stdout and in
// cfg.Out. Progress goes to stderr. Every process it starts is stopped before it returns,
// also on error and when ctx ends (Ctrl-C).
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (rep *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench authz: "+format+"\n", args...) }
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

	// The two targets, each a separate process.
	sc, scAddr, scHTTP, err := procs.StartSidecar(ctx, sidecarBin, []string{
		"DATABASE_URL=" + pg.URL(), "TOKEN_VERIFY_KEYS=" + pop.TokenVerifyKey, "TRUSTED_PROXIES=" + TrustedProxies,
		"LOG_LEVEL=warn", "LOG_FORMAT=text",
	}, stderr)
	if err != nil {
		return nil, err
	}
	defer sc.Stop()
	noop, noopAddr, err := procs.StartNoop(ctx, stderr)
	if err != nil {
		return nil, err
	}
	defer noop.Stop()
	sidecar := grpcload.NewTarget("sidecar", scAddr, sc, len(pop.Keys))
	noopT := grpcload.NewTarget("no-op", noopAddr, noop, len(pop.Keys))
	for _, t := range []*grpcload.Target{sidecar, noopT} {
		defer t.Close()
		if err := t.Dial(ctx, cfg.Conns); err != nil {
			return nil, err
		}
	}
	logf("sidecar %s (%s) and no-op server %s ready; %d rounds of %v warm-up + %v measured per target",
		scAddr, sidecarBin, noopAddr, cfg.Rounds, cfg.Warmup, cfg.Duration)

	r := grpcload.NewRunner(workload{mix}, cfg.Concurrency, cfg.MaxRequests)
	rep.Phases, rep.WarmupErrors, err = r.RunRounds(ctx, []*grpcload.Target{sidecar, noopT}, grpcload.Rounds{
		Rounds: cfg.Rounds, Warmup: cfg.Warmup, Duration: cfg.Duration, Prologue: mix.Prologue, Logf: logf,
	})
	if err != nil {
		return nil, err
	}
	rep.LoadEnd = runinfo.LoadAvg()
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
	rep.Counters, _ = promscrape.Scrape(ctx, "http://"+scHTTP+"/metrics", counterPrefixes) // none when it cannot
	rep.summarize()

	rep.WriteText(stdout)
	if out, err := procs.WriteReport(root, cfg.Out, rep.Markdown()); err != nil {
		return rep, err
	} else if out != "" {
		logf("report written to %s", out)
	}
	return rep, nil
}

// workload is the mix as the load generator sends it.
type workload struct{ *Mix }

func (workload) Method() string           { return rawcheck.Method }
func (w workload) Class(pos int) int      { return int(w.Mix.Class(pos)) }
func (workload) Classes() int             { return int(numClasses) }
func (w workload) Keys() int              { return len(w.Pop.Keys) }
func (workload) NewReply() grpcload.Reply { return new(rawcheck.Reply) }

// counterPrefixes are the sidecar metrics the report shows.
var counterPrefixes = []string{
	"converger_sidecar_cache_lookups_total{",
	"converger_sidecar_db_errors_total{",
	"converger_rate_limit_exceeded_count{",
	"converger_sidecar_checks_total{",
}
