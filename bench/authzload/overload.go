package authzload

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/overload"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/rawcheck"
)

// RunOverload runs the overload mode: the keys scenario's Checks (the activities of
// -keys tenants, each with its token, on a sidecar without a database) sent open loop
// (bench/overload) to the sidecar and to the -overload-baseline binary.
func RunOverload(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	bin, err := procs.FindSidecar(procs.RepoRoot(), cfg.Sidecar)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-authz-overload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	limits := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limits, []byte(scenarioLimits), 0o644); err != nil {
		return err
	}
	signer, err := newSigner()
	if err != nil {
		return err
	}
	g := &scenarioRequests{signer: signer, now: time.Now()}
	reqs := make([]rawcheck.Request, cfg.Keys)
	for k := range reqs {
		b, err := g.request("keys", k)
		if err != nil {
			return err
		}
		reqs[k] = rawcheck.Request{B: b}
	}
	svc := overload.Service{
		Name: "authz", Method: rawcheck.Method, Requests: reqs,
		NewReply: func() closedloop.Reply { return new(rawcheck.Reply) },
		Shed:     func(r closedloop.Reply) bool { return r.(*rawcheck.Reply).HTTP == 503 },
		Start: func(ctx context.Context, bin string, prefix []string) (*procs.Proc, string, string, error) {
			return procs.StartSidecarUnder(ctx, prefix, bin, []string{
				"TOKEN_VERIFY_KEYS=" + signer.PublicKey(), "TRUSTED_PROXIES=" + TrustedProxies, "RATE_LIMIT_CONFIG=" + limits,
				"LOG_LEVEL=error", "LOG_FORMAT=text",
			}, stderr)
		},
	}
	_, err = overload.Run(ctx, cfg.Overload, svc, bin, cfg.Args, stdout, stderr)
	return err
}
