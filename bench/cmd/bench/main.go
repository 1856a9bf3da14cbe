// Command bench is the project's load and accuracy harness. Each subcommand is one test;
// run `bench` without arguments for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/converger/edge/bench/authzload"
	"github.com/converger/edge/bench/clusterload"
	"github.com/converger/edge/bench/coreload"
	"github.com/converger/edge/bench/noopauthz"
)

// command is a subcommand: run parses its arguments and returns the exit status.
type command struct {
	name, summary string
	run           func(ctx context.Context, name string, args []string) int
}

// commands are the subcommands, in the order usage lists them. Add new ones here.
var commands = []command{
	{"authz", "load-test the sidecar's ext_authz Check against a no-op server (throughput, p50, p99, ratios)", runAuthz},
	{"cluster", "sidecar clusters: allowed per window against the limit, and sync traffic, by cluster size, sync interval and share mode", runCluster},
	{"core", "activity POSTs through the core against pgx inserting the same rows directly (throughput, p50, p99, ratios)", runCore},
	{"core-overload", "the core's capacity (p99 within a bound) against the pgx baseline's, then an overload at a multiple of it and the time to recover", runCoreOverload},
	{"noop-authz", "serve an Authorization/Check that allows everything (started by authz)", runNoopAuthz},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(os.Stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, c.name, args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "bench: unknown command %q\n\n", args[0])
	usage(os.Stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: bench <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun `bench <command> -h` for a command's flags.\n")
}

// parse parses a subcommand's flags; done is true when the command should exit with code.
func parse(fs *flag.FlagSet, args []string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: unexpected arguments: %v\n", fs.Name(), fs.Args())
		return 2, true
	}
	return 0, false
}

// loadTest is one load test as runLoad drives it: its flags, the check of their values
// once parsed, and the run, which reports whether the test missed its aim.
type loadTest struct {
	flags    func(*flag.FlagSet)
	validate func(fs *flag.FlagSet, args []string) error
	run      func(ctx context.Context) (missed bool, err error)
}

// runLoad parses a load test's flags and runs it. Exit status: 2 for bad usage, 1 when
// the run failed or (with -strict) missed its aim.
func runLoad(ctx context.Context, name string, args []string, t loadTest) int {
	fs := flag.NewFlagSet("bench "+name, flag.ContinueOnError)
	t.flags(fs)
	if code, done := parse(fs, args); done {
		return code
	}
	if err := t.validate(fs, args); err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		return 2
	}
	missed, err := t.run(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		return 1
	}
	if missed {
		return 1
	}
	return 0
}

func runAuthz(ctx context.Context, name string, args []string) int {
	cfg := authzload.DefaultConfig()
	return runLoad(ctx, name, args, loadTest{
		flags: cfg.RegisterFlags,
		validate: func(_ *flag.FlagSet, args []string) error {
			cfg.Args = args
			return cfg.Validate()
		},
		run: func(ctx context.Context) (bool, error) {
			rep, err := authzload.Run(ctx, cfg, os.Stdout, os.Stderr)
			return err == nil && cfg.Strict && !rep.Pass, err
		},
	})
}

func runCluster(ctx context.Context, name string, args []string) int {
	cfg := clusterload.DefaultConfig()
	return runLoad(ctx, name, args, loadTest{
		flags: cfg.RegisterFlags,
		validate: func(fs *flag.FlagSet, args []string) error {
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			cfg.ApplyQuick(set)
			cfg.Args = args
			return cfg.Validate()
		},
		run: func(ctx context.Context) (bool, error) {
			rep, err := clusterload.Run(ctx, cfg, os.Stdout, os.Stderr)
			return err == nil && cfg.Strict && !(rep.AimPass && rep.SinglePass), err
		},
	})
}

func runCore(ctx context.Context, name string, args []string) int {
	cfg := coreload.DefaultConfig()
	return runLoad(ctx, name, args, loadTest{
		flags: cfg.RegisterFlags,
		validate: func(_ *flag.FlagSet, args []string) error {
			cfg.Args = args
			return cfg.Validate()
		},
		run: func(ctx context.Context) (bool, error) {
			rep, err := coreload.Run(ctx, cfg, os.Stdout, os.Stderr)
			return err == nil && cfg.Strict && !rep.Pass, err
		},
	})
}

func runCoreOverload(ctx context.Context, name string, args []string) int {
	cfg := coreload.DefaultOverloadConfig()
	return runLoad(ctx, name, args, loadTest{
		flags: cfg.RegisterFlags,
		validate: func(_ *flag.FlagSet, args []string) error {
			cfg.Args = args
			return cfg.Validate()
		},
		run: func(ctx context.Context) (bool, error) {
			_, err := coreload.RunOverload(ctx, cfg, os.Stdout, os.Stderr)
			return false, err
		},
	})
}

func runNoopAuthz(ctx context.Context, name string, args []string) int {
	fs := flag.NewFlagSet("bench "+name, flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address; port 0 picks a free one, printed on stdout")
	if code, done := parse(fs, args); done {
		return code
	}
	err := noopauthz.Serve(ctx, *addr, func(a net.Addr) { fmt.Println(a.String()) })
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		return 1
	}
	return 0
}
