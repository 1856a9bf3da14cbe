package netlimit

import (
	"fmt"
	"io"
	"net"

	"github.com/converger/edge/shared/apierror"
)

// HTTPRefusal is the Options.Refuse of an HTTP port: RefuseHTTP in plain text; nil (the
// connection closed without an answer) when the port speaks TLS (tlsOn), since a refusal
// is written before the handshake and a TLS client would read the plain-text answer as
// a broken handshake instead of a refusal.
func HTTPRefusal(tlsOn bool) func(net.Conn, Reason) {
	if tlsOn {
		return nil
	}
	return RefuseHTTP
}

// RefuseHTTP is an Options.Refuse for HTTP servers: a minimal HTTP/1.1 answer with the
// error envelope, 503 unavailable at MaxConns and 429 rate_limited at MaxConnsPerIP,
// with retry-after: 1 and a new request id, and the connection closed.
func RefuseHTTP(c net.Conn, why Reason) {
	e := apierror.Unavailable.WithMessage("The server has too many connections. Please try again shortly.")
	status := "503 Service Unavailable"
	if why == TooManyConnsFromIP {
		e = apierror.RateLimited.WithMessage("Too many connections from your address. Please try again shortly.")
		status = "429 Too Many Requests"
	}
	id := apierror.NewRequestID()
	body := e.Body(apierror.RateLimitDetails{RetryAfterMS: 1000}, id)
	_, _ = io.WriteString(c, fmt.Sprintf("HTTP/1.1 %s\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"+
		"X-Request-Id: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", status, id, len(body), body))
}
