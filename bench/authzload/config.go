// Package authzload is the authorization load test: it seeds a throwaway PostgreSQL, starts
// the sidecar and a no-op Authorization server, drives Check with an Envoy-like mix against
// both in alternating rounds, and reports throughput, latency and their ratios.
package authzload

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/converger/edge/bench/grpcload"
)

// The targets the sidecar must meet, relative to the no-op server.
const (
	MinThroughputRatio = 0.90 // sidecar req/s ≥ 90% of the no-op's
	MaxP99Ratio        = 1.20 // sidecar p99 ≤ 1.2 × the no-op's
)

// Config is the load test's configuration, one field per flag.
type Config struct {
	Sidecar string  // the sidecar binary
	Keys    int     // distinct keys in the mix
	Over    float64 // share of keys driven over their limit
	grpcload.Loop
	Seed   uint64 // of the mix
	Out    string // markdown report; "" writes none
	Strict bool   // exit 1 when a target is missed

	// Args are the command-line arguments the configuration came from, for the report's
	// command that reproduces the run.
	Args []string
}

// DefaultConfig returns the defaults of the flags.
func DefaultConfig() Config {
	return Config{
		Sidecar: "bin/sidecar",
		Keys:    10_000,
		Over:    0.1,
		Loop: grpcload.Loop{Concurrency: 32, Conns: 4, Warmup: 2 * time.Second, Duration: 5 * time.Second,
			Rounds: 3, MaxRequests: 2_000_000},
		Seed: 1,
		Out:  "bench/results/authz.md",
	}
}

// RegisterFlags defines the flags of `bench authz` on fs, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Sidecar, "sidecar", c.Sidecar, "sidecar binary (relative paths: from the repository root, else the working directory)")
	fs.IntVar(&c.Keys, "keys", c.Keys, "distinct keys in the mix: API keys, tokens, channel secrets, publishable keys, inbound channel ids, client IPs")
	fs.Float64Var(&c.Over, "over", c.Over, "share of the keys driven over their limit (0 to 0.5)")
	c.Loop.RegisterFlags(fs)
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the request mix")
	fs.StringVar(&c.Out, "out", c.Out, "markdown report (relative paths: from the repository root); empty: none")
	fs.BoolVar(&c.Strict, "strict", c.Strict, fmt.Sprintf("exit 1 when the sidecar misses a target (throughput ≥ %.2f×, p99 ≤ %.2f× the no-op's)", MinThroughputRatio, MaxP99Ratio))
}

// maxRun bounds the whole measurement: the Converger tokens of the mix are issued once and
// live 30 minutes.
const maxRun = 25 * time.Minute

// Validate refuses values the load test cannot run with.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Sidecar != "", "-sidecar: required")
	check(c.Keys >= 100 && c.Keys <= 1_000_000, "-keys %d: must be from 100 to 1000000", c.Keys)
	check(c.Over >= 0 && c.Over <= 0.5, "-over %g: must be from 0 to 0.5", c.Over)
	errs = append(errs, c.Loop.Check()...)
	if total := time.Duration(c.Rounds) * 2 * (c.Warmup + c.Duration); total > maxRun {
		errs = append(errs, fmt.Errorf("-rounds × 2 × (-warmup + -duration) = %v: at most %v, since the tokens of the mix expire after 30 minutes", total, maxRun))
	}
	return errors.Join(errs...)
}
