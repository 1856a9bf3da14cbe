// Package rlsload is the rate limit service's load test: it starts the sidecar with a rule
// directory and the bench's no-op server, drives ShouldRateLimit with Envoy-like requests in
// three scenarios (one hot key, many keys, keys over their limit) against both in
// alternating rounds, and reports throughput, latency and their ratios.
package rlsload

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/overload"
)

// The aims the sidecar must meet in every scenario on one connection, relative to the
// no-op server (built with gRPC's standard codec): at least its throughput, at most its
// p99 and its CPU per call. Runs on more connections are reported against the same aims.
const (
	MinThroughputRatio = 1.0 // sidecar req/s ≥ the no-op's
	MaxP99Ratio        = 1.0 // sidecar p99 ≤ the no-op's
	MaxCPURatio        = 1.0 // sidecar CPU per call ≤ the no-op's
)

// Aims are the aims as the runner checks them.
var Aims = closedloop.Aims{MinThroughput: MinThroughputRatio, MaxP99: MaxP99Ratio, MaxCPU: MaxCPURatio}

// Config is the load test's configuration, one field per flag.
type Config struct {
	Sidecar         string // the sidecar binary
	Keys            int    // client addresses of the many-keys scenario
	OverKeys        int    // client addresses of the over-limit scenario
	closedloop.Loop        // per scenario and number of connections
	Seed            uint64 // of the order of the keys
	Out             string // markdown report; "" writes none
	Strict          bool   // exit 1 when a target is missed
	// Overload is the open-loop overload mode, run instead of the scenarios when enabled.
	Overload overload.Config
	// Args are the command-line arguments, for the report's command that reproduces the run.
	Args []string
}

// DefaultConfig returns the defaults of the flags.
func DefaultConfig() Config {
	return Config{
		Sidecar:  "bin/sidecar",
		Keys:     10_000,
		OverKeys: 1_000,
		Loop: closedloop.Loop{Concurrency: 32, Conns: closedloop.Counts{1, 4}, Warmup: time.Second, Duration: 3 * time.Second,
			Rounds: 3, MaxRequests: 2_000_000},
		Seed:     1,
		Out:      "bench/results/rls.md",
		Overload: overload.DefaultConfig("bench/results/rls-overload.md"),
	}
}

// RegisterFlags defines the flags of `bench rls` on fs, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Sidecar, "sidecar", c.Sidecar, "sidecar binary (relative paths: from the repository root, else the working directory)")
	fs.IntVar(&c.Keys, "keys", c.Keys, "client addresses of the many-keys scenario")
	fs.IntVar(&c.OverKeys, "over-keys", c.OverKeys, "client addresses of the over-limit scenario, each over its limit after its first request")
	c.Loop.RegisterFlags(fs, true) // per scenario and number of connections
	c.Overload.RegisterFlags(fs)
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the order of the keys")
	fs.StringVar(&c.Out, "out", c.Out, "markdown report (relative paths: from the repository root); empty: none")
	fs.BoolVar(&c.Strict, "strict", c.Strict, fmt.Sprintf("exit 1 when the sidecar misses an aim in a scenario on one connection (throughput ≥ %.2f×, p99 ≤ %.2f×, CPU per call ≤ %.2f× the no-op's)", MinThroughputRatio, MaxP99Ratio, MaxCPURatio))
}

// maxRun bounds the whole measurement.
const maxRun = 30 * time.Minute

// Validate refuses values the load test cannot run with.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Sidecar != "", "-sidecar: required")
	check(c.Keys >= 1 && c.Keys <= 1_000_000, "-keys %d: must be from 1 to 1000000", c.Keys)
	check(c.OverKeys >= 1 && c.OverKeys <= 1_000_000, "-over-keys %d: must be from 1 to 1000000", c.OverKeys)
	errs = append(errs, c.Loop.Check()...)
	if c.Overload.Enabled {
		errs = append(errs, c.Overload.Check()...)
	}
	if total := time.Duration(len(scenarios)*len(c.Conns)*c.Rounds) * 2 * (c.Warmup + c.Duration); total > maxRun {
		errs = append(errs, fmt.Errorf("3 scenarios × connection counts × -rounds × 2 × (-warmup + -duration) = %v: at most %v", total, maxRun))
	}
	return errors.Join(errs...)
}
