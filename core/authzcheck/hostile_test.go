package authzcheck_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/authzcheck"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
)

// rawPost sends one HTTP/1.1 POST over a new TCP connection with the header lines as
// they are, bytes Go's HTTP client would refuse included, and returns the status.
func (c *core) rawPost(path, body string, lines ...string) int {
	c.t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(c.base, "http://"), 5*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: core.test\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n", path, len(body))
	for _, l := range lines {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		c.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// hostileLimits count activities and legacy tokens 10 per hour, so that every request
// of a test falls in one window.
const hostileLimits = `database_wait_ms: 5000
limits:
  activity_create: {limit: 10, window: 1h}
  token_create: {limit: 10, window: 1h}
`

// Odd bytes in a request — a non-UTF-8 header value, a NUL, a long value, many headers,
// a non-UTF-8 path — never switch the limit off: the CheckRequest is still valid, so 15
// requests of a tenant with a limit of 10 are 10 × 201 and then the sidecar's 429, and
// no Check fails.
func TestOddBytesAreStillRateLimited(t *testing.T) {
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	sc := startSidecar(t, dbURL, "127.0.0.1:0", hostileLimits)
	var logs logBuffer
	// A generous timeout: a Check that a loaded machine delays must not fail open.
	checker, err := authzcheck.New(authzcheck.Options{Addr: sc.GRPCAddr.String(), Logger: logs.logger(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checker.Close() })
	c := startCore(t, dbURL, checker)

	many := make([]string, 60)
	for i := range many {
		many[i] = fmt.Sprintf("X-Many-%d: %d", i, i)
	}
	variants := []struct {
		name  string
		lines []string
		query string
	}{
		{"a non-UTF-8 header value", []string{"X-Junk: \xff"}, ""},
		{"invalid UTF-8 in a known header", []string{"User-Agent: caf\xc3\x28 \xed\xa0\x80"}, ""},
		{"a NUL in a header value", []string{"X-Junk: a\x00b"}, ""},
		{"a long header value", []string{"X-Junk: " + strings.Repeat("\xfe", 3000)}, ""},
		{"many headers", many, ""},
		{"a non-UTF-8 query", nil, "?q=\xff\xfe"},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			key, conv := c.conversation()
			path := "/api/v1/conversations/" + conv + "/activities" + v.query
			lines := append([]string{"X-Api-Key: " + key}, v.lines...)
			var got []int
			for i := 1; i <= 15; i++ {
				got = append(got, c.rawPost(path, fmt.Sprintf(`{"type":"message","text":"m%d"}`, i), lines...))
			}
			created, limited := 0, 0
			for _, s := range got {
				switch s {
				case 201:
					created++
				case 429:
					limited++
				}
			}
			// The core may refuse a header outright (400/431): then nothing was created;
			// what must never happen is more than the limit getting through.
			if created > 10 || (created > 0 && (created != 10 || limited != 5)) {
				t.Fatalf("statuses %v: want 10 × 201 then 5 × 429", got)
			}
			if created == 0 {
				t.Logf("the core refused the request itself: %v", got)
			}
		})
	}
	t.Run("legacy tokens with a non-UTF-8 header", func(t *testing.T) {
		created := 0
		for range 30 {
			if c.rawPost("/api/v1/tokens", `{}`, "X-Junk: \xff") != 429 {
				created++
			}
		}
		if created != 10 {
			t.Fatalf("%d of 30 legacy token requests passed the sidecar, want 10", created)
		}
	})
	if n := checker.FailedOpen() + checker.FailedClosed(); n != 0 {
		t.Fatalf("%d checks failed; logs:\n%s", n, logs.String())
	}
}

// When the Check cannot be made, the routes that protect credentials fail closed (503,
// counted), the others open; with FailClosed every route fails closed.
func TestFailClosedForCredentials(t *testing.T) {
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	// Nothing listens on port 1 of loopback.
	var logs logBuffer
	checker := newChecker(t, "127.0.0.1:1", logs.logger())
	c := startCore(t, dbURL, checker)
	key, conv := c.conversation()
	if s := c.rawPost("/api/v1/conversations/"+conv+"/activities", `{"type":"message","text":"x"}`, "X-Api-Key: "+key); s != 201 {
		t.Fatalf("an activity with the sidecar down: %d, want 201 (fail open)", s)
	}
	for _, p := range []string{"/api/v1/tokens", "/API/v1//tokens/", "/api/v1/converger/tokens/generate",
		"/api/v1/converger/tokens/refresh", "/api/v1/converger/tokens/publishable", "/admin/login", "/portal/login/totp",
		"/admin/password/reset"} {
		r := c.do("POST", p, `{}`, map[string]string{"x-request-id": "req-closed"})
		var env envelope
		if err := json.Unmarshal(r.body, &env); err != nil || r.status != 503 || env.Error.Code != "unavailable" ||
			env.Error.RequestID != "req-closed" || r.header.Get("retry-after") == "" {
			t.Fatalf("POST %s with the sidecar down: %d %s, want 503 unavailable (fail closed)", p, r.status, r.body)
		}
	}
	if checker.FailedClosed() != 8 || checker.FailedOpen() != 1 {
		t.Fatalf("FailedClosed %d, FailedOpen %d; want 8 and 1", checker.FailedClosed(), checker.FailedOpen())
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "refused with 503") {
		t.Fatalf("want one warning naming the failure mode; logs:\n%s", logs.String())
	}

	closed := newCheckerWith(t, "127.0.0.1:1", true)
	c = startCore(t, dbURL, closed)
	key, conv = c.conversation()
	if s := c.rawPost("/api/v1/conversations/"+conv+"/activities", `{"type":"message","text":"x"}`, "X-Api-Key: "+key); s != 503 {
		t.Fatalf("an activity with the sidecar down and fail-closed: %d, want 503", s)
	}
}

func newCheckerWith(t *testing.T, addr string, failClosed bool) *authzcheck.Checker {
	t.Helper()
	k, err := authzcheck.New(authzcheck.Options{Addr: addr, Logger: quietLogger(), FailClosed: failClosed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}
