// Package runinfo describes a benchmark run for its report: the machine, the Go version,
// the load average, and the command line that reproduces the run.
package runinfo

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Machine is what a report says about where it ran.
type Machine struct {
	CPU       string // model name
	NProc     int
	GoVersion string // `go version`
	BenchGo   string // the Go version the bench binary was built with
}

// Describe returns the machine's description.
func Describe(ctx context.Context) Machine {
	return Machine{CPU: CPUModel(), NProc: runtime.NumCPU(), GoVersion: GoVersion(ctx), BenchGo: runtime.Version()}
}

// GoVersion returns the output of `go version`.
func GoVersion(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "version").Output()
	if err != nil {
		return "unknown (go not on PATH; the bench was built with " + runtime.Version() + ")"
	}
	return strings.TrimSpace(string(out))
}

// CPUModel returns the model name of the first CPU in /proc/cpuinfo.
func CPUModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// LoadAvg returns the 1, 5 and 15-minute load averages of /proc/loadavg.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Verdict prints a check's outcome.
func Verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// Latency prints a latency with three significant digits: 850µs, 4.41ms, 12.1ms, 122ms.
func Latency(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0fms", float64(d)/1e6)
}

// Command returns the shell command that reproduces a run of `bench <sub> args...`,
// building the binaries first.
func Command(sub string, args []string) string {
	parts := []string{"go build -o bin/sidecar ./sidecar/cmd/sidecar && go build -o bin/bench ./bench/cmd/bench && ./bin/bench " + sub}
	for _, a := range args {
		parts = append(parts, ShellQuote(a))
	}
	return strings.Join(parts, " ")
}

// ShellQuote quotes s for a POSIX shell when it needs quoting.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Source describes the source a binary was built from, as far as the work tree tells: the
// commit checked out, and whether the given paths have uncommitted changes. The bench
// cannot see how a binary was built; this is the tree it most likely came from.
func Source(ctx context.Context, root string, paths ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	head, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not a git work tree)"
	}
	s := "commit " + strings.TrimSpace(string(head))
	args := append([]string{"-C", root, "status", "--porcelain", "--"}, paths...)
	if out, err := exec.CommandContext(ctx, "git", args...).Output(); err == nil && len(strings.TrimSpace(string(out))) > 0 {
		s += fmt.Sprintf(", with uncommitted changes under %s", strings.Join(paths, ", "))
	}
	return s
}
