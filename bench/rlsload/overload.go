package rlsload

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/overload"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/rawcheck"
)

// RunOverload runs the overload mode: the many-keys scenario's ShouldRateLimit calls
// (-keys client addresses) sent open loop (bench/overload) to the sidecar and to the
// -overload-baseline binary.
func RunOverload(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	bin, err := procs.FindSidecar(procs.RepoRoot(), cfg.Sidecar)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-rls-overload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(Rules), 0o644); err != nil {
		return err
	}
	w, err := BuildWorkload("keys", cfg.Keys, cfg.Seed)
	if err != nil {
		return err
	}
	reqs := make([]rawcheck.Request, w.Len())
	for i := range reqs {
		reqs[i] = rawcheck.Request{B: w.Bytes(i)}
	}
	svc := overload.Service{
		Name: "rls", Method: Method, Requests: reqs,
		NewReply: func() closedloop.Reply { return new(Reply) },
		Start: func(ctx context.Context, bin string, prefix []string) (*procs.Proc, string, string, error) {
			return procs.StartSidecarUnder(ctx, prefix, bin, []string{"RLS_CONFIG_DIR=" + dir, "LOG_LEVEL=error", "LOG_FORMAT=text"}, stderr)
		},
	}
	_, err = overload.Run(ctx, cfg.Overload, svc, bin, cfg.Args, stdout, stderr)
	return err
}
