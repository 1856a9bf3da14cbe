package browsertest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/converger/edge/shared/debpkg"
)

const (
	// chromiumPath is where Debian's chromium package puts the browser.
	chromiumPath = "/usr/bin/chromium"
	// installTimeout bounds the apt-get commands that install it.
	installTimeout = 10 * time.Minute
	// browserTimeout bounds a whole browser session, from start to the last step.
	browserTimeout = 3 * time.Minute
	// stepTimeout bounds one step: a navigation, a form submission, a query.
	stepTimeout = 15 * time.Second
)

// chromium returns the path of Debian's Chromium, installing the package with apt-get
// when it is missing and the test runs as root.
func chromium(t *testing.T) string {
	t.Helper()
	if debpkg.IsExecutable(chromiumPath) {
		return chromiumPath
	}
	if os.Geteuid() != 0 {
		t.Fatalf("Chromium is not installed at %s: install Debian's chromium package "+
			"(apt-get install --no-install-recommends chromium), or run the tests as root, which installs it", chromiumPath)
	}
	timeout := installTimeout
	if deadline, ok := t.Deadline(); ok {
		// Leave the rest of the test a minute before go test's own timeout.
		timeout = min(timeout, time.Until(deadline)-time.Minute)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t.Logf("Chromium not found at %s", chromiumPath)
	if err := debpkg.Install(ctx, t.Logf, "chromium"); err != nil {
		t.Fatal(err)
	}
	if !debpkg.IsExecutable(chromiumPath) {
		t.Fatalf("installed the chromium package, but %s is still missing", chromiumPath)
	}
	return chromiumPath
}

// startBrowser starts headless Chromium with a new, empty profile directory and returns
// the context of its first tab. The browser is killed when the test ends or after
// browserTimeout, whichever comes first.
func startBrowser(t *testing.T, execPath string) context.Context {
	t.Helper()
	output := &tail{max: 32 << 10}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		// This machine's network is closed: the browser must not try to reach
		// anything but the core on loopback.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(output),
		// No UserDataDir: chromedp makes a new empty one and removes it at the end.
	)
	session, cancelSession := context.WithTimeout(context.Background(), browserTimeout)
	alloc, cancelAlloc := chromedp.NewExecAllocator(session, opts...)
	tab, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // kills the browser and waits for it
		cancelSession()
		if t.Failed() {
			// Without a D-Bus daemon (containers, CI) Chromium logs many lines about it.
			var lines []string
			for _, line := range strings.Split(output.String(), "\n") {
				if !strings.Contains(line, ":ERROR:dbus/") {
					lines = append(lines, line)
				}
			}
			t.Logf("chromium output (last %d bytes, without D-Bus errors):\n%s", output.max, strings.Join(lines, "\n"))
		}
	})
	start := time.Now()
	// The first Do starts the browser; its life is bound to tab's context, so this call
	// is bounded by browserTimeout rather than stepTimeout.
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	t.Logf("Chromium started in %v", time.Since(start).Round(time.Millisecond))
	return tab
}
