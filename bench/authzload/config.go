// Package authzload is the authorization load test: it seeds a throwaway PostgreSQL, starts
// the sidecar and a no-op server, drives the sidecar's check with an Envoy-like mix against
// both in alternating rounds, and reports throughput, latency and their ratios. The check
// is ext_authz's Check over gRPC (bench authz) or the HTTP forward-auth check (bench
// forward-auth), which also measures Caddy and nginx with the check against without it.
package authzload

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/overload"
)

// The targets the sidecar must meet with the mix, relative to the no-op server.
const (
	MinThroughputRatio = 0.90 // sidecar req/s ≥ 90% of the no-op's
	MaxP99Ratio        = 1.20 // sidecar p99 ≤ 1.2 × the no-op's
)

// ScenarioAims are the aims of the scenarios (hot, keys, over) on one connection,
// relative to the no-op server built with gRPC's standard codec: at least its
// throughput, at most its p99 and its CPU per check. Runs on more connections are
// reported against the same aims.
var ScenarioAims = closedloop.Aims{MinThroughput: 1.0, MaxP99: 1.0, MaxCPU: 1.0}

// Config is the load test's configuration, one field per flag.
type Config struct {
	// Interface is the check driven: "grpc" (ext_authz Check) or "http" (forward-auth).
	Interface string
	Sidecar   string  // the sidecar binary
	Keys      int     // distinct keys in the mix, and of the keys scenario
	Over      float64 // share of keys driven over their limit
	// Mix measures the mix (on MixConns gRPC connections); Scenarios (gRPC only) the hot,
	// keys and over scenarios, on each of Loop.Conns, with OverKeys keys over the limit.
	Mix       bool
	MixConns  int
	Scenarios bool
	OverKeys  int
	closedloop.Loop
	Seed   uint64 // of the mix
	Out    string // markdown report; "" writes none
	Strict bool   // exit 1 when a target is missed
	// Proxies (http only) are the proxies measured with the check against without it:
	// "caddy", "nginx", comma-separated; "" none.
	Proxies string
	// NoopServer (http only) is the no-op check's HTTP server: "net/http" (the
	// standard library's, the baseline of the targets) or "fasthttp" (the server the
	// sidecar's HTTP port runs, to see what the decision costs over it).
	NoopServer string

	// Overload is the open-loop overload mode (gRPC only), run instead of the mix and
	// the scenarios when enabled.
	Overload overload.Config

	// Args are the command-line arguments the configuration came from, for the report's
	// command that reproduces the run.
	Args []string
}

// DefaultConfig returns the defaults of the flags.
func DefaultConfig() Config {
	return Config{
		Interface: "grpc",
		Sidecar:   "bin/sidecar",
		Keys:      10_000,
		Over:      0.1,
		Mix:       true,
		MixConns:  4,
		Scenarios: true,
		OverKeys:  1_000,
		Loop: closedloop.Loop{Concurrency: 32, Conns: closedloop.Counts{1, 4}, Warmup: 2 * time.Second, Duration: 5 * time.Second,
			Rounds: 3, MaxRequests: 2_000_000},
		Seed:     1,
		Out:      "bench/results/authz.md",
		Overload: overload.DefaultConfig("bench/results/authz-overload.md"),
	}
}

// DefaultForwardAuthConfig returns the defaults of `bench forward-auth`.
func DefaultForwardAuthConfig() Config {
	c := DefaultConfig()
	c.Interface = "http"
	c.Out = "bench/results/forward-auth.md"
	c.Proxies = "caddy,nginx"
	c.NoopServer = "net/http"
	c.Scenarios = false
	return c
}

// Name is the bench command that runs the configuration: authz or forward-auth.
func (c Config) Name() string {
	if c.Interface == "http" {
		return "forward-auth"
	}
	return "authz"
}

// grpc reports whether the check is ext_authz's over gRPC.
func (c Config) grpc() bool { return c.Interface != "http" }

// ProxyList is Proxies as a list.
func (c Config) ProxyList() []string {
	var out []string
	for _, p := range strings.Split(c.Proxies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// RegisterFlags defines the flags of `bench authz` or `bench forward-auth` on fs, with c's
// values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Sidecar, "sidecar", c.Sidecar, "sidecar binary (relative paths: from the repository root, else the working directory)")
	fs.IntVar(&c.Keys, "keys", c.Keys, "distinct keys in the mix: API keys, tokens, channel secrets, publishable keys, inbound channel ids, client IPs")
	fs.Float64Var(&c.Over, "over", c.Over, "share of the keys driven over their limit (0 to 0.5)")
	if !c.grpc() {
		fs.StringVar(&c.Proxies, "proxies", c.Proxies, "proxies measured with the check against without it, comma-separated (caddy, nginx); empty: none")
		fs.StringVar(&c.NoopServer, "noop-server", c.NoopServer, "HTTP server of the no-op check: net/http (the baseline of the targets) or fasthttp (the sidecar's own server)")
	}
	c.Loop.RegisterFlags(fs, c.grpc())
	if c.grpc() {
		fs.BoolVar(&c.Mix, "mix", c.Mix, "measure the mix (all limited routes, -keys keys, -over of them hot)")
		fs.IntVar(&c.MixConns, "mix-conns", c.MixConns, "gRPC connections per target of the mix")
		fs.BoolVar(&c.Scenarios, "scenarios", c.Scenarios, "measure the scenarios: one hot key, -keys keys, -over-keys keys over their limit, each on every -conns")
		c.Overload.RegisterFlags(fs)
		fs.IntVar(&c.OverKeys, "over-keys", c.OverKeys, "keys of the over scenario, each over its limit after its first request")
	}
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
	check(c.Interface == "grpc" || c.Interface == "http", "interface %q: must be grpc or http", c.Interface)
	check(c.Sidecar != "", "-sidecar: required")
	for _, p := range c.ProxyList() {
		check(c.Interface == "http" && (p == "caddy" || p == "nginx"), "-proxies: %q is not caddy or nginx", p)
	}
	check(c.grpc() || c.NoopServer == "net/http" || c.NoopServer == "fasthttp", "-noop-server %q: must be net/http or fasthttp", c.NoopServer)
	check(c.Keys >= 100 && c.Keys <= 1_000_000, "-keys %d: must be from 100 to 1000000", c.Keys)
	check(c.Mix || (c.grpc() && c.Scenarios), "-mix=false -scenarios=false: nothing to measure")
	check(c.MixConns >= 1 && c.MixConns <= 256, "-mix-conns %d: must be from 1 to 256", c.MixConns)
	check(c.OverKeys >= 1 && c.OverKeys <= 100_000, "-over-keys %d: must be from 1 to 100000", c.OverKeys)
	check(c.Over >= 0 && c.Over <= 0.5, "-over %g: must be from 0 to 0.5", c.Over)
	errs = append(errs, c.Loop.Check()...)
	if c.Overload.Enabled {
		errs = append(errs, c.Overload.Check()...)
	}
	if total := time.Duration(c.Rounds) * 2 * (c.Warmup + c.Duration) * time.Duration(1+len(c.ProxyList())); c.Mix && total > maxRun {
		errs = append(errs, fmt.Errorf("-rounds × 2 × (-warmup + -duration) × (1 + proxies) = %v: at most %v, since the tokens of the mix expire after 30 minutes", total, maxRun))
	}
	if total := time.Duration(c.Rounds) * 2 * (c.Warmup + c.Duration) * time.Duration(len(scenarios)*len(c.Conns)); c.grpc() && c.Scenarios && total > maxRun {
		errs = append(errs, fmt.Errorf("3 scenarios × connection counts × -rounds × 2 × (-warmup + -duration) = %v: at most %v, since their tokens expire after 30 minutes", total, maxRun))
	}
	return errors.Join(errs...)
}
