// Command core is the core API service (serve, migrate) and its management commands
// (core/manage: tenants, channels, limits, admins). `core help` lists them.
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

	"github.com/gofiber/fiber/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/authzcheck"
	"github.com/converger/edge/core/config"
	"github.com/converger/edge/core/console"
	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/manage"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/cmdline"
	"github.com/converger/edge/shared/envfile"
	"github.com/converger/edge/shared/limiterclient"
)

// serviceUsage explains serve and migrate, whose flags are only -h and --version.
var serviceUsage = map[string]string{
	"serve": "usage: core serve\n\nRuns the HTTP API on CORE_ADDR after applying the migrations to DATABASE_URL; needs\n" +
		"TOKEN_SIGNING_KEY and ENCRYPTION_KEY (`core keys generate` makes them). Configured by\n" +
		"environment variables (README.md, \"The core\"), any of which may be given as a file,\n" +
		"NAME_FILE=/path/to/file. SIGINT or SIGTERM stops it gracefully.\n",
	"migrate": "usage: core migrate\n\nApplies the database migrations to DATABASE_URL and prints the schema version.\n",
}

func main() {
	env := envfile.New(os.Environ(), os.ReadFile)
	if len(os.Args) < 2 || serviceUsage[os.Args[1]] == "" {
		// The management commands, help and unknown commands; they read only the
		// environment they need, so that an unrelated setting cannot stop them.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		code := manage.Run(ctx, os.Args[1:], manage.Env{Getenv: env.Getenv, Stdin: os.Stdin}, os.Stdout, os.Stderr)
		stop()
		if err := env.Err(); err != nil {
			fmt.Fprintf(os.Stderr, "core: invalid configuration: %v\n", err)
			code = 2
		}
		os.Exit(code)
	}
	fs := flag.NewFlagSet("core "+os.Args[1], flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), serviceUsage[os.Args[1]]) }
	if code, exit := cmdline.Parse(fs, os.Args[2:], false, os.Stdout, os.Stderr); exit {
		os.Exit(code)
	}
	cfg, err := config.Load(env.Getenv)
	if fileErr := env.Err(); fileErr != nil {
		err = fileErr // an unreadable NAME_FILE explains what Load said of NAME
	}
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
	// AUTHZ_ADDR: without Envoy in front, ask the sidecar's ext_authz Check about every
	// request ourselves, as Envoy would (core/authzcheck; when the Check fails, the routes
	// that protect credentials fail closed, the others open unless AUTHZ_FAIL_OPEN=false).
	var middleware []fiber.Handler
	if cfg.AuthzAddr != "" {
		checker, err := authzcheck.New(authzcheck.Options{Addr: cfg.AuthzAddr, Logger: log, FailClosed: !cfg.AuthzFailOpen})
		if err != nil {
			return err
		}
		defer checker.Close()
		middleware = append(middleware, checker.Handler)
		log.Info("every request is checked by the sidecar", "authz_addr", cfg.AuthzAddr)
	}
	st := store.New(pool, cfg.Sealer, cfg.Limits)
	lim, closeLimiter, err := limiter(cfg, log)
	if err != nil {
		return err
	}
	defer closeLimiter()
	pages, closePages, err := loginPages(ctx, cfg, st, lim, log)
	if err != nil {
		return err
	}
	defer closePages()
	var sidecar console.Sidecar
	if client, ok := lim.(*limiterclient.Client); ok {
		sidecar = client
	}
	cons, err := console.New(console.Options{Store: st, Pages: pages, Sidecar: sidecar, Logger: log})
	if err != nil {
		return err
	}
	app, listener := api.New(api.Deps{
		Store:          st,
		Signer:         cfg.Signer,
		Verifier:       cfg.Verifier,
		PublicURL:      cfg.PublicURL,
		Limits:         cfg.Limits,
		MaxUploadBytes: cfg.MaxUploadBytes,
		Logger:         log,
		Middleware:     middleware,
		Pages:          pages.Register,
		Console:        cons.Register,
		Limiter:        lim,
		CORSOrigins:    cfg.CORSOrigins,
	})
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go listener.Run(lctx)
	go st.RunInboundSignaturePurge(lctx, time.Minute, log)
	errc := make(chan error, 1)
	go func() { errc <- app.Listen(cfg.Addr) }()
	log.Info("core started", "addr", cfg.Addr, "public_url", cfg.PublicURL, "cors_origins", cfg.CORSOrigins)
	select {
	case err := <-errc:
		return fmt.Errorf("CORE_ADDR %s: %w", cfg.Addr, err)
	case <-ctx.Done():
	}
	log.Info("core stopping")
	return app.ShutdownWithTimeout(10 * time.Second)
}

// limiter is the sidecar's Limiter service at LIMITER_ADDR, or one in this process: it
// counts failed logins, password resets and the legacy WebSocket's activities.
func limiter(cfg *config.Config, log *slog.Logger) (login.Limiter, func(), error) {
	if cfg.LimiterAddr != "" {
		client, err := limiterclient.New(cfg.LimiterAddr)
		if err != nil {
			return nil, nil, fmt.Errorf("LIMITER_ADDR: %w", err)
		}
		log.Info("failed logins, password resets and legacy WebSocket activities are counted by the sidecar", "limiter_addr", cfg.LimiterAddr)
		return client, func() { client.Close() }, nil
	}
	local := login.NewLocalLimiter(nil)
	log.Info("LIMITER_ADDR is unset: failed logins, password resets and legacy WebSocket activities are counted in this process, not shared with other cores or the sidecar")
	return local, local.Close, nil
}

// loginPages creates the first admin when ADMIN_EMAIL asks for one, and returns the
// login pages with their limiter and mail sender (SMTP_URL, else the log), and what
// stops them.
func loginPages(ctx context.Context, cfg *config.Config, st *store.Store, lim login.Limiter, log *slog.Logger) (*login.Pages, func(), error) {
	if cfg.AdminEmail != "" {
		// A generated password goes to stderr once, never through the logger.
		u, created, err := login.BootstrapAdmin(ctx, st, cfg.AdminEmail, cfg.AdminPassword, passwords.Default, os.Stderr)
		if err != nil {
			return nil, nil, fmt.Errorf("creating the first admin (ADMIN_EMAIL): %w", err)
		}
		if created {
			log.Info("created the first admin user", "email", u.Email, "id", u.ID,
				"must_change_password", u.MustChangePassword)
		}
	}
	var sender mail.Sender = mail.Log{Logger: log, From: cfg.SMTPFrom}
	if cfg.SMTP != nil {
		sender = cfg.SMTP
		log.Info("email is sent through SMTP", "smtp", cfg.SMTP.Redacted(), "from", cfg.SMTPFrom)
	} else {
		log.Warn("SMTP_URL is unset: emails, password reset links included, are written to the log (for development only)")
	}
	pages, err := login.New(login.Options{
		Store:       st,
		Sealer:      cfg.Sealer,
		Limiter:     lim,
		Mailer:      sender,
		ClientIP:    cfg.TrustedProxies,
		PublicURL:   cfg.PublicURL,
		IdleTimeout: cfg.SessionIdleTimeout,
		MaxAge:      cfg.SessionMaxAge,
		Hashes:      passwords.NewGate(cfg.PasswordHashConcurrency, 0),
		Logger:      log,
	})
	if err != nil {
		return nil, nil, err
	}
	return pages, pages.Close, nil
}
