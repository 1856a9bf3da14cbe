package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/shared/debpkg"
	"github.com/converger/edge/shared/proxyserver"
	"github.com/converger/edge/shared/token"
)

// The shipped Caddy, nginx and (given a binary) Traefik configurations, run by the real
// proxies in front of the built sidecar and an upstream that records what reaches it.

var (
	proxiesOnce sync.Once
	proxiesErr  error
)

// requireProxies returns once Caddy and nginx are installed: it installs Debian's
// packages when one is missing and the tests run as root, and skips the test otherwise.
func requireProxies(t *testing.T) {
	t.Helper()
	missing := proxyserver.Missing()
	if len(missing) == 0 {
		return
	}
	if !debpkg.CanInstall() {
		t.Skipf("SKIP: the real-proxy tests need Caddy (%s) and nginx (%s): install Debian's caddy and nginx packages "+
			"(apt-get install caddy nginx), or run the tests as root, which installs them",
			proxyserver.Binaries[proxyserver.Caddy], proxyserver.Binaries[proxyserver.Nginx])
	}
	proxiesOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		proxiesErr = debpkg.Install(ctx, t.Logf, missing...)
	})
	if proxiesErr != nil {
		t.Fatal(proxiesErr)
	}
	if missing := proxyserver.Missing(); len(missing) > 0 {
		t.Fatalf("installed the packages, but %v are still missing", missing)
	}
}

// repoFile is a file of the repository, read from the package directory.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// upstream is the service behind the proxy: it answers 200 "upstream" and records the
// requests that reach it by their x-test-id header.
type upstream struct {
	addr string
	mu   sync.Mutex
	seen map[string]seenRequest
}

type seenRequest struct {
	method, uri, body string
	header            http.Header
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{seen: map[string]seenRequest{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		u.mu.Lock()
		u.seen[r.Header.Get("X-Test-Id")] = seenRequest{r.Method, r.RequestURI, string(body), r.Header.Clone()}
		u.mu.Unlock()
		_, _ = io.WriteString(w, "upstream")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return u
}

func (u *upstream) got(id string) (seenRequest, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	r, ok := u.seen[id]
	return r, ok
}

// startProxy starts Caddy or nginx with its shipped configuration in front of the
// sidecar's HTTP address and the upstream, until the test ends.
func startProxy(t *testing.T, name, sidecarHTTP, core string) *proxyserver.Proxy {
	t.Helper()
	p, err := proxyserver.Start(context.Background(), proxyserver.Options{
		Proxy: name, Root: repoFile(t, "."), Sidecar: sidecarHTTP, Upstream: core, Dir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, tail(p.Out.String()))
		}
	})
	return p
}

// client sends requests to a proxy from one loopback address: a client of its own.
type client struct {
	t    *testing.T
	ip   string
	http *http.Client
}

func newClient(t *testing.T, ip string) *client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{t: t, ip: ip, http: &http.Client{Timeout: 10 * time.Second, Transport: tr}}
}

type answer struct {
	status int
	header http.Header
	body   string
}

var testIDs struct {
	sync.Mutex
	n int
}

// send sends a request with a new x-test-id, returned with the answer.
func (c *client) send(p *proxyserver.Proxy, method, path, body string, header map[string]string) (answer, string) {
	c.t.Helper()
	testIDs.Lock()
	testIDs.n++
	id := fmt.Sprintf("%s-%d", p.Name, testIDs.n)
	testIDs.Unlock()
	req, err := http.NewRequest(method, "http://"+p.Addr+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("X-Test-Id", id)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s via %s: %v", method, path, p.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, string(b)}, id
}

type envelope struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Details struct {
			RetryAfterMS *int64 `json:"retry_after_ms"`
		} `json:"details"`
		RequestID string `json:"request_id"`
	} `json:"error"`
}

// denied checks a denial's contract: the status, the JSON envelope with its code,
// x-request-id the same as the body's, and for a 429 retry-after: the body's
// retry_after_ms in whole seconds, rounded up.
func denied(t *testing.T, what string, a answer, status int, code string) envelope {
	t.Helper()
	var env envelope
	if a.status != status {
		t.Fatalf("%s: %d %q, want %d", what, a.status, a.body, status)
	}
	if err := json.Unmarshal([]byte(a.body), &env); err != nil || env.Error.Code != code {
		t.Fatalf("%s: body %q, want the %s envelope", what, a.body, code)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: content-type %q", what, ct)
	}
	if id := a.header.Get("X-Request-Id"); id == "" || id != env.Error.RequestID {
		t.Errorf("%s: x-request-id %q, body's request_id %q", what, id, env.Error.RequestID)
	}
	if status == 429 {
		ms := env.Error.Details.RetryAfterMS
		if ms == nil || *ms <= 0 || a.header.Get("Retry-After") != strconv.FormatInt((*ms+999)/1000, 10) {
			t.Errorf("%s: retry-after %q with retry_after_ms %v", what, a.header.Get("Retry-After"), ms)
		}
	} else if ra := a.header.Get("Retry-After"); ra != "" {
		t.Errorf("%s: a %d with retry-after %q", what, status, ra)
	}
	for _, h := range []string{"X-Converger-Status", "X-Converger-Body"} {
		if a.header.Get(h) != "" {
			t.Errorf("%s: the client got the sidecar's %s header", what, h)
		}
	}
	return env
}

// envoyAnswer is the sidecar's ext_authz answer to the same request from the client ip
// (Envoy's view: the client as the source address).
func envoyAnswer(t *testing.T, n *node, ip, method, path string, headers map[string]string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := n.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: method, Path: path, Protocol: "HTTP/1.1", Scheme: "http", Host: "api.example.test", Headers: headers,
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	d := resp.GetDeniedResponse()
	if d == nil {
		return answer{status: 200}
	}
	h := http.Header{}
	for _, o := range d.GetHeaders() {
		h.Set(o.GetHeader().GetKey(), o.GetHeader().GetValue())
	}
	return answer{int(d.GetStatus().GetCode()), h, d.GetBody()}
}

var retryMS = regexp.MustCompile(`"retry_after_ms":\d+`)

// proxyLimits are the limits behind the proxies: budgets of 3 in hour-long windows, so
// that a window never ends during a test (the clock is put 1 s into a fresh hour).
const proxyLimits = `limits:
  token_create: {limit: 3, window: 1h}
  activity_create: {limit: 3, window: 1h}
`

// TestBehindProxies runs the shipped configurations of Caddy, nginx and Traefik in front
// of the sidecar and checks what clients get through each, as they would through Envoy.
func TestBehindProxies(t *testing.T) {
	requireProxies(t)
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.ParseSigningKey(key)
	if err != nil {
		t.Fatal(err)
	}
	offset := clockOffset(time.Hour)
	sc := startNode(t, "", "sidecar", map[string]string{
		"SIDECAR_GRPC_ADDR":            "127.0.0.1:0",
		"SIDECAR_HTTP_ADDR":            "127.0.0.1:0",
		"TRUSTED_PROXIES":              "127.0.0.1",
		"TOKEN_VERIFY_KEYS":            signer.PublicKey(),
		"RATE_LIMIT_CONFIG":            writeTemp(t, "limits.yaml", proxyLimits),
		"SIDECAR_TEST_CLOCK_OFFSET_MS": strconv.FormatInt(offset, 10),
		"LOG_FORMAT":                   "json",
	})
	core := startUpstream(t)
	// The sidecar down: a port nothing listens on, one that accepts and never answers, and
	// (below) one that answers 503.
	closed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	held.Go(func() {
		var conns []net.Conn
		for {
			c, err := hung.Accept()
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return
			}
			conns = append(conns, c)
		}
	})
	t.Cleanup(func() { hung.Close(); held.Wait() })
	// A sidecar that answers 503 to everything.
	failingSrv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	})}
	failingL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = failingSrv.Serve(failingL) }()
	t.Cleanup(func() { failingSrv.Close() })

	for i, name := range []string{proxyserver.Caddy, proxyserver.Nginx, proxyserver.Traefik} {
		t.Run(name, func(t *testing.T) {
			if name == proxyserver.Traefik && proxyserver.TraefikBinary() == "" {
				t.Skip("SKIP: no Traefik binary (set TRAEFIK=/path/to/traefik or put traefik on PATH): Debian has no package, " +
					"and building one from the Go module proxy takes about half an hour on 2 cores")
			}
			t.Parallel()
			p := startProxy(t, name, sc.httpAddr, core.addr)
			// Each proxy's clients: loopback addresses of their own.
			a := newClient(t, fmt.Sprintf("127.0.0.%d", 10+10*i))
			b := newClient(t, fmt.Sprintf("127.0.0.%d", 11+10*i))
			c := newClient(t, fmt.Sprintf("127.0.0.%d", 12+10*i))

			t.Run("within the budget reaches the upstream, over it gets the 429", func(t *testing.T) {
				for n := range 3 {
					ans, id := a.send(p, "POST", "/api/v1/tokens?n="+strconv.Itoa(n), `{"user":"u1"}`, map[string]string{"Content-Type": "application/json"})
					if ans.status != 200 || ans.body != "upstream" {
						t.Fatalf("request %d of 3: %d %q", n+1, ans.status, ans.body)
					}
					got, ok := core.got(id)
					if !ok || got.method != "POST" || got.uri != "/api/v1/tokens?n="+strconv.Itoa(n) || got.body != `{"user":"u1"}` {
						t.Fatalf("request %d of 3 reached the upstream as %+v (%v)", n+1, got, ok)
					}
				}
				ans, id := a.send(p, "POST", "/api/v1/tokens", `{"user":"u1"}`, map[string]string{"X-Request-Id": "over-" + p.Name})
				env := denied(t, "over the budget", ans, 429, "rate_limited")
				if env.Error.RequestID != "over-"+p.Name {
					t.Errorf("request_id %q, want the client's", env.Error.RequestID)
				}
				if _, ok := core.got(id); ok {
					t.Fatal("a request over the budget reached the upstream")
				}
				// What Envoy's client gets for the same request: the same status, headers and
				// body (but for the milliseconds that passed in between).
				want := envoyAnswer(t, sc, a.ip, "POST", "/api/v1/tokens", map[string]string{"x-request-id": "over-" + p.Name})
				if want.status != ans.status || retryMS.ReplaceAllString(want.body, "") != retryMS.ReplaceAllString(ans.body, "") {
					t.Errorf("through %s: %d %s; through Envoy: %d %s", p.Name, ans.status, ans.body, want.status, want.body)
				}
				for _, h := range []string{"Content-Type", "X-Request-Id"} {
					if want.header.Get(h) != ans.header.Get(h) {
						t.Errorf("%s: %q through %s, %q through Envoy", h, ans.header.Get(h), p.Name, want.header.Get(h))
					}
				}
			})

			t.Run("per-client budgets, spoofed X-Forwarded-For ignored", func(t *testing.T) {
				// a's budget is used up: entries a writes itself do not make it someone else.
				for n := range 5 {
					ans, id := a.send(p, "POST", "/api/v1/tokens", "", map[string]string{"X-Forwarded-For": fmt.Sprintf("198.51.100.%d", n)})
					denied(t, "a spoofing X-Forwarded-For", ans, 429, "rate_limited")
					if _, ok := core.got(id); ok {
						t.Fatal("a spoofed request over the budget reached the upstream")
					}
				}
				// Nor do forged forwarding headers, or a forged ask for nginx's form, change what is
				// checked or how it is answered.
				ans, _ := a.send(p, "POST", "/api/v1/tokens", "", map[string]string{
					"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/healthz", "X-Converger-Forward-Auth": "nginx",
					"X-Converger-Status": "200",
				})
				denied(t, "a forging the forwarding headers", ans, 429, "rate_limited")
				// b has a budget of its own.
				for n := range 3 {
					if ans, _ := b.send(p, "POST", "/api/v1/tokens", "", nil); ans.status != 200 {
						t.Fatalf("b's request %d: %d %s", n+1, ans.status, ans.body)
					}
				}
				denied(t, "b over its budget", first(b.send(p, "POST", "/api/v1/tokens", "", nil)), 429, "rate_limited")
				// c claiming to be a is counted as c.
				for n := range 3 {
					ans, id := c.send(p, "POST", "/api/v1/tokens", "", map[string]string{"X-Forwarded-For": a.ip})
					if ans.status != 200 {
						t.Fatalf("c's request %d, claiming to be a: %d %s", n+1, ans.status, ans.body)
					}
					if got, _ := core.got(id); !strings.HasSuffix(got.header.Get("X-Forwarded-For"), c.ip) {
						t.Errorf("the upstream got X-Forwarded-For %q", got.header.Get("X-Forwarded-For"))
					}
				}
			})

			t.Run("credentials", func(t *testing.T) {
				now := time.Now().Add(time.Duration(offset) * time.Millisecond)
				tenant := fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1)
				tok, err := signer.Issue(token.Claims{TenantID: tenant, ChannelID: "10000000-0000-4000-8000-000000000001", Src: token.SrcSecret}, now)
				if err != nil {
					t.Fatal(err)
				}
				bearer := map[string]string{"Authorization": "Bearer " + tok}
				for n := range 3 {
					ans, id := a.send(p, "POST", "/api/v1/converger/conversations/c1/activities", `{"type":"message"}`, bearer)
					if ans.status != 200 {
						t.Fatalf("activity %d with a valid token: %d %s", n+1, ans.status, ans.body)
					}
					if got, _ := core.got(id); got.header.Get("Authorization") != "Bearer "+tok {
						t.Fatal("the upstream did not get the credential")
					}
				}
				denied(t, "the tenant over its budget", first(a.send(p, "POST", "/api/v1/converger/conversations/c2/activities", "", bearer)), 429, "rate_limited")
				for _, tc := range []struct {
					what, path string
					header     map[string]string
					status     int
					code       string
				}{
					{"a bad API key", "/api/v1/conversations/c1/activities", map[string]string{"X-Api-Key": "cvg_live_nope"}, 401, "unauthorized"},
					{"no API key", "/api/v1/conversations/c1/activities", nil, 401, "unauthorized"},
					{"a bad token", "/api/v1/converger/conversations/c1/activities", map[string]string{"Authorization": "Bearer eyJ.not.valid"}, 403, "forbidden"},
					{"a token for a secret", "/api/v1/converger/tokens/generate", bearer, 400, "bad_request"},
				} {
					ans, id := b.send(p, "POST", tc.path, "{}", tc.header)
					denied(t, tc.what, ans, tc.status, tc.code)
					if _, ok := core.got(id); ok {
						t.Errorf("%s reached the upstream", tc.what)
					}
				}
			})

			t.Run("unlimited routes pass", func(t *testing.T) {
				for range 10 {
					ans, id := a.send(p, "GET", "/api/v1/conversations/c1/activities?watermark=5", "", nil)
					if _, ok := core.got(id); ans.status != 200 || !ok {
						t.Fatalf("GET activities: %d, reached the upstream: %v", ans.status, ok)
					}
				}
			})

			t.Run("a client calling the sidecar directly is refused", func(t *testing.T) {
				req, _ := http.NewRequest("GET", "http://"+sc.httpAddr+"/check", nil)
				req.Header.Set("X-Forwarded-Method", "POST")
				req.Header.Set("X-Forwarded-Uri", "/api/v1/tokens")
				req.Header.Set("X-Forwarded-For", "203.0.113.1")
				resp, err := a.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				denied(t, "a direct client", answer{resp.StatusCode, resp.Header, string(b)}, 403, "forbidden")
			})

			// The failure mode of the shipped configs: Caddy and nginx fail open, as Envoy;
			// Traefik fails closed (500), and waits 30 s for a hung sidecar, so that case is
			// left out for it.
			if name == proxyserver.Traefik {
				t.Run("sidecar unreachable: fail closed", func(t *testing.T) {
					dp := startProxy(t, name, closed, core.addr)
					ans, id := a.send(dp, "POST", "/api/v1/tokens", "body", nil)
					if _, ok := core.got(id); ans.status != 500 || ok {
						t.Fatalf("with the sidecar unreachable: %d %q, reached the upstream: %v", ans.status, ans.body, ok)
					}
				})
				return
			}
			for _, down := range []struct{ name, addr string }{{"unreachable", closed}, {"hung", hung.Addr().String()}, {"answering 503", failingL.Addr().String()}} {
				t.Run("sidecar "+down.name+": fail open", func(t *testing.T) {
					dp := startProxy(t, name, down.addr, core.addr)
					start := time.Now()
					for n := range 5 {
						ans, id := a.send(dp, "POST", "/api/v1/tokens", "body", nil)
						got, ok := core.got(id)
						if ans.status != 200 || !ok || got.body != "body" {
							t.Fatalf("request %d with the sidecar %s: %d %q, reached the upstream: %v", n+1, down.name, ans.status, ans.body, ok)
						}
					}
					if d := time.Since(start); d > 5*time.Second {
						t.Errorf("5 requests took %v with the sidecar %s: the check's timeout is not bounded", d, down.name)
					}
				})
			}
		})
	}
}

func first(a answer, _ string) answer { return a }
