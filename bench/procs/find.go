package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// RepoRoot returns the directory of this module's go.mod above the working directory, or
// the working directory.
func RepoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/converger/edge\n") {
			return d
		}
		if d == filepath.Dir(d) {
			return wd
		}
	}
}

// FindSidecar resolves the sidecar binary named by the -sidecar flag: absolute, or
// relative to the repository root, then to the working directory.
func FindSidecar(root, bin string) (string, error) {
	cands := []string{bin}
	if !filepath.IsAbs(bin) {
		cands = []string{filepath.Join(root, bin), bin}
	}
	for _, c := range cands {
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return filepath.Abs(c)
		}
	}
	return "", fmt.Errorf("-sidecar %s: no executable there; build it with `go build -o bin/sidecar ./sidecar/cmd/sidecar`", bin)
}

// OutPath resolves a report's path: relative paths are from the repository root.
func OutPath(root, out string) string {
	if filepath.IsAbs(out) {
		return out
	}
	return filepath.Join(root, out)
}

// WriteReport writes a report to out (relative to root, see OutPath), creating its
// directory, and returns the path written; "" writes nothing.
func WriteReport(root, out, content string) (string, error) {
	if out == "" {
		return "", nil
	}
	path := OutPath(root, out)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, []byte(content), 0o644)
}
