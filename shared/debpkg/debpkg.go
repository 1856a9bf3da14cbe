// Package debpkg installs the Debian packages that tests run (PostgreSQL, Chromium, Caddy,
// nginx) with apt-get, when they are missing and the tests run as root, as CI does.
package debpkg

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// mu keeps the tests of one binary from running apt-get at the same time; apt's own
// lock (waited for up to 5 minutes) orders the test binaries of one `go test` run.
var mu sync.Mutex

// CanInstall reports whether Install can work here: the process is root and apt-get is
// on PATH.
func CanInstall() bool {
	_, err := exec.LookPath("apt-get")
	return os.Geteuid() == 0 && err == nil
}

// Install installs packages (without their recommendations). When an install fails it
// runs apt-get update (a new machine may have no package lists) and tries again, and
// once more after a pause, since another install may hold apt's locks. logf, when not
// nil, is told what happens.
func Install(ctx context.Context, logf func(format string, args ...any), packages ...string) error {
	mu.Lock()
	defer mu.Unlock()
	if logf == nil {
		logf = func(string, ...any) {}
	}
	start := time.Now()
	logf("installing Debian's %s with apt-get", strings.Join(packages, ", "))
	install := append([]string{"install", "-y", "--no-install-recommends"}, packages...)
	for attempt := 1; ; attempt++ {
		err := aptGet(ctx, install...)
		if err == nil {
			logf("installed %s in %v", strings.Join(packages, ", "), time.Since(start).Round(time.Millisecond))
			return nil
		}
		switch attempt {
		case 1:
			if err := aptGet(ctx, "update"); err != nil {
				return err
			}
		case 2:
			logf("%v; trying again", err)
			select {
			case <-ctx.Done():
				return err
			case <-time.After(15 * time.Second):
			}
		default:
			return err
		}
	}
}

func aptGet(ctx context.Context, args ...string) error {
	args = append([]string{"-o", "DPkg::Lock::Timeout=300"}, args...)
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// IsExecutable reports whether path is an executable regular file.
func IsExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
