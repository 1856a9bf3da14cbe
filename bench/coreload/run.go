package coreload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/runinfo"
	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

// Run runs the load test: setup, the rounds, the report on stdout and in cfg.Out.
// Progress goes to stderr. Every process it starts is stopped before it returns, also on
// error and when ctx ends (Ctrl-C).
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (rep *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench core: "+format+"\n", args...) }
	root := procs.RepoRoot()
	coreBin, err := FindBinary(root, cfg.Core)
	if err != nil {
		return nil, err
	}
	rep = &Report{Config: cfg, Started: time.Now(), Machine: runinfo.Describe(ctx), LoadStart: runinfo.LoadAvg(),
		Source: runinfo.Source(ctx, root, "core", "shared")}

	st, err := startStack(ctx, coreBin, cfg.Conversations, stderr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if stopErr := st.stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	rep.Setup.Postgres, rep.Setup.Seed = st.setupPostgres, st.setupSeed
	logf("PostgreSQL ready in %v; seeded a tenant, a channel and %d+1 conversations in %v",
		rep.Setup.Postgres.Round(time.Millisecond), cfg.Conversations, rep.Setup.Seed.Round(time.Millisecond))
	core, base, pool, seed := st.core, st.base, st.pool, st.seed

	text := strings.Repeat("x", cfg.TextBytes)
	body := []byte(`{"type":"message","text":"` + text + `"}`)
	coreT := newCoreTarget(base, seed.APIKey, body, append([]string{seed.Hot}, seed.Many...), cfg.Concurrency, core.Pid())
	defer coreT.close()
	baseT := &baselineTarget{pool: pool, tenantID: seed.TenantID, text: text}
	scenarios := []struct {
		name string
		p    *picker
	}{
		{ScenarioMany, &picker{convs: seed.Many}},
		{ScenarioHot, &picker{convs: []string{seed.Hot}}},
	}
	logf("core %s at %s; both targets with %d PostgreSQL connections; %d rounds × 2 scenarios × 2 targets × (%v warm-up + %v measured), concurrency %d",
		coreBin, base, cfg.PoolSize(), cfg.Rounds, cfg.Warmup, cfg.Duration, cfg.Concurrency)

	for round := 1; round <= cfg.Rounds; round++ {
		for _, sc := range scenarios {
			order := []target{coreT, baseT}
			if round%2 == 0 {
				order[0], order[1] = order[1], order[0]
			}
			for _, t := range order {
				if cfg.Warmup > 0 {
					w := runPhase(ctx, t, sc.p, cfg.Concurrency, cfg.Warmup, false, st.pg.Pid())
					rep.WarmupErrors += w.Errors
					if w.Errors > 0 {
						logf("round %d %s %s warm-up: %d errors, first: %s", round, sc.name, t.name(), w.Errors, w.FirstErr)
					}
				}
				if err := phaseErr(ctx, core); err != nil {
					return nil, err
				}
				res := runPhase(ctx, t, sc.p, cfg.Concurrency, cfg.Duration, true, st.pg.Pid())
				if err := phaseErr(ctx, core); err != nil {
					return nil, err
				}
				res.Round, res.Scenario = round, sc.name
				rep.Phases = append(rep.Phases, res)
				logf("round %d %-4s %-8s %7.0f req/s  p50 %s  p99 %s  errors %d  CPU/req core %s, generator %s, PostgreSQL %s (stack %s), other %s",
					round, sc.name, t.name(), res.RPS, runinfo.Latency(res.P50), runinfo.Latency(res.P99), res.Errors,
					coreCPU(res.Target, res.CoreCPU), fmtCPU(res.GenCPU), fmtCPU(res.PGCPU), fmtCPU(res.StackCPU()), fmtCPU(res.RestCPU))
				if res.Errors > 0 {
					logf("round %d %s %s: first error: %s", round, sc.name, t.name(), res.FirstErr)
				}
			}
		}
	}
	rep.LoadEnd = runinfo.LoadAvg()
	if rep.Rows, rep.HotSeq, err = verify(ctx, pool, seed); err != nil {
		return rep, err
	}
	rep.summarize()

	rep.WriteText(stdout)
	if out, err := procs.WriteReport(root, cfg.Out, rep.Markdown()); err != nil {
		return rep, err
	} else if out != "" {
		logf("report written to %s", out)
	}
	return rep, nil
}

// stack is what a load test runs against: a throwaway PostgreSQL with the schema and
// the seed, a `core serve` over it, and the baseline's pool of as many connections as
// the core's.
type stack struct {
	pg                       *pgserver.Server
	seed                     SeedData
	core                     *procs.Proc
	base                     string
	pool                     *pgxpool.Pool
	setupPostgres, setupSeed time.Duration
}

// startStack starts a stack (the core with the extra variables); stop releases it,
// also after a failed start.
func startStack(ctx context.Context, coreBin string, conversations int, log io.Writer, coreEnv ...string) (st *stack, err error) {
	st = &stack{}
	defer func() {
		if err != nil {
			_ = st.stop()
		}
	}()
	t0 := time.Now()
	if st.pg, err = pgserver.Start(ctx, pgserver.Options{}); err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, st.pg.URL()); err != nil {
		return st, err
	}
	st.setupPostgres = time.Since(t0)
	t0 = time.Now()
	encKey := credentials.GenerateEncryptionKey()
	if st.seed, err = Seed(ctx, st.pg.URL(), encKey, conversations); err != nil {
		return st, err
	}
	st.setupSeed = time.Since(t0)
	if st.core, st.base, err = startCore(ctx, coreBin, st.pg.URL(), encKey, st.seed, log, coreEnv...); err != nil {
		return st, err
	}
	pc, err := pgxpool.ParseConfig(st.pg.URL())
	if err != nil {
		return st, err
	}
	pc.MaxConns = int32(Config{}.PoolSize())
	st.pool, err = pgxpool.NewWithConfig(ctx, pc)
	return st, err
}

func (st *stack) stop() error {
	if st.pool != nil {
		st.pool.Close()
	}
	if st.core != nil {
		st.core.Stop()
	}
	if st.pg != nil {
		return st.pg.Stop()
	}
	return nil
}

// phaseErr reports an interruption or a core that died.
func phaseErr(ctx context.Context, core *procs.Proc) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return core.Exited()
}

// SeedData is what the load runs against.
type SeedData struct {
	TenantID, APIKey string
	Many             []string // conversation ids
	Hot              string
}

// Seed creates the tenant (through the core's store, so its API key is the core's),
// a webhook channel (no echo replies), the conversations of the "many" scenario and the
// hot conversation.
func Seed(ctx context.Context, dbURL, encKey string, conversations int) (SeedData, error) {
	sealer, err := credentials.ParseEncryptionKey(encKey)
	if err != nil {
		return SeedData{}, err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return SeedData{}, err
	}
	defer pool.Close()
	st := store.New(pool, sealer, activity.DefaultLimits)
	t, key, err := st.As("bench").CreateTenant(ctx, "bench")
	if err != nil {
		return SeedData{}, fmt.Errorf("seeding the tenant: %w", err)
	}
	ch, _, err := st.As("bench").CreateChannel(ctx, t.ID, "bench", "webhook", "duplex")
	if err != nil {
		return SeedData{}, fmt.Errorf("seeding the channel: %w", err)
	}
	rows, err := pool.Query(ctx, `INSERT INTO conversations (tenant_id, channel_id)
		SELECT $1, $2 FROM generate_series(1, $3) RETURNING id::text`, t.ID, ch.ID, conversations+1)
	if err != nil {
		return SeedData{}, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return SeedData{}, fmt.Errorf("seeding the conversations: %w", err)
	}
	return SeedData{TenantID: t.ID, APIKey: key, Many: ids[1:], Hot: ids[0]}, nil
}

// verify checks what the run left: every activity has its own seq, gap-free per
// conversation (seq 1..last_seq). It returns the rows and the hot conversation's last seq.
func verify(ctx context.Context, pool *pgxpool.Pool, seed SeedData) (rows, hotSeq int64, err error) {
	var bad int64
	err = pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM activities),
		       (SELECT last_seq FROM conversations WHERE id = $1),
		       (SELECT count(*) FROM conversations c WHERE c.last_seq <>
		           (SELECT count(*) FROM activities a WHERE a.conversation_id = c.id AND a.seq BETWEEN 1 AND c.last_seq))`,
		seed.Hot).Scan(&rows, &hotSeq, &bad)
	if err != nil {
		return 0, 0, err
	}
	if bad > 0 {
		return rows, hotSeq, fmt.Errorf("%d conversations have seq gaps or extra rows", bad)
	}
	return rows, hotSeq, nil
}

// CoreEnvPrefixes are the core's variables, which the bench sets itself and keeps from
// leaking in from the caller's environment.
var CoreEnvPrefixes = []string{"CORE_", "DATABASE_", "TOKEN_", "ENCRYPTION_KEY=", "PUBLIC_URL=", "LIMITER_ADDR=",
	"AUTHZ_ADDR=", "TRUSTED_PROXIES=", "ACTIVITY_MAX_", "UPLOAD_MAX_BYTES=", "LOG_"}

func coreEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		keep := true
		for _, p := range CoreEnvPrefixes {
			keep = keep && !strings.HasPrefix(kv, p)
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}

// startCore starts `core serve` on a free loopback port, with extra variables, and waits
// until it answers the tenant API. It returns the process and the base URL.
func startCore(ctx context.Context, bin, dbURL, encKey string, seed SeedData, log io.Writer, extra ...string) (*procs.Proc, string, error) {
	signing, err := token.GenerateKey()
	if err != nil {
		return nil, "", err
	}
	var lastErr error
	for range 3 {
		ports, err := procs.FreePorts(1)
		if err != nil {
			return nil, "", err
		}
		base := "http://" + ports[0]
		cmd := exec.Command(bin, "serve")
		cmd.Env = append(coreEnv(),
			"CORE_ADDR="+ports[0],
			"CORE_OPS_ADDR=127.0.0.1:0",
			"PUBLIC_URL="+base,
			"DATABASE_URL="+dbURL,
			"TOKEN_SIGNING_KEY="+signing,
			"ENCRYPTION_KEY="+encKey,
			"LOG_LEVEL=warn",
			"LOG_FORMAT=text",
		)
		cmd.Env = append(cmd.Env, extra...)
		p, err := procs.Start("core", cmd, &procs.TailWriter{Prefix: "core: ", W: log})
		if err != nil {
			return nil, "", err
		}
		err = procs.WaitReady(ctx, p, base+"/api/v1/conversations/"+seed.Hot, http.Header{"X-Api-Key": {seed.APIKey}})
		if err == nil {
			return p, base, nil
		}
		p.Stop()
		if !strings.Contains(p.Out.Tail(), "address already in use") {
			return nil, "", err
		}
		lastErr = err // the port was taken in between: try another
	}
	return nil, "", lastErr
}

// FindBinary resolves the binary named by the -core flag: absolute, or relative to the
// repository root, then to the working directory.
func FindBinary(root, bin string) (string, error) {
	cands := []string{bin}
	if !filepath.IsAbs(bin) {
		cands = []string{filepath.Join(root, bin), bin}
	}
	for _, c := range cands {
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return filepath.Abs(c)
		}
	}
	return "", errors.New("-core " + bin + ": no executable there; build it with `go build -o bin/core ./core/cmd/core`")
}
