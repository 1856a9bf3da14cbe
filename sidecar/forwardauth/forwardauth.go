// Package forwardauth is the sidecar's HTTP forward-auth check for Caddy, nginx and
// Traefik: it rebuilds the original request from the proxy's forwarding headers, makes
// the ext_authz decision on it, and answers the way those proxies read an answer.
package forwardauth

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/sidecar/authz"
)

// Path is the check's path on SIDECAR_HTTP_ADDR; it answers any method.
const Path = "/check"

// The headers of the protocol. Caddy's forward_auth and Traefik's ForwardAuth send the
// original method and URI in X-Forwarded-Method and X-Forwarded-Uri; the shipped nginx
// configuration sets the same two, and ModeHeader.
const (
	MethodHeader = "X-Forwarded-Method"
	URIHeader    = "X-Forwarded-Uri"
	// ModeHeader set to "nginx" asks for denials nginx's auth_request can pass on: it
	// passes only 2xx, 401 and 403, so other denials (429, 400) are answered 403, with
	// the real status in StatusHeader and the envelope in BodyHeader, which the nginx
	// configuration turns back into the real answer.
	ModeHeader   = "X-Converger-Forward-Auth"
	StatusHeader = "X-Converger-Status"
	BodyHeader   = "X-Converger-Body"
)

// Bounds of the forwarding headers. Longer values are refused: no proxy sends them.
const (
	maxMethod = 32
	maxURI    = 16 << 10
)

// Messages of the check's own refusals.
var (
	errUntrusted = apierror.Forbidden.WithMessage("The forward-auth check answers only proxies listed in the sidecar's TRUSTED_PROXIES.")
	errHeaders   = apierror.BadRequest.WithMessage("The forward-auth check needs exactly one X-Forwarded-Method and one X-Forwarded-Uri (the original request's method and URI).")
)

// Verdict is the ext_authz decision (*authz.Server's Verdict): it waits for a turn
// among the checks in flight within the budget of ctx, and decides.
type Verdict func(ctx context.Context, r authz.Request) authz.Verdict

// Handler answers forward-auth checks.
type Handler struct {
	verdict Verdict
	proxies *clientip.Resolver
	log     *slog.Logger
	refused *prometheus.CounterVec
	// lastLog is when a refusal was last logged (unix ns): at most one a minute.
	lastLog atomic.Int64
	checks  sync.Pool // of *check
}

// New returns the handler. verdict is the ext_authz decision; proxies is
// TRUSTED_PROXIES, the only peers whose forwarding headers are believed. Its refusals
// are counted on reg.
func New(verdict Verdict, proxies *clientip.Resolver, log *slog.Logger, reg prometheus.Registerer) *Handler {
	if proxies == nil {
		proxies = &clientip.Resolver{}
	}
	h := &Handler{verdict: verdict, proxies: proxies, log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_sidecar_forward_auth_refused_total",
			Help: "Forward-auth checks refused without a decision, by reason: untrusted_peer (not in TRUSTED_PROXIES), bad_headers (no usable X-Forwarded-Method or X-Forwarded-Uri).",
		}, []string{"reason"}),
	}
	h.checks.New = func() any {
		c := &check{}
		c.header = c.lookup
		return c
	}
	reg.MustRegister(h.refused)
	return h
}

// check is one check's state, pooled: the request it reads headers of, and the buffer
// the denial's body is written into.
type check struct {
	ctx    *fasthttp.RequestCtx
	header func(string) string // c.lookup, bound once
	body   []byte
	digits [20]byte
}

// Serve answers one check. An allowed request gets 200 with an empty body; a denied
// one exactly the ext_authz denial (status, headers, body), reshaped for nginx when
// ModeHeader asks.
//
// Everything the decision reads is a view of ctx's buffers, valid until Serve returns:
// the decision keeps nothing of a request's strings (sidecar/envoywire relies on the
// same).
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	peer, ok := peerAddr(ctx.RemoteAddr())
	if !ok || !h.proxies.Trusted(peer) {
		h.refuse(ctx, "untrusted_peer", errUntrusted)
		return
	}
	method, okM := single(&ctx.Request.Header, MethodHeader, maxMethod)
	uri, okU := single(&ctx.Request.Header, URIHeader, maxURI)
	if !okM || !okU {
		h.refuse(ctx, "bad_headers", errHeaders)
		return
	}
	c := h.checks.Get().(*check)
	c.ctx = ctx
	v := h.verdict(ctx, authz.Request{
		Method: method,
		Path:   originForm(uri),
		Source: ctx.RemoteAddr().String(),
		Header: c.header,
	})
	c.ctx = nil
	if v.Allowed() {
		ctx.SetStatusCode(fasthttp.StatusOK)
		h.checks.Put(c)
		return
	}
	status := v.Denial.Status
	if status < 400 || status > 599 {
		status = fasthttp.StatusForbidden // as Envoy answers a denial without a status
	}
	c.body = v.Denial.AppendBody(c.body[:0], v.Details(), v.RequestID)
	rh := &ctx.Response.Header
	if v.Retry() {
		rh.SetBytesV(authz.HeaderRetryAfter, strconv.AppendInt(c.digits[:0], v.RetryAfterSeconds(), 10))
	}
	rh.SetContentType(authz.ContentTypeJSON)
	rh.Set(authz.HeaderRequestID, v.RequestID)
	if bytes.Equal(ctx.Request.Header.Peek(ModeHeader), nginxMode) {
		rh.SetBytesV(StatusHeader, strconv.AppendInt(c.digits[:0], int64(status), 10))
		rh.SetBytesV(BodyHeader, c.body)
		if status != fasthttp.StatusUnauthorized && status != fasthttp.StatusForbidden {
			status = fasthttp.StatusForbidden
		}
	}
	ctx.SetStatusCode(status)
	ctx.SetBody(c.body)
	h.checks.Put(c)
}

var nginxMode = []byte("nginx")

// refuse answers a check that cannot be decided, and logs it at most once a minute:
// a refusal is a configuration error of the proxy or of TRUSTED_PROXIES, or a client
// that reached the sidecar directly.
func (h *Handler) refuse(ctx *fasthttp.RequestCtx, reason string, e apierror.Error) {
	h.refused.WithLabelValues(reason).Inc()
	now := time.Now().UnixNano()
	if last := h.lastLog.Load(); now-last >= int64(time.Minute) && h.lastLog.CompareAndSwap(last, now) {
		h.log.Warn("forward-auth check refused (logged at most once a minute; converger_sidecar_forward_auth_refused_total counts them)",
			"reason", reason, "peer", ctx.RemoteAddr().String())
	}
	id := apierror.RequestID(string(ctx.Request.Header.Peek("X-Request-Id")))
	ctx.Response.Header.SetContentType(authz.ContentTypeJSON)
	ctx.Response.Header.Set("X-Request-Id", id)
	ctx.SetStatusCode(e.Status)
	ctx.SetBody(e.Body(nil, id))
}

// peerAddr is the address of the connection's peer.
func peerAddr(a net.Addr) (netip.Addr, bool) {
	if t, ok := a.(*net.TCPAddr); ok {
		ip := t.AddrPort().Addr().Unmap().WithZone("")
		return ip, ip.IsValid()
	}
	return clientip.ParseHost(a.String())
}

// single returns the one value of a header, refusing none, several or a longer one:
// a proxy sets these headers, so a second value can only be a client's. The value is
// a view of the request's buffer.
func single(hd *fasthttp.RequestHeader, name string, max int) (string, bool) {
	vs := hd.PeekAll(name)
	if len(vs) != 1 || len(vs[0]) == 0 || len(vs[0]) > max {
		return "", false
	}
	return view(vs[0]), true
}

// lookup is the decision's Header: the copied request headers by lower-case name, as
// the decision reads Envoy's. Repeated headers are joined with ",", so that every
// X-Forwarded-For line is walked, not only the first.
func (c *check) lookup(name string) string {
	vs := c.ctx.Request.Header.PeekAll(name)
	switch len(vs) {
	case 0:
		return ""
	case 1:
		return view(vs[0])
	}
	return string(bytes.Join(vs, []byte(",")))
}

// view is b as a string, without a copy: b must not change while the string is used.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// originForm returns the path and query of a request target: proxies send the origin
// form (/path?query), but nginx's $request_uri keeps an absolute-form target as the
// client wrote it (http://host/path?query).
func originForm(uri string) string {
	if strings.HasPrefix(uri, "/") {
		return uri
	}
	if _, rest, ok := strings.Cut(uri, "://"); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return rest[i:]
		}
		return "/"
	}
	return uri
}
