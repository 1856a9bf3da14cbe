package deploy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/cmdline/cmdlinetest"
	"github.com/converger/edge/shared/pgserver"
)

func TestMain(m *testing.M) {
	code := pgserver.RunTests(m)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinaries builds the core and the sidecar once, into a directory TestMain removes.
func buildBinaries(t *testing.T) map[string]string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "deploy-bin-")
		if err != nil {
			binErr = err
			return
		}
		binDir = dir
		for _, pkg := range []string{"core", "sidecar"} {
			args := append(append([]string{"build"}, cmdlinetest.BuildFlags...), "-o", filepath.Join(dir, pkg), "../"+pkg+"/cmd/"+pkg)
			if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
				binErr = fmt.Errorf("building %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return map[string]string{"core": filepath.Join(binDir, "core"), "sidecar": filepath.Join(binDir, "sidecar")}
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// TestKubernetesProbesServed starts the real binaries with the environment, keys and
// files the Deployment gives its sidecar and core (over a test database, on free loopback
// ports), and checks that every probe of theirs answers: a probe path the binary does
// not serve fails here, as it would fail the pod. It runs `sidecar check-config` with the
// sidecar's environment and files too, as the README tells operators to.
func TestKubernetesProbesServed(t *testing.T) {
	files, readme := readKubernetesFiles(t)
	k, err := loadKube(t, files, readme)
	if err != nil {
		t.Fatal(err)
	}
	bins := buildBinaries(t)
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	if len(k.m.deployments) != 1 {
		t.Fatalf("%d Deployments, want one", len(k.m.deployments))
	}
	d := k.m.deployments[0]
	pod := podTemplate{"deployment " + d.Name, d.Spec.Template.Labels, d.Spec.Template.Spec, false}
	ports := map[string]string{} // container port -> the loopback port it runs on here
	started := 0
	// The sidecar first: the core's LIMITER_ADDR points at it.
	for _, program := range []string{"sidecar", "core"} {
		for _, c := range pod.spec.Containers {
			if programOf(c.Image, "") != program {
				continue
			}
			mc, errs := k.materialize(t, pod, c, dbURL)
			if len(errs) > 0 {
				t.Fatal(errors.Join(errs...))
			}
			relocate(mc, ports)
			if program == "sidecar" {
				out, err := runProgram(bins[program], mc, "check-config")
				if err != nil || !regexp.MustCompile(`(?m)^RLS_CONFIG_DIR \S+: valid, \d+ files, domains edge`).MatchString(out) {
					t.Errorf("%s: sidecar check-config: %v\n%s", mc.where, err, out)
				}
			}
			startProgram(t, bins[program], mc)
			started++
			for _, err := range probeContainer(mc.where, c, ports, 30*time.Second) {
				t.Error(err)
			}
		}
	}
	if started != 2 {
		t.Errorf("%s: started %d programs, want the sidecar and the core", pod.where, started)
	}

	// The same processes, probed as broken copies of the Deployment would: each fails.
	for _, tc := range []struct{ container, old, new, want string }{
		{"core", "httpGet: {path: /readyz, port: core-ops}", "httpGet: {path: /ready, port: core-ops}", "GET /ready: 404"},
		{"core", "httpGet: {path: /healthz, port: core-ops}", "httpGet: {path: /admin/login, port: core-ops}", "GET /admin/login: 404"},
		{"sidecar", "httpGet: {path: /healthz, port: metrics}", "httpGet: {path: /health, port: metrics}", "GET /health: 404"},
	} {
		if !strings.Contains(string(files["converger.yaml"]), tc.old) {
			t.Fatalf("test setup: %q is not in converger.yaml", tc.old)
		}
		broken, err := decodeManifests(map[string][]byte{"converger.yaml": []byte(strings.Replace(string(files["converger.yaml"]), tc.old, tc.new, 1))})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range broken.deployments[0].Spec.Template.Spec.Containers {
			if c.Name != tc.container {
				continue
			}
			if all := errors.Join(probeContainer(c.Name, c, ports, 0)...); all == nil || !strings.Contains(all.Error(), tc.want) {
				t.Errorf("%q -> %q: want a probe error containing %q, got %v", tc.old, tc.new, tc.want, all)
			}
		}
	}
}

// probeContainer runs the probes of a container against the programs started here
// (ports: container port -> the loopback port), each retried for up to within (0: once).
func probeContainer(where string, c corev1.Container, ports map[string]string, within time.Duration) []error {
	var errs []error
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil {
			continue
		}
		port := strconv.Itoa(portOf(c, probePort(p)))
		if ports[port] == "" {
			errs = append(errs, fmt.Errorf("%s: the probe's port %s is not one the program listens on (%v)", where, port, ports))
			continue
		}
		if err := probe(p, "127.0.0.1:"+ports[port], within); err != nil {
			errs = append(errs, fmt.Errorf("%s: probe on container port %s: %v", where, port, err))
		}
	}
	return errs
}

// runProgram runs a command of a program (check-config) as its container would, and
// returns what it printed.
func runProgram(binary string, c *container, args ...string) (string, error) {
	cmd := exec.Command(binary, args...)
	cmd.Env = programEnv(c)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// programEnv is a container's environment for a program run here: paths through the
// mounts, text logs.
func programEnv(c *container) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "LOG_FORMAT=text"}
	for k, v := range c.env {
		env = append(env, k+"="+c.hostPath(v))
	}
	return env
}

// relocate moves every address a program listens on or dials in its pod (0.0.0.0,
// 127.0.0.1 or the pod's IP) to a free loopback port, the same one for the same port of
// the pod, and keeps cluster discovery off the network.
func relocate(c *container, ports map[string]string) {
	for k, v := range c.env {
		if k == "CLUSTER_DNS_NAME" {
			c.env[k] = "localhost" // resolved from /etc/hosts: no DNS query leaves the machine
			continue
		}
		host, port, err := net.SplitHostPort(v)
		if err != nil || (host != "0.0.0.0" && host != "127.0.0.1" && host != "localhost" && host != fakePodIP) {
			continue
		}
		if ports[port] == "" {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				panic(err)
			}
			_, free, _ := net.SplitHostPort(l.Addr().String())
			l.Close()
			ports[port] = free
		}
		c.env[k] = "127.0.0.1:" + ports[port]
	}
}

// startProgram runs a program as its container would (args, environment with paths
// through the mounts) and stops it when the test ends.
func startProgram(t *testing.T, binary string, c *container) {
	t.Helper()
	cmd := exec.Command(binary, c.args...)
	cmd.Env = programEnv(c)
	var out lockedWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", c.where, out.String())
		}
	})
}

// probe runs a probe as the kubelet would, again every 100 ms until it succeeds or within
// has passed (0: once) while the program starts: httpGet wants a status from 200 to 399,
// tcpSocket a connection. Each attempt may take 10 s, so that a loaded machine answers.
func probe(p *corev1.Probe, addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	client := &http.Client{Timeout: 10 * time.Second}
	for {
		var err error
		switch {
		case p.HTTPGet != nil:
			var resp *http.Response
			if resp, err = client.Get("http://" + addr + p.HTTPGet.Path); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode >= 200 && resp.StatusCode < 400 {
					return nil
				}
				err = fmt.Errorf("GET %s: %s", p.HTTPGet.Path, resp.Status)
			}
		case p.TCPSocket != nil:
			var conn net.Conn
			if conn, err = net.DialTimeout("tcp", addr, 10*time.Second); err == nil {
				conn.Close()
				return nil
			}
		default:
			return fmt.Errorf("a probe these checks do not run: %+v", p)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no success within %v: %v", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
