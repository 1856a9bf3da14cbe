package netlimit

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// flakyListener fails its first accepts with an error, then accepts from a real listener.
type flakyListener struct {
	net.Listener
	mu    sync.Mutex
	fails int
	err   error
}

func (f *flakyListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if f.fails > 0 {
		f.fails--
		f.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: f.err}
	}
	f.mu.Unlock()
	return f.Listener.Accept()
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialFrom connects to addr from a loopback source address (127.0.0.0/8 is all local).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// serve accepts until the listener closes, handing each connection to got.
func serve(l *Listener, got chan<- net.Conn) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(got)
				return
			}
			got <- c
		}
	}()
}

func recv(t *testing.T, got <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-got:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

// readAnswer reads what a refused connection was told, until the listener closes it.
func readAnswer(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading the refusal: %v", err)
	}
	return string(b)
}

func TestAcceptErrorsAreRetried(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED, syscall.EPROTO} {
		t.Run(errno.Error(), func(t *testing.T) {
			f := &flakyListener{Listener: listen(t), fails: 5, err: errno}
			l := Wrap(f, Options{Logger: quiet})
			got := make(chan net.Conn, 1)
			serve(l, got)
			dialFrom(t, "127.0.0.1", l.Addr().String())
			recv(t, got).Close()
			if s := l.Stats(); s.AcceptErrors != 5 || s.Accepted != 1 {
				t.Fatalf("stats %+v, want 5 accept errors and 1 accepted", s)
			}
			l.Close()
			if _, ok := <-got; ok {
				t.Fatal("Accept went on after Close")
			}
		})
	}
}

func TestCloseEndsABackoff(t *testing.T) {
	f := &flakyListener{Listener: listen(t), fails: 1 << 30, err: syscall.EMFILE}
	l := Wrap(f, Options{Logger: quiet})
	done := make(chan error, 1)
	go func() { _, err := l.Accept(); done <- err }()
	time.Sleep(50 * time.Millisecond)
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Accept still retrying after Close")
	}
}

func TestPerIPCap(t *testing.T) {
	var mu sync.Mutex
	reasons := map[Reason]int{}
	exempt := netip.MustParseAddr("127.0.0.3")
	l := Wrap(listen(t), Options{MaxConnsPerIP: 2, Logger: quiet,
		Exempt: func(a netip.Addr) bool { return a == exempt },
		Refuse: func(c net.Conn, why Reason) {
			mu.Lock()
			reasons[why]++
			mu.Unlock()
			_, _ = io.WriteString(c, "refused")
		}})
	defer l.Close()
	got := make(chan net.Conn, 16)
	serve(l, got)
	addr := l.Addr().String()

	a1, a2 := dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.1", addr)
	s1, s2 := recv(t, got), recv(t, got)
	if answer := readAnswer(t, dialFrom(t, "127.0.0.1", addr)); answer != "refused" {
		t.Fatalf("third connection from one address: %q, want the refusal", answer)
	}
	// Another address has its own count; an exempt one none.
	dialFrom(t, "127.0.0.2", addr)
	recv(t, got)
	for range 4 {
		dialFrom(t, "127.0.0.3", addr)
		recv(t, got)
	}
	// A closed connection gives its place back.
	s1.Close()
	a1.Close()
	dialFrom(t, "127.0.0.1", addr)
	recv(t, got)
	_, _ = a2, s2 // still open, still counted
	mu.Lock()
	defer mu.Unlock()
	if reasons[TooManyConnsFromIP] != 1 || reasons[TooManyConns] != 0 {
		t.Fatalf("refusals %v, want one per IP", reasons)
	}
	if s := l.Stats(); s.RefusedPerIP != 1 || s.Open != 7 {
		t.Fatalf("stats %+v, want 1 refused and 7 open", s)
	}
}

func TestTotalCapTakesTheLongestIdle(t *testing.T) {
	l := Wrap(listen(t), Options{MaxConns: 3, Logger: quiet,
		Refuse: func(c net.Conn, why Reason) { _, _ = io.WriteString(c, "full") }})
	defer l.Close()
	got := make(chan net.Conn, 16)
	serve(l, got)
	addr := l.Addr().String()

	// Three connections: the first sends a request (busy), the second is answered and
	// idle, the third never sends anything (idle since it was accepted, after the second).
	c1 := dialFrom(t, "127.0.0.1", addr)
	s1 := recv(t, got)
	c2 := dialFrom(t, "127.0.0.1", addr)
	s2 := recv(t, got)
	c3 := dialFrom(t, "127.0.0.1", addr)
	s3 := recv(t, got)
	busy(t, c1, s1)
	busy(t, c2, s2)
	l.SetIdle(s2) // answered: idle from now, later than c3's accept
	_ = s3

	// A fourth connection takes the place of the third (idle longest), a fifth that of
	// the second.
	c4 := dialFrom(t, "127.0.0.1", addr)
	s4 := recv(t, got)
	if answer := readAnswer(t, c3); answer != "" {
		t.Fatalf("the evicted connection got %q", answer)
	}
	c5 := dialFrom(t, "127.0.0.1", addr)
	s5 := recv(t, got)
	if answer := readAnswer(t, c2); answer != "" {
		t.Fatalf("the evicted connection got %q", answer)
	}
	// With every connection busy, a new one is refused.
	busy(t, c4, s4)
	busy(t, c5, s5)
	if answer := readAnswer(t, dialFrom(t, "127.0.0.1", addr)); answer != "full" {
		t.Fatalf("a connection beyond the cap with none idle: %q, want the refusal", answer)
	}
	if s := l.Stats(); s.Evicted != 2 || s.RefusedTotal != 1 || s.Open != 3 {
		t.Fatalf("stats %+v, want 2 evicted, 1 refused, 3 open", s)
	}
}

// busy sends a byte from the client c that the server side s reads: s is busy.
func busy(t *testing.T, c, s net.Conn) {
	t.Helper()
	if _, err := io.WriteString(c, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
}

func TestPeerGone(t *testing.T) {
	l := Wrap(listen(t), Options{Logger: quiet})
	defer l.Close()
	got := make(chan net.Conn, 4)
	serve(l, got)
	c := dialFrom(t, "127.0.0.1", l.Addr().String())
	s := recv(t, got)
	if PeerGone(s) {
		t.Fatal("an open connection is gone")
	}
	// Bytes sent but not read yet: still there, and still readable afterwards.
	if _, err := io.WriteString(c, "GET"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if PeerGone(s) {
		t.Fatal("a connection with unread bytes is gone")
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "GET" {
		t.Fatalf("the peeked bytes were taken: %q %v", buf, err)
	}
	c.Close()
	deadline := time.Now().Add(2 * time.Second)
	for !PeerGone(s) {
		if time.Now().After(deadline) {
			t.Fatal("a closed connection is not gone")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRaiseOpenFiles(t *testing.T) {
	n, err := RaiseOpenFiles()
	if err != nil {
		t.Fatal(err)
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if n != rl.Cur || rl.Cur != rl.Max {
		t.Fatalf("soft limit %d (returned %d), hard %d", rl.Cur, n, rl.Max)
	}
	for _, c := range []struct {
		files uint64
		want  int
	}{{1024, 768}, {20000, 10000}, {1 << 20, 10000}} {
		if got := DefaultMaxConns(c.files); got != c.want {
			t.Errorf("DefaultMaxConns(%d) = %d, want %d", c.files, got, c.want)
		}
	}
}

func TestRefuseHTTP(t *testing.T) {
	for _, c := range []struct {
		why    Reason
		status string
		code   string
	}{{TooManyConns, "503", `"code":"unavailable"`}, {TooManyConnsFromIP, "429", `"code":"rate_limited"`}} {
		client, server := net.Pipe()
		go func() { RefuseHTTP(server, c.why); server.Close() }()
		b, _ := io.ReadAll(client)
		resp := string(b)
		for _, want := range []string{"HTTP/1.1 " + c.status, "Retry-After: 1", "X-Request-Id: ", "Connection: close", c.code, `"request_id":"`} {
			if !strings.Contains(resp, want) {
				t.Errorf("refusal %v lacks %q:\n%s", c.why, want, resp)
			}
		}
	}
}

// A connection answered before its request was read closes lingering: the client,
// still sending, reads the answer rather than a reset.
func TestLingerOnClose(t *testing.T) {
	l := Wrap(listen(t), Options{Logger: quiet})
	defer l.Close()
	got := make(chan net.Conn, 1)
	serve(l, got)
	c := dialFrom(t, "127.0.0.1", l.Addr().String())
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 4<<20))
		sent <- err
	}()
	s := recv(t, got)
	if _, err := io.ReadFull(s, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(s, "too large"); err != nil {
		t.Fatal(err)
	}
	LingerOnClose(s)
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the lingering close took %v", d)
	}
	if err := <-sent; err != nil {
		t.Fatalf("the client could not send its request: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if string(b) != "too large" || err != nil {
		t.Fatalf("the client read %q, %v", b, err)
	}
	if s := l.Stats(); s.Open != 0 {
		t.Fatalf("%d open after the close", s.Open)
	}
}

// TestHTTPRefusal: a plain HTTP port answers a refusal with the 429 envelope; a TLS port
// (whose refusals come before the handshake) closes the connection without writing.
func TestHTTPRefusal(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		l := Wrap(listen(t), Options{MaxConnsPerIP: 1, Refuse: HTTPRefusal(tlsOn)})
		got := make(chan net.Conn, 4)
		serve(l, got)
		first := dialFrom(t, "127.0.0.1", l.Addr().String())
		recv(t, got)
		_, _ = first.Write([]byte("x")) // not idle
		answer := readAnswer(t, dialFrom(t, "127.0.0.1", l.Addr().String()))
		switch {
		case !tlsOn && !strings.HasPrefix(answer, "HTTP/1.1 429 "):
			t.Errorf("plain text: the refusal %q", answer)
		case tlsOn && answer != "":
			t.Errorf("TLS: the refusal wrote %q before the handshake", answer)
		}
	}
}
