package main_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/shared/cmdline/cmdlinetest"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
	sidecarconfig "github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/service"
)

var binary string // the core binary, built once by TestMain

func TestMain(m *testing.M) {
	if addr := os.Getenv(floodEnv); addr != "" {
		os.Exit(flood(addr)) // a helper process of TestConnectionFlood
	}
	dir, err := os.MkdirTemp("", "core-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "core")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	// Not with -race, whatever the test runs with: the resilience tests hold 20,000
	// connections (a goroutine each), past the race detector's 8,128 goroutines, and
	// measure answer times that its slowdown would make meaningless.
	build := exec.CommandContext(ctx, "go", "build", "-buildvcs=auto", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	err = build.Run()
	cancel()
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, "building core:", err)
	} else {
		code = pgserver.RunTests(m)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc runs the binary with a controlled environment.
type proc struct {
	t   *testing.T
	env map[string]string
	// tls is the configuration of start's requests to ports on TLS (CORE_TLS_*,
	// CORE_OPS_TLS_*): the CA to trust and the client certificate to present.
	tls *tls.Config
}

func newProc(t *testing.T, env map[string]string) *proc {
	if env["USER"] == "" {
		env["USER"] = "e2e"
	}
	return &proc{t: t, env: env}
}

func (p *proc) environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "DATABASE_URL", "DATABASE_TIMEOUT", "ENCRYPTION_KEY", "TOKEN_SIGNING_KEY", "TOKEN_VERIFY_KEYS", "CORE_ADDR", "CORE_OPS_ADDR", "PUBLIC_URL", "USER", "LOGNAME":
			continue
		}
		out = append(out, kv)
	}
	for k, v := range p.env {
		out = append(out, k+"="+v)
	}
	return out
}

type result struct {
	code           int
	stdout, stderr string
}

func (p *proc) run(stdin string, args ...string) result {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = p.environ()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	code := 0
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		p.t.Fatalf("core %v: %v", args, err)
	}
	return result{code, out.String(), errOut.String()}
}

func (p *proc) expect(code int, want string, args ...string) result {
	p.t.Helper()
	r := p.run("", args...)
	text := r.stdout
	if code != 0 {
		text = r.stderr
	}
	if r.code != code || !strings.Contains(text, want) {
		p.t.Fatalf("core %s: exit %d (want %d)\nstdout: %s\nstderr: %s\nwant output containing %q",
			strings.Join(args, " "), r.code, code, r.stdout, r.stderr, want)
	}
	return r
}

func field(t *testing.T, out, label string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(label) + `:\s*(\S+)\s*$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q in output:\n%s", label, out)
	}
	return m[1]
}

func TestUsage(t *testing.T) {
	t.Parallel()
	p := newProc(t, map[string]string{})
	r := p.expect(0, "tenants rotate-key --name N [--grace 24h]", "help")
	for _, cmd := range []string{"serve", "migrate", "tenants create", "tenants deactivate", "channels create",
		"limits set", "limits show", "limits clear", "admins create", "keys generate", "keys public", "version"} {
		if !strings.Contains(r.stdout, cmd) {
			t.Errorf("help does not list %q", cmd)
		}
	}
	if r := p.run(""); r.code != 2 || !strings.Contains(r.stderr, "usage: core") {
		t.Errorf("no arguments: exit %d stderr %q", r.code, r.stderr)
	}
	p.expect(2, `unknown command "launch"`, "launch")
	p.expect(2, "--name is required", "tenants", "create")
	p.expect(1, "DATABASE_URL is required", "tenants", "create", "--name", "x")
	p.expect(1, "DATABASE_URL is required", "migrate")
}

// TestCommandsEndToEnd runs the binary's commands against a database it migrates itself,
// then serves with it and uses the printed credentials.
func TestCommandsEndToEnd(t *testing.T) {
	t.Parallel()
	url := pgserver.NewTestDatabase(t, nil)
	encKey := credentials.GenerateEncryptionKey()
	p := newProc(t, map[string]string{"DATABASE_URL": url, "ENCRYPTION_KEY": encKey})

	p.expect(1, "run `core migrate` first", "tenants", "create", "--name", "acme")
	p.expect(0, "database at schema version", "migrate")

	r := p.expect(0, "shown only this once", "tenants", "create", "--name", "acme")
	tenantID, apiKey := field(t, r.stdout, "id"), field(t, r.stdout, "api key")
	p.expect(1, `a tenant named "ACME" already exists`, "tenants", "create", "--name", "ACME")

	r = p.expect(0, "publishable key", "channels", "create", "--tenant", "acme", "--name", "web", "--type", "echo")
	secret := field(t, r.stdout, "secret")
	p.expect(2, `--type "sms"`, "channels", "create", "--tenant", "acme", "--name", "x", "--type", "sms")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN rate_limit_overrides"); err != nil {
		t.Fatal(err)
	}
	p.expect(2, `the limit "0" must be a positive integer`, "limits", "set", "--tenant", "acme", "inbound=0/1s")
	p.expect(2, `the window "1x" is not a duration`, "limits", "set", "--tenant", "acme", "inbound=5/1x")
	p.expect(2, `"nope" is not an overridable bucket`, "limits", "set", "--tenant", "acme", "nope=5/1s")
	p.expect(1, `no tenant named "nobody"`, "limits", "set", "--tenant", "nobody", "inbound=5/1s")
	p.expect(0, "inbound            2000/1s", "limits", "set", "--tenant", "acme", "inbound=2000/1s", "--actor", "e2e:ops")
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	n, err := conn.WaitForNotification(wctx)
	wcancel()
	if err != nil || n.Payload != tenantID {
		t.Fatalf("notification: %v %v (only the successful set may notify, with the tenant id %s)", n, err, tenantID)
	}
	p.expect(0, "inbound            2000/1s    tenant override", "limits", "show", "--tenant", "acme")
	p.expect(0, "cleared", "limits", "clear", "--tenant", "acme")

	r = p.run("long enough password\n", "admins", "create", "--email", "ops@example.com", "--password-stdin")
	if r.code != 0 || !strings.Contains(r.stdout, "Admin user created") {
		t.Fatalf("admins create: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = p.expect(0, "must be changed at the first login", "admins", "create", "--email", "second@example.com")
	password := field(t, r.stdout, "password")

	var audits int
	var leaked bool
	if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(bool_or(changes::text LIKE '%' || $1 || '%' OR changes::text LIKE '%' || $2 || '%'
		OR changes::text LIKE '%' || $3 || '%'), false) FROM audit_logs`, apiKey, secret, password).Scan(&audits, &leaked); err != nil {
		t.Fatal(err)
	}
	if audits != 6 || leaked {
		t.Fatalf("%d audit rows (want 6: tenant, channel, limits set and clear, two admins); secrets leaked: %v", audits, leaked)
	}

	// The printed credentials work against the served API.
	base := p.serve(t)
	status := func(key string) int {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/conversations/00000000-0000-0000-0000-000000000000", nil)
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(apiKey); got != http.StatusNotFound {
		t.Fatalf("the created key: %d, want 404 (authenticated, no such conversation)", got)
	}
	r = p.expect(0, "keeps working until", "tenants", "rotate-key", "--name", "acme", "--grace", "1h")
	newKey := field(t, r.stdout, "api key")
	if status(apiKey) != http.StatusNotFound || status(newKey) != http.StatusNotFound {
		t.Fatal("within the grace both keys authenticate")
	}
	p.expect(0, "deactivated", "tenants", "deactivate", "--name", "acme")
	// Refused as soon as the change's notification reaches the core, which remembers
	// keys until then.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := status(newKey)
		if got == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a deactivated tenant's key: %d, want 401", got)
		}
	}
}

// serve starts `core serve` on a free port and stops it (SIGTERM, exit 0) when the test
// ends; it returns the base URL once the API answers.
func (p *proc) serve(t *testing.T) string {
	t.Helper()
	return p.start(t).base
}

// served is a running `core serve`.
type served struct {
	t         *testing.T
	base, ops string // http://CORE_ADDR, http://CORE_OPS_ADDR (https:// on TLS)
	client    *http.Client
	cmd       *exec.Cmd
	logs      *lockedBuffer
	done      chan struct{} // closed when the process has exited, waitErr set
	waitErr   error
}

// freeAddr returns a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start runs `core serve` with p's environment (and a signing key, free addresses and
// warn-level text logs unless p's environment says otherwise), prefixed by wrap (a
// command such as prlimit, or none), and waits until it answers. It is stopped with
// SIGTERM when the test ends and must exit 0.
func (p *proc) start(t *testing.T, wrap ...string) *served {
	t.Helper()
	signing, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CORE_ADDR": freeAddr(t), "CORE_OPS_ADDR": freeAddr(t), "TOKEN_SIGNING_KEY": signing,
		"LOG_FORMAT": "text", "LOG_LEVEL": "warn"}
	for k, v := range p.env {
		env[k] = v
	}
	sp := &proc{t: t, env: env}
	args := append(append([]string(nil), wrap...), binary, "serve")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = sp.environ()
	scheme := func(tlsVar string) string {
		if env[tlsVar] != "" {
			return "https://"
		}
		return "http://"
	}
	s := &served{t: t, base: scheme("CORE_TLS_CERT_FILE") + env["CORE_ADDR"], ops: scheme("CORE_OPS_TLS_CERT_FILE") + env["CORE_OPS_ADDR"], cmd: cmd,
		logs: &lockedBuffer{}, done: make(chan struct{}), client: http.DefaultClient}
	if p.tls != nil {
		s.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: p.tls}}
	}
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.waitErr = cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
			if s.waitErr != nil {
				t.Errorf("core serve exited with %v after SIGTERM\n%s", s.waitErr, tailOf(s.logs.String()))
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-s.done
			t.Errorf("core serve did not stop within 15 s of SIGTERM")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := s.client.Get(s.base + "/api/v1/conversations/x")
		if err == nil {
			resp.Body.Close()
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("core serve exited: %v\n%s", s.waitErr, tailOf(s.logs.String()))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("core serve does not answer on %s\n%s", s.base, tailOf(s.logs.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive fails the test if the process has exited.
func (s *served) alive() {
	s.t.Helper()
	select {
	case <-s.done:
		s.t.Fatalf("core serve exited: %v\n%s", s.waitErr, tailOf(s.logs.String()))
	default:
	}
}

// tailOf is the end of a log, for failure messages.
func tailOf(s string) string {
	const max = 8 << 10
	if len(s) > max {
		return "…" + s[len(s)-max:]
	}
	return s
}

// lockedBuffer is the log of a running process, read while it is written.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCommandLine: help and --version of the binary and of serve and migrate start
// nothing (serve would listen, migrate would need a database); unknown flags are exit 2.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	env := []string{"CORE_ADDR=127.0.0.1:0", "DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}
	cmdlinetest.Check(t, binary, env, "usage: core <command>")
	cmdlinetest.Check(t, binary, env, "usage: core serve", "serve")
	cmdlinetest.Check(t, binary, env, "usage: core migrate", "migrate")
	if r := cmdlinetest.Run(t, t.TempDir(), env, binary, "serve", "now"); r.Code != 2 || !strings.Contains(r.Stderr, `unexpected argument "now"`) {
		t.Errorf("serve now: exit %d, stderr %q", r.Code, r.Stderr)
	}
	// An unreadable NAME_FILE stops the binary with a message naming it, but not its help.
	env = append(env, "TOKEN_SIGNING_KEY_FILE=/nonexistent/key")
	if r := cmdlinetest.Run(t, t.TempDir(), env, binary, "serve"); r.Code != 2 || !strings.Contains(r.Stderr, "TOKEN_SIGNING_KEY_FILE: open /nonexistent/key") {
		t.Errorf("serve with a missing key file: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if r := cmdlinetest.Run(t, t.TempDir(), env, binary, "--help"); r.Code != 0 {
		t.Errorf("--help with a missing key file: exit %d, stderr %q", r.Code, r.Stderr)
	}
}

// TestKeysRoundTrip: a token signed with the key `core keys generate` made verifies, in
// the sidecar, with the key `core keys public` printed for it, read from the file that
// `keys generate --dir` wrote; a token of another key is refused.
func TestKeysRoundTrip(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	p := newProc(t, map[string]string{})
	p.expect(0, "created "+filepath.Join(dir, "TOKEN_SIGNING_KEY"), "keys", "generate", "--dir", dir)
	fileOf := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	pub := newProc(t, map[string]string{"TOKEN_SIGNING_KEY_FILE": filepath.Join(dir, "TOKEN_SIGNING_KEY")}).
		expect(0, "", "keys", "public")
	verifyKeys := strings.TrimSpace(pub.stdout)
	if verifyKeys != fileOf("TOKEN_VERIFY_KEYS") {
		t.Fatalf("keys public printed %q; keys generate wrote %q", verifyKeys, fileOf("TOKEN_VERIFY_KEYS"))
	}

	env := map[string]string{"SIDECAR_GRPC_ADDR": "127.0.0.1:0", "SIDECAR_HTTP_ADDR": "127.0.0.1:0", "TOKEN_VERIFY_KEYS": verifyKeys,
		"CLUSTER_STRATEGY": "none"}
	cfg, err := sidecarconfig.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	sc, err := service.Start(cfg, service.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Stop)
	conn, err := grpc.NewClient(sc.GRPCAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	check := func(signingKey string) *authv3.CheckResponse {
		signer, err := token.ParseSigningKey(signingKey)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := signer.Issue(token.Claims{TenantID: "00000000-0000-4000-8000-000000000001",
			ChannelID: "00000000-0000-4000-8000-000000000002", Src: token.SrcSecret}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}}}}},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "POST", Path: "/api/v1/converger/tokens/refresh", Host: "edge.test",
				Headers: map[string]string{"authorization": "Bearer " + tok, "x-request-id": "keys-round-trip"},
			}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := check(fileOf("TOKEN_SIGNING_KEY")); r.GetStatus().GetCode() != 0 || r.GetDeniedResponse() != nil {
		t.Fatalf("a token of the generated key is refused: %v", r)
	}
	other, _ := token.GenerateKey()
	if r := check(other); r.GetDeniedResponse().GetStatus().GetCode() != 403 {
		t.Fatalf("a token of another key: %v, want a 403 denial", r)
	}
}
