// Command core is the core API service (serve, migrate) and its management commands
// (core/manage: tenants, channels, limits, admins). `core help` lists them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/authzcheck"
	"github.com/converger/edge/core/config"
	"github.com/converger/edge/core/console"
	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/manage"
	"github.com/converger/edge/core/metrics"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/cmdline"
	"github.com/converger/edge/shared/envfile"
	"github.com/converger/edge/shared/limiterclient"
	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/shared/ops"
	"github.com/converger/edge/shared/pgguard"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/shared/tracing"
)

// serviceUsage explains serve and migrate, whose flags are only -h and --version.
var serviceUsage = map[string]string{
	"serve": "usage: core serve\n\nRuns the HTTP API on CORE_ADDR after applying the migrations to DATABASE_URL; needs\n" +
		"TOKEN_SIGNING_KEY and ENCRYPTION_KEY (`core keys generate` makes them). Configured by\n" +
		"environment variables (docs/core.md, \"Configuration\"), any of which may be given as a file,\n" +
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
		// Traces (OTLP) only when OTEL_EXPORTER_OTLP_ENDPOINT is set; flushed on the way out.
		var stopTracing func(context.Context) error
		if stopTracing, err = tracing.SetupFromEnv(ctx, "converger-core"); err != nil {
			fmt.Fprintf(os.Stderr, "core: invalid configuration: %v\n", err)
			os.Exit(2)
		}
		err = serve(ctx, cfg, log)
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = stopTracing(flush)
		cancel()
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
	openFiles, err := netlimit.RaiseOpenFiles()
	if err != nil {
		log.Warn("could not raise the open-files limit", "error", err, "limit", openFiles)
	}
	if err := migrations.Up(ctx, cfg.DatabaseURL); err != nil {
		return err
	}
	m := metrics.New()
	pool, monitor, err := openDatabase(ctx, cfg, m, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	bg, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	go monitor.Run(bg)

	// AUTHZ_ADDR: without Envoy in front, ask the sidecar's ext_authz Check about every
	// request ourselves, as Envoy would (core/authzcheck; when the Check fails, the routes
	// that protect credentials fail closed, the others open unless AUTHZ_FAIL_OPEN=false).
	var middleware []fiber.Handler
	var checker *authzcheck.Checker
	if cfg.AuthzAddr != "" {
		authzTLS, err := tlsconfig.ClientConfig(cfg.AuthzTLS, cfg.AuthzAddr, tlsconfig.Options{Logger: log})
		if err != nil {
			return err
		}
		if checker, err = authzcheck.New(authzcheck.Options{Addr: cfg.AuthzAddr, TLS: authzTLS, Logger: log, FailClosed: !cfg.AuthzFailOpen}); err != nil {
			return err
		}
		defer checker.Close()
		middleware = append(middleware, checker.Handler)
		m.CounterFunc("converger_core_authz_fail_open_total", "Requests let through unchecked because the sidecar's Check (AUTHZ_ADDR) failed.",
			func() float64 { return float64(checker.FailedOpen()) })
		log.Info("every request is checked by the sidecar", "authz_addr", cfg.AuthzAddr)
	}
	st := store.New(pool, cfg.Sealer, cfg.Limits)
	lim, limiterClient, closeLimiter, err := limiter(cfg, log)
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
	if limiterClient != nil { // a nil *Client would not be a nil Sidecar
		sidecar = limiterClient
	}
	cons, err := console.New(console.Options{Store: st, Pages: pages, Sidecar: sidecar, Logger: log})
	if err != nil {
		return err
	}
	b := cfg.Bounds
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
		Metrics:        m,
		Database:       monitor,
		AccessLog:      cfg.AccessLog,
		MaxInFlight:    b.MaxInFlight,
		RequestTimeout: b.RequestTimeout,
		ReadTimeout:    b.ReadTimeout,
		WriteTimeout:   b.WriteTimeout,
		IdleTimeout:    b.IdleTimeout,

		BodyBudgetMB:              b.BodyBudgetMB,
		BodyBudgetPerIPMB:         b.BodyBudgetPerIPMB,
		BodyMinRate:               b.BodyMinRate,
		MaxStreamsPerToken:        b.MaxStreamsPerToken,
		MaxStreamsPerConversation: b.MaxStreamsPerConversation,
		MaxSocketsPerIP:           b.MaxSocketsPerIP,
		ClientIP:                  cfg.TrustedProxies,
		Credentialed:              cons.Credentialed,
	})
	go listener.Run(bg)
	go st.RunInboundSignaturePurge(bg, time.Minute, log)

	maxConns := b.MaxConns
	if maxConns == 0 {
		maxConns = netlimit.DefaultMaxConns(openFiles)
	}
	ln, err := listen("CORE_ADDR", cfg.Addr, netlimit.Options{MaxConns: maxConns, MaxConnsPerIP: b.MaxConnsPerIP,
		Exempt: cfg.TrustedProxies.Trusted, Refuse: netlimit.HTTPRefusal(cfg.TLS != nil), Logger: log, Name: "CORE_ADDR"}, m)
	if err != nil {
		return err
	}
	app.Server().ConnState = func(c net.Conn, state fasthttp.ConnState) {
		switch state {
		case fasthttp.StateIdle:
			ln.SetIdle(c)
		case fasthttp.StateActive:
			ln.SetActive(c)
		}
	}
	apiLn, err := tlsconfig.Listener(ln, cfg.TLS, tlsconfig.Options{Logger: log}, "http/1.1")
	if err != nil {
		ln.Close()
		return err
	}
	opsLn, err := net.Listen("tcp", cfg.OpsAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("CORE_OPS_ADDR %s: %w", cfg.OpsAddr, err)
	}
	opsSrv := &http.Server{
		Handler: ops.Mux(m.Registry, func() (bool, map[string]any) {
			return readiness(monitor, listener, checker, limiterClient)
		}),
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 16 << 10,
	}
	// A scraper or a probe needs few connections; the ops address is loopback by default.
	opsGuard := netlimit.Wrap(opsLn, netlimit.Options{MaxConns: 64, Refuse: netlimit.HTTPRefusal(cfg.OpsTLS != nil), Logger: log, Name: "CORE_OPS_ADDR"})
	opsServeLn, err := tlsconfig.Listener(opsGuard, cfg.OpsTLS, tlsconfig.Options{Logger: log}, "http/1.1")
	if err != nil {
		ln.Close()
		opsLn.Close()
		return err
	}
	opsSrv.ConnState = func(c net.Conn, state http.ConnState) {
		switch state {
		case http.StateIdle:
			opsGuard.SetIdle(c)
		case http.StateActive:
			opsGuard.SetActive(c)
		}
	}

	errc := make(chan error, 2)
	go func() { errc <- fmt.Errorf("CORE_ADDR %s: %w", cfg.Addr, app.Listener(apiLn)) }()
	go func() {
		if err := opsSrv.Serve(opsServeLn); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("CORE_OPS_ADDR %s: %w", cfg.OpsAddr, err)
		}
	}()
	log.Info("core started", "addr", ln.Addr().String(), "ops_addr", opsLn.Addr().String(), "public_url", cfg.PublicURL,
		"tls", cfg.TLS != nil, "ops_tls", cfg.OpsTLS != nil, "open_files", openFiles, "max_conns", maxConns, "max_conns_per_ip", b.MaxConnsPerIP, "max_in_flight", b.MaxInFlight, "cors_origins", cfg.CORSOrigins)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("core stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = opsSrv.Shutdown(sctx)
	return app.ShutdownWithTimeout(10 * time.Second)
}

// limiter is the sidecar's Limiter service at LIMITER_ADDR (also returned as the client,
// whose state /readyz shows), or one in this process: it counts failed logins, password
// resets and the legacy WebSocket's activities.
func limiter(cfg *config.Config, log *slog.Logger) (login.Limiter, *limiterclient.Client, func(), error) {
	if cfg.LimiterAddr != "" {
		tlsCfg, err := tlsconfig.ClientConfig(cfg.LimiterTLS, cfg.LimiterAddr, tlsconfig.Options{Logger: log})
		if err != nil {
			return nil, nil, nil, err
		}
		client, err := limiterclient.New(cfg.LimiterAddr, limiterclient.WithTLS(tlsCfg))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("LIMITER_ADDR: %w", err)
		}
		log.Info("failed logins, password resets and legacy WebSocket activities are counted by the sidecar", "limiter_addr", cfg.LimiterAddr)
		return client, client, func() { client.Close() }, nil
	}
	local := login.NewLocalLimiter(nil)
	log.Info("LIMITER_ADDR is unset: failed logins, password resets and legacy WebSocket activities are counted in this process, not shared with other cores or the sidecar")
	return local, nil, local.Close, nil
}

// openDatabase opens the pool with a deadline of DATABASE_TIMEOUT on every query and
// of DATABASE_ACQUIRE_TIMEOUT on every acquisition, and the monitor that probes PostgreSQL on a connection of its own, with
// their metrics.
func openDatabase(ctx context.Context, cfg *config.Config, m *metrics.Metrics, log *slog.Logger) (*pgxpool.Pool, *pgguard.Monitor, error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, nil, errors.New("DATABASE_URL: not a valid PostgreSQL connection string")
	}
	timeout := cfg.Bounds.DatabaseTimeout
	monitor := pgguard.NewMonitor(pgguard.ConnPing(pc.ConnConfig), pgguard.Options{
		Timeout:     min(time.Second, timeout),
		Logger:      log,
		DownMessage: "the database does not answer: requests are answered 503 until it does",
		UpMessage:   "the database answers again",
	})
	deadlines := pgguard.Configure(pc, timeout, cfg.Bounds.DatabaseAcquireTimeout, monitor)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	m.Database(monitor, deadlines, pool)
	return pool, monitor, nil
}

// listen opens a listener with the bounds of o and registers its metrics.
func listen(name, addr string, o netlimit.Options, m *metrics.Metrics) (*netlimit.Listener, error) {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, addr, err)
	}
	ln := netlimit.Wrap(raw, o)
	m.Listener(ln)
	return ln, nil
}

// readiness is /readyz: ready while PostgreSQL answers; the details say how the
// database, the activity notifications and the sidecar (AUTHZ_ADDR, LIMITER_ADDR) are.
func readiness(monitor *pgguard.Monitor, listener *api.Listener, checker *authzcheck.Checker, limiter *limiterclient.Client) (bool, map[string]any) {
	d := map[string]any{"database": "up", "activity_notifications": listener.Listening()}
	if !monitor.Up() {
		d["database"] = "down"
	}
	if checker != nil {
		d["authz"] = "ok"
		if checker.Failing() {
			d["authz"] = "failing open"
		}
	}
	if limiter != nil {
		d["limiter"] = limiter.State()
	}
	return monitor.Up(), d
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
