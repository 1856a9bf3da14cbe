package service_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/sidecar/service"
)

// /readyz says "database":"down" within a second or two of an outage, a stopped and a
// hung PostgreSQL alike, even when no check asks the database, and "up" again after.
func TestReadyzNoticesAnOutageWithoutTraffic(t *testing.T) {
	pg := pgserver.StartForTest(t)
	if err := migrations.Up(context.Background(), pg.URL()); err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOptions{databaseURL: pg.URL()})
	s.db.Close()
	database := func(want string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			r := s.get("/readyz", 200) // ready all along: checks go on with the caches
			if strings.Contains(r, `"database":"`+want+`"`) {
				return time.Since(start)
			}
			if time.Since(start) > within {
				t.Fatalf("/readyz after %v: %s, want database %s", within, r, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	database("up", 5*time.Second)
	if err := pg.Shutdown(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped: down after %v", database("down", 3*time.Second))
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	database("up", 10*time.Second)
	if err := pg.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Logf("hung: down after %v", database("down", 3*time.Second))
	if err := pg.Resume(); err != nil {
		t.Fatal(err)
	}
	database("up", 10*time.Second)
}

// Beyond SIDECAR_MAX_CHECKS_IN_FLIGHT, a Check waits for its turn within its deadline,
// then gets a fast decision: 503 unavailable with retry-after on a limited route (an
// overloaded sidecar never lets limited traffic through unchecked), allowed on the
// others; never a gRPC error or an answer after the deadline, which Envoy with
// failure_mode_allow would take as "let it through".
func TestChecksBeyondTheBoundGetAFastDecision(t *testing.T) {
	pg := pgserver.StartForTest(t)
	if err := migrations.Up(context.Background(), pg.URL()); err != nil {
		t.Fatal(err)
	}
	// Each check of a credential never seen waits up to 200 ms on the database, hung
	// below: two of them at a time fill the bound.
	s := newStack(t, stackOptions{databaseURL: pg.URL(), yaml: "database_wait_ms: 200\n",
		env: map[string]string{"SIDECAR_MAX_CHECKS_IN_FLIGHT": "2"}})
	s.db.Close()
	if err := pg.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pg.Resume() }()

	// Envoy's ext_authz timeout in envoy.yaml is 250 ms; a longer one leaves a loaded
	// machine (and the race detector) room without changing what is checked.
	const deadline = 2 * time.Second
	type result struct {
		resp    *authv3.CheckResponse
		req     *authv3.CheckRequest
		err     error
		took    time.Duration
		limited bool
	}
	results := make([]result, 60)
	var wg sync.WaitGroup
	for i := range results {
		limited := i%6 != 0
		req := request("GET", "/api/v1/conversations/c", "192.0.2.1", nil) // not limited
		if limited {
			req = request("POST", "/api/v1/conversations/c/activities", "192.0.2.1",
				map[string]string{"x-api-key": fmt.Sprintf("cvg_live_%043d", i)})
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			resp, err := s.authz.Check(ctx, req)
			results[i] = result{resp, req, err, time.Since(start), limited}
		})
	}
	wg.Wait()
	shed := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("check %d: %v after %v (code %v); want a decision within the deadline", i, r.err, r.took, status.Code(r.err))
		}
		if !r.limited {
			if !isAllowed(r.resp) {
				t.Errorf("check %d on a route that is not limited: %v", i, r.resp)
			}
			continue
		}
		if isAllowed(r.resp) {
			continue // it got its turn (and was counted unverified)
		}
		code, headers, env := denial(t, r.resp, r.req)
		if code != 503 || env.Error.Code != "unavailable" || headers["retry-after"] != "1" || codes.Code(r.resp.GetStatus().GetCode()) != codes.Unavailable {
			t.Fatalf("check %d: %d %+v %v, want the 503 of an overloaded sidecar", i, code, env.Error, headers)
		}
		shed++
	}
	if shed == 0 {
		t.Fatal("no check was shed with two turns for 50 checks of 200 ms")
	}
	if m := s.metrics(); !strings.Contains(m, "converger_sidecar_checks_shed_total") || strings.Contains(m, "converger_sidecar_checks_shed_total 0\n") {
		t.Errorf("shed checks are not counted:\n%s", m)
	}
	t.Logf("%d of 50 limited checks shed", shed)
}

// The HTTP port caps its connections per client address and in total (a new one takes
// the place of the longest idle), bounds headers, and keeps answering a new client.
func TestHTTPPortHoldsUpUnderAConnectionFlood(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true,
		env: map[string]string{"SIDECAR_HTTP_MAX_CONNS": "40", "SIDECAR_HTTP_MAX_CONNS_PER_IP": "10"}})
	addr := s.sc.HTTPAddr.String()
	dial := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// From one address: ten held, the eleventh told why and closed.
	for range 10 {
		dial("127.0.0.1")
	}
	time.Sleep(100 * time.Millisecond)
	c := dial("127.0.0.1")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 429") || !strings.Contains(string(b), `"code":"rate_limited"`) {
		t.Fatalf("a connection over the per-address cap got %q", b)
	}
	// From many: the total cap is reached, and idle connections make room.
	for i := range 60 {
		dial(fmt.Sprintf("127.0.1.%d", 10+i%20))
	}
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	for range 5 {
		resp, err := probe.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("a new client during the flood: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("a new client during the flood: %d", resp.StatusCode)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 32<<10))
	resp, err := probe.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("32 KiB of headers: %d, want 431", resp.StatusCode)
	}
	m := s.metrics()
	for _, want := range []string{"converger_sidecar_http_connections ", "converger_sidecar_http_connections_refused_total "} {
		if !strings.Contains(m, want) || strings.Contains(m, want+"0\n") {
			t.Errorf("metric %q missing or 0", want)
		}
	}
}

// What the HTTP port cannot read is refused with the envelope and a request id, fast,
// and the port keeps serving: a malformed request, a body over its bound (also to the
// forward-auth check, which reads none), a request that stops halfway.
func TestHTTPPortRefusesWhatItCannotRead(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true, env: map[string]string{"TRUSTED_PROXIES": proxyAddr}})
	addr := s.sc.HTTPAddr.String()
	exchange := func(raw string) string {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(proxyAddr)}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(c)
		return string(b)
	}
	big := strconv.Itoa(service.MaxHTTPBodyBytes + 1)
	for _, tc := range []struct{ name, raw, status, code string }{
		{"garbage", "\x00\xff\xfe GARBAGE\r\n\r\n", "400", "bad_request"},
		{"a body over the bound to /check", "POST /check HTTP/1.1\r\nHost: x\r\nX-Forwarded-Method: GET\r\nX-Forwarded-Uri: /\r\nContent-Length: " + big + "\r\n\r\n", "413", "payload_too_large"},
		{"a body over the bound to /json", "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: " + big + "\r\n\r\n", "413", "payload_too_large"},
		{"a bad content-length", "POST /check HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", "400", "bad_request"},
	} {
		start := time.Now()
		got := exchange(tc.raw)
		if !strings.HasPrefix(got, "HTTP/1.1 "+tc.status) || !strings.Contains(got, `"code":"`+tc.code+`"`) ||
			!strings.Contains(strings.ToLower(got), "x-request-id: ") || !strings.Contains(strings.ToLower(got), "content-type: application/json") {
			t.Errorf("%s: got %q, want %s %s with the envelope", tc.name, got, tc.status, tc.code)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: answered after %v", tc.name, d)
		}
	}
	// Half a request, then nothing: the read timeout (10 s) ends it with a 408.
	if testing.Short() {
		return
	}
	start := time.Now()
	got := exchange("GET /check HTTP/1.1\r\nHost: x\r\nX-Forwa")
	if !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, `"code":"request_timeout"`) {
		t.Errorf("half a request: got %q after %v, want 408 request_timeout", got, time.Since(start))
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the refusals /healthz answers %d", resp.StatusCode)
	}
}
