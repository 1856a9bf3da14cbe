package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/converger/edge/shared/cmdline/cmdlinetest"
)

func TestCommandLine(t *testing.T) {
	binary := filepath.Join(t.TempDir(), "bench")
	build := exec.Command("go", append(append([]string{"build"}, cmdlinetest.BuildFlags...), "-o", binary, ".")...)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	cmdlinetest.Check(t, binary, nil, "usage: bench <command>")
	for _, cmd := range []string{"authz", "core", "cluster", "noop"} {
		cmdlinetest.Check(t, binary, nil, "-", cmd) // every subcommand lists its flags
	}
}

func TestFreshOutputs(t *testing.T) {
	now := time.Date(2026, 12, 1, 11, 16, 0, 0, time.UTC)
	for _, tc := range []struct {
		args           []string
		update         bool
		wantOut, wantP string
	}{
		{nil, false, "bench/out/20261201T111600Z-cluster/cluster-sync.md", "bench/out/20261201T111600Z-cluster/cluster-sync.png"},
		{nil, true, "bench/results/cluster-sync.md", "bench/results/cluster-sync.png"},
		{[]string{"-out", "bench/results/cluster-sync.md"}, false, "bench/results/cluster-sync.md", "bench/out/20261201T111600Z-cluster/cluster-sync.png"},
		{[]string{"-out", "", "-plot", "/tmp/p.png"}, false, "", "/tmp/p.png"},
	} {
		fs := flag.NewFlagSet("bench cluster", flag.ContinueOnError)
		out := fs.String("out", "bench/results/cluster-sync.md", "")
		plot := fs.String("plot", "bench/results/cluster-sync.png", "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		freshOutputs(fs, "cluster", map[string]*string{"out": out, "plot": plot}, tc.update, now)
		if *out != tc.wantOut || *plot != tc.wantP {
			t.Errorf("%v update=%v: out %q plot %q, want %q %q", tc.args, tc.update, *out, *plot, tc.wantOut, tc.wantP)
		}
	}
}
