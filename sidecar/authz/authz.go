// Package authz is the sidecar's answer to Envoy's external authorization Check: match
// the route, identify the request, count it, and allow it or deny it with the envelope.
package authz

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/shared/tracing"
	"github.com/converger/edge/sidecar/identity"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/metrics"
	"github.com/converger/edge/sidecar/routes"
	"github.com/converger/edge/sidecar/tenants"
	"github.com/converger/edge/sidecar/traffic"
)

// Overrides gives a tenant's limit overrides; *tenants.Directory implements it.
type Overrides interface {
	Overrides(tenantID string) (buckets.Overrides, tenants.Status)
}

// BaseLimits resolves a bucket's limit without overrides; *config.Config implements it.
type BaseLimits interface {
	BaseLimit(bucket string, route buckets.Limit) (buckets.Limit, bool)
}

// Server answers envoy.service.auth.v3.Authorization/Check.
type Server struct {
	authv3.UnimplementedAuthorizationServer

	table     *routes.Table
	steps     [][]step // by route index
	ident     *identity.Resolver
	limiter   *limiter.Limiter
	overrides Overrides // nil without a database
	metrics   *metrics.Metrics
	none      prometheus.Counter
	traffic   *traffic.Recorder // nil: decisions are not recorded for the live view
	slots     chan struct{}     // one per Check being decided
	longest   time.Duration     // the longest a decision may take (its database wait)
	shed      prometheus.Counter
}

// step is a route step with everything resolved that does not depend on the request.
type step struct {
	routes.Step
	main, publishable counter
}

type counter struct {
	name        string
	id          limiter.BucketID
	base        buckets.Limit
	overridable bool
	metrics     *metrics.Bucket
}

// New builds the server for a route table.
func New(table *routes.Table, ident *identity.Resolver, lim *limiter.Limiter, limits BaseLimits, overrides Overrides, m *metrics.Metrics) (*Server, error) {
	s := &Server{table: table, ident: ident, limiter: lim, overrides: overrides, metrics: m, none: m.Unlimited(),
		slots: make(chan struct{}, DefaultMaxInFlight), shed: m.Shed()}
	mk := func(name string, route buckets.Limit) (counter, error) {
		base, ok := limits.BaseLimit(name, route)
		if !ok {
			return counter{}, fmt.Errorf("bucket %s has no limit", name)
		}
		b, _ := buckets.Lookup(name)
		return counter{name: name, id: lim.Bucket(name), base: base, overridable: b.Overridable, metrics: m.Bucket(name)}, nil
	}
	for _, r := range table.Routes() {
		var steps []step
		for _, rs := range r.Steps {
			st := step{Step: rs}
			var err error
			if st.main, err = mk(rs.Bucket, rs.Limit); err != nil {
				return nil, err
			}
			if rs.PublishableBucket != "" {
				if st.publishable, err = mk(rs.PublishableBucket, buckets.Limit{}); err != nil {
					return nil, err
				}
			}
			steps = append(steps, st)
		}
		s.steps = append(s.steps, steps)
	}
	return s, nil
}

// RecordTraffic makes every decision count in the live view's minutes and busiest keys
// (sidecar/traffic). Call it before serving.
func (s *Server) RecordTraffic(r *traffic.Recorder) { s.traffic = r }

// defaultBudget bounds a Check waiting for its turn without a deadline from the caller;
// with one, it keeps a fifth of the time to its deadline (at least
// limiter.AnswerMargin) for the answer to travel, so that it arrives in time
// (limiter.DecideBy).
const defaultBudget = 200 * time.Millisecond

// DefaultMaxInFlight is the bound on Checks decided at once until LimitInFlight.
const DefaultMaxInFlight = 256

// LimitInFlight bounds the Checks decided at once to n; longest is the longest a
// decision may take (the database wait of a credential not cached). Call it before
// serving. Beyond the bound a Check waits for its turn while its decision could still
// be in time — until longest and a margin before its deadline (Envoy's timeout, sent
// as grpc-timeout) — then gets the fast decision of overloaded, so that an
// overloaded sidecar still answers within the budget, and never with an error or late,
// either of which Envoy, with failure_mode_allow, takes as "let it through".
func (s *Server) LimitInFlight(n int, longest time.Duration) {
	s.slots = make(chan struct{}, n)
	s.longest = longest
}

// Check decides on one request. Every decision is an answer, never a gRPC error: Envoy
// treats errors as failures of the service, not as denials.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return s.Verdict(ctx, RequestOf(req)).Response(), nil
}

// Request is what a decision reads of a request, whichever interface it came in on:
// Envoy's CheckRequest, or the forwarding headers of an HTTP forward-auth check.
//
// Its strings need only live for the call: the caller may reuse their bytes once the
// decision has returned (and once its Verdict is answered), so whatever the decision keeps
// beyond the call (caches, counters) it copies.
type Request struct {
	Method string
	// Path is the request target as the client sent it: path and query.
	Path string
	// Source is the last hop before the sidecar's caller: Envoy's source address (its
	// direct peer), or for a forward-auth check the proxy itself. The client address is
	// resolved from it and x-forwarded-for under TRUSTED_PROXIES.
	Source string
	// Header returns a request header by lower-case name, "" when absent. It is asked
	// for no other names than RequestHeaders, and while tracing is on for traceparent
	// and tracestate (a caller that extracts only RequestHeaders answers "").
	Header func(name string) string
}

// HeaderRequestID is the request header whose value a denial echoes (apierror.RequestID).
const HeaderRequestID = "x-request-id"

// RequestHeaders are the only request headers a decision reads: a caller that decodes
// requests itself need extract no others.
var RequestHeaders = append(identity.Headers[:len(identity.Headers):len(identity.Headers)], HeaderRequestID)

// Verdict is Check without the CheckResponse: it waits for a turn among the Checks in
// flight within the budget of ctx (LimitInFlight), decides, and records the decision's
// latency. A caller that writes the answer itself (sidecar/envoywire) asks it.
func (s *Server) Verdict(ctx context.Context, r Request) Verdict {
	start := time.Now()
	var span trace.Span
	if tracing.Enabled() {
		ctx, span = startSpan(ctx, r)
	}
	var v Verdict
	by := limiter.DecideBy(ctx, start)
	if s.admit(ctx, start, by) {
		v = s.decide(r, by)
		<-s.slots
	} else {
		s.shed.Inc()
		v = s.overloaded(r)
		v.shed = true
	}
	s.metrics.ObserveCheck(time.Since(start))
	if span != nil {
		endSpan(span, &v)
	}
	return v
}

// startSpan starts a decision's span below the caller's: Envoy's span of its ext_authz
// call (the call's traceparent), or the traceparent of the request itself (a proxy's
// forward-auth check copies the client's headers).
func startSpan(ctx context.Context, r Request) (context.Context, trace.Span) {
	parent := tracing.FromIncoming(ctx)
	if !trace.SpanContextFromContext(parent).IsValid() {
		parent = tracing.Extract(ctx, tracing.Header(r.Header))
	}
	ctx, span := tracing.Start(parent, "converger.check", trace.SpanKindServer)
	if span.IsRecording() { // not for the requests the sampler leaves out
		span.SetAttributes(attribute.String("http.request.method", r.Method))
	}
	return ctx, span
}

// endSpan records what was decided: the bucket and the decision, never the path (it
// may hold a secret, as a password reset link does), a header or a counted key.
func endSpan(span trace.Span, v *Verdict) {
	if !span.IsRecording() {
		span.End()
		return
	}
	decision := "allowed"
	switch {
	case v.shed:
		decision = "shed"
	case v.RateLimited():
		decision = "rate_limited"
	case !v.Allowed():
		decision = "refused"
	}
	span.SetAttributes(attribute.String("converger.decision", decision), attribute.String("converger.bucket", v.Bucket))
	if !v.Allowed() {
		span.SetAttributes(attribute.Int("http.response.status_code", v.Denial.Status))
	}
	span.End()
}

// Verdict is a decision: allowed, or denied with what the answer says.
type Verdict struct {
	// Code is the CheckResponse's status code: OK when allowed, else PermissionDenied,
	// Unauthenticated (a 401), ResourceExhausted (over the limit) or Unavailable (an
	// overloaded sidecar).
	Code codes.Code
	// Denial is a denial's HTTP status and envelope; zero when allowed.
	Denial apierror.Error
	// RetryAfterMS is, for a denial that says when to retry (Retry), how long: the
	// envelope's retry_after_ms and, in whole seconds (RetryAfterSeconds), retry-after.
	RetryAfterMS int64
	// RequestID is the denial's x-request-id, in its header and its envelope: the
	// request's own when it is a sensible one, else a new one (apierror.RequestID).
	RequestID string
	// Bucket is the bucket that decided: the one that denied, or the last one counted;
	// "" for a route that is not limited.
	Bucket string

	shed bool // no turn in time: the overloaded decision
}

// Allowed reports an allowed request.
func (v *Verdict) Allowed() bool { return v.Code == codes.OK }

// RateLimited reports a denial for a request over its limit: 429 with retry-after.
func (v *Verdict) RateLimited() bool { return v.Code == codes.ResourceExhausted }

// Retry reports a denial that carries retry-after and retry_after_ms: over the limit,
// or overloaded.
func (v *Verdict) Retry() bool {
	return v.Code == codes.ResourceExhausted || v.Code == codes.Unavailable
}

// RetryAfterSeconds is the retry-after header's value: RetryAfterMS in whole seconds,
// rounded up, at least 1.
func (v *Verdict) RetryAfterSeconds() int64 {
	return limiter.Result{RetryAfterMS: v.RetryAfterMS}.RetryAfterSeconds()
}

// Details are the envelope's details: the retry delay of a denial that has one, else
// none ({}).
func (v *Verdict) Details() *apierror.RateLimitDetails {
	if !v.Retry() {
		return nil
	}
	return &apierror.RateLimitDetails{RetryAfterMS: v.RetryAfterMS}
}

// The response headers of a denial, in order: retry-after (Retry only), content-type,
// x-request-id.
const (
	HeaderRetryAfter  = "retry-after"
	HeaderContentType = "content-type"
	ContentTypeJSON   = "application/json"
)

// Response is the CheckResponse of a verdict.
func (v Verdict) Response() *authv3.CheckResponse {
	if v.Allowed() {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)}}
	}
	var headers []*corev3.HeaderValueOption
	var details any
	if d := v.Details(); d != nil {
		headers = append(headers, header(HeaderRetryAfter, strconv.FormatInt(v.RetryAfterSeconds(), 10)))
		details = *d
	}
	headers = append(headers, header(HeaderContentType, ContentTypeJSON), header(HeaderRequestID, v.RequestID))
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(v.Code), Message: v.Denial.Code},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(v.Denial.Status)},
			Headers: headers,
			Body:    string(v.Denial.Body(details, v.RequestID)),
		}},
	}
}

// admit takes a turn among the Checks in flight, waiting within the budget: until the
// decision, due by by (zero: defaultBudget after start), could still be made in time,
// or ctx is done.
func (s *Server) admit(ctx context.Context, start, by time.Time) bool {
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	until := start.Add(defaultBudget)
	if !by.IsZero() {
		until = by
	}
	until = until.Add(-s.longest)
	wait := time.Until(until)
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// DroppedLate counts a Check refused unread because its deadline was too close
// (envoywire.LateDropper): it is shed, as one that gets no turn.
func (s *Server) DroppedLate() { s.shed.Inc() }

// overloaded is the fast decision of a Check that got no turn: requests on routes that
// are not limited are allowed, as they would be; the others are denied with 503
// unavailable and retry-after, so that an overloaded sidecar neither lets limited
// traffic through unchecked nor counts it.
func (s *Server) overloaded(r Request) Verdict {
	if route, _, ok := s.table.Match(r.Method, r.Path); !ok || route.Core {
		s.none.Inc()
		return Verdict{}
	}
	v := deny(Overloaded, codes.Unavailable, r.Header(HeaderRequestID))
	v.RetryAfterMS = 1000
	return v
}

// Overloaded is the answer to a request on a limited route that an overloaded sidecar
// had no time to decide on.
var Overloaded = apierror.Unavailable.WithMessage("The service is overloaded. Please try again shortly.")

// RequestOf reads the parts of a CheckRequest that a decision reads, as Check reads them.
func RequestOf(req *authv3.CheckRequest) Request {
	attrs := req.GetAttributes()
	h := attrs.GetRequest().GetHttp()
	return Request{
		Method: h.GetMethod(),
		Path:   h.GetPath(),
		Source: attrs.GetSource().GetAddress().GetSocketAddress().GetAddress(),
		Header: headerFunc(h),
	}
}

// decide decides on req; a wait for a counter's owner ends by by (zero: none).
func (s *Server) decide(req Request, by time.Time) Verdict {
	route, channelID, ok := s.table.Match(req.Method, req.Path)
	if !ok || route.Core {
		s.none.Inc()
		return Verdict{}
	}
	// buf holds the counted id of an IP step (identity.Request.Buf), so that counting
	// a client address builds no string; nothing keeps the id once the decision returns
	// (the limiter copies the ids it keeps).
	buf := idBuffers.Get().(*[identity.MaxBufferedID]byte)
	defer idBuffers.Put(buf)
	r := identity.Request{
		Header:    req.Header,
		Source:    req.Source,
		ChannelID: channelID,
		Buf:       buf[:0],
	}
	var bucket string
	for i := range s.steps[route.Index] {
		st := &s.steps[route.Index][i]
		id, rejected := s.ident.Identify(st.Step, &r)
		if rejected != nil {
			st.main.metrics.Rejected.Inc()
			v := deny(*rejected, codes.PermissionDenied, r.Header(HeaderRequestID))
			v.Bucket = st.main.name
			return v
		}
		c := &st.main
		if id.Src == token.SrcPublishable && st.publishable.name != "" {
			c = &st.publishable
		}
		k := limiter.Key{Bucket: c.id, ID: id.ID}
		res := s.limiter.CheckBy(k, 1, s.limit(c, id.TenantID), by)
		if s.traffic != nil {
			s.traffic.Note(k, res)
		}
		if !res.Allowed {
			c.metrics.Denied.Inc()
			c.metrics.Exceeded.Inc()
			v := deny(apierror.RateLimited, codes.ResourceExhausted, r.Header(HeaderRequestID))
			v.RetryAfterMS = res.RetryAfterMS
			v.Bucket = c.name
			return v
		}
		c.metrics.Allowed.Inc()
		bucket = c.name
	}
	return Verdict{Bucket: bucket}
}

// idBuffers are the buffers of decide's counted ids.
var idBuffers = sync.Pool{New: func() any { return new([identity.MaxBufferedID]byte) }}

// limit applies the tenant's override, when the bucket has one, over the base limit.
func (s *Server) limit(c *counter, tenantID string) buckets.Limit {
	if !c.overridable || tenantID == "" || s.overrides == nil {
		return c.base
	}
	o, _ := s.overrides.Overrides(tenantID)
	if l, ok := o[c.name]; ok {
		return l
	}
	return c.base
}

// headerFunc reads request headers from the map Envoy sends, or from the raw header
// list when Envoy is configured with encode_raw_headers.
func headerFunc(h *authv3.AttributeContext_HttpRequest) func(string) string {
	if hm := h.GetHeaderMap(); hm != nil && len(h.GetHeaders()) == 0 {
		return func(name string) string {
			for _, hv := range hm.GetHeaders() {
				if strings.EqualFold(hv.GetKey(), name) {
					if v := hv.GetValue(); v != "" {
						return v
					}
					return string(hv.GetRawValue())
				}
			}
			return ""
		}
	}
	headers := h.GetHeaders()
	return func(name string) string { return headers[name] }
}

// RateLimited is the denial of a request over its limit: 429 with retry-after and the
// rate_limited envelope.
func RateLimited(res limiter.Result, requestIDHeader string) *authv3.CheckResponse {
	v := deny(apierror.RateLimited, codes.ResourceExhausted, requestIDHeader)
	v.RetryAfterMS = res.RetryAfterMS
	return v.Response()
}

func deny(e apierror.Error, code codes.Code, requestIDHeader string) Verdict {
	if e.Status == 401 {
		code = codes.Unauthenticated
	}
	return Verdict{Code: code, Denial: e, RequestID: apierror.RequestID(requestIDHeader)}
}

func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, Value: v},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}
