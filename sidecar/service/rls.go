package service

import (
	"context"

	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/rlsapi"
	"github.com/converger/edge/sidecar/rlsxds"
)

// rateLimitService builds Envoy's rate limit service over the sidecar's limiter, with the
// rules of RLS_CONFIG_DIR (none without it), and watches the directory until ctx ends;
// or, with RLS_CONFIG_TYPE=GRPC_XDS_SOTW, follows an xDS server's rules.
func (s *Sidecar) rateLimitService(ctx context.Context, cfg *config.Config) (*rlsapi.Server, error) {
	svc := rls.New(s.Limiter, cfg.RLSRules, rls.Options{
		ShadowMode:      cfg.RLSShadowMode,
		ResponseHeaders: cfg.RLSResponseHeaders,
		QuotaMode:       cfg.RLSQuotaMode,
		HeaderNames:     cfg.RLSHeaderNames,
		DynamicMetadata: cfg.RLSDynamicMetadata,
		WaitForRules:    cfg.RLSConfigType == config.ConfigTypeXDS,
		Metrics:         rls.NewMetrics(s.Metrics.Registry),
	})
	if cfg.RLSDir != "" {
		svc.Loaded(true)
		descs, limits := cfg.RLSRules.Size()
		s.log.Info("RLS rules loaded", "dir", cfg.RLSDir, "files", len(cfg.RLSRules.Files()), "domains", cfg.RLSRules.Domains(),
			"descriptors", descs, "limits", limits, "shadow_mode", cfg.RLSShadowMode, "response_headers", cfg.RLSResponseHeaders)
		w := &rls.Watcher{Dir: cfg.RLSDir, Logger: s.log, Options: rls.LoadOptions{MergeDomains: cfg.RLSMergeDomains}}
		s.wg.Go(func() { w.Run(ctx, svc) })
	}
	if cfg.RLSConfigType == config.ConfigTypeXDS {
		x := cfg.RLSXDS
		xdsTLS, err := tlsconfig.ClientConfig(x.TLS, x.ServerURL, tlsconfig.Options{Logger: s.log})
		if err != nil {
			return nil, err
		}
		s.rlsXDS = rlsxds.New(rlsxds.Options{
			ServerURL: x.ServerURL, NodeID: x.NodeID, Metadata: x.Metadata, Headers: x.Headers, TLS: xdsTLS,
			BackoffInitial: x.BackoffInitial, BackoffMax: x.BackoffMax,
			Load:   rls.LoadOptions{MergeDomains: cfg.RLSMergeDomains},
			Logger: s.log, Registry: s.Metrics.Registry,
		}, svc)
		s.log.Info("RLS rules from an xDS server", "server", x.ServerURL, "node", x.NodeID, "tls", xdsTLS != nil)
		s.wg.Go(func() { s.rlsXDS.Run(ctx) })
	}
	return rlsapi.New(svc, s.log), nil
}
