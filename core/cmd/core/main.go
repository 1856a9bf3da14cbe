// Command core is the core API service and its management commands. See the README.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/config"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
)

const usage = `usage: core <command>

commands:
  serve     run the HTTP API on CORE_ADDR (migrates first)
  migrate   apply the database migrations to DATABASE_URL
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cfg, err := config.Load(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "core: invalid configuration: %v\n", err)
		os.Exit(2)
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	log := slog.New(slog.NewJSONHandler(os.Stderr, opts))
	if cfg.LogFormat == "text" {
		log = slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	switch os.Args[1] {
	case "serve":
		err = serve(ctx, cfg, log)
	case "migrate":
		err = migrate(ctx, cfg)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "core: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "core: %v\n", err)
		os.Exit(1)
	}
}

func migrate(ctx context.Context, cfg *config.Config) error {
	if cfg.DatabaseURL == "" {
		return fmt.Errorf("DATABASE_URL is required")
	}
	if err := migrations.Up(ctx, cfg.DatabaseURL); err != nil {
		return err
	}
	current, _, err := migrations.Version(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	fmt.Printf("database at schema version %d\n", current)
	return nil
}

func serve(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if err := cfg.RequireServe(); err != nil {
		return err
	}
	if err := migrations.Up(ctx, cfg.DatabaseURL); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	app, listener := api.New(api.Deps{
		Store:          store.New(pool, cfg.Sealer, cfg.Limits),
		Signer:         cfg.Signer,
		Verifier:       cfg.Verifier,
		PublicURL:      cfg.PublicURL,
		Limits:         cfg.Limits,
		MaxUploadBytes: cfg.MaxUploadBytes,
		Logger:         log,
	})
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go listener.Run(lctx)
	errc := make(chan error, 1)
	go func() { errc <- app.Listen(cfg.Addr) }()
	log.Info("core started", "addr", cfg.Addr, "public_url", cfg.PublicURL)
	select {
	case err := <-errc:
		return fmt.Errorf("CORE_ADDR %s: %w", cfg.Addr, err)
	case <-ctx.Done():
	}
	log.Info("core stopping")
	return app.ShutdownWithTimeout(10 * time.Second)
}
