package closedloop

import (
	"flag"
	"fmt"
	"time"
)

// Loop is what the load tests' flags say of their closed loops and rounds.
type Loop struct {
	Concurrency int           // requests in flight per target (closed loop)
	Conns       int           // gRPC connections per target, used round robin (HTTP: one per loop)
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
		fs.IntVar(&l.Conns, "conns", l.Conns, "gRPC connections per target, used round robin")
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
	check(l.Conns >= 1 && l.Conns <= 256, "-conns %d: must be from 1 to 256", l.Conns)
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
		rows = append(rows, [2]string{"-conns", fmt.Sprint(l.Conns)})
	}
	return append(rows, [][2]string{
		{"-warmup", l.Warmup.String()},
		{"-duration", l.Duration.String()},
		{"-rounds", fmt.Sprint(l.Rounds)},
		{"-max-requests", fmt.Sprint(l.MaxRequests)},
	}...)
}
