package service

import (
	"context"

	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/rlsapi"
)

// rateLimitService builds Envoy's rate limit service over the sidecar's limiter, with the
// rules of RLS_CONFIG_DIR (none without it), and watches the directory until ctx ends.
func (s *Sidecar) rateLimitService(ctx context.Context, cfg *config.Config) *rlsapi.Server {
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
	return rlsapi.New(svc, s.log)
}
