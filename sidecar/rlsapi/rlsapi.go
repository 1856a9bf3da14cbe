// Package rlsapi serves the rate limit service to Envoy over gRPC
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) and over HTTP (POST /json),
// converting the protos to and from the decisions of package rls.
package rlsapi

import (
	"context"
	"errors"
	"github.com/prometheus/client_golang/prometheus"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/tracing"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/rls"
)

// The response headers, named as the reference names them by default (RLS_LIMIT_HEADER,
// RLS_REMAINING_HEADER and RLS_RESET_HEADER rename them).
const (
	HeaderLimit     = "RateLimit-Limit"
	HeaderRemaining = "RateLimit-Remaining"
	HeaderReset     = "RateLimit-Reset"
)

// ConfigPath is where the rules in use are shown as text on SIDECAR_HTTP_ADDR, as the
// reference's /rlconfig on its debug port.
const ConfigPath = "/rlconfig"

// JSONPath is the JSON endpoint's path on SIDECAR_HTTP_ADDR, as the reference serves it.
const JSONPath = "/json"

// MaxJSONBody bounds a /json request, as the gRPC server bounds a message.
const MaxJSONBody = 1 << 20

// Server implements RateLimitServiceServer and the /json handler.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc  *rls.Service
	log  *slog.Logger
	pool sync.Pool // of *scratch
	shed prometheus.Counter
}

// CountShed counts in c the calls refused unread because their deadline was too close
// (envoywire.ErrTooLate). Call it before serving.
func (s *Server) CountShed(c prometheus.Counter) { s.shed = c }

// DroppedLate counts a call refused as too late (envoywire.LateDropper).
func (s *Server) DroppedLate() {
	if s.shed != nil {
		s.shed.Inc()
	}
}

// New returns the server of svc.
func New(svc *rls.Service, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{svc: svc, log: log, pool: sync.Pool{New: func() any { return new(scratch) }}}
}

// scratch is what one call converts into, reused across calls.
type scratch struct {
	req     rls.Request
	resp    rls.Response
	entries []rls.Entry
}

// ShouldRateLimit decides on a request. Its errors are the reference's (an empty domain,
// no descriptors) and ours (a limit override without a valid unit, a request over the
// bounds), all InvalidArgument: Envoy treats any error as a failed call.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, req)
	if err != nil {
		return nil, GRPCError(err)
	}
	return resp, nil
}

// GRPCError is the gRPC status of a decision's error: Unavailable while the service waits
// for its first rules, InvalidArgument for a request refused.
func GRPCError(err error) error {
	if errors.Is(err, rls.ErrNoRules) {
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	sc := s.pool.Get().(*scratch)
	defer func() {
		// The scratch must not keep the request's strings alive.
		clear(sc.entries)
		clear(sc.req.Descriptors)
		s.pool.Put(sc)
	}()
	convert(req, sc)
	if err := s.Decide(ctx, &sc.req, &sc.resp); err != nil {
		return nil, err
	}
	out := response(&sc.resp)
	if sc.resp.Metadata {
		out.DynamicMetadata = DynamicMetadata(&sc.req, &sc.resp)
	}
	return out, nil
}

// Decide is ShouldRateLimit's decision on a request already read from its message, into
// resp, with the metrics ShouldRateLimit records: for a caller that reads requests and
// writes answers itself. Its error is the client's mistake (InvalidArgument, 400).
// While tracing is on, the decision has a span below ctx's (Envoy's span of its call).
func (s *Server) Decide(ctx context.Context, req *rls.Request, resp *rls.Response) error {
	start := time.Now()
	var span trace.Span
	if tracing.Enabled() {
		_, span = tracing.Start(tracing.FromIncoming(ctx), "converger.ratelimit", trace.SpanKindServer,
			attribute.String("converger.domain", req.Domain), attribute.Int("converger.descriptors", len(req.Descriptors)))
	}
	req.DecideBy = limiter.DecideBy(ctx, start)
	err := s.svc.Decide(req, resp)
	s.svc.Metrics().Observe(err == nil && resp.Code == rls.OverLimit, err != nil, time.Since(start))
	if span != nil {
		// The domain and the overall code only: descriptor values are the counted keys
		// (users, addresses), never put in a trace.
		if err != nil {
			span.SetStatus(otelcodes.Error, "invalid request")
		} else {
			span.SetAttributes(attribute.Bool("converger.over_limit", resp.Code == rls.OverLimit))
		}
		span.End()
	}
	return err
}

// convert reads a RateLimitRequest into sc.req, whose strings are the message's.
func convert(req *rlsv3.RateLimitRequest, sc *scratch) {
	ds := req.GetDescriptors()
	n := 0
	for _, d := range ds {
		n += len(d.GetEntries())
	}
	if cap(sc.entries) < n {
		sc.entries = make([]rls.Entry, n)
	}
	entries := sc.entries[:n]
	if cap(sc.req.Descriptors) < len(ds) {
		sc.req.Descriptors = make([]rls.Descriptor, len(ds))
	}
	sc.req.Domain, sc.req.Hits, sc.req.Descriptors = req.GetDomain(), req.GetHitsAddend(), sc.req.Descriptors[:len(ds)]
	for i, d := range ds {
		es := d.GetEntries()
		mine := entries[:len(es):len(es)]
		entries = entries[len(es):]
		for j, e := range es {
			mine[j] = rls.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		out := rls.Descriptor{Entries: mine, Refund: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			out.HasHits, out.Hits = true, h.GetValue()
		}
		if o := d.GetLimit(); o != nil {
			out.HasOverride = true
			out.Override = rls.Override{PerUnit: o.GetRequestsPerUnit(), Unit: rls.Unit(o.GetUnit()), Multiplier: o.GetUnitMultiplier().GetValue()}
		}
		sc.req.Descriptors[i] = out
	}
}

// smallN is the number of descriptors up to which a response is one allocation: Envoy
// sends one per rate_limits entry of a route, most often one or two.
const smallN = 2

// small is a whole response of up to smallN statuses, allocated at once.
type small struct {
	resp     rlsv3.RateLimitResponse
	ptrs     [smallN]*rlsv3.RateLimitResponse_DescriptorStatus
	statuses [smallN]statusParts
}

// headers are the response headers, allocated at once.
type headers struct {
	values [3]corev3.HeaderValue
	ptrs   [3]*corev3.HeaderValue
}

// statusParts are a DescriptorStatus and what it points to.
type statusParts struct {
	st  rlsv3.RateLimitResponse_DescriptorStatus
	lim rlsv3.RateLimitResponse_RateLimit
	dur durationpb.Duration
}

// response builds the RateLimitResponse of a decision: in one allocation for up to smallN
// descriptors, in three for more; the response headers take one more, and their values.
func response(d *rls.Response) *rlsv3.RateLimitResponse {
	n := len(d.Statuses)
	var out *rlsv3.RateLimitResponse
	var parts []statusParts
	if n <= smallN {
		sm := new(small)
		out, parts = &sm.resp, sm.statuses[:n]
		out.Statuses = sm.ptrs[:n]
	} else {
		out, parts = new(rlsv3.RateLimitResponse), make([]statusParts, n)
		out.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	out.OverallCode = rlsv3.RateLimitResponse_Code(d.Code)
	for i := range d.Statuses {
		st, p := &d.Statuses[i], &parts[i]
		p.st.Code = rlsv3.RateLimitResponse_Code(st.Code)
		p.st.LimitRemaining = st.Remaining
		if st.HasLimit {
			l := &p.lim
			l.RequestsPerUnit, l.Unit, l.Name = st.Limit.PerUnit, rlsv3.RateLimitResponse_RateLimit_Unit(st.Limit.Unit), st.Limit.Name
			if st.Limit.Multiplier != 0 {
				l.UnitMultiplier = wrapperspb.UInt32(st.Limit.Multiplier)
			}
			p.dur.Seconds = st.Reset
			p.st.CurrentLimit, p.st.DurationUntilReset = l, &p.dur
		}
		out.Statuses[i] = &p.st
	}
	if d.Header >= 0 {
		st, h, names := &d.Statuses[d.Header], new(headers), Names(d)
		h.values[0] = corev3.HeaderValue{Key: names[0], Value: strconv.FormatUint(uint64(st.Limit.PerUnit), 10)}
		h.values[1] = corev3.HeaderValue{Key: names[1], Value: strconv.FormatUint(uint64(st.Remaining), 10)}
		h.values[2] = corev3.HeaderValue{Key: names[2], Value: strconv.FormatInt(st.Reset, 10)}
		for i := range h.values {
			h.ptrs[i] = &h.values[i]
		}
		out.ResponseHeadersToAdd = h.ptrs[:]
	}
	return out
}

// Names are the names of the response headers of a decision: the reference's defaults
// unless configured.
func Names(d *rls.Response) *rls.HeaderNames {
	if d.HeaderNames != nil {
		return d.HeaderNames
	}
	return &rls.DefaultHeaderNames
}

// DynamicMetadata is the dynamic_metadata the reference returns with
// RESPONSE_DYNAMIC_METADATA=true: the domain; the request's descriptors, each with its
// entries as "key=value", its limit override (in the protos' text form) and its
// hitsAddend when set; the request's hitsAddend when not 0; and under "metadata" the
// metadata of the rules the request passed, merged in the order of the descriptors
// (the first value of a key stays, mappings are merged key by key).
func DynamicMetadata(req *rls.Request, d *rls.Response) *structpb.Struct {
	descs := make([]*structpb.Value, len(req.Descriptors))
	for i := range req.Descriptors {
		desc := &req.Descriptors[i]
		entries := make([]*structpb.Value, len(desc.Entries))
		for j, e := range desc.Entries {
			entries[j] = structpb.NewStringValue(e.Key + "=" + e.Value)
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if desc.HasOverride {
			o := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: desc.Override.PerUnit, Unit: typev3.RateLimitUnit(desc.Override.Unit)}
			if desc.Override.Multiplier != 0 {
				o.UnitMultiplier = wrapperspb.UInt32(desc.Override.Multiplier)
			}
			f["limit"] = structpb.NewStringValue(o.String())
		}
		if desc.HasHits {
			f["hitsAddend"] = structpb.NewNumberValue(float64(desc.Hits))
		}
		descs[i] = structpb.NewStructValue(&structpb.Struct{Fields: f})
	}
	out := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.Domain),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if req.Hits != 0 {
		out["hitsAddend"] = structpb.NewNumberValue(float64(req.Hits))
	}
	var passed *structpb.Struct
	for i := range d.Statuses {
		if m := d.PassedMetadata(i); m != nil {
			if passed == nil {
				passed = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			}
			merge(passed, m)
		}
	}
	if passed != nil && len(passed.Fields) > 0 {
		out["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: out}
}

// merge adds src's fields to dst: a key dst lacks takes src's value (copied, so that the
// rules' own metadata is never changed), mappings on both sides are merged, any other
// value of dst stays.
func merge(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		switch {
		case !ok:
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
		case have.GetStructValue() != nil && v.GetStructValue() != nil:
			merge(have.GetStructValue(), v.GetStructValue())
		}
	}
}

// RulesText serves GET /rlconfig: the rules in use as text, one line per descriptor with
// a limit, as the reference's debug port shows them.
func (s *Server) RulesText(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "Use GET.", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if rules := s.svc.Rules(); rules != nil {
		_, _ = io.WriteString(w, rules.Dump())
	}
}

// JSON serves POST /json: a RateLimitRequest in protobuf's JSON mapping in, the
// RateLimitResponse in the same mapping out, 200 when OK and 429 when over the limit;
// 400 with the error envelope for a body that is not a request, or a request refused.
// The response headers, when on, are only in the body, as the reference sends them.
func (s *Server) JSON(w http.ResponseWriter, r *http.Request) {
	id := apierror.RequestID(r.Header.Get("x-request-id"))
	fail := func(e apierror.Error, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("x-request-id", id)
		w.WriteHeader(e.Status)
		_, _ = w.Write(e.WithMessage(msg).Body(nil, id))
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(apierror.Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed"}, "Use POST with a RateLimitRequest in JSON.")
		return
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		fail(apierror.Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type"}, "Compressed bodies are not accepted.")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(apierror.Error{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large"}, "The body is larger than "+strconv.Itoa(MaxJSONBody)+" bytes.")
			return
		}
		fail(apierror.BadRequest, "The body could not be read.")
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		fail(apierror.BadRequest, "The body is not a RateLimitRequest in protobuf's JSON mapping: "+err.Error())
		return
	}
	resp, err := s.decide(tracing.Extract(r.Context(), tracing.Header(r.Header.Get)), &req)
	if err != nil {
		if errors.Is(err, rls.ErrNoRules) {
			w.Header().Set("Retry-After", "1")
			fail(apierror.Unavailable, "No rate limit configuration is loaded yet.")
			return
		}
		fail(apierror.BadRequest, err.Error())
		return
	}
	b, err := protojson.Marshal(resp)
	if err != nil {
		s.log.Error("encoding a RateLimitResponse", "error", err)
		fail(apierror.Unavailable, apierror.Unavailable.Message)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	code := http.StatusOK
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = http.StatusTooManyRequests
	}
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
