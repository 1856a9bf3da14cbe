// Command sidecar is the rate-limit sidecar: Envoy's external authorization service and
// the project's Limiter service. See the README for its configuration.
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
