package authzcheck_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/gofiber/fiber/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/authzcheck"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/service"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// logBuffer collects a logger's output.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// limitsYAML is the sidecar's configuration in these tests. The sidecar counts in fixed
// windows aligned to the wall clock, so 101 activities sent "within a second" could
// straddle two one-second windows and all pass; an hour-long window makes every request
// of a test fall in one window (TestRateLimits also re-runs once if the hour changed).
// database_wait_ms is raised so that a loaded machine cannot make the sidecar count an
// API key unverified (a timing-dependent answer).
const limitsYAML = `database_wait_ms: 5000
limits:
  activity_create: {limit: 100, window: 1h}
  token_create: {limit: 10, window: 1h}
`

// startSidecar starts the real sidecar in this process on addr (127.0.0.1:0 for any
// port) over the core's database, with the limits document limits.
func startSidecar(t *testing.T, dbURL, addr, limits string) *service.Sidecar {
	t.Helper()
	return service.StartForTest(t, map[string]string{"SIDECAR_GRPC_ADDR": addr, "DATABASE_URL": dbURL}, limits,
		service.Options{Logger: quietLogger()})
}

// core is the real core API on a listener, with the checker in front.
type core struct {
	t     *testing.T
	base  string
	store *store.Store
	// reached counts the requests that got past the checker.
	reached atomic.Int64
}

func startCore(t *testing.T, dbURL string, checker *authzcheck.Checker) *core {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, _ := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	key, _ := token.GenerateKey()
	signer, _ := token.ParseSigningKey(key)
	verifier, _ := token.ParseVerifyKeys(signer.PublicKey())
	st := store.New(pool, sealer, activity.DefaultLimits)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &core{t: t, base: "http://" + ln.Addr().String(), store: st}
	counter := func(fc *fiber.Ctx) error {
		c.reached.Add(1)
		return fc.Next()
	}
	app, listener := api.New(api.Deps{Store: st, Signer: signer, Verifier: verifier, PublicURL: c.base,
		Limits: activity.DefaultLimits, MaxUploadBytes: 1 << 20, Logger: quietLogger(),
		Middleware: []fiber.Handler{checker.Handler, counter}})
	lctx, cancel := context.WithCancel(ctx)
	go listener.Run(lctx)
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() {
		cancel()
		_ = app.ShutdownWithTimeout(5 * time.Second)
	})
	return c
}

func newChecker(t *testing.T, addr string, log *slog.Logger) *authzcheck.Checker {
	t.Helper()
	k, err := authzcheck.New(authzcheck.Options{Addr: addr, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// conversation creates a tenant with a webhook channel and a conversation, returning
// the tenant's API key and the conversation id.
func (c *core) conversation() (apiKey, conversationID string) {
	c.t.Helper()
	ctx := context.Background()
	ten, key, err := c.store.As("test").CreateTenant(ctx, fmt.Sprintf("tenant-%d", names.Add(1)))
	if err != nil {
		c.t.Fatal(err)
	}
	ch, _, err := c.store.As("test").CreateChannel(ctx, ten.ID, "web", "webhook", "duplex")
	if err != nil {
		c.t.Fatal(err)
	}
	conv, err := c.store.CreateConversation(ctx, ten.ID, ch.ID, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return key, conv.ID
}

var names atomic.Int64

type response struct {
	status int
	header http.Header
	body   []byte
}

var client = &http.Client{Timeout: 10 * time.Second}

func (c *core) do(method, path, body string, headers map[string]string) response {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("content-type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

type envelope struct {
	Error struct {
		Code      string         `json:"code"`
		Message   string         `json:"message"`
		Details   map[string]any `json:"details"`
		RequestID string         `json:"request_id"`
	} `json:"error"`
}

// assert429 checks a rate-limited answer against the sidecar's: 429, retry-after in
// whole seconds rounded up, and a body byte for byte the one the sidecar builds for the
// request id sent and the retry_after_ms it reports.
func assert429(t *testing.T, r response, requestID string) {
	t.Helper()
	var env envelope
	if err := json.Unmarshal(r.body, &env); err != nil || r.status != 429 {
		t.Fatalf("want 429 with the envelope, got %d %s", r.status, r.body)
	}
	ms, _ := env.Error.Details["retry_after_ms"].(float64)
	want := apierror.RateLimited.Body(apierror.RateLimitDetails{RetryAfterMS: int64(ms)}, requestID)
	if ms <= 0 || !bytes.Equal(r.body, want) {
		t.Fatalf("body %s, want the sidecar's %s", r.body, want)
	}
	if got, wantSecs := r.header.Get("retry-after"), strconv.FormatInt((int64(ms)+999)/1000, 10); got != wantSecs {
		t.Fatalf("retry-after %q, want %s (retry_after_ms %v)", got, wantSecs, ms)
	}
	if r.header.Get("x-request-id") != requestID || r.header.Get("content-type") != "application/json" {
		t.Fatalf("headers %v", r.header)
	}
}

// TestRateLimits runs the real core behind the real sidecar: the 101st activity of a
// tenant within the window is the sidecar's 429, reads stay unlimited, a bad API key is
// the sidecar's 401, and the client IP reaches the sidecar as the source address.
func TestRateLimits(t *testing.T) {
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	sc := startSidecar(t, dbURL, "127.0.0.1:0", limitsYAML)
	var logs logBuffer
	checker := newChecker(t, sc.GRPCAddr.String(), logs.logger())
	c := startCore(t, dbURL, checker)

	t.Run("activities", func(t *testing.T) {
		// All 101 must fall in one window (see limitsYAML); if the hour changed during
		// the run, run again with another tenant once.
		for attempt := 1; ; attempt++ {
			hour := time.Now().Truncate(time.Hour)
			key, conv := c.conversation()
			path := "/api/v1/conversations/" + conv + "/activities"
			before := c.reached.Load()
			for i := 1; i <= 100; i++ {
				r := c.do("POST", path, fmt.Sprintf(`{"type":"message","text":"m%d"}`, i), map[string]string{"x-api-key": key})
				if r.status != 201 {
					t.Fatalf("activity %d: %d %s, want 201", i, r.status, r.body)
				}
			}
			r := c.do("POST", path, `{"type":"message","text":"m101"}`, map[string]string{"x-api-key": key, "x-request-id": "req-101st"})
			if attempt == 1 && r.status != 429 && !time.Now().Truncate(time.Hour).Equal(hour) {
				t.Logf("the hour changed during the run: again")
				continue
			}
			assert429(t, r, "req-101st")
			if got := c.reached.Load() - before; got != 100 {
				t.Fatalf("%d requests reached the core, want 100 (the 429 comes from the sidecar)", got)
			}
			// The denial stands for the tenant, and no 101st row exists.
			r = c.do("POST", path, `{"type":"message","text":"again"}`, map[string]string{"x-api-key": key, "x-request-id": "req-again"})
			assert429(t, r, "req-again")

			// Reads are never counted: the tenant is over its activity limit, yet 300
			// reads all answer.
			for i := range 300 {
				r := c.do("GET", path+"?limit=1000", "", map[string]string{"x-api-key": key})
				if r.status != 200 {
					t.Fatalf("read %d: %d %s", i+1, r.status, r.body)
				}
				if i == 0 {
					var page struct {
						Data []json.RawMessage `json:"data"`
					}
					if err := json.Unmarshal(r.body, &page); err != nil || len(page.Data) != 100 {
						t.Fatalf("%d activities stored, want 100: %s", len(page.Data), r.body)
					}
				}
			}
			break
		}
	})

	t.Run("bad API key", func(t *testing.T) {
		_, conv := c.conversation()
		before := c.reached.Load()
		r := c.do("POST", "/api/v1/conversations/"+conv+"/activities", `{"type":"message","text":"x"}`,
			map[string]string{"x-api-key": "cvg_live_" + strings.Repeat("A", 43), "x-request-id": "req-badkey"})
		var env envelope
		if err := json.Unmarshal(r.body, &env); err != nil || r.status != 401 || env.Error.Code != "unauthorized" ||
			env.Error.RequestID != "req-badkey" || r.header.Get("x-request-id") != "req-badkey" {
			t.Fatalf("got %d %s, want the sidecar's 401", r.status, r.body)
		}
		if c.reached.Load() != before {
			t.Fatal("the request reached the core: the 401 must be the sidecar's")
		}
	})

	t.Run("client IP", func(t *testing.T) {
		// The legacy token endpoint is counted per client IP (token_create); the sidecar
		// knows the client only from the source address of the CheckRequest.
		for i := 1; i <= 10; i++ {
			r := c.do("POST", "/api/v1/tokens", `{}`, nil)
			if r.status == 429 {
				t.Fatalf("request %d: 429 before the limit: %s", i, r.body)
			}
		}
		r := c.do("POST", "/api/v1/tokens", `{}`, map[string]string{"x-request-id": "req-ip-11"})
		assert429(t, r, "req-ip-11")
	})

	if got := checker.FailedOpen(); got != 0 || strings.Contains(logs.String(), "fail open") {
		t.Fatalf("%d checks failed open; logs:\n%s", got, logs.String())
	}
}

// TestFailOpen: when the sidecar is down, requests go through unchecked (as Envoy's
// failure_mode_allow: true), with one warning for the outage and a note when it ends.
func TestFailOpen(t *testing.T) {
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	sc := startSidecar(t, dbURL, "127.0.0.1:0", limitsYAML)
	addr := sc.GRPCAddr.String()
	var logs logBuffer
	checker := newChecker(t, addr, logs.logger())
	c := startCore(t, dbURL, checker)
	key, conv := c.conversation()
	path := "/api/v1/conversations/" + conv + "/activities"
	badKey := map[string]string{"x-api-key": "cvg_live_" + strings.Repeat("B", 43)}

	// Checked: a bad key is the sidecar's 401.
	before := c.reached.Load()
	if r := c.do("POST", path, `{"type":"message","text":"x"}`, badKey); r.status != 401 || c.reached.Load() != before {
		t.Fatalf("with the sidecar up: %d %s", r.status, r.body)
	}

	sc.Stop()
	// Down: 150 activities (over the limit of 100) all pass, and the bad key reaches the
	// core, which answers its own 401.
	for i := 1; i <= 150; i++ {
		r := c.do("POST", path, fmt.Sprintf(`{"type":"message","text":"m%d"}`, i), map[string]string{"x-api-key": key})
		if r.status != 201 {
			t.Fatalf("activity %d with the sidecar down: %d %s, want 201 (fail open)", i, r.status, r.body)
		}
	}
	before = c.reached.Load()
	if r := c.do("POST", path, `{"type":"message","text":"x"}`, badKey); r.status != 401 || c.reached.Load() != before+1 {
		t.Fatalf("bad key with the sidecar down: %d %s, want the core's own 401", r.status, r.body)
	}
	if got := checker.FailedOpen(); got != 151 {
		t.Fatalf("FailedOpen = %d, want 151", got)
	}
	if n := strings.Count(logs.String(), "fail open"); n != 1 {
		t.Fatalf("%d fail-open warnings, want exactly 1; logs:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), addr) {
		t.Fatalf("the warning should name the address; logs:\n%s", logs.String())
	}

	// Back: a sidecar on the same address is asked again once gRPC has reconnected
	// (its backoff after a few failures is a few seconds).
	startSidecar(t, dbURL, addr, limitsYAML)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := c.do("POST", path, `{"type":"message","text":"x"}`, badKey)
		if r.status != 401 {
			t.Fatalf("bad key: %d %s", r.status, r.body)
		}
		if strings.Contains(logs.String(), "check is back") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the checker did not recover within 20s; logs:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "let_through_unchecked=") {
		t.Fatalf("the recovery should say how many went through; logs:\n%s", logs.String())
	}
}

// fakeAuthz is an Authorization server whose answers a test sets, recording what it is
// asked: it shows the CheckRequest the middleware builds and how answers are enforced.
type fakeAuthz struct {
	authv3.UnimplementedAuthorizationServer
	mu     sync.Mutex
	reqs   []*authv3.CheckRequest
	answer *authv3.CheckResponse
	delay  time.Duration
}

func (f *fakeAuthz) Check(ctx context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, r)
	a, d := f.answer, f.delay
	f.mu.Unlock()
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			// The caller's deadline: an error, never an answer that could arrive in time.
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if a == nil {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)}}, nil
	}
	return a, nil
}

func (f *fakeAuthz) set(a *authv3.CheckResponse, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer, f.delay = a, delay
}

func (f *fakeAuthz) last(t *testing.T) *authv3.CheckRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		t.Fatal("no Check was made")
	}
	return f.reqs[len(f.reqs)-1]
}

func startFake(t *testing.T) (*fakeAuthz, string) {
	t.Helper()
	f := &fakeAuthz{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(service.GRPCServerOptions()...)
	authv3.RegisterAuthorizationServer(s, f)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return f, ln.Addr().String()
}

// rawRequest sends one HTTP/1.1 request over its own connection and returns the
// response and the connection's local address (the source the Check must report).
func rawRequest(t *testing.T, base, raw string) (*http.Response, []byte, *net.TCPAddr) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b, conn.LocalAddr().(*net.TCPAddr)
}

func TestCheckRequestIsEnvoys(t *testing.T) {
	f, addr := startFake(t)
	c := startCore(t, pgserver.NewTestDatabase(t, migrations.Up), newChecker(t, addr, quietLogger()))
	host := strings.TrimPrefix(c.base, "http://")

	raw := "POST /api/v1/Conversations/abc/activities?watermark=c2VxOjE&limit=5 HTTP/1.1\r\n" +
		"Host: " + host + "\r\n" +
		"X-Api-Key: cvg_live_k\r\n" +
		"Authorization: Bearer tok\r\n" +
		"X-Forwarded-For: 203.0.113.9\r\n" +
		"X-Multi: a\r\n" +
		"x-multi: b\r\n" +
		"Content-Type: application/json\r\n" +
		"Content-Length: 2\r\n" +
		"Connection: close\r\n\r\n{}"
	resp, _, local := rawRequest(t, c.base, raw)
	req := f.last(t)
	a := req.GetAttributes()
	h := a.GetRequest().GetHttp()
	src := a.GetSource().GetAddress().GetSocketAddress()
	if src.GetAddress() != "127.0.0.1" || int(src.GetPortValue()) != local.Port {
		t.Errorf("source %v, want the peer 127.0.0.1:%d", src, local.Port)
	}
	if dst := a.GetDestination().GetAddress().GetSocketAddress(); net.JoinHostPort(dst.GetAddress(), strconv.Itoa(int(dst.GetPortValue()))) != host {
		t.Errorf("destination %v, want %s", dst, host)
	}
	want := map[string]string{
		"method": "POST", "path": "/api/v1/Conversations/abc/activities?watermark=c2VxOjE&limit=5",
		"host": host, "scheme": "http", "protocol": "HTTP/1.1", "size": "2",
	}
	got := map[string]string{"method": h.GetMethod(), "path": h.GetPath(), "host": h.GetHost(), "scheme": h.GetScheme(),
		"protocol": h.GetProtocol(), "size": strconv.FormatInt(h.GetSize(), 10)}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	rid := resp.Header.Get("x-request-id")
	wantHeaders := map[string]string{
		"host": host, "x-api-key": "cvg_live_k", "authorization": "Bearer tok", "x-forwarded-for": "203.0.113.9",
		"x-multi": "a,b", "content-type": "application/json", "content-length": "2", "x-request-id": rid,
	}
	for k, v := range wantHeaders {
		if h.GetHeaders()[k] != v {
			t.Errorf("header %s = %q, want %q (all: %v)", k, h.GetHeaders()[k], v, h.GetHeaders())
		}
	}
	for k := range h.GetHeaders() {
		if k != strings.ToLower(k) {
			t.Errorf("header %q is not lower case", k)
		}
	}
	if rid == "" || h.GetId() != rid {
		t.Errorf("request id: Check %q, response %q", h.GetId(), rid)
	}

	// A client's sensible x-request-id is kept, as behind Envoy.
	r := c.do("POST", limitedPath, "{}", map[string]string{"x-request-id": "client-id-1"})
	if got := f.last(t).GetAttributes().GetRequest().GetHttp().GetHeaders()["x-request-id"]; got != "client-id-1" || r.header.Get("x-request-id") != "client-id-1" {
		t.Errorf("x-request-id %q in the Check, %q on the response; want client-id-1", got, r.header.Get("x-request-id"))
	}
}

// limitedPath is a route of the sidecar's table (activity_create), which the middleware
// asks about; without an API key the core answers it 401.
const limitedPath = "/api/v1/conversations/x/activities"

func header(k, v string, action corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}, AppendAction: action}
}

func TestAnswersAreEnforcedAsTheyAre(t *testing.T) {
	f, addr := startFake(t)
	var logs logBuffer
	checker := newChecker(t, addr, logs.logger())
	c := startCore(t, pgserver.NewTestDatabase(t, migrations.Up), checker)

	t.Run("denied", func(t *testing.T) {
		f.set(&authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_PaymentRequired},
				Headers: []*corev3.HeaderValueOption{
					header("content-type", "text/plain", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
					header("x-request-id", "from-sidecar", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
					header("x-extra", "1", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD),
				},
				Body: "pay up",
			}},
		}, 0)
		before := c.reached.Load()
		r := c.do("POST", limitedPath, "{}", nil)
		if r.status != 402 || string(r.body) != "pay up" || r.header.Get("content-type") != "text/plain" ||
			r.header.Get("x-request-id") != "from-sidecar" || r.header.Get("x-extra") != "1" {
			t.Fatalf("got %d %v %q", r.status, r.header, r.body)
		}
		if c.reached.Load() != before {
			t.Fatal("a denied request reached the core")
		}
	})

	t.Run("denied without a response", func(t *testing.T) {
		// Envoy answers 403 when a denial carries no status; the core keeps its envelope.
		f.set(&authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}, 0)
		r := c.do("POST", limitedPath, "{}", map[string]string{"x-request-id": "rid-403"})
		var env envelope
		if err := json.Unmarshal(r.body, &env); err != nil || r.status != 403 || env.Error.Code != "forbidden" || env.Error.RequestID != "rid-403" {
			t.Fatalf("got %d %s", r.status, r.body)
		}
	})

	t.Run("allowed with headers", func(t *testing.T) {
		f.set(&authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
				ResponseHeadersToAdd: []*corev3.HeaderValueOption{header("x-checked", "yes", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)},
			}},
		}, 0)
		r := c.do("POST", limitedPath, "{}", nil)
		if r.status != 401 || r.header.Get("x-checked") != "yes" {
			t.Fatalf("got %d %v %s", r.status, r.header, r.body)
		}
	})

	t.Run("slow sidecar fails open after the timeout", func(t *testing.T) {
		f.set(nil, 2*time.Second)
		start := time.Now()
		before := c.reached.Load()
		r := c.do("POST", limitedPath, "{}", nil)
		if el := time.Since(start); r.status != 401 || c.reached.Load() != before+1 || el > 1500*time.Millisecond || el < authzcheck.DefaultTimeout {
			t.Fatalf("got %d after %v, want the core's 401 after about %v", r.status, el, authzcheck.DefaultTimeout)
		}
		if checker.FailedOpen() != 1 || !strings.Contains(logs.String(), "DeadlineExceeded") {
			t.Fatalf("FailedOpen %d; logs:\n%s", checker.FailedOpen(), logs.String())
		}
		f.set(nil, 0)
	})
}

func TestNewRefusesABadAddress(t *testing.T) {
	if _, err := authzcheck.New(authzcheck.Options{Addr: "no-port"}); err == nil || !strings.Contains(err.Error(), "AUTHZ_ADDR") {
		t.Fatalf("err = %v", err)
	}
}
