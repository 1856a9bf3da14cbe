// Package coreload is the core's activity load test: it starts a throwaway PostgreSQL and
// a real `core serve` process (no sidecar), and drives activity POSTs through the core's
// tenant API against a baseline measured in the same run — the same row inserted by the
// load generator itself through pgx, with the same seq update in one transaction — over
// many conversations and over one hot conversation, in alternating rounds.
package coreload

import (
	"errors"
	"flag"
	"fmt"
	"runtime"
	"time"
)

// MinThroughputRatio is the aim: over many conversations, the core's requests/s at
// least nine tenths of the baseline's.
const MinThroughputRatio = 0.90

// Config is the load test's configuration, one field per flag.
type Config struct {
	Core          string        // the core binary
	Conversations int           // conversations of the "many" scenario
	Concurrency   int           // requests in flight (closed loop), for both targets
	Warmup        time.Duration // per target, scenario and round, not measured
	Duration      time.Duration // measured, per target, scenario and round
	Rounds        int
	TextBytes     int    // bytes of text per activity
	Out           string // markdown report; "" writes none
	Strict        bool   // exit 1 when the aim is missed

	// Args are the command-line arguments the configuration came from, for the report's
	// command that reproduces the run.
	Args []string
}

// DefaultConfig returns the defaults of the flags.
func DefaultConfig() Config {
	return Config{
		Core:          "bin/core",
		Conversations: 1000,
		Concurrency:   32,
		Warmup:        2 * time.Second,
		Duration:      5 * time.Second,
		Rounds:        3,
		TextBytes:     100,
		Out:           "bench/results/core.md",
	}
}

// RegisterFlags defines the flags of `bench core` on fs, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Core, "core", c.Core, "core binary (relative paths: from the repository root, else the working directory)")
	fs.IntVar(&c.Conversations, "conversations", c.Conversations, "conversations the \"many\" scenario spreads its activities over")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "requests in flight per target (closed loop)")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "unmeasured warm-up per target, scenario and round")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "measured phase per target, scenario and round")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "rounds; each runs both scenarios on both targets, targets in alternating order")
	fs.IntVar(&c.TextBytes, "text-bytes", c.TextBytes, "bytes of text per activity")
	fs.StringVar(&c.Out, "out", c.Out, "markdown report (relative paths: from the repository root); empty: none")
	fs.BoolVar(&c.Strict, "strict", c.Strict, fmt.Sprintf("exit 1 when the core misses the aim (≥ %.2f× the baseline's throughput over many conversations) or a request fails", MinThroughputRatio))
}

// PoolSize is the number of PostgreSQL connections each target gets: the core's pool is
// pgxpool's default, max(4, number of CPUs) — its DATABASE_URL cannot carry pool_max_conns,
// since `core serve` migrates through the same URL and PostgreSQL refuses the unknown
// parameter — and the baseline's pool is made the same size.
func (c Config) PoolSize() int { return max(4, runtime.NumCPU()) }

// Validate refuses values the load test cannot run with.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Core != "", "-core: required")
	check(c.Conversations >= 1 && c.Conversations <= 1_000_000, "-conversations %d: must be from 1 to 1000000", c.Conversations)
	check(c.Concurrency >= 1 && c.Concurrency <= 1024, "-concurrency %d: must be from 1 to 1024", c.Concurrency)
	check(c.Warmup >= 0, "-warmup %v: must not be negative", c.Warmup)
	check(c.Duration >= 100*time.Millisecond, "-duration %v: must be at least 100ms", c.Duration)
	check(c.Rounds >= 1 && c.Rounds <= 100, "-rounds %d: must be from 1 to 100", c.Rounds)
	check(c.TextBytes >= 1 && c.TextBytes <= 65536, "-text-bytes %d: must be from 1 to 65536 (the core's default text limit)", c.TextBytes)
	return errors.Join(errs...)
}
