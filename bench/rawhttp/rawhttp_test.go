package rawhttp

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// Requests go over one connection while the server keeps it, their statuses read and
// their bodies drained; a connection the server closes is dialed again.
func TestConnKeepsAliveAndRedials(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Close") != "" {
			w.Header().Set("Connection", "close")
		}
		if r.URL.Path == "/deny" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		if r.Method == "POST" {
			if b, err := io.ReadAll(r.Body); err != nil || string(b) != "a body" {
				w.WriteHeader(http.StatusBadRequest)
			} else {
				w.WriteHeader(http.StatusCreated)
			}
		}
		_, _ = io.WriteString(w, strings.Repeat("x", 100_000))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := &Conn{Addr: srv.Listener.Addr().String()}
	defer c.Close()
	ctx := context.Background()
	for i, tc := range []struct {
		req    []byte
		status int
		conns  int64
	}{
		{Request("GET", "/", "h", nil), 200, 1},
		{Request("POST", "/deny", "h", map[string]string{"X-A": "1"}), 429, 1},
		{Request("GET", "/", "h", map[string]string{"X-Close": "1"}), 200, 1},
		{Request("GET", "/", "h", nil), 200, 2},
		{RequestWithBody("POST", "/", "h", map[string]string{"Content-Type": "text/plain"}, []byte("a body")), 201, 2},
		{RequestWithBody("POST", "/", "h", nil, []byte("a body")), 201, 2}, // the body was read whole: the connection stays
	} {
		status, err := c.Do(ctx, tc.req)
		if err != nil || status != tc.status || conns.Load() != tc.conns {
			t.Fatalf("request %d: %d %v over %d connections, want %d over %d", i+1, status, err, conns.Load(), tc.status, tc.conns)
		}
	}
}
