package browsertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

func TestMain(m *testing.M) {
	code := pgserver.RunTests(m)
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

const (
	buildTimeout = 5 * time.Minute
	readyTimeout = 30 * time.Second
)

// coreVars are the prefixes of the variables `core serve` reads; the test's own
// environment must not leak them into the process.
var coreVars = []string{
	"CORE_", "DATABASE_", "PUBLIC_URL=", "TOKEN_", "ENCRYPTION_KEY=", "LIMITER_ADDR=",
	"AUTHZ_ADDR=", "TRUSTED_PROXIES=", "ACTIVITY_MAX_", "UPLOAD_MAX_BYTES=", "LOG_LEVEL=",
	"LOG_FORMAT=", "ADMIN_", "SMTP_", "SESSION_", "CORS_ORIGINS=",
}

// core is a `core serve` process started by startCore.
type core struct {
	base   string // http://127.0.0.1:port, also its PUBLIC_URL
	bin    string // the binary, for its management commands
	env    []string
	stderr *tail
	done   chan struct{} // closed when the process has exited
	err    error         // of Wait, set before done closes
}

// admin is the first admin the core creates at start from ADMIN_EMAIL and ADMIN_PASSWORD.
type admin struct{ email, password string }

// moduleRoot is the directory of go.mod above the package directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the package directory")
		}
		dir = parent
	}
}

// built is the core binary buildCore made for this test process.
var built struct {
	sync.Mutex
	dir, bin string
}

// buildCore builds ./core/cmd/core once per test process, with the race detector when
// the test binary has it, so that the server runs under it too.
func buildCore(t *testing.T) string {
	t.Helper()
	built.Lock()
	defer built.Unlock()
	if built.bin != "" {
		return built.bin
	}
	dir, err := os.MkdirTemp("", "browsertest-core-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "core")
	args := []string{"build", "-o", bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", append(args, "./core/cmd/core")...)
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s ./core/cmd/core: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built the core in %v", time.Since(start).Round(time.Millisecond))
	built.dir, built.bin = dir, bin
	return bin
}

func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// newAdmin makes the first admin's credentials: a fixed address and a random password.
func newAdmin(t *testing.T) admin {
	t.Helper()
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return admin{email: "admin@example.com", password: base64.RawURLEncoding.EncodeToString(b)}
}

// startCore builds the core and serves it on a free loopback port over a fresh database,
// with generated keys, the first admin a, the in-process limiter (no LIMITER_ADDR) and
// the extra variables. It returns once the core answers HTTP; the process is killed when
// the test ends.
func startCore(t *testing.T, a admin, extra ...string) *core {
	t.Helper()
	bin := buildCore(t)
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	signingKey, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	encryptionKey := credentials.GenerateEncryptionKey()
	// The port was free a moment ago; another process may take it before the core
	// binds it, so a core that cannot bind is started again on another.
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		c := &core{base: "http://" + addr, bin: bin, stderr: &tail{max: 64 << 10}, done: make(chan struct{})}
		for _, kv := range os.Environ() {
			if !hasAnyPrefix(kv, coreVars) {
				c.env = append(c.env, kv)
			}
		}
		c.env = append(c.env,
			"CORE_ADDR="+addr,
			"CORE_OPS_ADDR=127.0.0.1:0",
			"PUBLIC_URL="+c.base,
			"DATABASE_URL="+dbURL,
			"TOKEN_SIGNING_KEY="+signingKey,
			"ENCRYPTION_KEY="+encryptionKey,
			"ADMIN_EMAIL="+a.email,
			"ADMIN_PASSWORD="+a.password,
			"LOG_FORMAT=text",
		)
		c.env = append(c.env, extra...)
		c.start(t)
		err := c.waitReady()
		if err == nil {
			return c
		}
		if attempt < 3 && strings.Contains(c.stderr.String(), "address already in use") {
			t.Logf("%v; starting it again on another port", err)
			continue
		}
		t.Fatal(err)
	}
}

// start starts `core serve` with c's environment; the process is killed when the test
// ends.
func (c *core) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(c.bin, "serve")
	cmd.Env = c.env
	cmd.Stdout = c.stderr
	cmd.Stderr = c.stderr
	setParentDeathSignal(cmd)
	cmd.WaitDelay = 5 * time.Second

	// The kernel sends the parent-death signal when the thread that started the child
	// ends, not the process: start and wait from one goroutine locked to its thread.
	// It unlocks when the child has exited: a goroutine that ends locked ends its
	// thread, which would signal other children started from it (the PostgreSQL server).
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(c.done)
			return
		}
		started <- nil
		c.err = cmd.Wait()
		close(c.done)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("core serve output (last %d bytes):\n%s", c.stderr.max, c.stderr.String())
		}
	})
}

// command runs one of the core's management commands (`core tenants create …`) on the
// core's database and returns its standard output.
func (c *core) command(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env = append(slices.Clip(c.env), "USER=browsertest")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("core %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// waitReady polls the login page until the core answers HTTP at all (any status), the
// process exits or readyTimeout passes.
func (c *core) waitReady() error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(readyTimeout)
	for {
		resp, err := client.Get(c.base + "/admin/login")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("core serve exited before it answered: %v\n%s", c.err, c.stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("core serve did not answer at %s within %v: %v", c.base, readyTimeout, err)
		}
	}
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// tail keeps the last max bytes written to it; safe for concurrent writers.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = w.buf[over:]
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(bytes.ToValidUTF8(w.buf, []byte("?")))
}
