package service_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/shared/token"
)

// proxyAddr is the loopback address the forward-auth tests' "proxy" connects from;
// TRUSTED_PROXIES lists it. Connections from 127.0.0.1 are an untrusted client's.
const proxyAddr = "127.0.0.2"

// fwdAnswer is an HTTP answer of /check.
type fwdAnswer struct {
	status int
	header http.Header
	body   string
}

// forwardAuth sends one check to the sidecar's /check from the loopback address from,
// with the given headers (X-Forwarded-Method and X-Forwarded-Uri among them, as a
// proxy sets them) and method.
func (s *stack) forwardAuth(from, method string, headers http.Header) fwdAnswer {
	s.t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequest(method, "http://"+s.sc.HTTPAddr.String()+"/check", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for k, vs := range headers {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return fwdAnswer{resp.StatusCode, resp.Header, string(b)}
}

// fwdHeaders are the headers a proxy sends for a request: the original method and URI,
// the client in X-Forwarded-For, and the client's own headers.
func fwdHeaders(method, uri, client string, own map[string]string) http.Header {
	h := http.Header{}
	h.Set("X-Forwarded-Method", method)
	h.Set("X-Forwarded-Uri", uri)
	if client != "" {
		h.Set("X-Forwarded-For", client)
	}
	for k, v := range own {
		h.Set(k, v)
	}
	return h
}

// asHTTP is what Envoy sends a client for a Check answer: 200 or the denial.
func asHTTP(t *testing.T, r *authv3.CheckResponse) fwdAnswer {
	t.Helper()
	if isAllowed(r) {
		return fwdAnswer{status: 200, header: http.Header{}}
	}
	d := r.GetDeniedResponse()
	h := http.Header{}
	for _, o := range d.GetHeaders() {
		h.Set(o.GetHeader().GetKey(), o.GetHeader().GetValue())
	}
	return fwdAnswer{int(d.GetStatus().GetCode()), h, d.GetBody()}
}

// sameAnswer fails unless the forward-auth answer is the Envoy one: status, body, and
// every header of the denial.
func sameAnswer(t *testing.T, what string, got, want fwdAnswer) {
	t.Helper()
	if got.status != want.status || got.body != want.body {
		t.Fatalf("%s: forward-auth answered %d %q, ext_authz %d %q", what, got.status, got.body, want.status, want.body)
	}
	for k := range want.header {
		if got.header.Get(k) != want.header.Get(k) {
			t.Errorf("%s: header %s = %q, ext_authz sends %q", what, k, got.header.Get(k), want.header.Get(k))
		}
	}
	if want.status == 200 && got.body != "" {
		t.Errorf("%s: allowed with a body %q", what, got.body)
	}
}

// The HTTP check makes the ext_authz decision: the two interfaces count in the same
// counters, and a denial is the same status, headers and body, for every kind of answer.
func TestForwardAuthMakesTheCheckDecision(t *testing.T) {
	s := newStack(t, stackOptions{env: map[string]string{"TRUSTED_PROXIES": proxyAddr}})
	s.clock.set(s.start.Add(250 * time.Millisecond))
	ten := s.tenant()
	ch := s.channel(ten.id)
	bearer := func(v string) map[string]string { return map[string]string{"authorization": "Bearer " + v} }
	const client = "198.51.100.7"
	cases := []struct {
		name         string
		method, path string
		own          map[string]string
		budget       int
		status       int // of the answer after the budget
	}{
		{"tenant API activity", "POST", "/api/v1/conversations/c1/activities", map[string]string{"x-api-key": ten.apiKey}, 100, 429},
		{"client API activity", "POST", "/api/v1/converger/conversations/c1/activities?x=1", bearer(s.token(ch, token.SrcSecret)), 0, 429},
		{"inbound", "POST", "/api/v1/channels/" + ch.id + "/inbound", nil, 500, 429},
		{"legacy tokens per IP", "POST", "/api/v1/tokens", nil, 10, 429},
		{"password reset per IP, another spelling", "post", "/ADMIN//password/reset/", nil, 5, 429},
		{"bad API key", "POST", "/api/v1/conversations/c1/activities", map[string]string{"x-api-key": "cvg_live_nope"}, 0, 401},
		{"bad token", "POST", "/api/v1/converger/tokens/refresh", bearer("eyJ.bad.token"), 0, 403},
		{"a token where a secret belongs", "POST", "/api/v1/converger/tokens/generate", bearer(s.token(ch, token.SrcSecret)), 0, 400},
		{"unlimited route", "GET", "/api/v1/conversations/c1/activities", nil, 0, 200},
	}
	// The client API activity shares the tenant's activity_create budget, used up by
	// the first case: its first request is already over.
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			grpcReq := func(id string) *authv3.CheckRequest {
				own := map[string]string{"x-request-id": id}
				for k, v := range c.own {
					own[k] = v
				}
				return request(strings.ToUpper(c.method), c.path, client, own)
			}
			httpReq := func(id string) http.Header {
				own := map[string]string{"X-Request-Id": id}
				for k, v := range c.own {
					own[k] = v
				}
				return fwdHeaders(c.method, c.path, client, own)
			}
			// The budget, alternating between the interfaces: one counter.
			for i := range c.budget {
				id := "budget-" + strconv.Itoa(i)
				if i%2 == 0 {
					if a := s.forwardAuth(proxyAddr, "GET", httpReq(id)); a.status != 200 || a.body != "" {
						t.Fatalf("request %d of %d (HTTP): %d %s", i+1, c.budget, a.status, a.body)
					}
				} else if r := s.check(grpcReq(id)); !isAllowed(r) {
					t.Fatalf("request %d of %d (gRPC) denied", i+1, c.budget)
				}
			}
			// Over it, both interfaces answer the same, to the byte.
			id := strings.ReplaceAll(c.name, " ", "-") + "-over"
			got := s.forwardAuth(proxyAddr, "GET", httpReq(id))
			want := asHTTP(t, s.check(grpcReq(id)))
			if want.status != c.status {
				t.Fatalf("ext_authz answered %d, want %d", want.status, c.status)
			}
			sameAnswer(t, c.name, got, want)
		})
	}
}

// The check answers any method: Caddy and Traefik send GET, nginx the original
// request's method.
func TestForwardAuthAnyMethod(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true, env: map[string]string{"TRUSTED_PROXIES": proxyAddr}})
	for i, m := range []string{"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"} {
		a := s.forwardAuth(proxyAddr, m, fwdHeaders("POST", "/portal/password/reset", "192.0.2.60", nil))
		if i < 5 && a.status != 200 {
			t.Fatalf("check %d by %s: %d %s", i+1, m, a.status, a.body)
		}
		if i >= 5 && a.status != 429 {
			t.Fatalf("check %d by %s after a budget of 5: %d, want 429", i+1, m, a.status)
		}
	}
}

// Forwarding headers are believed only from TRUSTED_PROXIES: a client that reaches the
// sidecar directly with forged headers gets 403 and is counted nowhere.
func TestForwardAuthRefusesUntrustedPeers(t *testing.T) {
	for _, trusted := range []string{"", proxyAddr, "10.0.0.0/8"} {
		t.Run("TRUSTED_PROXIES="+trusted, func(t *testing.T) {
			s := newStack(t, stackOptions{noDatabase: true, env: map[string]string{"TRUSTED_PROXIES": trusted}})
			for i := range 30 {
				h := fwdHeaders("POST", "/api/v1/tokens", "203.0.113."+strconv.Itoa(i), map[string]string{"X-Request-Id": "forged-" + strconv.Itoa(i)})
				a := s.forwardAuth("127.0.0.1", "GET", h)
				if a.status != 403 || a.header.Get("Content-Type") != "application/json" || a.header.Get("X-Request-Id") != "forged-"+strconv.Itoa(i) ||
					!strings.Contains(a.body, `"code":"forbidden"`) || !strings.Contains(a.body, "TRUSTED_PROXIES") {
					t.Fatalf("direct client with forged headers: %d %v %s", a.status, a.header, a.body)
				}
			}
			if n := s.sc.Limiter.Len(); n != 0 {
				t.Fatalf("refused checks created %d counters", n)
			}
			if m := s.metrics(); !strings.Contains(m, `converger_sidecar_forward_auth_refused_total{reason="untrusted_peer"} 30`) {
				t.Errorf("refusals not counted:\n%s", grepLines(m, "forward_auth"))
			}
		})
	}
}

// The client address is resolved as on the gRPC path: X-Forwarded-For walked right to
// left from the proxy, trusted hops skipped, the entries a client wrote itself ignored.
func TestForwardAuthClientAddress(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true, env: map[string]string{"TRUSTED_PROXIES": proxyAddr + ",10.0.0.0/8"}})
	budget := func(name string, xff []string, wantKey string) {
		t.Helper()
		for i := range 6 {
			h := fwdHeaders("POST", "/admin/password/reset", "", nil)
			// A spoofer rotates the entries it writes itself.
			for _, v := range xff {
				h.Add("X-Forwarded-For", strings.ReplaceAll(v, "SPOOF", "192.0.2."+strconv.Itoa(i)))
			}
			a := s.forwardAuth(proxyAddr, "GET", h)
			if (i < 5) != (a.status == 200) {
				t.Fatalf("%s: check %d answered %d", name, i+1, a.status)
			}
		}
		if got := s.get("/debug/counter?bucket=password_reset_ip&key="+wantKey, 200); !strings.Contains(got, `"own":6`) {
			t.Errorf("%s: counter of %s: %s", name, wantKey, got)
		}
	}
	budget("the proxy's entry", []string{"203.0.113.1"}, "203.0.113.1")
	budget("spoofed entries before the proxy's", []string{"SPOOF, 203.0.113.2"}, "203.0.113.2")
	budget("a second X-Forwarded-For line", []string{"SPOOF", "203.0.113.3"}, "203.0.113.3")
	budget("trusted load balancers skipped", []string{"SPOOF, 203.0.113.4, 10.1.2.3, 10.0.0.1"}, "203.0.113.4")
	budget("IPv6 with a port: counted per /64", []string{"[2001:db8::5]:4711"}, "2001:db8::/64")
	budget("no X-Forwarded-For: the proxy itself", nil, proxyAddr)
}

// Checks without usable forwarding headers are refused with 400 and not counted;
// odd but well-formed ones are decided, never a 500.
func TestForwardAuthBadHeaders(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true, env: map[string]string{"TRUSTED_PROXIES": proxyAddr}})
	two := fwdHeaders("POST", "/api/v1/tokens", "192.0.2.1", nil)
	two.Add("X-Forwarded-Uri", "/healthz")
	twoM := fwdHeaders("POST", "/api/v1/tokens", "192.0.2.1", nil)
	twoM.Add("X-Forwarded-Method", "GET")
	for name, h := range map[string]http.Header{
		"no headers":         {},
		"no method":          {"X-Forwarded-Uri": {"/api/v1/tokens"}},
		"no URI":             {"X-Forwarded-Method": {"POST"}},
		"empty URI":          fwdHeaders("POST", "", "", nil),
		"two URIs":           two,
		"two methods":        twoM,
		"a 17 KB URI":        fwdHeaders("POST", "/api/v1/tokens?"+strings.Repeat("a", 17<<10), "", nil),
		"a 33-letter method": fwdHeaders(strings.Repeat("P", 33), "/api/v1/tokens", "", nil),
	} {
		a := s.forwardAuth(proxyAddr, "GET", h)
		if a.status != 400 || !strings.Contains(a.body, `"code":"bad_request"`) || a.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s", name, a.status, a.body)
		}
	}
	if n := s.sc.Limiter.Len(); n != 0 {
		t.Fatalf("refused checks created %d counters", n)
	}
	for _, uri := range []string{
		"/api/v1/\xff\xfe/tokens", "*", "http://api.example.test/api/v1/tokens?x=1", "https://h", "/%zz", "/../../api/v1/tokens",
		"api/v1/tokens", "/api/v1/channels/" + strings.Repeat("x", 10_000) + "/inbound",
	} {
		if a := s.forwardAuth(proxyAddr, "GET", fwdHeaders("POST", uri, "192.0.2.2", nil)); a.status != 200 && a.status != 429 {
			t.Errorf("URI %.40q: %d %s", uri, a.status, a.body)
		}
	}
	// The absolute form is the same route.
	for range 10 {
		s.forwardAuth(proxyAddr, "GET", fwdHeaders("POST", "http://api.example.test/api/v1/tokens", "192.0.2.3", nil))
	}
	if a := s.forwardAuth(proxyAddr, "GET", fwdHeaders("POST", "/api/v1/tokens", "192.0.2.3", nil)); a.status != 429 {
		t.Errorf("absolute-form URIs were not counted on their route: %d", a.status)
	}
}

// With X-Converger-Forward-Auth: nginx, denials other than 401 and 403 come as 403
// with the real status and body in headers, for the shipped nginx configuration.
func TestForwardAuthNginxMode(t *testing.T) {
	s := newStack(t, stackOptions{env: map[string]string{"TRUSTED_PROXIES": proxyAddr}})
	s.clock.set(s.start.Add(59_250 * time.Millisecond))
	nginx := func(uri string, own map[string]string) fwdAnswer {
		h := fwdHeaders("POST", uri, "192.0.2.9", own)
		h.Set("X-Converger-Forward-Auth", "nginx")
		return s.forwardAuth(proxyAddr, "POST", h)
	}
	for i := range 10 {
		if a := nginx("/api/v1/tokens", nil); a.status != 200 || a.header.Get("X-Converger-Status") != "" {
			t.Fatalf("request %d: %d %v", i+1, a.status, a.header)
		}
	}
	a := nginx("/api/v1/tokens", map[string]string{"X-Request-Id": "nginx-1"})
	want := `{"error":{"code":"rate_limited","message":"Too many requests. Please try again later.","details":{"retry_after_ms":750},"request_id":"nginx-1"}}`
	if a.status != 403 || a.header.Get("X-Converger-Status") != "429" || a.header.Get("X-Converger-Body") != want || a.body != want ||
		a.header.Get("Retry-After") != "1" || a.header.Get("X-Request-Id") != "nginx-1" {
		t.Fatalf("a 429 for nginx: %d %v %s", a.status, a.header, a.body)
	}
	a = nginx("/api/v1/conversations/c/activities", map[string]string{"x-api-key": "cvg_live_short"})
	if a.status != 401 || a.header.Get("X-Converger-Status") != "401" || !strings.Contains(a.header.Get("X-Converger-Body"), `"code":"unauthorized"`) {
		t.Fatalf("a 401 for nginx: %d %v", a.status, a.header)
	}
	a = nginx("/api/v1/converger/tokens/generate", map[string]string{"authorization": "Bearer " + s.token(s.channel(s.tenant().id), token.SrcSecret)})
	if a.status != 403 || a.header.Get("X-Converger-Status") != "400" {
		t.Fatalf("a 400 for nginx: %d %v", a.status, a.header)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
