// Command sidecar is the rate-limit sidecar: Envoy's external authorization service,
// Envoy's rate limit service and the project's Limiter service. See the README for its
// configuration. `sidecar check-config` validates the configuration files and exits.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/service"
)

func main() {
	switch {
	case len(os.Args) == 2 && os.Args[1] == "check-config":
		os.Exit(checkConfig())
	case len(os.Args) > 1:
		fmt.Fprintln(os.Stderr, "usage: sidecar              serve (configured by the environment; see the README)\n       sidecar check-config validate RATE_LIMIT_CONFIG and RLS_CONFIG_DIR, and the rest of the environment")
		os.Exit(2)
	}
	cfg, err := config.Load(os.Getenv)
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

	s, err := service.Start(cfg, service.Options{Logger: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
		s.Stop()
	case err := <-s.Err():
		s.Stop()
		fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		os.Exit(1)
	}
}

// checkConfig validates RATE_LIMIT_CONFIG and RLS_CONFIG_DIR, then the rest of the
// configuration, without serving: 0 when valid, 2 with every problem found.
func checkConfig() int {
	summary, err := config.CheckFiles(os.Getenv)
	if err == nil {
		_, err = config.Load(os.Getenv)
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
