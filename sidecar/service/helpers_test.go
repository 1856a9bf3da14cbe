package service_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/service"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// clock is the sidecar's wall clock in these tests, so windows and TTLs move only when a
// test moves them.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// stack is a running sidecar with real gRPC clients and, optionally, its database.
type stack struct {
	t       *testing.T
	sc      *service.Sidecar
	clock   *clock
	start   time.Time // the clock's start: the beginning of an hour, so every window
	authz   authv3.AuthorizationClient
	limiter limiterpb.LimiterClient
	db      *pgxpool.Pool
	signer  *token.Signer
	tls     *tls.Config // the gRPC client's TLS with mutualTLS, else nil
}

type stackOptions struct {
	env         map[string]string
	databaseURL string // "" with noDatabase false: a fresh test database
	noDatabase  bool
	yaml        string
	// mutualTLS puts the gRPC port on mutual TLS, with the test's client allowed.
	mutualTLS bool
}

func newStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	ctx := context.Background()
	s := &stack{t: t, clock: &clock{}}
	s.start = time.Now().Truncate(time.Hour).Add(24 * time.Hour)
	s.clock.set(s.start)

	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if s.signer, err = token.ParseSigningKey(key); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"SIDECAR_GRPC_ADDR": "127.0.0.1:0",
		"SIDECAR_HTTP_ADDR": "127.0.0.1:0",
		"TOKEN_VERIFY_KEYS": s.signer.PublicKey(),
	}
	if !o.noDatabase {
		url := o.databaseURL
		if url == "" {
			url = pgserver.NewTestDatabase(t, migrations.Up)
		}
		env["DATABASE_URL"] = url
		if s.db, err = pgxpool.New(ctx, url); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.db.Close)
	}
	// A check waits on PostgreSQL for at most database_wait_ms, then counts the request
	// without the database's answer. On a loaded machine 50 ms can pass, which would make
	// the tests' counts depend on timing; tests that are about that bound set it back.
	yml := o.yaml
	if !strings.Contains(yml, "database_wait_ms") {
		yml = "database_wait_ms: 5000\n" + yml
	}
	{
		path := filepath.Join(t.TempDir(), "limits.yaml")
		if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		env["RATE_LIMIT_CONFIG"] = path
	}
	creds := insecure.NewCredentials()
	if o.mutualTLS {
		s.tls = mutualTLS(t, env)
		creds = credentials.NewTLS(s.tls.Clone())
	}
	for k, v := range o.env {
		env[k] = v
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if s.sc, err = service.Start(cfg, service.Options{Logger: log, Now: s.clock.now}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.sc.Stop)
	conn, err := grpc.NewClient(s.sc.GRPCAddr.String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.authz = authv3.NewAuthorizationClient(conn)
	s.limiter = limiterpb.NewLimiterClient(conn)
	return s
}

// mutualTLS sets in env the variables of mutual TLS on the gRPC port, with a CA and
// certificates of its own, and returns the configuration of a client it allows.
func mutualTLS(t *testing.T, env map[string]string) *tls.Config {
	t.Helper()
	const id = "spiffe://cluster.local/ns/edge/sa/envoy"
	dir := t.TempDir()
	ca, err := testpki.NewCA("service test CA")
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(testpki.Localhost("sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(testpki.Leaf{Name: "envoy", URIs: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(server, dir, "server"); err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(client, dir, "client"); err != nil {
		t.Fatal(err)
	}
	env["SIDECAR_GRPC_TLS_CERT_FILE"], env["SIDECAR_GRPC_TLS_KEY_FILE"] = server.CertFile, server.KeyFile
	env["SIDECAR_GRPC_TLS_CLIENT_CA_FILE"], env["SIDECAR_GRPC_TLS_ALLOWED_CLIENTS"] = server.CAFile, id
	c, err := tlsconfig.NewClient(&tlsconfig.ClientFiles{Name: "TEST", CAFile: client.CAFile, CertFile: client.CertFile, KeyFile: client.KeyFile}, "localhost", tlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Config()
}

// check sends one CheckRequest as Envoy builds it.
func (s *stack) check(r *authv3.CheckRequest) *authv3.CheckResponse {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := s.authz.Check(ctx, r)
	if err != nil {
		s.t.Fatalf("Check returned a gRPC error (Envoy would treat it as a failure, not a decision): %v", err)
	}
	return resp
}

// request builds a CheckRequest like Envoy's: source address, method, path and
// lower-case headers.
func request(method, path, source string, headers map[string]string) *authv3.CheckRequest {
	h := map[string]string{"x-request-id": "req-" + strconv.Itoa(int(reqSeq.Add(1)))}
	for k, v := range headers {
		h[k] = v
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: source, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 41234}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: method, Path: path, Headers: h, Protocol: "HTTP/1.1", Scheme: "http", Host: "api.example.test",
		}},
	}}
}

var reqSeq atomic.Int64

func isAllowed(r *authv3.CheckResponse) bool {
	return r.GetStatus().GetCode() == 0 && r.GetDeniedResponse() == nil
}

type envelope struct {
	Error struct {
		Code      string         `json:"code"`
		Message   string         `json:"message"`
		Details   map[string]any `json:"details"`
		RequestID string         `json:"request_id"`
	} `json:"error"`
}

// denial returns a denied response's status, headers and envelope, failing when the
// response is not a complete denial.
func denial(t *testing.T, r *authv3.CheckResponse, req *authv3.CheckRequest) (int, map[string]string, envelope) {
	t.Helper()
	d := r.GetDeniedResponse()
	if r.GetStatus().GetCode() == 0 || d == nil {
		t.Fatalf("want a denial, got %v", r)
	}
	headers := map[string]string{}
	for _, h := range d.GetHeaders() {
		headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	var env envelope
	if err := json.Unmarshal([]byte(d.GetBody()), &env); err != nil {
		t.Fatalf("denial body is not JSON: %q", d.GetBody())
	}
	if headers["content-type"] != "application/json" {
		t.Errorf("content-type = %q", headers["content-type"])
	}
	want := req.GetAttributes().GetRequest().GetHttp().GetHeaders()["x-request-id"]
	if want != "" && (env.Error.RequestID != want || headers["x-request-id"] != want) {
		t.Errorf("request id: body %q, header %q, want %q", env.Error.RequestID, headers["x-request-id"], want)
	}
	if want == "" && len(env.Error.RequestID) < 8 {
		t.Errorf("no request id generated: %q", env.Error.RequestID)
	}
	return int(d.GetStatus().GetCode()), headers, env
}

// assert429 checks the full rate-limit contract of a denial: 429, retry-after in whole
// seconds rounded up (at least 1), the rate_limited envelope with retry_after_ms.
func assert429(t *testing.T, r *authv3.CheckResponse, req *authv3.CheckRequest, wantRetryMS int64) {
	t.Helper()
	status, headers, env := denial(t, r, req)
	if status != 429 {
		t.Fatalf("status %d, want 429 (%s)", status, env.Error.Message)
	}
	wantSecs := max((wantRetryMS+999)/1000, 1)
	if headers["retry-after"] != strconv.FormatInt(wantSecs, 10) {
		t.Errorf("retry-after = %q, want %d", headers["retry-after"], wantSecs)
	}
	if env.Error.Code != "rate_limited" || env.Error.Message != "Too many requests. Please try again later." {
		t.Errorf("envelope %+v", env.Error)
	}
	if got, _ := env.Error.Details["retry_after_ms"].(float64); int64(got) != wantRetryMS {
		t.Errorf("retry_after_ms = %v, want %d", env.Error.Details["retry_after_ms"], wantRetryMS)
	}
}

// assertRejected checks a credential answer: the core's status and error code.
func assertRejected(t *testing.T, r *authv3.CheckResponse, req *authv3.CheckRequest, status int, code string) {
	t.Helper()
	got, headers, env := denial(t, r, req)
	if got != status || env.Error.Code != code {
		t.Fatalf("got %d %q, want %d %q", got, env.Error.Code, status, code)
	}
	if _, ok := headers["retry-after"]; ok {
		t.Errorf("a credential answer carries retry-after")
	}
}

// tenant is a tenant row with its plaintext API key.
type tenant struct{ id, apiKey string }

// channel is a channel row with its plaintext credentials.
type channel struct{ id, tenantID, secret, publishable string }

func randomB64(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

var names atomic.Int64

func (s *stack) tenant() tenant {
	s.t.Helper()
	key := "cvg_live_" + randomB64(32)
	var id string
	err := s.db.QueryRow(context.Background(),
		`INSERT INTO tenants (name, api_key_hash, api_key_prefix) VALUES ($1, $2, $3) RETURNING id::text`,
		fmt.Sprintf("tenant-%d", names.Add(1)), hash(key), key[:13]).Scan(&id)
	if err != nil {
		s.t.Fatal(err)
	}
	return tenant{id: id, apiKey: key}
}

func (s *stack) channel(tenantID string) channel {
	s.t.Helper()
	c := channel{tenantID: tenantID, secret: randomB64(32), publishable: "cvg_pk_" + randomB64(24)}
	err := s.db.QueryRow(context.Background(), `
		INSERT INTO channels (tenant_id, name, type, secret_hash, secret_ciphertext, publishable_key_hash)
		VALUES ($1, $2, 'echo', $3, $4, $5) RETURNING id::text`,
		tenantID, fmt.Sprintf("channel-%d", names.Add(1)), hash(c.secret), []byte("sealed"), hash(c.publishable)).Scan(&c.id)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// token issues a Converger token at the stack's clock.
func (s *stack) token(c channel, src string) string {
	s.t.Helper()
	tok, err := s.signer.Issue(token.Claims{TenantID: c.tenantID, ChannelID: c.id, Src: src}, s.clock.now())
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}

// metrics scrapes /metrics.
func (s *stack) metrics() string {
	s.t.Helper()
	return s.get("/metrics", 200)
}

func (s *stack) get(path string, want int) string {
	s.t.Helper()
	resp, err := http.Get("http://" + s.sc.HTTPAddr.String() + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		s.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}
