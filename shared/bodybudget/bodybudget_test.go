package bodybudget

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// serve runs a streaming fasthttp server on loopback whose handler reads each body
// with b and the rules, answering 200 with the body's length or the error's name, and
// holds what it read until release is closed.
func serve(t *testing.T, b *Budget, r Rules, release chan struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{StreamRequestBody: true, MaxRequestBodySize: 1, ReadTimeout: 10 * time.Second, Handler: func(ctx *fasthttp.RequestCtx) {
		h, err := b.Read(ctx, string(ctx.Request.Header.Peek("x-client")), r)
		if err != nil {
			ctx.SetConnectionClose()
			ctx.SetStatusCode(503)
			ctx.SetBodyString(err.Error())
			return
		}
		<-release
		h.Release()
		ctx.SetBodyString(fmt.Sprint(len(ctx.Request.Body())))
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// send sends headers declaring declared bytes, then first bytes of the body.
func send(t *testing.T, addr, client string, declared, first int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nx-client: %s\r\nContent-Length: %d\r\n\r\n%s", client, declared, strings.Repeat("a", first))
	return c
}

func answer(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
	return resp.StatusCode, sb.String()
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A body's buffer grows with what arrived, not with what it declared; beyond the
// client's part of the budget, or the whole, a body is refused at once; what a body
// held comes back once it is released.
func TestBudget(t *testing.T) {
	b := New(96<<10, 64<<10)
	release := make(chan struct{})
	addr := serve(t, b, Rules{Max: 4 << 20, Timeout: 5 * time.Second}, release)
	// 4 MB declared, 20 KiB sent: at most 32 KiB held (4 KiB doubled).
	a1 := send(t, addr, "a", 4_000_000, 20<<10)
	eventually(t, "the first body holds nothing", func() bool { return b.Used() > 0 })
	if u := b.Used(); u > 32<<10 {
		t.Fatalf("%d bytes held for 20 KiB arrived", u)
	}
	// A second of client a's: its next 32 KiB would take a over 64 KiB.
	a2 := send(t, addr, "a", 4_000_000, 40<<10)
	if code, body := answer(t, a2); code != 503 || body != ErrBudget.Error() {
		t.Fatalf("client a over its part: %d %q", code, body)
	}
	// Client b: within its part, until the whole budget is used up.
	b1 := send(t, addr, "b", 48<<10, 48<<10)
	eventually(t, "client b's body is not held", func() bool { return b.Used() >= 80<<10 })
	b2 := send(t, addr, "b", 20<<10, 20<<10)
	if code, body := answer(t, b2); code != 503 || body != ErrBudget.Error() {
		t.Fatalf("over the whole budget: %d %q", code, body)
	}
	close(release)
	if code, body := answer(t, b1); code != 200 || body != fmt.Sprint(48<<10) {
		t.Fatalf("client b's body: %d %q", code, body)
	}
	a1.Close()
	eventually(t, "the budget is not given back", func() bool { return b.Used() == 0 })
	if b.Refused(1) != 2 {
		t.Fatalf("%d refusals over budget, want 2", b.Refused(1))
	}
}

// A body over its bound is refused before it is read; one that arrives slower than
// the minimum rate is cut off once the grace has passed.
func TestTooLargeAndTooSlow(t *testing.T) {
	b := New(1<<20, 0)
	release := make(chan struct{})
	close(release)
	addr := serve(t, b, Rules{Max: 64 << 10, Timeout: 5 * time.Second, MinRate: 1024, Grace: 500 * time.Millisecond}, release)
	// (fasthttp calls the handler once a byte or two of the body arrived.)
	if code, body := answer(t, send(t, addr, "a", 65<<10, 2)); code != 503 || body != ErrTooLarge.Error() {
		t.Fatalf("declared over the bound: %d %q", code, body)
	}
	start := time.Now()
	if code, body := answer(t, send(t, addr, "a", 60<<10, 1<<10)); code != 503 || body != ErrTooSlow.Error() {
		t.Fatalf("a body that stopped: %d %q", code, body)
	}
	// 0.5 s of grace, then 1 KiB/s: 1 KiB lasts until 1.5 s, well before the body's 5 s.
	if d := time.Since(start); d < time.Second || d > 3*time.Second {
		t.Fatalf("cut off after %v", d)
	}
	c := send(t, addr, "a", 2<<10, 2<<10)
	if code, body := answer(t, c); code != 200 || body != fmt.Sprint(2<<10) {
		t.Fatalf("a small body: %d %q", code, body)
	}
	if b.Used() != 0 {
		t.Fatalf("%d bytes still held", b.Used())
	}
}
