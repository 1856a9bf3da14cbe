// Package cmdlinetest checks a built binary against the conventions of package cmdline:
// help exits 0 with the usage on stdout and starts nothing, --version names the build's
// VCS revision, and an unknown flag exits 2.
package cmdlinetest

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// Result is one run of the binary.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs binary with args in dir, with env added to the environment, and waits at most
// 20 seconds: a binary that has started serving fails the test.
func Run(t *testing.T, dir string, env []string, binary string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not exit within 20 s: it started something\nstdout: %s\nstderr: %s", binary, strings.Join(args, " "), out.String(), errOut.String())
	}
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", binary, err)
	}
	return Result{code, out.String(), errOut.String()}
}

// Check runs `binary prefix... -h`, `--help`, `--version` and an unknown flag in an empty
// directory, with env added (addresses that would be served, say), and checks their exit
// status and output, and that the directory is still empty afterwards. usage is a
// substring of the usage text.
func Check(t *testing.T, binary string, env []string, usage string, prefix ...string) {
	t.Helper()
	dir := t.TempDir()
	name := strings.Join(append([]string{baseName(binary)}, prefix...), " ")
	for _, help := range []string{"-h", "--help"} {
		r := Run(t, dir, env, binary, append(append([]string{}, prefix...), help)...)
		if r.Code != 0 || !strings.Contains(r.Stdout, usage) || r.Stderr != "" {
			t.Errorf("%s %s: exit %d, want 0 with %q on stdout and nothing on stderr\nstdout: %s\nstderr: %s", name, help, r.Code, usage, r.Stdout, r.Stderr)
		}
	}
	r := Run(t, dir, env, binary, append(append([]string{}, prefix...), "--version")...)
	rev := Revision(t, binary)
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, name+" ") || !strings.Contains(r.Stdout, ", revision "+rev+" ") && !strings.Contains(r.Stdout, ", revision "+rev+",") {
		t.Errorf("%s --version: exit %d, want 0 and %q with revision %s\nstdout: %s\nstderr: %s", name, r.Code, name, rev, r.Stdout, r.Stderr)
	}
	r = Run(t, dir, env, binary, append(append([]string{}, prefix...), "--no-such-flag")...)
	if r.Code != 2 || !strings.Contains(r.Stderr, "no-such-flag") {
		t.Errorf("%s --no-such-flag: exit %d, want 2 with the flag named on stderr\nstdout: %s\nstderr: %s", name, r.Code, r.Stdout, r.Stderr)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) > 0 {
		t.Errorf("%s wrote %s into its working directory while printing help or its version", name, entries[0].Name())
	}
}

// Revision is the VCS revision the Go toolchain recorded in binary, or "unknown" when it
// recorded none (a build outside a repository, from a git worktree, or with -buildvcs=false).
func Revision(t *testing.T, binary string) string {
	t.Helper()
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		t.Fatalf("reading the build info of %s: %v", binary, err)
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return "unknown"
}

// BuildFlags are the flags tests build binaries with: VCS stamping on where the checkout
// allows it (an environment may turn it off with GOFLAGS=-buildvcs=false), and -race when
// the test itself runs with it, so that the build reuses the packages the test's build
// compiled.
var BuildFlags = buildFlags()

func buildFlags() []string {
	flags := []string{"-buildvcs=auto"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				flags = append(flags, "-race")
			}
		}
	}
	return flags
}

func baseName(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[i+1:]
	}
	return path
}
