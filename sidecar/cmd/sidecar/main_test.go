package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/cmdline/cmdlinetest"
	"github.com/converger/edge/shared/pgserver"
)

// binary is the sidecar, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sidecar-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "sidecar")
	// Built with the test binary's -race setting (cmdlinetest.BuildFlags), so that it
	// reuses the packages the test build compiled and runs under the race detector too.
	args := append(append([]string{"build"}, cmdlinetest.BuildFlags...), "-o", binary)
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the sidecar:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := pgserver.RunTests(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// configVars are the variables the sidecar reads; the test's own environment must not
// leak into the processes.
var configVars = []string{"SIDECAR_", "DATABASE_URL", "RATE_LIMIT_", "CLUSTER_", "TRUSTED_PROXIES", "TOKEN_VERIFY_KEYS", "LOG_LEVEL", "LOG_FORMAT"}

// sidecar is a sidecar process.
type sidecar struct {
	t      *testing.T
	bin    string // the build it runs
	cmd    *exec.Cmd
	stderr *logLines
	done   chan struct{} // closed when the process has exited
	err    error         // of Wait, set before done closes
}

// start starts the sidecar with env added to a clean copy of the test's environment.
func start(t *testing.T, env map[string]string) *sidecar {
	t.Helper()
	return startIn(t, "", env)
}

// startIn starts the sidecar in the network namespace netns, or in the test's own
// when netns is "".
func startIn(t *testing.T, netns string, env map[string]string) *sidecar {
	t.Helper()
	return startBinary(t, netns, binary, env)
}

// startBinary starts the sidecar binary bin (binary, or another release's).
func startBinary(t *testing.T, netns, bin string, env map[string]string) *sidecar {
	t.Helper()
	cmd := exec.Command(bin)
	if netns != "" {
		// ip execs the sidecar in its own process: signals and Pdeathsig reach it.
		cmd = exec.Command("ip", "netns", "exec", netns, bin)
	}
	for _, kv := range os.Environ() {
		keep := true
		for _, p := range configVars {
			if strings.HasPrefix(kv, p) {
				keep = false
			}
		}
		if keep {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	s := &sidecar{t: t, bin: bin, cmd: cmd, stderr: newLogLines(), done: make(chan struct{})}
	cmd.Stdout = io.Discard
	cmd.Stderr = s.stderr
	// The sidecar never outlives the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = cmd.Process.Kill()
			<-s.done
		}
	})
	return s
}

// wait waits at most timeout for the process to exit and returns its exit status.
func (s *sidecar) wait(timeout time.Duration) int {
	s.t.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		s.t.Fatalf("the sidecar did not exit within %v; stderr:\n%s", timeout, s.stderr)
	}
	var exit *exec.ExitError
	if errors.As(s.err, &exit) {
		return exit.ExitCode()
	}
	if s.err != nil {
		s.t.Fatal(s.err)
	}
	return 0
}

// logLines collects a process's stderr and finds the "sidecar started" line in it.
type logLines struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	started chan struct{} // closed when the line is seen
	grpc    string
	http    string
}

func newLogLines() *logLines { return &logLines{started: make(chan struct{})} }

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := l.partial[:i]
		l.partial = l.partial[i+1:]
		var rec struct {
			Msg  string `json:"msg"`
			GRPC string `json:"grpc"`
			HTTP string `json:"http"`
		}
		if json.Unmarshal(line, &rec) == nil && rec.Msg == "sidecar started" && l.grpc == "" {
			l.grpc, l.http = rec.GRPC, rec.HTTP
			close(l.started)
		}
	}
	return len(p), nil
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// addrs waits for the "sidecar started" line and returns the addresses it logs.
func (s *sidecar) addrs(timeout time.Duration) (grpcAddr, httpAddr string) {
	s.t.Helper()
	select {
	case <-s.stderr.started:
	case <-s.done:
		s.t.Fatalf("the sidecar exited (%v) before it started; stderr:\n%s", s.err, s.stderr)
	case <-time.After(timeout):
		s.t.Fatalf("no \"sidecar started\" line within %v; stderr:\n%s", timeout, s.stderr)
	}
	s.stderr.mu.Lock()
	defer s.stderr.mu.Unlock()
	return s.stderr.grpc, s.stderr.http
}

func TestInvalidConfigurationExits2(t *testing.T) {
	badYAML := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(badYAML, []byte("limits:\n  foo: {limit: 5, window: 1s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"RATE_LIMIT_BACKEND": "bogus"}, []string{"RATE_LIMIT_BACKEND", "bogus"}},
		{map[string]string{"TRUSTED_PROXIES": "x"}, []string{"TRUSTED_PROXIES"}},
		{map[string]string{"RATE_LIMIT_CONFIG": "/nonexistent"}, []string{"RATE_LIMIT_CONFIG", "/nonexistent"}},
		{map[string]string{"RATE_LIMIT_CONFIG": badYAML}, []string{"RATE_LIMIT_CONFIG", "limits.foo"}},
		{map[string]string{"SIDECAR_GRPC_ADDR": "localhost"}, []string{"SIDECAR_GRPC_ADDR"}},
		{map[string]string{"SIDECAR_HTTP_ADDR": "127.0.0.1:99999"}, []string{"SIDECAR_HTTP_ADDR"}},
		{map[string]string{"CLUSTER_STRATEGY": "static"}, []string{"CLUSTER_STRATEGY"}},
		{map[string]string{"RATE_LIMIT_SYNC_INTERVAL_MS": "0"}, []string{"RATE_LIMIT_SYNC_INTERVAL_MS"}},
		{map[string]string{"TOKEN_VERIFY_KEYS": "short"}, []string{"TOKEN_VERIFY_KEYS"}},
		{map[string]string{"LOG_LEVEL": "loud"}, []string{"LOG_LEVEL"}},
		{map[string]string{"DATABASE_URL": "postgres://u:hunter2@db:port/x"}, []string{"DATABASE_URL"}},
	} {
		var name []string
		for k, v := range tc.env {
			name = append(name, k+"="+v)
		}
		t.Run(strings.Join(name, ","), func(t *testing.T) {
			t.Parallel()
			s := start(t, tc.env)
			if code := s.wait(5 * time.Second); code != 2 {
				t.Errorf("exit status %d, want 2; stderr:\n%s", code, s.stderr)
			}
			out := s.stderr.String()
			for _, w := range append([]string{"sidecar: invalid configuration: "}, tc.want...) {
				if !strings.Contains(out, w) {
					t.Errorf("stderr does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "hunter2") {
				t.Errorf("stderr repeats a password:\n%s", out)
			}
		})
	}
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, body
}

func TestServesAndStopsOnSIGTERM(t *testing.T) {
	for _, tc := range []struct {
		name     string
		database bool
	}{{"without a database", false}, {"with a database", true}} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{
				"SIDECAR_GRPC_ADDR": "127.0.0.1:0",
				"SIDECAR_HTTP_ADDR": "127.0.0.1:0",
				"LOG_FORMAT":        "json",
				"LOG_LEVEL":         "info",
			}
			if tc.database {
				env["DATABASE_URL"] = pgserver.NewTestDatabase(t, migrations.Up)
			}
			s := start(t, env)
			grpcAddr, httpAddr := s.addrs(30 * time.Second)
			for _, a := range []string{grpcAddr, httpAddr} {
				host, port, err := net.SplitHostPort(a)
				if err != nil || host != "127.0.0.1" || port == "0" {
					t.Fatalf("logged address %q is not the one listened on; stderr:\n%s", a, s.stderr)
				}
			}

			if code, body := getJSON(t, "http://"+httpAddr+"/healthz"); code != 200 || body["status"] != "ok" {
				t.Errorf("/healthz: %d %v", code, body)
			}
			wantDB := "none"
			if tc.database {
				wantDB = "up"
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				code, body := getJSON(t, "http://"+httpAddr+"/readyz")
				if code != 200 || body["status"] != "ready" || body["database"] != wantDB {
					t.Fatalf("/readyz: %d %v", code, body)
				}
				// With a database, the override notifications come up shortly after.
				if !tc.database || body["override_notifications"] == true {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/readyz never reported override notifications: %v", body)
				}
				time.Sleep(10 * time.Millisecond)
			}

			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			health := healthpb.NewHealthClient(conn)
			for _, svc := range []string{"", "envoy.service.auth.v3.Authorization"} {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				cancel()
				if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("gRPC health of %q: %v, %v; want SERVING", svc, resp.GetStatus(), err)
				}
			}

			if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := s.wait(10 * time.Second); code != 0 {
				t.Errorf("exit status %d after SIGTERM, want 0; stderr:\n%s", code, s.stderr)
			}
			if !strings.Contains(s.stderr.String(), "sidecar stopped") {
				t.Errorf("no \"sidecar stopped\" line:\n%s", s.stderr)
			}
			// The ports are free again.
			for _, a := range []string{grpcAddr, httpAddr} {
				l, err := net.Listen("tcp", a)
				if err != nil {
					t.Errorf("%s still taken after the sidecar stopped: %v", a, err)
					continue
				}
				l.Close()
			}
		})
	}
}

func TestPortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, v := range []string{"SIDECAR_GRPC_ADDR", "SIDECAR_HTTP_ADDR"} {
		t.Run(v, func(t *testing.T) {
			env := map[string]string{"SIDECAR_GRPC_ADDR": "127.0.0.1:0", "SIDECAR_HTTP_ADDR": "127.0.0.1:0"}
			env[v] = taken.Addr().String()
			s := start(t, env)
			if code := s.wait(10 * time.Second); code == 0 {
				t.Errorf("exit status 0 with %s in use; stderr:\n%s", v, s.stderr)
			}
			if out := s.stderr.String(); !strings.Contains(out, v) || !strings.Contains(out, "address already in use") {
				t.Errorf("stderr does not name %s and the cause:\n%s", v, out)
			}
		})
	}
}

// TestCommandLine: help and --version start nothing, an unknown flag is exit 2.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	cmdlinetest.Check(t, binary, []string{"SIDECAR_GRPC_ADDR=127.0.0.1:0", "SIDECAR_HTTP_ADDR=127.0.0.1:0"}, "usage: sidecar")
	if r := cmdlinetest.Run(t, t.TempDir(), nil, binary, "serve"); r.Code != 2 || !strings.Contains(r.Stderr, `unexpected argument "serve"`) {
		t.Errorf("an argument: exit %d, stderr %q", r.Code, r.Stderr)
	}
}
