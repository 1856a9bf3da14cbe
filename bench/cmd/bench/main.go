// Command bench is the project's load and accuracy harness. Each subcommand is one test;
// run `bench` without arguments for the list.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/converger/edge/bench/authzload"
	"github.com/converger/edge/bench/benchtls"
	"github.com/converger/edge/bench/clusterload"
	"github.com/converger/edge/bench/coreload"
	"github.com/converger/edge/bench/noop"
	"github.com/converger/edge/bench/rlsload"
	"github.com/converger/edge/shared/cmdline"
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
	{"cluster-scale", "what replication costs each node as the cluster grows: CPU, traffic, checks served and refused per node at N = 1, 3, 10, 20, against a baseline binary", runClusterScale},
	{"core", "activity POSTs through the core against pgx inserting the same rows directly (throughput, p50, p99, ratios)", runCore},
	{"forward-auth", "load-test the sidecar's HTTP forward-auth check against a no-op HTTP handler, and Caddy and nginx with the check against without it", runForwardAuth},
	{"rls", "load-test the sidecar's rate limit service (ShouldRateLimit) against a no-op server: hot key, many keys, keys over limit", runRLS},
	{"core-overload", "the core's capacity (p99 within a bound) against the pgx baseline's, then an overload at a multiple of it and the time to recover", runCoreOverload},
	{"noop", "serve an Authorization/Check that allows everything and a RateLimitService/ShouldRateLimit that answers OK (started by authz and rls)", runNoop},
	{"noop-forward-auth", "serve an HTTP check that allows everything (started by forward-auth)", runNoopForwardAuth},
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
	case "-version", "--version", "version":
		fmt.Println(cmdline.Version("bench"))
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
	fmt.Fprintf(w, "usage: bench <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-18s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun `bench <command> -h` for a command's flags; `bench --version` prints the build.\n")
}

// parse parses a subcommand's flags; done is true when the command should exit with code
// (after -h, --version or a bad command line).
func parse(fs *flag.FlagSet, args []string) (code int, done bool) {
	return cmdline.Parse(fs, args, false, os.Stdout, os.Stderr)
}

// loadTest is one load test as runLoad drives it: its flags, the check of their values
// once parsed, the run, which reports whether the test missed its aim, and the files it
// writes (by flag name: the flag's value).
type loadTest struct {
	flags    func(*flag.FlagSet)
	validate func(fs *flag.FlagSet, args []string) error
	run      func(ctx context.Context) (missed bool, err error)
	outputs  map[string]*string
	// mutualTLS offers -mtls: the connections to the sidecar's ports and to the no-op
	// over mutual TLS (bench/benchtls).
	mutualTLS bool
}

// resultsDir holds the committed figures; a run writes there only with -update-results.
const resultsDir = "bench/results/"

// runLoad parses a load test's flags and runs it. Exit status: 2 for bad usage, 1 when
// the run failed or (with -strict) missed its aim.
func runLoad(ctx context.Context, name string, args []string, t loadTest) int {
	fs := flag.NewFlagSet("bench "+name, flag.ContinueOnError)
	t.flags(fs)
	update := fs.Bool("update-results", false, "write the report into "+resultsDir+" (the committed figures) instead of a new folder under bench/out/")
	var mtls *bool
	if t.mutualTLS {
		mtls = fs.Bool("mtls", false, "the connections to the sidecars' gRPC and HTTP ports (and to the no-op, where the test has one) over mutual TLS, with certificates made for the run")
	}
	if code, done := parse(fs, args); done {
		return code
	}
	if mtls != nil && *mtls {
		cleanup, err := benchtls.Enable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
			return 1
		}
		defer cleanup()
	}
	if err := t.validate(fs, args); err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		return 2
	}
	freshOutputs(fs, name, t.outputs, *update, time.Now())
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

// freshOutputs moves the files a run writes by default, under resultsDir, to a folder of
// their own, bench/out/<UTC time>-<name>/, unless update asks for resultsDir. A path given
// on the command line is kept as given.
func freshOutputs(fs *flag.FlagSet, name string, outputs map[string]*string, update bool, now time.Time) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	dir := "bench/out/" + now.UTC().Format("20060102T150405Z") + "-" + name + "/"
	for flagName, p := range outputs {
		if set[flagName] || update || !strings.HasPrefix(*p, resultsDir) {
			continue
		}
		*p = dir + strings.TrimPrefix(*p, resultsDir)
	}
}

func runAuthz(ctx context.Context, name string, args []string) int {
	return runAuthzLoad(ctx, name, args, authzload.DefaultConfig())
}

func runForwardAuth(ctx context.Context, name string, args []string) int {
	return runAuthzLoad(ctx, name, args, authzload.DefaultForwardAuthConfig())
}

func runAuthzLoad(ctx context.Context, name string, args []string, cfg authzload.Config) int {
	return runLoad(ctx, name, args, loadTest{
		flags: cfg.RegisterFlags,
		validate: func(_ *flag.FlagSet, args []string) error {
			cfg.Args = args
			return cfg.Validate()
		},
		run: func(ctx context.Context) (bool, error) {
			if cfg.Overload.Enabled {
				return false, authzload.RunOverload(ctx, cfg, os.Stdout, os.Stderr)
			}
			rep, err := authzload.Run(ctx, cfg, os.Stdout, os.Stderr)
			return err == nil && cfg.Strict && !rep.Pass, err
		},
		outputs:   map[string]*string{"out": &cfg.Out, "overload-out": &cfg.Overload.Out},
		mutualTLS: true,
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
		outputs:   map[string]*string{"out": &cfg.Out, "plot": &cfg.Plot},
		mutualTLS: true,
	})
}

func runClusterScale(ctx context.Context, name string, args []string) int {
	cfg := clusterload.DefaultScaleConfig()
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
			_, err := clusterload.RunScale(ctx, cfg, os.Stdout, os.Stderr)
			return false, err
		},
		outputs: map[string]*string{"out": &cfg.Out},
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
		outputs: map[string]*string{"out": &cfg.Out},
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
		outputs: map[string]*string{"out": &cfg.Out},
	})
}

func runRLS(ctx context.Context, name string, args []string) int {
	cfg := rlsload.DefaultConfig()
	return runLoad(ctx, name, args, loadTest{
		flags: cfg.RegisterFlags,
		validate: func(_ *flag.FlagSet, args []string) error {
			cfg.Args = args
			return cfg.Validate()
		},
		run: func(ctx context.Context) (bool, error) {
			if cfg.Overload.Enabled {
				return false, rlsload.RunOverload(ctx, cfg, os.Stdout, os.Stderr)
			}
			rep, err := rlsload.Run(ctx, cfg, os.Stdout, os.Stderr)
			return err == nil && cfg.Strict && !rep.Pass, err
		},
		mutualTLS: true,
		outputs:   map[string]*string{"out": &cfg.Out, "overload-out": &cfg.Overload.Out},
	})
}

func runNoop(ctx context.Context, name string, args []string) int {
	return serveNoop(ctx, name, args, nil, noop.Serve)
}

func runNoopForwardAuth(ctx context.Context, name string, args []string) int {
	var server string
	return serveNoop(ctx, name, args, func(fs *flag.FlagSet) {
		fs.StringVar(&server, "server", "net/http", "HTTP server: net/http or fasthttp")
	}, func(ctx context.Context, addr string, ready func(net.Addr)) error {
		switch server {
		case "net/http":
			return noop.ServeHTTP(ctx, addr, ready)
		case "fasthttp":
			return noop.ServeFastHTTP(ctx, addr, ready)
		}
		return fmt.Errorf("-server %q: must be net/http or fasthttp", server)
	})
}

// serveNoop parses a no-op server's flags (those of flags beyond -addr) and runs it
// until ctx ends.
func serveNoop(ctx context.Context, name string, args []string, flags func(*flag.FlagSet), serve func(context.Context, string, func(net.Addr)) error) int {
	fs := flag.NewFlagSet("bench "+name, flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address; port 0 picks a free one, printed on stdout")
	if flags != nil {
		flags(fs)
	}
	if code, done := parse(fs, args); done {
		return code
	}
	err := serve(ctx, *addr, func(a net.Addr) { fmt.Println(a.String()) })
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		return 1
	}
	return 0
}
