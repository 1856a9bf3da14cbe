package netlimit

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A connection that is closed to make room while its server still holds it must fail
// its reads and writes, not its deadlines: fasthttp panics on a deadline error.
func TestEvictedConnectionDeadlines(t *testing.T) {
	l := Wrap(listen(t), Options{MaxConns: 1, Logger: quiet})
	defer l.Close()
	got := make(chan net.Conn, 4)
	serve(l, got)
	dialFrom(t, "127.0.0.1", l.Addr().String())
	first := recv(t, got) // idle: it sent nothing
	dialFrom(t, "127.0.0.1", l.Addr().String())
	recv(t, got) // took the first one's place
	for name, set := range map[string]func(time.Time) error{
		"SetDeadline": first.SetDeadline, "SetReadDeadline": first.SetReadDeadline, "SetWriteDeadline": first.SetWriteDeadline,
	} {
		if err := set(time.Now().Add(time.Second)); err != nil {
			t.Errorf("%s on an evicted connection: %v", name, err)
		}
	}
	if _, err := first.Write([]byte("x")); err == nil {
		t.Error("a write on an evicted connection succeeded")
	}
}

// fasthttp behind the listener, at its cap: a connection whose second, pipelined
// request fasthttp handles from its buffer (no read from the socket) is busy, and a new
// connection meanwhile is refused rather than taking its place.
func TestPipelinedRequestIsNotEvicted(t *testing.T) {
	l := Wrap(listen(t), Options{MaxConns: 1, Logger: quiet, Refuse: RefuseHTTP})
	defer l.Close()
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			time.Sleep(300 * time.Millisecond)
			ctx.SetBodyString("ok")
		},
		ConnState: func(c net.Conn, state fasthttp.ConnState) {
			switch state {
			case fasthttp.StateIdle:
				l.SetIdle(c)
			case fasthttp.StateActive:
				l.SetActive(c)
			}
		},
	}
	go func() { _ = srv.Serve(l) }()
	// Registered before the connections' cleanups, so it runs after them; bounded, so
	// that a failing test cannot hang on a connection fasthttp still holds.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
	})

	a := dialFrom(t, "127.0.0.1", l.Addr().String())
	req := "GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := io.WriteString(a, req); err != nil {
		t.Fatal(err)
	}
	// During the second request (from 300 ms to 600 ms), a new connection.
	time.Sleep(450 * time.Millisecond)
	b := dialFrom(t, "127.0.0.1", l.Addr().String())
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	refusal, _ := io.ReadAll(b)
	if !strings.HasPrefix(string(refusal), "HTTP/1.1 503") {
		t.Errorf("a connection beyond the cap with none idle got %q", refusal)
	}
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(a)
	for _, path := range []string{"/one", "/two"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("the answer to %s: %v (the connection was closed under its request)", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "ok" {
			t.Fatalf("the answer to %s: %q", path, body)
		}
	}
}
