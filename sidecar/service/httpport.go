package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/bodybudget"
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

// The HTTP port's body budget: bodies are streamed (fasthttp reads a byte or two of one
// before the handler runs) and read into buffers that grow with what arrived, within
// HTTPBodyBudget bytes held at once in total and HTTPBodyBudgetPerIP for one client
// address (503 beyond), at HTTPBodyMinRate bytes a second on average once
// httpBodyGrace has passed (408 when slower), within the read timeout.
const (
	HTTPBodyBudget      = 32 << 20
	HTTPBodyBudgetPerIP = 8 << 20
	HTTPBodyMinRate     = 1024
	httpBodyGrace       = 5 * time.Second
	httpReadTimeout     = 10 * time.Second
)

// httpServer is the server of the HTTP port. The forward-auth check, which a proxy
// asks before every request, is served by fasthttp itself; the operator's endpoints
// (health, metrics, the live view, /json) by their net/http handlers in mux.
func (s *Sidecar) httpServer(hl *netlimit.Listener, check *forwardauth.Handler, mux http.Handler) *fasthttp.Server {
	others := fasthttpadaptor.NewFastHTTPHandler(mux)
	bodies := bodybudget.New(HTTPBodyBudget, HTTPBodyBudgetPerIP)
	s.Metrics.GaugeFunc("converger_sidecar_http_body_bytes", "Bytes held for request bodies of the HTTP port.",
		func() float64 { return float64(bodies.Used()) })
	for i, reason := range bodybudget.Reasons {
		s.Metrics.CounterFunc("converger_sidecar_http_bodies_refused_"+reason+"_total", "Request bodies of the HTTP port refused: "+strings.ReplaceAll(reason, "_", " ")+".",
			func() float64 { return float64(bodies.Refused(i)) })
	}
	return &fasthttp.Server{
		Name: "converger-sidecar",
		// A body declared over the bound is answered 413 at once: the read of its first
		// bytes times out at once, and httpError sees the mark.
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if h.ContentLength() > MaxHTTPBodyBytes {
				declaredTooLarge.Store(h, true)
				return fasthttp.RequestConfig{ReadTimeout: time.Nanosecond}
			}
			return fasthttp.RequestConfig{}
		},
		Handler: func(ctx *fasthttp.RequestCtx) {
			declaredTooLarge.Delete(&ctx.Request.Header)
			if ctx.Request.Header.ContentLength() != 0 && ctx.Request.BodyStream() != nil {
				held, err := bodies.Read(ctx, clientAddr(ctx), bodybudget.Rules{Max: MaxHTTPBodyBytes, Timeout: httpReadTimeout,
					MinRate: HTTPBodyMinRate, Grace: httpBodyGrace})
				if err != nil {
					refuseBody(ctx, err)
					return
				}
				defer held.Release()
			}
			if string(ctx.Path()) == forwardauth.Path {
				check.Serve(ctx)
				return
			}
			others(ctx)
		},
		StreamRequestBody: true,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			if _, ok := declaredTooLarge.Load(&ctx.Request.Header); ok {
				bodies.Refuse(bodybudget.ErrTooLarge)
			}
			httpError(ctx, err)
		},
		Logger:         httpLogger{s.log},
		ReadTimeout:    httpReadTimeout,
		WriteTimeout:   30 * time.Second,
		IdleTimeout:    2 * time.Minute,
		ReadBufferSize: MaxHTTPHeaderBytes,
		// A byte or two of a body before the handler, which reads the rest (bodies).
		MaxRequestBodySize:    1,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// Not ReduceMemoryUsage: with streamed bodies, fasthttp (v1.52) gives a
		// connection's reader back to its pool while the body's stream still reads
		// from it, and two connections then read one buffer. An idle connection keeps
		// its 24 KiB read and 4 KiB write buffers instead, within the listener's caps.
		ReduceMemoryUsage: false,
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

// declaredTooLarge marks the requests (by their header, which fasthttp reuses with its
// request context) whose Content-Length is over MaxHTTPBodyBytes, between the headers
// and the answer.
var declaredTooLarge sync.Map

// clientAddr is the address a body is counted for: the connection's.
func clientAddr(ctx *fasthttp.RequestCtx) string {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ctx.RemoteAddr().String()
}

// refuseBody answers a body the budget refused, with the envelope, and closes the
// connection (dropping what the client still sends for a moment, so that it reads the
// answer).
func refuseBody(ctx *fasthttp.RequestCtx, err error) {
	e := apierror.BadRequest.WithMessage("The request body could not be read.")
	switch err {
	case bodybudget.ErrTooLarge:
		e = apierror.PayloadTooLarge.WithMessage(fmt.Sprintf("The request body is larger than %d bytes.", MaxHTTPBodyBytes))
	case bodybudget.ErrBudget:
		e = apierror.Unavailable.WithMessage("The sidecar is receiving too many request bodies at once. Please try again shortly.")
		ctx.Response.Header.Set("Retry-After", "1")
	case bodybudget.ErrTooSlow:
		e = apierror.RequestTimeout
	}
	ctx.SetConnectionClose()
	netlimit.LingerOnClose(ctx.Conn())
	id := apierror.RequestID(string(ctx.Request.Header.Peek("X-Request-Id")))
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("X-Request-Id", id)
	ctx.SetStatusCode(e.Status)
	ctx.SetBody(e.Body(nil, id))
}

// httpError answers a request fasthttp could not read, with the envelope: headers
// over MaxHTTPHeaderBytes (431), a body over MaxHTTPBodyBytes (413), too slow (408),
// else malformed (400).
func httpError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var nerr net.Error
	e := apierror.BadRequest
	_, tooLarge := declaredTooLarge.LoadAndDelete(&ctx.Request.Header)
	switch {
	case tooLarge:
		e = apierror.PayloadTooLarge.WithMessage(fmt.Sprintf("The request body is larger than %d bytes.", MaxHTTPBodyBytes))
		netlimit.LingerOnClose(ctx.Conn())
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
		Exempt: cfg.TrustedProxies.Trusted, Refuse: netlimit.HTTPRefusal(cfg.HTTPTLS != nil), Logger: s.log, Name: "SIDECAR_HTTP_ADDR"})
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
