// Package npmci installs the pinned Node.js packages of a test's directory (its
// package.json and package-lock.json) with `npm ci`, once per change of the lock file,
// so that tests drive real JavaScript clients at exactly the versions they pin.
package npmci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Timeout bounds one npm ci.
const Timeout = 5 * time.Minute

// Install runs `npm ci --no-audit --no-fund --ignore-scripts` in dir unless its
// node_modules already holds what package-lock.json pins (npm's own record of the
// install, node_modules/.package-lock.json, is not older than the lock file) and every
// one of the files named relative to dir exists.
func Install(t testing.TB, dir string, files ...string) {
	t.Helper()
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && !st.ModTime().Before(lock.ModTime()) && present(dir, files) {
		return
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("npm is needed to install the packages of %s (Debian: apt-get install npm)", dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	t.Logf("npm ci in %s took %v", dir, time.Since(start).Round(time.Millisecond))
}

func present(dir string, files []string) bool {
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}
