package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/forwardauth"
	"github.com/converger/edge/sidecar/rlsapi"
)

// The bounds of a request on the HTTP port: its request line and headers (431 beyond;
// room for a forward-auth check's X-Forwarded-Uri of up to 16 KiB and the copied
// headers) and its body (413 beyond; the largest body is a /json request's).
const (
	MaxHTTPHeaderBytes = 24 << 10
	MaxHTTPBodyBytes   = rlsapi.MaxJSONBody
)

// httpServer is the server of the HTTP port. The forward-auth check, which a proxy
// asks before every request, is served by fasthttp itself; the operator's endpoints
// (health, metrics, the live view, /json) by their net/http handlers in mux.
func (s *Sidecar) httpServer(hl *netlimit.Listener, check *forwardauth.Handler, mux http.Handler) *fasthttp.Server {
	others := fasthttpadaptor.NewFastHTTPHandler(mux)
	return &fasthttp.Server{
		Name: "converger-sidecar",
		Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == forwardauth.Path {
				check.Serve(ctx)
				return
			}
			others(ctx)
		},
		ErrorHandler:          httpError,
		Logger:                httpLogger{s.log},
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		ReadBufferSize:        MaxHTTPHeaderBytes,
		MaxRequestBodySize:    MaxHTTPBodyBytes,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// An idle connection holds no buffers: a flood of idle connections (up to the
		// listener's cap) costs a descriptor each, not a 24 KiB read buffer each.
		ReduceMemoryUsage: true,
		ConnState: func(c net.Conn, state fasthttp.ConnState) {
			switch state {
			case fasthttp.StateIdle:
				hl.SetIdle(c)
			case fasthttp.StateActive:
				hl.SetActive(c)
			}
		},
	}
}

// httpError answers a request fasthttp could not read, with the envelope: headers
// over MaxHTTPHeaderBytes (431), a body over MaxHTTPBodyBytes (413), too slow (408),
// else malformed (400).
func httpError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var nerr net.Error
	e := apierror.BadRequest
	switch {
	case errors.As(err, &small):
		e = apierror.HeadersTooLarge
		netlimit.LingerOnClose(ctx.Conn())
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = apierror.PayloadTooLarge.WithMessage(fmt.Sprintf("The request body is larger than %d bytes.", MaxHTTPBodyBytes))
		netlimit.LingerOnClose(ctx.Conn())
	case errors.As(err, &nerr) && nerr.Timeout():
		e = apierror.RequestTimeout
	}
	id := apierror.RequestID("")
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("X-Request-Id", id)
	ctx.SetStatusCode(e.Status)
	ctx.SetBody(e.Body(nil, id))
}

// httpListener bounds the HTTP port's connections: failed accepts are retried, the
// connections capped in total (SIDECAR_HTTP_MAX_CONNS, else from the open-files limit)
// and per client address (SIDECAR_HTTP_MAX_CONNS_PER_IP; the TRUSTED_PROXIES, such as a
// proxy asking for forward-auth, are exempt), with their counts in the metrics.
func (s *Sidecar) httpListener(raw net.Listener, cfg *config.Config, openFiles uint64) *netlimit.Listener {
	maxConns := cfg.HTTPMaxConns
	if maxConns == 0 {
		maxConns = netlimit.DefaultMaxConns(openFiles)
	}
	ln := netlimit.Wrap(raw, netlimit.Options{MaxConns: maxConns, MaxConnsPerIP: cfg.HTTPMaxConnsPerIP,
		Exempt: cfg.TrustedProxies.Trusted, Refuse: netlimit.RefuseHTTP, Logger: s.log, Name: "SIDECAR_HTTP_ADDR"})
	s.Metrics.GaugeFunc("converger_sidecar_http_connections", "Open connections of the HTTP port.",
		func() float64 { return float64(ln.Stats().Open) })
	s.Metrics.CounterFunc("converger_sidecar_http_connections_refused_total", "Connections of the HTTP port refused at its caps.",
		func() float64 { st := ln.Stats(); return float64(st.RefusedTotal + st.RefusedPerIP) })
	s.Metrics.CounterFunc("converger_sidecar_http_accept_errors_total", "Failed accepts of the HTTP port, each retried.",
		func() float64 { return float64(ln.Stats().AcceptErrors) })
	return ln
}

// httpLogger takes fasthttp's messages, which are about one connection each (a client
// that went away, a connection closed to make room): at debug level, as the listener
// counts what an operator watches.
type httpLogger struct{ log *slog.Logger }

func (l httpLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("HTTP port: " + fmt.Sprintf(format, args...))
	}
}
