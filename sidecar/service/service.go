// Package service assembles the sidecar from its configuration: the limiter, the tenant
// directory, the gRPC services (ext_authz, Envoy's rate limit service, Limiter, health,
// reflection), the HTTP forward-auth check, the rate limit service's POST /json and the
// operator endpoints, and runs them until stopped.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/sidecar/authz"
	"github.com/converger/edge/sidecar/cluster"
	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/envoywire"
	"github.com/converger/edge/sidecar/forwardauth"
	"github.com/converger/edge/sidecar/identity"
	"github.com/converger/edge/sidecar/limitapi"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/metrics"
	"github.com/converger/edge/sidecar/ops"
	"github.com/converger/edge/sidecar/rlsapi"
	"github.com/converger/edge/sidecar/rlsxds"
	"github.com/converger/edge/sidecar/routes"
	"github.com/converger/edge/sidecar/tenants"
	"github.com/converger/edge/sidecar/traffic"
)

// Sidecar is a running sidecar.
type Sidecar struct {
	// GRPCAddr and HTTPAddr are the addresses actually listened on.
	GRPCAddr, HTTPAddr net.Addr
	Limiter            *limiter.Limiter
	Metrics            *metrics.Metrics
	Cluster            *cluster.Cluster // nil with the local backend
	// Traffic records every decision for the console's live view.
	Traffic *traffic.Recorder

	log      *slog.Logger
	grpc     *grpc.Server
	health   *health.Server
	http     *fasthttp.Server
	pool     *pgxpool.Pool
	dir      *tenants.Directory
	rlsXDS   *rlsxds.Client // nil unless the RLS rules come from an xDS server
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	serving  atomic.Bool
	stopOnce sync.Once
	errc     chan error
}

// Options are the parts of a sidecar that do not come from its configuration.
type Options struct {
	Logger *slog.Logger // slog.Default() when nil
	// Now is the wall clock of the limiter, caches and token checks (time.Now when
	// nil): tests move it instead of sleeping across windows.
	Now func() time.Time
}

// Start builds the sidecar and starts serving. It fails when a listener cannot be opened.
func Start(cfg *config.Config, o Options) (*Sidecar, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if o.Now == nil && cfg.ClockOffset != 0 {
		offset := cfg.ClockOffset
		o.Now = func() time.Time { return time.Now().Add(offset) }
		log.Warn("the clock is shifted by SIDECAR_TEST_CLOCK_OFFSET_MS, a test hook", "offset", offset)
	}
	openFiles, err := netlimit.RaiseOpenFiles()
	if err != nil {
		log.Warn("could not raise the open-files limit", "error", err, "limit", openFiles)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sidecar{log: log, cancel: cancel, errc: make(chan error, 2)}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()

	s.Metrics = metrics.New()
	s.Limiter = limiter.New(limiter.Options{Now: o.Now, Replicated: cfg.Backend == "cluster"})
	s.Metrics.GaugeFunc("converger_sidecar_limiter_keys", "Live counters in the limiter.", func() float64 { return float64(s.Limiter.Len()) })
	s.wg.Go(func() { s.Limiter.RunSweeper(cfg.CleanPeriod, ctx.Done()) })
	s.Traffic = traffic.New(s.Limiter)

	var dir identity.Directory
	var overrides authz.Overrides
	if cfg.DatabaseURL != "" {
		pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("DATABASE_URL: %w", err)
		}
		pc.MaxConns = 8
		pc.ConnConfig.ConnectTimeout = 2 * time.Second
		if s.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, fmt.Errorf("DATABASE_URL: %w", err)
		}
		s.dir = tenants.New(s.pool, tenants.Options{
			OverrideTTL:   cfg.OverrideTTL,
			CredentialTTL: cfg.CredentialTTL,
			Wait:          cfg.DBWait,
			Metrics:       s.Metrics,
			Logger:        log,
			Now:           o.Now,
		})
		s.wg.Go(func() { s.dir.Listen(ctx) })
		s.wg.Go(func() { s.dir.Watch(ctx) })
		dir, overrides = s.dir, s.dir
	} else {
		log.Warn("DATABASE_URL is not set: API keys, channel secrets and publishable keys are counted unverified, and tenant overrides are off")
	}
	if cfg.Verifier != nil && o.Now != nil {
		cfg.Verifier.Now = o.Now
	}
	if cfg.Verifier == nil {
		log.Warn("TOKEN_VERIFY_KEYS is not set: every Converger token is refused on token-counted routes; `core keys public` prints it for the core's TOKEN_SIGNING_KEY")
	}

	if cfg.Backend == "cluster" {
		cl := cfg.Cluster
		var err error
		s.Cluster, err = cluster.Start(cluster.Config{
			NodeName: cl.NodeName, BindAddr: cl.BindAddr, AdvertiseAddr: cl.AdvertiseAddr,
			Strategy: cl.Strategy, Join: cl.Join, DNSName: cl.DNSName, SecretKey: cl.SecretKey,
			SyncInterval: cfg.SyncInterval, ShareMode: cfg.ShareMode, GrantWait: grantWait(cfg.GrantWait), GrantMaxLimit: cfg.GrantMaxLimit, Traffic: s.Traffic,
			Broadcast: cl.Replication == "broadcast",
			Now:       o.Now, Logger: log, Registry: s.Metrics.Registry,
		}, s.Limiter)
		if err != nil {
			return nil, err
		}
	}

	table, err := routes.New(cfg.Routes)
	if err != nil {
		return nil, err
	}
	ident := identity.New(dir, identity.NewTokenCache(cfg.Verifier, 0), cfg.TrustedProxies)
	az, err := authz.New(table, ident, s.Limiter, cfg, overrides, s.Metrics)
	if err != nil {
		return nil, err
	}
	az.RecordTraffic(s.Traffic)
	// A decision may wait for the database and then for a counter's owner.
	az.LimitInFlight(cfg.MaxChecksInFlight, cfg.DBWait+max(cfg.GrantWait, 0))

	rlsAPI, err := s.rateLimitService(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rlsAPI.CountShed(s.Metrics.Shed())

	// Envoy's two services read their requests straight from the wire (envoywire); the
	// others go through the standard proto codec.
	grpcTLS, err := grpcCredentials(cfg.GRPCTLS, log)
	if err != nil {
		return nil, err
	}
	opts := append(append(tuning(), overloadOptions(s.Metrics)...), connectionAge(cfg))
	opts = append(append(opts, grpcTLS...), envoywire.ServerOption())
	s.grpc = grpc.NewServer(append(GRPCServerOptions(), opts...)...)
	envoywire.RegisterAuthorization(s.grpc, az)
	envoywire.RegisterRateLimitService(s.grpc, rlsAPI)
	var limitOverrides limitapi.Overrides
	if s.dir != nil {
		limitOverrides = s.dir
	}
	limitAPI := limitapi.New(s.Limiter, cfg, limitOverrides, s.Metrics)
	limitAPI.ServeLiveView(limitapi.LiveView{Traffic: s.Traffic, Installation: cfg.Limits, Routes: table.Routes(), Cluster: s.Cluster})
	limiterpb.RegisterLimiterServer(s.grpc, limitAPI)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	gl, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("SIDECAR_GRPC_ADDR: %w", err)
	}
	raw, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		gl.Close()
		return nil, fmt.Errorf("SIDECAR_HTTP_ADDR: %w", err)
	}
	hl := s.httpListener(raw, cfg, openFiles)
	httpLn, err := tlsconfig.Listener(hl, cfg.HTTPTLS, tlsconfig.Options{Logger: log}, "http/1.1")
	if err != nil {
		gl.Close()
		hl.Close()
		return nil, err
	}
	s.GRPCAddr, s.HTTPAddr = gl.Addr(), hl.Addr()
	mux := http.NewServeMux()
	mux.Handle("/", ops.Handler(s.Metrics.Registry, s.readiness, s.debugCounter))
	mux.HandleFunc(rlsapi.JSONPath, rlsAPI.JSON)
	mux.HandleFunc(rlsapi.ConfigPath, rlsAPI.RulesText)
	s.http = s.httpServer(hl, forwardauth.New(az.Verdict, cfg.TrustedProxies, log, s.Metrics.Registry), mux)
	s.wg.Go(func() {
		if err := s.grpc.Serve(gl); err != nil {
			s.errc <- fmt.Errorf("gRPC server: %w", err)
		}
	})
	s.wg.Go(func() {
		if err := s.http.Serve(httpLn); err != nil {
			s.errc <- fmt.Errorf("HTTP server: %w", err)
		}
	})
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus("ratelimit", healthpb.HealthCheckResponse_SERVING) // envoyproxy/ratelimit's name
	s.health.SetServingStatus(limiterpb.Limiter_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.serving.Store(true)
	log.Info("sidecar started", "grpc", s.GRPCAddr.String(), "http", s.HTTPAddr.String(),
		"backend", cfg.Backend, "database", cfg.DatabaseURL != "", "routes", len(table.Routes()))
	ok = true
	return s, nil
}

// GRPCServerOptions are the options of the sidecar's gRPC server: Envoy's keepalive
// pings are allowed, and a request is at most 1 MiB.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(1 << 20),
	}
}

// connectionAge is GRPC_MAX_CONNECTION_AGE and its grace, as the reference sets them: a
// connection older than the age (give or take 10 %, grpc-go's jitter) is sent a GOAWAY,
// so that the clients of a shared deployment move to new replicas; the calls in flight
// then have the grace to finish before it is closed.
func connectionAge(cfg *config.Config) grpc.ServerOption {
	return grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge:      cfg.GRPCMaxConnectionAge,
		MaxConnectionAgeGrace: cfg.GRPCMaxConnectionAgeGrace,
	})
}

// tuning are the options of the sidecar's gRPC server beyond GRPCServerOptions, kept
// because the bench rls load test measured them faster: stream workers, so that a
// Check or ShouldRateLimit runs on a goroutine that already has the stack it needs,
// instead of a new one that grows its stack on every call (runtime.morestack was a
// fifth of the sidecar's CPU on one connection). Beyond the workers a call gets its own
// goroutine, as without them.
func tuning() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(uint32(32 * runtime.GOMAXPROCS(0)))}
}

// grpcCredentials are the gRPC server's options for TLS on its port (none for plain
// text): the certificates of f, re-read when they change, and at most 10 s for a
// client's handshake.
func grpcCredentials(f *tlsconfig.ServerFiles, log *slog.Logger) ([]grpc.ServerOption, error) {
	if f == nil {
		return nil, nil
	}
	t, err := tlsconfig.NewServer(f, tlsconfig.Options{Logger: log}, "h2")
	if err != nil {
		return nil, err
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(t.Config())), grpc.ConnectionTimeout(10 * time.Second)}, nil
}

// Err reports a server that stopped on its own.
func (s *Sidecar) Err() <-chan error { return s.errc }

func (s *Sidecar) readiness() (bool, map[string]any) {
	d := map[string]any{"database": "none"}
	if s.dir != nil {
		d["database"] = "up"
		if !s.dir.Healthy() {
			d["database"] = "down"
		}
		d["override_notifications"] = s.dir.Listening()
	}
	if s.Cluster != nil {
		d["cluster_members"] = s.Cluster.MemberNames()
		d["cluster_size"] = s.Cluster.Members()
	}
	ready := s.serving.Load()
	if s.Cluster != nil && s.Cluster.Settling() {
		d["cluster_settling"] = true
		ready = false
	}
	if s.rlsXDS != nil {
		// Ready once the xDS server's rules are applied; an outage of the server later
		// keeps them, and the sidecar ready.
		st := s.rlsXDS.Status()
		d["rls_xds"] = st
		ready = ready && st.Applied
	}
	// A database outage does not make the sidecar unready: it keeps deciding with
	// cached values and defaults, which is better than taking every node out of service.
	// Nor does being alone in a cluster: a node that starts first serves on its own.
	return ready, d
}

// debugCounter shows one counter: this node's count and, in a cluster, every origin's.
func (s *Sidecar) debugCounter(bucket, key string) any {
	if s.Cluster != nil {
		return s.Cluster.Debug(bucket, key)
	}
	d := map[string]any{"bucket": bucket, "key": key}
	if b, ok := s.Limiter.LookupBucket(bucket); ok {
		if snap, ok := s.Limiter.Lookup(limiter.Key{Bucket: b, ID: key}); ok {
			d["own"], d["limit"], d["window_ms"], d["window_end_ms"] = snap.Own, snap.Limit, snap.SizeMS, snap.EndMS
		}
	}
	return d
}

// Stop stops accepting checks, lets the ones in flight finish (for at most 5 s) and
// releases everything.
func (s *Sidecar) Stop() {
	s.stopOnce.Do(func() {
		s.serving.Store(false)
		if s.health != nil {
			s.health.Shutdown()
		}
		if s.grpc != nil {
			done := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				s.grpc.Stop()
			}
		}
		if s.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.http.ShutdownWithContext(ctx)
			cancel()
		}
		if s.Cluster != nil {
			s.Cluster.Stop()
		}
		s.cancel()
		s.wg.Wait()
		if s.pool != nil {
			s.pool.Close()
		}
		s.log.Info("sidecar stopped")
	})
}

// grantWait is the cluster's GrantWait for RATE_LIMIT_GRANT_WAIT_MS: 0 there never asks.
func grantWait(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
