// Package forwardauth is the sidecar's HTTP forward-auth check for Caddy, nginx and
// Traefik: it rebuilds the original request from the proxy's forwarding headers, makes
// the ext_authz decision on it, and answers the way those proxies read an answer.
package forwardauth

import (
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

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

// Handler answers forward-auth checks.
type Handler struct {
	decide  func(authz.Request) *authv3.CheckResponse
	proxies *clientip.Resolver
	log     *slog.Logger
	refused *prometheus.CounterVec
	// lastLog is when a refusal was last logged (unix ns): at most one a minute.
	lastLog atomic.Int64
}

// New returns the handler. decide is the ext_authz decision (*authz.Server's Decide);
// proxies is TRUSTED_PROXIES, the only peers whose forwarding headers are believed.
// Its refusals are counted on reg.
func New(decide func(authz.Request) *authv3.CheckResponse, proxies *clientip.Resolver, log *slog.Logger, reg prometheus.Registerer) *Handler {
	if proxies == nil {
		proxies = &clientip.Resolver{}
	}
	h := &Handler{decide: decide, proxies: proxies, log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_sidecar_forward_auth_refused_total",
			Help: "Forward-auth checks refused without a decision, by reason: untrusted_peer (not in TRUSTED_PROXIES), bad_headers (no usable X-Forwarded-Method or X-Forwarded-Uri).",
		}, []string{"reason"}),
	}
	reg.MustRegister(h.refused)
	return h
}

// ServeHTTP answers one check. An allowed request gets 200 with an empty body; a denied
// one exactly the ext_authz denial (status, headers, body), reshaped for nginx when
// ModeHeader asks.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	peer, ok := clientip.ParseHost(r.RemoteAddr)
	if !ok || !h.proxies.Trusted(peer) {
		h.refuse(w, r, "untrusted_peer", errUntrusted, "peer", r.RemoteAddr)
		return
	}
	method, okM := single(r.Header, MethodHeader, maxMethod)
	uri, okU := single(r.Header, URIHeader, maxURI)
	if !okM || !okU {
		h.refuse(w, r, "bad_headers", errHeaders, "peer", r.RemoteAddr)
		return
	}
	resp := h.decide(authz.Request{
		Method: method,
		Path:   originForm(uri),
		Source: r.RemoteAddr,
		Header: headerFunc(r.Header),
	})
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK {
		for _, o := range resp.GetOkResponse().GetHeaders() {
			w.Header().Set(o.GetHeader().GetKey(), o.GetHeader().GetValue())
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	d := resp.GetDeniedResponse()
	status := int(d.GetStatus().GetCode())
	if status < 400 || status > 599 {
		status = http.StatusForbidden // as Envoy answers a denial without a status
	}
	for _, o := range d.GetHeaders() {
		w.Header().Set(o.GetHeader().GetKey(), o.GetHeader().GetValue())
	}
	if r.Header.Get(ModeHeader) == "nginx" {
		w.Header().Set(StatusHeader, strconv.Itoa(status))
		w.Header().Set(BodyHeader, d.GetBody())
		if status != http.StatusUnauthorized && status != http.StatusForbidden {
			status = http.StatusForbidden
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(d.GetBody()))
}

// refuse answers a check that cannot be decided, and logs it at most once a minute:
// a refusal is a configuration error of the proxy or of TRUSTED_PROXIES, or a client
// that reached the sidecar directly.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, reason string, e apierror.Error, args ...any) {
	h.refused.WithLabelValues(reason).Inc()
	now := time.Now().UnixNano()
	if last := h.lastLog.Load(); now-last >= int64(time.Minute) && h.lastLog.CompareAndSwap(last, now) {
		h.log.Warn("forward-auth check refused (logged at most once a minute; converger_sidecar_forward_auth_refused_total counts them)",
			append([]any{"reason", reason}, args...)...)
	}
	id := apierror.RequestID(r.Header.Get("X-Request-Id"))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Request-Id", id)
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.Body(nil, id))
}

// single returns the one value of a header, refusing none, several or a longer one:
// a proxy sets these headers, so a second value can only be a client's.
func single(hd http.Header, name string, max int) (string, bool) {
	vs := hd[name]
	if len(vs) != 1 || vs[0] == "" || len(vs[0]) > max {
		return "", false
	}
	return vs[0], true
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

// headerFunc reads the copied request headers by lower-case name, as the decision
// reads Envoy's: repeated headers are joined with ",", so that every X-Forwarded-For
// line is walked, not only the first.
func headerFunc(hd http.Header) func(string) string {
	return func(name string) string {
		vs := hd[textproto.CanonicalMIMEHeaderKey(name)]
		switch len(vs) {
		case 0:
			return ""
		case 1:
			return vs[0]
		}
		return strings.Join(vs, ",")
	}
}
