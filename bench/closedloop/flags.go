package closedloop

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Loop is what the load tests' flags say of their closed loops and rounds.
type Loop struct {
	Concurrency int // requests in flight per target (closed loop)
	// Conns are the numbers of gRPC connections per target, used round robin, that the
	// load test measures with, each in a run of its own (HTTP: one per loop).
	Conns       Counts
	Warmup      time.Duration // per target and round, not measured
	Duration    time.Duration // measured, per target and round
	Rounds      int
	MaxRequests int // per measured phase
}

// RegisterFlags defines the loop's flags on fs, with l's values as defaults: -conns only
// for gRPC, since an HTTP loop has a connection of its own.
func (l *Loop) RegisterFlags(fs *flag.FlagSet, grpc bool) {
	fs.IntVar(&l.Concurrency, "concurrency", l.Concurrency, "requests in flight per target (closed loop)")
	if grpc {
		fs.Var(&l.Conns, "conns", "gRPC connections per target, used round robin: a comma-separated list, each measured on its own (e.g. 1,4)")
	}
	fs.DurationVar(&l.Warmup, "warmup", l.Warmup, "unmeasured warm-up per target and round")
	fs.DurationVar(&l.Duration, "duration", l.Duration, "measured phase per target and round")
	fs.IntVar(&l.Rounds, "rounds", l.Rounds, "rounds; each runs both targets, in alternating order")
	fs.IntVar(&l.MaxRequests, "max-requests", l.MaxRequests, "at most this many requests per measured phase")
}

// Check returns what is wrong with the loop's values.
func (l Loop) Check() []error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(l.Concurrency >= 1 && l.Concurrency <= 4096, "-concurrency %d: must be from 1 to 4096", l.Concurrency)
	check(len(l.Conns) >= 1 && len(l.Conns) <= 8, "-conns %s: give 1 to 8 numbers", l.Conns)
	for _, n := range l.Conns {
		check(n >= 1 && n <= 256, "-conns %s: %d is not from 1 to 256", l.Conns, n)
	}
	check(l.Warmup >= 0, "-warmup %v: must not be negative", l.Warmup)
	check(l.Duration >= 100*time.Millisecond, "-duration %v: must be at least 100ms", l.Duration)
	check(l.Rounds >= 1 && l.Rounds <= 100, "-rounds %d: must be from 1 to 100", l.Rounds)
	check(l.MaxRequests >= l.Concurrency && l.MaxRequests <= 100_000_000, "-max-requests %d: must be from -concurrency to 100000000", l.MaxRequests)
	return errs
}

// Flags lists the loop's flags and their values, for a report (-conns only for gRPC).
func (l Loop) Flags(grpc bool) [][2]string {
	rows := [][2]string{{"-concurrency", fmt.Sprint(l.Concurrency)}}
	if grpc {
		rows = append(rows, [2]string{"-conns", l.Conns.String()})
	}
	return append(rows, [][2]string{
		{"-warmup", l.Warmup.String()},
		{"-duration", l.Duration.String()},
		{"-rounds", fmt.Sprint(l.Rounds)},
		{"-max-requests", fmt.Sprint(l.MaxRequests)},
	}...)
}

// Counts is a flag's list of whole numbers, written comma-separated.
type Counts []int

func (c Counts) String() string {
	parts := make([]string, len(c))
	for i, n := range c {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

// Set reads a comma-separated list; numbers repeated count once.
func (c *Counts) Set(s string) error {
	var out Counts
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q is not a number", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	*c = out
	return nil
}
