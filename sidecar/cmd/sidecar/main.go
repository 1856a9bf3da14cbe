// Command sidecar is the rate-limit sidecar: Envoy's external authorization service,
// Envoy's rate limit service and the project's Limiter service. See docs/sidecar.md for
// its configuration. `sidecar check-config` validates the configuration files and exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/converger/edge/shared/cmdline"
	"github.com/converger/edge/shared/envfile"
	"github.com/converger/edge/shared/gctune"
	"github.com/converger/edge/shared/tracing"
	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/service"
)

const usage = `usage: sidecar [--help] [--version]      serve
       sidecar check-config                validate RATE_LIMIT_CONFIG, RLS_CONFIG_DIR and
                                           the rest of the environment, and exit

The rate-limit sidecar: Envoy's external authorization service (gRPC Check), Envoy's rate
limit service (ShouldRateLimit) and the Limiter service on SIDECAR_GRPC_ADDR
(127.0.0.1:8081); /metrics, /healthz, /readyz, the forward-auth /check and the rate limit
service's POST /json on SIDECAR_HTTP_ADDR (127.0.0.1:8082). It is configured by environment
variables (docs/sidecar.md, "Configuration"); any of them may be given as a file instead,
NAME_FILE=/path/to/file. SIGINT or SIGTERM stops it. check-config exits 0, or 2 with every
problem found.
`

func main() {
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	if code, exit := cmdline.Parse(fs, os.Args[1:], true, os.Stdout, os.Stderr); exit {
		os.Exit(code)
	}
	env := envfile.New(os.Environ(), os.ReadFile)
	switch {
	case fs.NArg() == 1 && fs.Arg(0) == "check-config":
		os.Exit(checkConfig(env))
	case fs.NArg() > 0:
		fmt.Fprintf(os.Stderr, "sidecar: unexpected argument %q\nRun `sidecar --help` for its usage.\n", fs.Arg(0))
		os.Exit(2)
	}
	cfg, err := config.Load(env.Getenv)
	if fileErr := env.Err(); fileErr != nil {
		err = fileErr // an unreadable NAME_FILE explains what Load said of NAME
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sidecar: invalid configuration: %v\n", err)
		os.Exit(2)
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var log *slog.Logger
	if cfg.LogFormat == "text" {
		log = slog.New(slog.NewTextHandler(os.Stderr, opts))
	} else {
		log = slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	slog.SetDefault(log)

	// The sidecar's live heap is a few megabytes beside the garbage of its calls: at
	// Go's default pacing it collects many times a second under load, in its answers'
	// latency tail (bench rls, bench authz).
	gctune.Start(uint64(cfg.GCHeadroomMB) << 20)
	// Traces (OTLP) only when OTEL_EXPORTER_OTLP_ENDPOINT is set.
	stopTracing, err := tracing.SetupFromEnv(context.Background(), "converger-sidecar")
	if err != nil {
		fmt.Fprintf(os.Stderr, "sidecar: invalid configuration: %v\n", err)
		os.Exit(2)
	}
	s, err := service.Start(cfg, service.Options{Logger: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	code := 0
	select {
	case <-sig:
		s.Stop()
	case err := <-s.Err():
		s.Stop()
		fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		code = 1
	}
	flushTraces(stopTracing)
	os.Exit(code)
}

// flushTraces sends the spans not sent yet, waiting at most 5 s.
func flushTraces(stop func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = stop(ctx)
}

// checkConfig validates RATE_LIMIT_CONFIG and RLS_CONFIG_DIR, then the rest of the
// configuration, without serving: 0 when valid, 2 with every problem found.
func checkConfig(env *envfile.Env) int {
	summary, err := config.CheckFiles(env.Getenv)
	if err == nil {
		_, err = config.Load(env.Getenv)
	}
	if fileErr := env.Err(); fileErr != nil {
		err = fileErr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sidecar: invalid configuration: %v\n", err)
		return 2
	}
	for _, line := range summary {
		fmt.Println(line)
	}
	fmt.Println("configuration valid")
	return 0
}
