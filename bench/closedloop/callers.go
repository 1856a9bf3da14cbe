package closedloop

import (
	"context"
	"crypto/tls"
	"net/http"

	"google.golang.org/grpc"

	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/bench/rawhttp"
)

// Reply is what a gRPC caller reads of an answer: rawcheck.Codec gives it the bytes.
type Reply interface {
	Parse(b []byte) error
	// Allowed reports an answer that lets the request through; RateLimited one that
	// denies it for its rate limit. An answer that is neither is a rejection.
	Allowed() bool
	RateLimited() bool
}

// GRPCRequests are a workload's requests as a gRPC caller sends them: one method, each
// request marshaled once, and the reply its answers are read into. Any number of callers
// share them.
type GRPCRequests struct {
	method   string
	reqs     []rawcheck.Request
	newReply func() Reply
}

// NewGRPCRequests returns the n requests whose marshaled bytes at position pos are
// bytes(pos), called as method (e.g. /envoy.service.auth.v3.Authorization/Check).
func NewGRPCRequests(method string, n int, bytes func(pos int) []byte, newReply func() Reply) *GRPCRequests {
	g := &GRPCRequests{method: method, reqs: make([]rawcheck.Request, n), newReply: newReply}
	for i := range g.reqs {
		g.reqs[i] = rawcheck.Request{B: bytes(i)}
	}
	return g
}

// grpcCaller sends pre-marshaled requests over a few connections, round robin by worker.
type grpcCaller struct {
	conns   []*grpc.ClientConn
	reqs    *GRPCRequests
	replies []Reply // by worker
}

// DialGRPC opens conns connections to addr, waits until all are ready, and returns a
// caller of reqs for workers closed loops.
func DialGRPC(ctx context.Context, addr string, conns, workers int, reqs *GRPCRequests) (Caller, error) {
	cs, err := rawcheck.Dial(ctx, addr, conns)
	if err != nil {
		return nil, err
	}
	c := &grpcCaller{conns: cs, reqs: reqs, replies: make([]Reply, workers)}
	for i := range c.replies {
		c.replies[i] = reqs.newReply()
	}
	return c, nil
}

func (c *grpcCaller) Call(ctx context.Context, worker, pos int) (Verdict, error) {
	reply := c.replies[worker]
	if err := c.conns[worker%len(c.conns)].Invoke(ctx, c.reqs.method, &c.reqs.reqs[pos], reply); err != nil {
		return 0, err
	}
	switch {
	case reply.RateLimited():
		return RateLimited, nil
	case !reply.Allowed():
		return Rejected, nil
	}
	return Allowed, nil
}

func (c *grpcCaller) Close() { rawcheck.Close(c.conns) }

// httpCaller sends pre-built HTTP requests, one keep-alive connection per closed loop.
type httpCaller struct {
	conns []rawhttp.Conn // by worker
	reqs  [][]byte
}

// NewHTTPCaller returns a caller of the pre-built requests reqs (by position) to addr for
// workers closed loops, each with its own keep-alive connection, dialed on first use. It
// reads the status: 429 is rate limited, another 3xx to 5xx a rejection.
func NewHTTPCaller(addr string, workers int, reqs [][]byte) Caller {
	return NewHTTPSCaller(addr, workers, reqs, nil)
}

// NewHTTPSCaller is NewHTTPCaller with TLS on the connections (plain text when tlsCfg
// is nil); each pays its handshake once, when it is dialed.
func NewHTTPSCaller(addr string, workers int, reqs [][]byte, tlsCfg *tls.Config) Caller {
	c := &httpCaller{conns: make([]rawhttp.Conn, workers), reqs: reqs}
	for i := range c.conns {
		c.conns[i].Addr, c.conns[i].TLS = addr, tlsCfg
	}
	return c
}

func (c *httpCaller) Call(ctx context.Context, worker, pos int) (Verdict, error) {
	status, err := c.conns[worker].Do(ctx, c.reqs[pos])
	switch {
	case err != nil:
		return 0, err
	case status == http.StatusTooManyRequests:
		return RateLimited, nil
	case status >= 300:
		return Rejected, nil
	}
	return Allowed, nil
}

func (c *httpCaller) Close() {
	for i := range c.conns {
		c.conns[i].Close()
	}
}
