// Package rawhttp sends pre-built HTTP/1.1 requests over keep-alive connections and
// reads only the status of each answer, so that a load generator costs little per
// request and the same for every server it drives.
package rawhttp

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"
)

// Request builds the bytes of a request without a body: the request line, Host, the
// headers in a fixed order and "Connection: keep-alive".
func Request(method, target, host string, header map[string]string) []byte {
	return RequestWithBody(method, target, host, header, nil)
}

// RequestWithBody builds the bytes of a request as Request does, with a Content-Length
// and the body when body is not nil.
func RequestWithBody(method, target, host string, header map[string]string, body []byte) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host)
	names := make([]string, 0, len(header))
	for k := range header {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "%s: %s\r\n", k, header[k])
	}
	if body != nil {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("Connection: keep-alive\r\n\r\n")
	b.Write(body)
	return []byte(b.String())
}

// timeout bounds one request.
const timeout = 10 * time.Second

// Conn is one keep-alive connection to a server, dialed on first use and again after
// an error. It is not safe for concurrent use: each closed loop has its own.
type Conn struct {
	Addr string
	TLS  *tls.Config // TLS on the connection; nil: plain text
	c    net.Conn
	br   *bufio.Reader
}

// Do sends a pre-built request and returns the answer's status, its body read and
// dropped.
func (c *Conn) Do(ctx context.Context, req []byte) (int, error) {
	if c.c == nil {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.DialContext(ctx, "tcp", c.Addr)
		if err != nil {
			return 0, err
		}
		if c.TLS != nil {
			tc := tls.Client(conn, c.TLS)
			hctx, cancel := context.WithTimeout(ctx, timeout)
			err := tc.HandshakeContext(hctx)
			cancel()
			if err != nil {
				conn.Close()
				return 0, err
			}
			conn = tc
		}
		c.c, c.br = conn, bufio.NewReaderSize(conn, 16<<10)
	}
	status, err := c.do(req)
	if err != nil {
		c.Close()
	}
	return status, err
}

func (c *Conn) do(req []byte) (int, error) {
	if err := c.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := c.c.Write(req); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.Close {
		c.Close()
	}
	return resp.StatusCode, err
}

// Close closes the connection; the next Do dials again.
func (c *Conn) Close() {
	if c.c != nil {
		c.c.Close()
		c.c, c.br = nil, nil
	}
}
