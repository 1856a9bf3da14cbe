// Package authzcheck is the core's own ext_authz client, for running without Envoy
// (AUTHZ_ADDR): a fiber middleware that asks the sidecar's
// envoy.service.auth.v3.Authorization/Check about every request, with the CheckRequest
// Envoy would send, and enforces the answer as Envoy would.
//
// Whatever bytes a client sends, the CheckRequest is valid: header values, the path and
// the other strings are made valid UTF-8 as Envoy does (every byte of an invalid
// sequence becomes "!"), since proto3 strings must be UTF-8 and a request the gRPC
// client cannot encode would otherwise never be checked.
//
// Only the requests that the sidecar's built-in route table matches are asked about:
// on any other route no bucket counts the request, the sidecar would allow it, and the
// round trip (and, under overload, its share of the sidecar's capacity) is saved.
//
// Failure mode: a Check that fails — the sidecar unreachable, slower than the timeout,
// answering a gRPC error, or an error of ours building or sending it — is counted and
// logged, and then decided by the route: requests on routes whose buckets protect
// credentials (logins, password resets, token minting; buckets.ProtectsCredentials)
// are refused with 503 (fail closed), since an outage must not open unlimited guessing
// or minting; every other request goes through unchecked, like Envoy with
// `failure_mode_allow: true`, unless the operator turned that off (AUTHZ_FAIL_OPEN=false:
// everything fails closed). The first failure after a success is logged (a warning),
// the recovery too (with how many requests went through unchecked and how many were
// refused), and FailedOpen and FailedClosed count them; failures in between are not
// logged one by one.
package authzcheck

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/gofiber/fiber/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/tracing"
	"github.com/converger/edge/sidecar/routes"
)

// DefaultTimeout bounds one Check, as envoy.yaml's ext_authz timeout does: a Check is an
// in-memory lookup on loopback, and this bounds what a stuck sidecar adds to a request.
const DefaultTimeout = 250 * time.Millisecond

// Options configure a Checker.
type Options struct {
	// Addr is the sidecar's gRPC address (AUTHZ_ADDR), host:port.
	Addr string
	// TLS makes the connection speak TLS (AUTHZ_TLS_*); nil: plain text.
	TLS *tls.Config
	// Timeout bounds one Check (DefaultTimeout when zero).
	Timeout time.Duration
	// Logger receives the failure warnings (slog.Default() when nil).
	Logger *slog.Logger
	// FailClosed refuses every request whose Check failed (AUTHZ_FAIL_OPEN=false);
	// without it only the routes that protect credentials are refused.
	FailClosed bool
}

// Checker asks the sidecar over one shared gRPC connection.
type Checker struct {
	addr    string
	conn    *grpc.ClientConn
	client  authv3.AuthorizationClient
	timeout time.Duration
	log     *slog.Logger
	// closedAll refuses every request whose Check failed; else only those that
	// credentials routes match.
	closedAll bool
	// credentials matches the requests whose Check protects credentials, as the
	// sidecar's built-in route table matches them.
	credentials *routes.Table
	// limited is the sidecar's built-in route table: a request it does not match is
	// counted in no bucket, so the sidecar would allow it, and it is not asked.
	limited *routes.Table

	skipped      atomic.Uint64 // requests on routes no bucket counts, not asked about
	failedOpen   atomic.Uint64 // requests let through because the Check failed
	failedClosed atomic.Uint64 // requests refused because the Check failed
	failing      atomic.Bool   // the last Check failed
	sinceFail    atomic.Uint64 // requests let through since the current failure began
	sinceClosed  atomic.Uint64 // requests refused since the current failure began
}

// New returns a Checker for the sidecar at o.Addr. The connection is made lazily and
// re-made after failures by gRPC; New fails only on an unusable address.
func New(o Options) (*Checker, error) {
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return nil, fmt.Errorf("AUTHZ_ADDR=%q: must be host:port", o.Addr)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	conn, err := grpc.NewClient(o.Addr,
		grpc.WithTransportCredentials(creds),
		// As Envoy's sidecar_authz cluster: HTTP/2 keepalive pings every 30 s (the
		// sidecar's server permits pings every 5 s).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		// A span of its own, in the request's trace, while tracing is on.
		grpc.WithUnaryInterceptor(tracing.UnaryClientInterceptor()),
	)
	if err != nil {
		return nil, fmt.Errorf("AUTHZ_ADDR=%q: %w", o.Addr, err)
	}
	table, err := routes.New(credentialRoutes())
	if err != nil {
		return nil, err
	}
	limited, err := routes.New(routes.BuiltIn())
	if err != nil {
		return nil, err
	}
	return &Checker{addr: o.Addr, conn: conn, client: authv3.NewAuthorizationClient(conn), timeout: o.Timeout,
		log: o.Logger, closedAll: o.FailClosed, credentials: table, limited: limited}, nil
}

// credentialRoutes are the sidecar's built-in routes whose buckets protect credentials,
// and the logins the core counts itself.
func credentialRoutes() []routes.Route {
	var out []routes.Route
	for _, r := range routes.BuiltIn() {
		protects := r.Core
		for _, st := range r.Steps {
			protects = protects || buckets.ProtectsCredentials(st.Bucket) || buckets.ProtectsCredentials(st.PublishableBucket)
		}
		if protects {
			out = append(out, r)
		}
	}
	return out
}

// Close closes the connection.
func (k *Checker) Close() error { return k.conn.Close() }

// FailedOpen returns how many requests were let through unchecked because the Check
// failed.
func (k *Checker) FailedOpen() uint64 { return k.failedOpen.Load() }

// Skipped returns how many requests were not asked about because no bucket counts
// their route.
func (k *Checker) Skipped() uint64 { return k.skipped.Load() }

// FailedClosed returns how many requests were refused because the Check failed.
func (k *Checker) FailedClosed() uint64 { return k.failedClosed.Load() }

// errUnchecked is the answer to a request refused because it could not be checked.
var errUnchecked = apierror.Unavailable.WithMessage("This request cannot be checked right now. Please try again shortly.")

// Failing reports whether the last Check failed (requests are let through unchecked, or refused on the routes that fail closed).
func (k *Checker) Failing() bool { return k.failing.Load() }

// Handler is the fiber middleware. It must run after the core's request-id middleware,
// so that the Check carries the request's x-request-id (api.New runs Deps.Middleware
// after it).
func (k *Checker) Handler(c *fiber.Ctx) error {
	if _, _, ok := k.limited.Match(c.Method(), validUTF8(c.Request().Header.RequestURI())); !ok {
		k.skipped.Add(1)
		return c.Next() // no bucket counts it: a Check would be a round trip for an allow
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), k.timeout)
	resp, err := k.client.Check(ctx, Request(c))
	cancel()
	if err != nil {
		if k.closedAll || k.protectsCredentials(c) {
			k.failed(err, &k.failedClosed, &k.sinceClosed)
			c.Set(fiber.HeaderRetryAfter, "1")
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			return c.Status(errUnchecked.Status).Send(errUnchecked.Body(nil, string(c.Response().Header.Peek("x-request-id"))))
		}
		k.failed(err, &k.failedOpen, &k.sinceFail)
		return c.Next()
	}
	k.recovered()
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK {
		return k.allowed(c, resp.GetOkResponse())
	}
	return deny(c, resp.GetDeniedResponse())
}

// protectsCredentials reports whether the request is on a route that protects
// credentials.
func (k *Checker) protectsCredentials(c *fiber.Ctx) bool {
	_, _, ok := k.credentials.Match(c.Method(), validUTF8(c.Request().Header.RequestURI()))
	return ok
}

// failed counts a request whose Check failed (in total and since the failure began),
// and logs the first of a run of failures.
func (k *Checker) failed(err error, total, since *atomic.Uint64) {
	total.Add(1)
	since.Add(1)
	if k.failing.CompareAndSwap(false, true) {
		mode := "requests on routes that protect credentials (logins, password resets, token minting) are refused with 503, " +
			"others are let through unchecked (fail open, as Envoy's failure_mode_allow)"
		if k.closedAll {
			mode = "every request is refused with 503 (AUTHZ_FAIL_OPEN=false)"
		}
		k.log.Warn("the sidecar's authorization check failed: "+mode+" until it answers again",
			"authz_addr", k.addr, "code", status.Code(err).String(), "error", err)
	}
}

// recovered logs the end of a run of failures.
func (k *Checker) recovered() {
	if k.failing.Load() && k.failing.CompareAndSwap(true, false) {
		k.log.Info("the sidecar's authorization check is back: requests are checked again", "authz_addr", k.addr,
			"let_through_unchecked", k.sinceFail.Swap(0), "refused_unchecked", k.sinceClosed.Swap(0))
	}
}

// allowed applies an OK answer's header changes, as Envoy would (the sidecar sends
// none), and runs the request.
func (k *Checker) allowed(c *fiber.Ctx, ok *authv3.OkHttpResponse) error {
	if ok == nil {
		return c.Next()
	}
	for _, name := range ok.GetHeadersToRemove() {
		c.Request().Header.Del(name)
	}
	for _, h := range ok.GetHeaders() {
		applyHeader(&requestHeaders{c}, h)
	}
	err := c.Next()
	for _, h := range ok.GetResponseHeadersToAdd() {
		applyHeader(&responseHeaders{c}, h)
	}
	return err
}

// deny answers with the denial exactly as the sidecar sent it: status, headers, body.
// A denial without a status is 403, as in Envoy; without a body it gets the forbidden
// envelope, since every answer of the core is JSON.
func deny(c *fiber.Ctx, d *authv3.DeniedHttpResponse) error {
	status := int(d.GetStatus().GetCode())
	if status < 400 || status > 599 {
		status = fiber.StatusForbidden
	}
	body := d.GetBody()
	if body == "" && len(d.GetHeaders()) == 0 {
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		body = string(apierror.Forbidden.Body(nil, string(c.Response().Header.Peek("x-request-id"))))
	}
	for _, h := range d.GetHeaders() {
		applyHeader(&responseHeaders{c}, h)
	}
	return c.Status(status).SendString(body)
}

// headers are the request's or the response's headers.
type headers interface {
	get(name string) string
	set(name, value string)
	add(name, value string)
}

type requestHeaders struct{ c *fiber.Ctx }

func (h *requestHeaders) get(n string) string { return string(h.c.Request().Header.Peek(n)) }
func (h *requestHeaders) set(n, v string)     { h.c.Request().Header.Set(n, v) }
func (h *requestHeaders) add(n, v string)     { h.c.Request().Header.Add(n, v) }

type responseHeaders struct{ c *fiber.Ctx }

func (h *responseHeaders) get(n string) string { return string(h.c.Response().Header.Peek(n)) }
func (h *responseHeaders) set(n, v string)     { h.c.Response().Header.Set(n, v) }
func (h *responseHeaders) add(n, v string)     { h.c.Response().Header.Add(n, v) }

// applyHeader applies one header option with its append action (the deprecated append
// flag wins when set, as in Envoy).
func applyHeader(hs headers, o *corev3.HeaderValueOption) {
	name, value := o.GetHeader().GetKey(), o.GetHeader().GetValue()
	if value == "" {
		value = string(o.GetHeader().GetRawValue())
	}
	if name == "" || strings.HasPrefix(name, ":") {
		return
	}
	action := o.GetAppendAction()
	//lint:ignore SA1019 Envoy still honours the deprecated append flag when it is set.
	if a := o.GetAppend(); a != nil {
		action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		if a.GetValue() {
			action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
		}
	}
	switch action {
	case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
		hs.add(name, value)
	case corev3.HeaderValueOption_ADD_IF_ABSENT:
		if hs.get(name) == "" {
			hs.set(name, value)
		}
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
		if hs.get(name) != "" {
			hs.set(name, value)
		}
	default: // OVERWRITE_IF_EXISTS_OR_ADD
		hs.set(name, value)
	}
}

// Request builds the CheckRequest Envoy would send for c: the peer as the source, the
// local address as the destination, the method, the path with its query exactly as
// received (the sidecar decodes and cleans it as the core's router does), host, scheme,
// protocol, the body size, and every request header under its lower-case name, repeated
// headers joined with ",". x-request-id is the core's: the one Envoy or the client sent
// when it is sensible, else the one the core's request-id middleware made (the response
// already carries it). Every string is valid UTF-8 (validUTF8), as Envoy makes it.
func Request(c *fiber.Ctx) *authv3.CheckRequest {
	rc := c.Context()
	req := &c.Request().Header
	hdrs := make(map[string]string, req.Len()+1)
	req.VisitAll(func(k, v []byte) {
		name := strings.ToLower(validUTF8(k))
		if prev, ok := hdrs[name]; ok {
			hdrs[name] = prev + "," + validUTF8(v)
			return
		}
		hdrs[name] = validUTF8(v)
	})
	if id := c.Response().Header.Peek("x-request-id"); len(id) > 0 {
		hdrs["x-request-id"] = validUTF8(id)
	}
	path := validUTF8(req.RequestURI())
	if !strings.HasPrefix(path, "/") { // absolute-form request target: Envoy passes the path on
		path = validUTF8(c.Request().URI().RequestURI())
	}
	scheme := "http"
	if rc.IsTLS() {
		scheme = "https"
	}
	size := int64(req.ContentLength())
	if size < 0 {
		size = -1 // unknown (chunked)
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: socketAddress(rc.RemoteAddr())},
		Destination: &authv3.AttributeContext_Peer{Address: socketAddress(rc.LocalAddr())},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id:       hdrs["x-request-id"],
			Method:   validUTF8(req.Method()),
			Headers:  hdrs,
			Path:     path,
			Host:     validUTF8(req.Host()),
			Scheme:   scheme,
			Protocol: validUTF8(req.Protocol()),
			Size:     size,
		}},
	}}
}

// validUTF8 returns b as a string that is valid UTF-8, as Envoy sanitizes the strings of
// a CheckRequest: every byte of an invalid sequence becomes "!". Valid input is copied
// as it is.
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size <= 1 {
			out = append(out, '!')
			b = b[1:]
			continue
		}
		out = append(out, b[:size]...)
		b = b[size:]
	}
	return string(out)
}

// socketAddress is a TCP address as Envoy reports it: IP and port.
func socketAddress(a net.Addr) *corev3.Address {
	var ip string
	var port int
	switch t := a.(type) {
	case *net.TCPAddr:
		ip, port = t.IP.String(), t.Port
	case nil:
		return nil
	default:
		host, p, err := net.SplitHostPort(a.String())
		if err != nil {
			ip = a.String()
		} else {
			ip = host
			_, _ = fmt.Sscanf(p, "%d", &port)
		}
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}
}
