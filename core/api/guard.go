package api

// What keeps the core answering under hostile clients and overload, in the order a
// request meets it:
//
//   - fasthttp reads at most maxHeaderBytes of headers and a byte or two of the body
//     (prefetchBody), within CORE_READ_TIMEOUT (uploads: uploadReadTimeout);
//   - readBody reads the body within the route's limit (bodyRule: 413 beyond it, before
//     it is read when its length says so), the body budget (503) and the least rate
//     (408), and gives a request without a credential that holds a few KiB at most
//     (bodies.go);
//   - checkRequest refuses too many headers (431) and compressed bodies on routes that
//     do not take them (415), and inflates those of the routes that do through a
//     reader capped at the route's limit (413 beyond it);
//   - requireDatabase answers 503 at once while the database monitor says PostgreSQL is
//     down or hung;
//   - admit does nothing for a request whose client has already closed its
//     connection, answers 503 at once beyond CORE_MAX_IN_FLIGHT requests in flight,
//     instead of queueing them, and gives each request a deadline
//     (CORE_REQUEST_TIMEOUT, or Envoy's x-envoy-expected-rq-timeout-ms when shorter)
//     and cancels its work when its client closes the connection (watchInFlight);
//   - observe counts every answer by route pattern and status and writes the access
//     log line.

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/converger/edge/core/inbound"
	"github.com/converger/edge/core/metrics"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/shared/tracing"
)

const (
	// maxHeaderBytes bounds a request's line and headers (fasthttp's read buffer): 431
	// beyond it.
	maxHeaderBytes = 8 << 10
	// maxHeaders bounds how many header fields a request has: 431 beyond it.
	maxHeaders = 100
	// minJSONBody is the least body limit of every route but uploads; it grows with the
	// activity limits (maxJSONBody).
	minJSONBody = 256 << 10
	// uploadReadTimeout bounds reading an upload's body, larger than the other bodies.
	uploadReadTimeout = 60 * time.Second
	// retryAfterSeconds is the retry-after of the 503s of an overloaded core or an
	// unavailable database.
	retryAfterSeconds = 1
	// goneCheckAfter is how long a request runs before watchInFlight looks whether its
	// client is still there; goneCheckEvery how often it looks.
	goneCheckAfter = 50 * time.Millisecond
	goneCheckEvery = 100 * time.Millisecond
)

var (
	errHeadersTooLarge = apierror.HeadersTooLarge
	errRequestTimeout  = apierror.RequestTimeout
	errMethod          = apierror.Error{Status: 405, Code: "method_not_allowed", Message: "Method not allowed."}
	errCompressed      = apierror.Error{Status: 415, Code: "unsupported_media_type", Message: "Compressed request bodies are not accepted here; send the body uncompressed."}
	errEncoding        = apierror.Error{Status: 415, Code: "unsupported_media_type", Message: "The content encoding is not supported; send the body uncompressed, or with gzip or deflate."}
	errBadCompressed   = apierror.BadRequest.WithMessage("The compressed body is malformed.")
	errOverloaded      = apierror.Unavailable.WithMessage("The service is overloaded. Please try again shortly.")
	errDatabaseDown    = apierror.Unavailable.WithMessage("The service is temporarily unavailable. Please try again shortly.")
	errInternal        = apierror.Error{Status: 500, Code: "internal_error", Message: "Something went wrong."}
)

// encodingRule is what a route does with a compressed body.
type encodingRule int

const (
	// refuseEncoded answers a compressed body 415: the default.
	refuseEncoded encodingRule = iota
	// inflateEncoded inflates gzip and deflate bodies, capped at the route's limit.
	inflateEncoded
	// rawBody leaves the body as sent: the route reads the raw bytes and answers a
	// compressed body itself (the inbound webhooks, whose signature covers the bytes).
	rawBody
)

// bodyRule is how a route takes its body.
type bodyRule struct {
	max         int           // the most bytes read
	readTimeout time.Duration // 0: CORE_READ_TIMEOUT
	encoding    encodingRule
}

// maxJSONBody is the body limit of every route but uploads: minJSONBody, or more when
// the activity limits need it (as the legacy socket's message bound).
func (s *server) maxJSONBody() int {
	return max(minJSONBody, int(legacyReadLimit(s.Limits)), inbound.MaxBodyBytes)
}

// bodyRule returns the rule of the route a request goes to, from its method and its
// path as the router sees it (decoded, dot segments resolved). The routes that differ
// from the default are listed here: uploads take large bodies; the tenant API, called
// server to server, takes gzip and deflate; the inbound webhooks read the raw body.
func (s *server) bodyRule(method, path string) bodyRule {
	r := bodyRule{max: s.maxJSONBody()}
	if method != fiber.MethodPost && method != fiber.MethodPut && method != fiber.MethodPatch {
		return r
	}
	p := strings.TrimRight(strings.ToLower(path), "/")
	switch {
	case matchPath(p, "/api/v1/converger/conversations/:id/upload"):
		r.max, r.readTimeout = s.MaxUploadBytes+uploadOverhead, uploadReadTimeout
	case matchPath(p, "/api/v1/channels/:channel_id/inbound"), matchPath(p, "/api/v1/channels/:channel_id/status"):
		r.encoding = rawBody
	case strings.HasPrefix(p, "/api/v1/") && !strings.HasPrefix(p, "/api/v1/converger/") && !strings.HasPrefix(p, "/api/v1/channels/"):
		r.encoding = inflateEncoded
	}
	return r
}

// matchPath reports whether a lower-case path without a trailing slash matches a
// pattern whose ":name" segments match any one segment.
func matchPath(path, pattern string) bool {
	for {
		pseg, prest, pmore := strings.Cut(pattern, "/")
		seg, rest, more := strings.Cut(path, "/")
		if pmore != more || (pseg != seg && (!strings.HasPrefix(pseg, ":") || seg == "")) {
			return false
		}
		if !more {
			return true
		}
		pattern, path = prest, rest
	}
}

// requestConfig is fasthttp's HeaderReceived: the read timeout of the request's route,
// known before the body is read. fasthttp reads at most prefetchBody bytes of a body
// before the handler runs; readBody reads the rest within the route's limit and the
// body budget.
func (s *server) requestConfig(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if !h.IsPost() && !h.IsPut() && !h.IsPatch() {
		return fasthttp.RequestConfig{MaxRequestBodySize: prefetchBody}
	}
	u := fasthttp.AcquireURI()
	defer fasthttp.ReleaseURI(u)
	if err := u.Parse(nil, h.RequestURI()); err != nil {
		return fasthttp.RequestConfig{MaxRequestBodySize: prefetchBody}
	}
	r := s.bodyRule(string(h.Method()), string(u.Path()))
	if h.ContentLength() > r.max {
		// Answered 413 at once, not once a byte of the body came: the read of the
		// body times out at once and the error handler sees the mark.
		declaredTooLarge.Store(h, r.max)
		return fasthttp.RequestConfig{MaxRequestBodySize: prefetchBody, ReadTimeout: time.Nanosecond}
	}
	return fasthttp.RequestConfig{MaxRequestBodySize: prefetchBody, ReadTimeout: r.readTimeout}
}

// declaredTooLarge marks the requests (by their header, which fasthttp reuses with its
// request context) whose Content-Length is over their route's limit, with the limit,
// between requestConfig and the answer.
var declaredTooLarge sync.Map

// checkRequest bounds the header count and applies the route's rule to compressed
// bodies.
func (s *server) checkRequest(c *fiber.Ctx) error {
	if c.Request().Header.Len() > maxHeaders {
		return fail(c, errHeadersTooLarge, nil)
	}
	enc, ok := contentEncoding(c.Get(fiber.HeaderContentEncoding))
	if enc == "" && ok {
		return c.Next()
	}
	rule := s.bodyRule(c.Method(), c.Path())
	switch {
	case rule.encoding == rawBody:
		return c.Next()
	case len(c.Request().Body()) == 0:
		// Nothing to decode: an encoding header on an empty body changes nothing.
		c.Request().Header.Del(fiber.HeaderContentEncoding)
		return c.Next()
	case rule.encoding == refuseEncoded:
		return fail(c, errCompressed, nil)
	case !ok:
		return fail(c, errEncoding, nil)
	}
	body, err := inflate(c.Request().Body(), enc, rule.max)
	switch {
	case errors.Is(err, errTooLarge):
		return fail(c, errPayloadTooLarge, map[string]any{"max_bytes": rule.max})
	case err != nil:
		return fail(c, errBadCompressed, nil)
	}
	// The handlers read the inflated body; nothing decodes it again.
	c.Request().SetBodyRaw(body)
	c.Request().Header.Del(fiber.HeaderContentEncoding)
	return c.Next()
}

// contentEncoding reads a Content-Encoding header: "" for none (or identity), "gzip" or
// "deflate"; ok is false for any other encoding or several of them.
func contentEncoding(h string) (enc string, ok bool) {
	for part := range strings.SplitSeq(h, ",") {
		switch v := strings.ToLower(strings.TrimSpace(part)); v {
		case "", "identity":
		case "gzip", "x-gzip", "deflate":
			if enc != "" {
				return "", false
			}
			enc = strings.TrimPrefix(v, "x-")
		default:
			return "", false
		}
	}
	return enc, true
}

var errTooLarge = errors.New("inflated body too large")

// inflate decodes a gzip or deflate body (zlib-wrapped, or raw as some clients send
// it), reading at most max bytes of output.
func inflate(body []byte, enc string, max int) ([]byte, error) {
	var r io.ReadCloser
	var err error
	switch enc {
	case "gzip":
		r, err = gzip.NewReader(bytes.NewReader(body))
	default:
		if r, err = zlib.NewReader(bytes.NewReader(body)); err != nil {
			r, err = flate.NewReader(bytes.NewReader(body)), nil
		}
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	out, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(out) > max {
		return nil, errTooLarge
	}
	return out, nil
}

// requireDatabase answers 503 at once while the database is known to be down, rather
// than letting every request wait for its deadline.
func (s *server) requireDatabase(c *fiber.Ctx) error {
	if s.Database == nil || s.Database.Up() {
		return c.Next()
	}
	s.Metrics.Shed(metrics.ShedDatabaseDown)
	return failUnavailable(c, errDatabaseDown)
}

// failUnavailable answers 503 with retry-after.
func failUnavailable(c *fiber.Ctx, e apierror.Error) error {
	c.Set(fiber.HeaderRetryAfter, strconv.Itoa(retryAfterSeconds))
	return fail(c, e, apierror.RateLimitDetails{RetryAfterMS: retryAfterSeconds * 1000})
}

// admission is the bound on requests in flight: a slot per request.
type admission struct {
	free  chan int
	slots []atomic.Pointer[admitted]
}

// admitted is a request in flight.
type admitted struct {
	conn   net.Conn
	cancel context.CancelFunc
	start  time.Time
	gone   atomic.Bool
}

func newAdmission(n int) *admission {
	a := &admission{free: make(chan int, n), slots: make([]atomic.Pointer[admitted], n)}
	for i := range n {
		a.free <- i
	}
	return a
}

// admit runs the request in a free slot with its deadline, or answers 503 at once;
// a request whose client is gone is not run.
func (s *server) admit(c *fiber.Ctx) error {
	conn := c.Context().Conn()
	if conn != nil && netlimit.PeerGone(conn) {
		// The client left while the request waited to be read (an overloaded machine,
		// a full accept queue): nobody is there for the answer, so no work is done.
		s.Metrics.Shed(metrics.ShedClientGone)
		c.Context().SetConnectionClose()
		return failUnavailable(c, errOverloaded)
	}
	var slot int
	select {
	case slot = <-s.inFlight.free:
	default:
		s.Metrics.Shed(metrics.ShedInFlight)
		return failUnavailable(c, errOverloaded)
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.requestTimeout(c))
	r := &admitted{conn: c.Context().Conn(), cancel: cancel, start: time.Now()}
	s.inFlight.slots[slot].Store(r)
	gauge := s.Metrics.InFlight()
	gauge.Inc()
	defer func() {
		gauge.Dec()
		s.inFlight.slots[slot].Store(nil)
		cancel()
		s.inFlight.free <- slot
	}()
	c.SetUserContext(ctx)
	return c.Next()
}

// requestTimeout is CORE_REQUEST_TIMEOUT, or the time Envoy gives the request when
// shorter (x-envoy-expected-rq-timeout-ms: a client can only shorten its own request).
func (s *server) requestTimeout(c *fiber.Ctx) time.Duration {
	d := s.RequestTimeout
	if v := c.Get("x-envoy-expected-rq-timeout-ms"); v != "" {
		if ms, err := strconv.Atoi(v); err == nil && ms > 0 {
			d = min(d, time.Duration(ms)*time.Millisecond)
		}
	}
	return d
}

// watchInFlight cancels the work of requests whose client has closed its connection,
// every goneCheckEvery, until ctx ends: a client that gave up no longer holds a
// database connection or a slot. Work already committed stays committed; only its
// answer is lost with the client.
func (s *server) watchInFlight(ctx context.Context) {
	t := time.NewTicker(goneCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for i := range s.inFlight.slots {
				r := s.inFlight.slots[i].Load()
				if r == nil || r.gone.Load() || now.Sub(r.start) < goneCheckAfter || r.conn == nil {
					continue
				}
				if netlimit.PeerGone(r.conn) && !r.gone.Swap(true) {
					r.cancel()
					s.Metrics.Shed(metrics.ShedClientGone)
				}
			}
		}
	}
}

// localObserved marks requests whose answer observe records.
const localObserved localKey = 100

// observe counts the request's answer and writes its access log line. Errors the
// handlers return are answered here (errorHandler), so that the status is final.
func (s *server) observe(c *fiber.Ctx) error {
	start := time.Now()
	c.Locals(localObserved, true)
	var span trace.Span
	if tracing.Enabled() {
		span = startSpan(c)
	}
	if err := c.Next(); err != nil {
		if err := s.errorHandler(c, err); err != nil {
			if span != nil {
				endSpan(c, span)
			}
			return err
		}
	}
	s.record(c, start)
	if span != nil {
		endSpan(c, span)
	}
	return nil
}

// record counts an answer and logs it: request id, method, route pattern (never the
// path or the query, which can carry tokens), status, duration, client address.
func (s *server) record(c *fiber.Ctx, start time.Time) {
	route := routePattern(c)
	method := methodLabel(c.Method())
	status := c.Response().StatusCode()
	d := time.Since(start)
	s.Metrics.ObserveRequest(route, method, status, d)
	if s.AccessLog {
		s.Logger.LogAttrs(context.Background(), slog.LevelInfo, "request",
			slog.String("request_id", requestID(c)), slog.String("method", method), slog.String("route", route),
			slog.Int("status", status), slog.Float64("duration_ms", float64(d.Microseconds())/1000),
			slog.String("client_ip", c.IP()))
	}
}

// routePattern is the pattern of the route that answered, metrics.NoRoute when none
// did: the middleware and the catch-all 404 are mounted at "/", where the API has no
// route of its own, and fiber's Route of a request that reached no handler (an error
// of the HTTP server) holds the raw path, which must not become a label.
func routePattern(c *fiber.Ctx) string {
	if r := c.Route(); r != nil && len(r.Handlers) > 0 && r.Path != "" && r.Path != "/" {
		return r.Path
	}
	return metrics.NoRoute
}

// methodLabel is the method as a label: the known ones, else "other" (a client chooses
// the method, and labels must stay few).
//
// It returns the constant, never m: fiber's method string is a view of the request's
// buffer, which the next request on the connection overwrites, and a label kept in the
// metrics' maps must not change under them.
func methodLabel(m string) string {
	for _, known := range [...]string{fiber.MethodGet, fiber.MethodPost, fiber.MethodPut, fiber.MethodPatch, fiber.MethodDelete,
		fiber.MethodHead, fiber.MethodOptions} {
		if m == known {
			return known
		}
	}
	return "other"
}
