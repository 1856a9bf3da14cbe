package service

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/converger/edge/sidecar/config"
)

// StartForTest starts a sidecar in this process for a test of another package (the
// core's tests run the real sidecar beside the core) and stops it when the test ends.
// vars is its environment, over SIDECAR_GRPC_ADDR and SIDECAR_HTTP_ADDR on ports of
// loopback that the system picks; a non-empty limitsYAML is written to a file that
// RATE_LIMIT_CONFIG names.
func StartForTest(t testing.TB, vars map[string]string, limitsYAML string, o Options) *Sidecar {
	t.Helper()
	env := map[string]string{"SIDECAR_GRPC_ADDR": "127.0.0.1:0", "SIDECAR_HTTP_ADDR": "127.0.0.1:0"}
	if limitsYAML != "" {
		path := filepath.Join(t.TempDir(), "limits.yaml")
		if err := os.WriteFile(path, []byte(limitsYAML), 0o600); err != nil {
			t.Fatal(err)
		}
		env["RATE_LIMIT_CONFIG"] = path
	}
	for k, v := range vars {
		env[k] = v
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	sc, err := Start(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Stop)
	return sc
}
