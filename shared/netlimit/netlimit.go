// Package netlimit keeps a TCP server up under connection floods: a listener whose
// accept errors (too many open files, aborted connections) are retried with backoff
// instead of ending the server, with caps on open connections in total and per client
// IP, where a new connection at the total cap takes the place of the longest idle one.
package netlimit

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Reason says why a connection was refused.
type Reason int

const (
	// TooManyConns: the listener holds MaxConns connections and none of them is idle.
	TooManyConns Reason = iota
	// TooManyConnsFromIP: the client's address holds MaxConnsPerIP connections.
	TooManyConnsFromIP
)

// Options configure a Listener. Zero caps are no caps.
type Options struct {
	// MaxConns bounds the open connections. At the bound a new connection closes the
	// connection that has been idle longest (one that has sent nothing since it was
	// accepted or since its last answer, as nginx reuses keep-alive connections); with
	// none idle, the new one is refused.
	MaxConns int
	// MaxConnsPerIP bounds the open connections of one client address (IPv6 addresses
	// count per address, IPv4-mapped ones as IPv4).
	MaxConnsPerIP int
	// Exempt reports addresses that MaxConnsPerIP does not apply to (the proxies in
	// front, whose connections carry many clients); nil: none.
	Exempt func(netip.Addr) bool
	// Refuse writes the answer to a refused connection before it is closed (an HTTP
	// error response); it must not block: the connection has a short write deadline.
	// Nil: the connection is closed without an answer.
	Refuse func(c net.Conn, why Reason)
	// Logger receives accept errors and refusals, at most once a minute each
	// (slog.Default() when nil).
	Logger *slog.Logger
	// Name names the listener in logs ("CORE_ADDR").
	Name string
}

// Stats are a listener's counters since it was created.
type Stats struct {
	Open         int64  // connections open now
	Accepted     uint64 // connections admitted
	AcceptErrors uint64 // failed accepts (each retried)
	RefusedTotal uint64 // refused at MaxConns
	RefusedPerIP uint64 // refused at MaxConnsPerIP
	Evicted      uint64 // idle connections closed to make room for a new one
}

// Listener is a net.Listener with the bounds of Options. Accept returns an error only
// once the listener is closed.
type Listener struct {
	net.Listener
	o      Options
	log    *slog.Logger
	closed chan struct{}
	once   sync.Once

	mu    sync.Mutex
	conns map[*Conn]struct{}
	perIP map[netip.Addr]int

	open                                                     atomic.Int64
	accepted, acceptErrors, refusedTotal, refusedIP, evicted atomic.Uint64
	lastAcceptLog, lastRefuseLog                             atomic.Int64 // unix nanoseconds
}

// Wrap returns ln with the bounds of o.
func Wrap(ln net.Listener, o Options) *Listener {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if o.Name == "" {
		o.Name = ln.Addr().String()
	}
	return &Listener{Listener: ln, o: o, log: log, closed: make(chan struct{}),
		conns: map[*Conn]struct{}{}, perIP: map[netip.Addr]int{}}
}

// Backoff bounds of failed accepts: the first retry waits minBackoff, each next one
// twice as long, up to maxBackoff (as net/http's server).
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
	// refuseWriteTimeout bounds the answer to a refused connection.
	refuseWriteTimeout = 100 * time.Millisecond
	logEvery           = time.Minute
)

// Accept waits for the next connection within the bounds. Failed accepts are retried
// with backoff (after EMFILE, closing the longest idle connection frees a descriptor);
// refused connections get the Refuse answer and are closed.
func (l *Listener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			select {
			case <-l.closed:
				return nil, net.ErrClosed
			default:
			}
			l.acceptErrors.Add(1)
			if l.every(&l.lastAcceptLog) {
				l.log.Warn("accepting a connection failed; retrying", "listener", l.o.Name, "error", err)
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				l.evictIdle()
			}
			delay = min(max(2*delay, minBackoff), maxBackoff)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-l.closed:
				t.Stop()
				return nil, net.ErrClosed
			}
			continue
		}
		delay = 0
		if lc, ok := l.admit(c); ok {
			return lc, nil
		}
	}
}

// Close closes the listener; open connections stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Stats returns the listener's counters.
func (l *Listener) Stats() Stats {
	return Stats{Open: l.open.Load(), Accepted: l.accepted.Load(), AcceptErrors: l.acceptErrors.Load(),
		RefusedTotal: l.refusedTotal.Load(), RefusedPerIP: l.refusedIP.Load(), Evicted: l.evicted.Load()}
}

// SetIdle tells the listener that a connection is idle (it has been answered and waits
// for its next request): it may be closed to make room at MaxConns. Call it, and
// SetActive, from the server's connection-state hook; connections of other listeners
// are ignored.
func (l *Listener) SetIdle(c net.Conn) {
	if lc, ok := unwrap(c).(*Conn); ok && lc.l == l {
		lc.idleSince.Store(time.Now().UnixNano())
	}
}

// SetActive tells the listener that the server is reading or handling a request of a
// connection (a request it may have buffered already, so that no read follows): it is
// not closed to make room. A connection that has not sent a byte yet stays idle (some
// servers, fasthttp among them, call a new connection active before anything arrives).
func (l *Listener) SetActive(c net.Conn) {
	if lc, ok := unwrap(c).(*Conn); ok && lc.l == l && lc.read.Load() {
		lc.idleSince.Store(0)
	}
}

// admit counts a new connection, or refuses it.
func (l *Listener) admit(c net.Conn) (*Conn, bool) {
	ip := remoteIP(c)
	perIP := l.o.MaxConnsPerIP > 0 && ip.IsValid() && (l.o.Exempt == nil || !l.o.Exempt(ip))
	var victim *Conn
	l.mu.Lock()
	switch {
	case perIP && l.perIP[ip] >= l.o.MaxConnsPerIP:
		l.mu.Unlock()
		l.refusedIP.Add(1)
		l.refuse(c, TooManyConnsFromIP, ip)
		return nil, false
	case l.o.MaxConns > 0 && len(l.conns) >= l.o.MaxConns:
		if victim = l.oldestIdleLocked(); victim == nil {
			l.mu.Unlock()
			l.refusedTotal.Add(1)
			l.refuse(c, TooManyConns, ip)
			return nil, false
		}
		l.forgetLocked(victim)
	}
	lc := &Conn{Conn: c, l: l, ip: ip, counted: perIP}
	lc.idleSince.Store(time.Now().UnixNano()) // nothing read yet
	l.conns[lc] = struct{}{}
	if perIP {
		l.perIP[ip]++
	}
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		_ = victim.Conn.Close()
	}
	l.open.Add(1)
	l.accepted.Add(1)
	return lc, true
}

// evictIdle closes the longest idle connection, if there is one.
func (l *Listener) evictIdle() {
	l.mu.Lock()
	victim := l.oldestIdleLocked()
	if victim != nil {
		l.forgetLocked(victim)
	}
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		_ = victim.Conn.Close()
	}
}

// oldestIdleLocked returns the connection idle the longest, nil when none is idle. It
// walks every connection; it runs only at the cap.
func (l *Listener) oldestIdleLocked() *Conn {
	var oldest *Conn
	var since int64
	for c := range l.conns {
		if s := c.idleSince.Load(); s != 0 && (oldest == nil || s < since) {
			oldest, since = c, s
		}
	}
	return oldest
}

// forgetLocked stops counting c; it is counted at most once.
func (l *Listener) forgetLocked(c *Conn) {
	if _, ok := l.conns[c]; !ok {
		return
	}
	delete(l.conns, c)
	if c.counted {
		if n := l.perIP[c.ip] - 1; n > 0 {
			l.perIP[c.ip] = n
		} else {
			delete(l.perIP, c.ip)
		}
	}
	l.open.Add(-1)
}

func (l *Listener) refuse(c net.Conn, why Reason, ip netip.Addr) {
	if l.every(&l.lastRefuseLog) {
		msg := "connection refused: the listener holds its maximum of connections, none idle"
		if why == TooManyConnsFromIP {
			msg = "connection refused: the client address holds its maximum of connections"
		}
		l.log.Warn(msg, "listener", l.o.Name, "client_ip", ip.String(),
			"max_conns", l.o.MaxConns, "max_conns_per_ip", l.o.MaxConnsPerIP)
	}
	if l.o.Refuse != nil {
		_ = c.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
		l.o.Refuse(c, why)
	}
	_ = c.Close()
}

// every reports whether the last log of a kind is older than logEvery, and if so
// records now.
func (l *Listener) every(last *atomic.Int64) bool {
	now := time.Now().UnixNano()
	prev := last.Load()
	return now-prev >= int64(logEvery) && last.CompareAndSwap(prev, now)
}

func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// Conn is a connection admitted by a Listener; closing it releases its place.
type Conn struct {
	net.Conn
	l       *Listener
	ip      netip.Addr
	counted bool // in perIP
	// idleSince is when the connection became idle (unix nanoseconds), 0 while busy.
	idleSince atomic.Int64
	read      atomic.Bool // it has sent a byte
	linger    atomic.Bool
}

// Bounds of a lingering close: how long, and how many bytes of the client's request
// are read and dropped.
const (
	lingerTimeout  = time.Second
	lingerMaxBytes = 8 << 20
)

// LingerOnClose makes the close of a connection of a Listener lingering: the answer is
// followed by the end of the stream, then what the client still sends is read and
// dropped, for at most a second, before the connection closes. A server that answers
// before reading the whole request (a body over its limit) calls it, so that the
// client reads the answer instead of a reset. Other connections are ignored.
func LingerOnClose(c net.Conn) {
	if lc, ok := unwrap(c).(*Conn); ok {
		lc.linger.Store(true)
	}
}

// unwrap returns the connection under a TLS one (tls.NewListener over a Listener), so
// that servers on a TLS port report the states of the listener's own connections.
func unwrap(c net.Conn) net.Conn {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok {
		return t.NetConn()
	}
	return c
}

// Read reads from the connection; a connection that receives bytes is busy.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		if !c.read.Load() {
			c.read.Store(true)
		}
		if c.idleSince.Load() != 0 {
			c.idleSince.Store(0)
		}
	}
	return n, err
}

// A connection closed to make room may still be in a server's hands, between the bytes
// it read and the answer it writes. Its reads and writes fail, as on any closed
// connection; its deadlines are set without error, because servers take a failed
// deadline for a bug of their own (fasthttp panics).

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error { return closedIsNil(c.Conn.SetDeadline(t)) }

// SetReadDeadline sets the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return closedIsNil(c.Conn.SetReadDeadline(t)) }

// SetWriteDeadline sets the write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return closedIsNil(c.Conn.SetWriteDeadline(t)) }

func closedIsNil(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Close closes the connection and releases its place.
func (c *Conn) Close() error {
	if c.linger.Swap(false) {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		_ = c.Conn.SetReadDeadline(time.Now().Add(lingerTimeout))
		_, _ = io.CopyN(io.Discard, c.Conn, lingerMaxBytes)
	}
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// TCPConn returns the underlying TCP connection, nil for another kind.
func (c *Conn) TCPConn() *net.TCPConn {
	tc, _ := c.Conn.(*net.TCPConn)
	return tc
}
