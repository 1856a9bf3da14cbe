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
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/identity"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/metrics"
	"github.com/converger/edge/sidecar/routes"
	"github.com/converger/edge/sidecar/tenants"
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
	s := &Server{table: table, ident: ident, limiter: lim, overrides: overrides, metrics: m, none: m.Unlimited()}
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

// Check decides on one request. Every decision is an answer, never a gRPC error: Envoy
// treats errors as failures of the service, not as denials.
func (s *Server) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := time.Now()
	v := s.decide(RequestOf(req))
	s.metrics.ObserveCheck(time.Since(start))
	return v.Response(), nil
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
	// for no other names than RequestHeaders.
	Header func(name string) string
}

// HeaderRequestID is the request header whose value a denial echoes (apierror.RequestID).
const HeaderRequestID = "x-request-id"

// RequestHeaders are the only request headers a decision reads: a caller that decodes
// requests itself need extract no others.
var RequestHeaders = append(identity.Headers[:len(identity.Headers):len(identity.Headers)], HeaderRequestID)

// Decide makes Check's decision on a request given by its parts, and records its
// latency as Check does. The HTTP forward-auth check answers with it.
func (s *Server) Decide(r Request) *authv3.CheckResponse {
	return s.Verdict(r).Response()
}

// Verdict is Decide without the CheckResponse: the decision's parts, for a caller that
// writes the answer itself.
func (s *Server) Verdict(r Request) Verdict {
	start := time.Now()
	v := s.decide(r)
	s.metrics.ObserveCheck(time.Since(start))
	return v
}

// Verdict is a decision: allowed, or denied with what the answer says.
type Verdict struct {
	// Code is the CheckResponse's status code: OK when allowed, else PermissionDenied,
	// Unauthenticated (a 401) or ResourceExhausted (over the limit).
	Code codes.Code
	// Denial is a denial's HTTP status and envelope; zero when allowed.
	Denial apierror.Error
	// RetryAfterMS is what is left of the window of a request over its limit: the
	// envelope's retry_after_ms and, in whole seconds (RetryAfterSeconds), retry-after.
	RetryAfterMS int64
	// RequestID is the denial's x-request-id, in its header and its envelope: the
	// request's own when it is a sensible one, else a new one (apierror.RequestID).
	RequestID string
}

// Allowed reports an allowed request.
func (v *Verdict) Allowed() bool { return v.Code == codes.OK }

// RateLimited reports a denial for a request over its limit: 429 with retry-after.
func (v *Verdict) RateLimited() bool { return v.Code == codes.ResourceExhausted }

// RetryAfterSeconds is the retry-after header's value: RetryAfterMS in whole seconds,
// rounded up, at least 1.
func (v *Verdict) RetryAfterSeconds() int64 {
	return limiter.Result{RetryAfterMS: v.RetryAfterMS}.RetryAfterSeconds()
}

// Details are the envelope's details: the retry delay of a rate-limited denial, else
// none ({}).
func (v *Verdict) Details() *apierror.RateLimitDetails {
	if !v.RateLimited() {
		return nil
	}
	return &apierror.RateLimitDetails{RetryAfterMS: v.RetryAfterMS}
}

// The response headers of a denial, in order: retry-after (rate limited only),
// content-type, x-request-id.
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

func (s *Server) decide(req Request) Verdict {
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
	for i := range s.steps[route.Index] {
		st := &s.steps[route.Index][i]
		id, rejected := s.ident.Identify(st.Step, &r)
		if rejected != nil {
			st.main.metrics.Rejected.Inc()
			return deny(*rejected, codes.PermissionDenied, r.Header(HeaderRequestID))
		}
		c := &st.main
		if id.Src == token.SrcPublishable && st.publishable.name != "" {
			c = &st.publishable
		}
		res := s.limiter.Check(limiter.Key{Bucket: c.id, ID: id.ID}, 1, s.limit(c, id.TenantID))
		if !res.Allowed {
			c.metrics.Denied.Inc()
			c.metrics.Exceeded.Inc()
			v := deny(apierror.RateLimited, codes.ResourceExhausted, r.Header(HeaderRequestID))
			v.RetryAfterMS = res.RetryAfterMS
			return v
		}
		c.metrics.Allowed.Inc()
	}
	return Verdict{}
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
