package envoywire

import (
	"context"
	"strconv"
	"sync"
	"unsafe"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/rlsapi"
)

// RateLimiter decides ShouldRateLimit requests: *rlsapi.Server.
type RateLimiter interface {
	Decide(context.Context, *rls.Request, *rls.Response) error
}

// ShouldRateLimitMethod is the full name of RateLimitService/ShouldRateLimit.
const ShouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

var rateLimitDesc = grpc.ServiceDesc{
	ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*RateLimiter)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: rateLimitHandler}},
	Metadata:    rlsv3.RateLimitService_ServiceDesc.Metadata,
}

// RegisterRateLimitService registers Envoy's RateLimitService on s, answered by r
// through the codec: s must have been built with ServerOption.
func RegisterRateLimitService(s grpc.ServiceRegistrar, r RateLimiter) {
	s.RegisterService(&rateLimitDesc, r)
}

// The captured fields of a RateLimitRequest: what rls.Request is made of.
const (
	capDomain capture = iota + 1
	capHitsAddend
	capDescriptor
	capEntry
	capEntryKey
	capEntryValue
	capLimit
	capLimitPerUnit
	capLimitUnit
	capLimitMultiplier
	capDescriptorHits // hits_addend, a UInt64Value
	capDescriptorHitsValue
	capRefund
)

var rateLimitSchema = compile((&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor(), map[string]capture{
	"domain":                                  capDomain,
	"hits_addend":                             capHitsAddend,
	"descriptors":                             capDescriptor,
	"descriptors.entries":                     capEntry,
	"descriptors.entries.key":                 capEntryKey,
	"descriptors.entries.value":               capEntryValue,
	"descriptors.limit":                       capLimit,
	"descriptors.limit.requests_per_unit":     capLimitPerUnit,
	"descriptors.limit.unit":                  capLimitUnit,
	"descriptors.limit.unit_multiplier.value": capLimitMultiplier,
	"descriptors.hits_addend":                 capDescriptorHits,
	"descriptors.hits_addend.value":           capDescriptorHitsValue,
	"descriptors.is_negative_hits":            capRefund,
})

// rateLimitWalk is the captor of a RateLimitRequest. It keeps descriptors up to one past
// rls.MaxDescriptors, and entries up to one past rls.MaxEntries each, and counts the
// rest: such a request is refused for its counts, and its memory stays bounded.
type rateLimitWalk struct {
	domain  []byte
	hits    uint32
	descs   []rawDescriptor
	extra   int // descriptors not kept
	entries []rawEntry
	inDesc  bool // the descriptor being read is kept
	inEntry bool // the entry being read is kept
}

type rawDescriptor struct {
	first, n, extra int // its entries: entries[first:first+n], and how many more
	override        bool
	perUnit, mult   uint32
	unit            int32
	hasHits         bool
	hits            uint64
	refund          bool
}

type rawEntry struct{ key, value []byte }

func (w *rateLimitWalk) desc() *rawDescriptor { return &w.descs[len(w.descs)-1] }

func (w *rateLimitWalk) scalar(id capture, v []byte, x uint64) {
	switch id {
	case capDomain:
		w.domain = v
		return
	case capHitsAddend:
		w.hits = uint32(x)
		return
	}
	if !w.inDesc {
		return
	}
	d := w.desc()
	switch id {
	case capEntryKey:
		if w.inEntry {
			w.entries[len(w.entries)-1].key = v
		}
	case capEntryValue:
		if w.inEntry {
			w.entries[len(w.entries)-1].value = v
		}
	case capLimitPerUnit:
		d.perUnit = uint32(x)
	case capLimitUnit:
		d.unit = int32(x)
	case capLimitMultiplier:
		d.mult = uint32(x)
	case capDescriptorHitsValue:
		d.hits = x
	case capRefund:
		d.refund = x != 0
	}
}

func (w *rateLimitWalk) enter(id capture) {
	switch id {
	case capDescriptor:
		w.inDesc = len(w.descs) <= rls.MaxDescriptors
		if !w.inDesc {
			w.extra++
			return
		}
		w.descs = append(w.descs, rawDescriptor{first: len(w.entries)})
		return
	}
	if !w.inDesc {
		return
	}
	d := w.desc()
	switch id {
	case capEntry:
		w.inEntry = d.n <= rls.MaxEntries
		if !w.inEntry {
			d.extra++
			return
		}
		w.entries = append(w.entries, rawEntry{})
		d.n++
	case capLimit:
		d.override = true
	case capDescriptorHits:
		d.hasHits = true
	}
}

func (w *rateLimitWalk) leave(capture)                 {}
func (w *rateLimitWalk) entry(capture, []byte, []byte) {}

func (w *rateLimitWalk) reset() {
	clear(w.entries) // drop the references to the message
	*w = rateLimitWalk{descs: w.descs[:0], entries: w.entries[:0]}
}

// rateLimitCall is one ShouldRateLimit, pooled as checkCall is.
type rateLimitCall struct {
	w         rateLimitWalk
	malformed bool
	req       rls.Request
	resp      rls.Response
	entries   []rls.Entry
	buf       []byte // the request's strings
	answer
}

var rateLimitCalls sync.Pool

func init() {
	rateLimitCalls.New = func() any {
		c := &rateLimitCall{}
		c.answer.release = c.release
		return c
	}
}

func newRateLimitCall() *rateLimitCall { return rateLimitCalls.Get().(*rateLimitCall) }

// The bounds of what a pooled rateLimitCall keeps.
const (
	maxPooledDescriptors = 64
	maxPooledEntries     = 256
)

func (c *rateLimitCall) release() {
	c.reset()
	if cap(c.buf) > maxPooled || cap(c.out) > maxPooled || cap(c.req.Descriptors) > maxPooledDescriptors ||
		cap(c.entries) > maxPooledEntries || cap(c.w.descs) > maxPooledDescriptors || cap(c.w.entries) > maxPooledEntries {
		return
	}
	rateLimitCalls.Put(c)
}

func (c *rateLimitCall) reset() {
	c.w.reset()
	c.malformed = false
	c.req = rls.Request{Descriptors: c.req.Descriptors[:0]}
	c.entries = c.entries[:0]
	c.buf = c.buf[:0]
}

// decode reads a RateLimitRequest into c.req, whose strings are copies in c.buf.
func (c *rateLimitCall) decode(b []byte) {
	c.reset()
	w := &c.w
	if !walk(b, rateLimitSchema, protowire.DefaultRecursionLimit, w) {
		c.malformed = true
		w.reset()
		return
	}
	n := len(w.domain)
	for _, e := range w.entries {
		n += len(e.key) + len(e.value)
	}
	if cap(c.buf) < n {
		c.buf = make([]byte, 0, n+n/2)
	}
	c.entries = grow(c.entries, len(w.entries))
	for i, e := range w.entries {
		c.entries[i] = rls.Entry{Key: c.keep(e.key), Value: c.keep(e.value)}
	}
	c.req.Domain, c.req.Hits, c.req.ExtraDescriptors = c.keep(w.domain), w.hits, w.extra
	c.req.Descriptors = grow(c.req.Descriptors, len(w.descs))
	for i := range w.descs {
		d := &w.descs[i]
		c.req.Descriptors[i] = rls.Descriptor{
			Entries:      c.entries[d.first : d.first+d.n : d.first+d.n],
			HasOverride:  d.override,
			Override:     rls.Override{PerUnit: d.perUnit, Unit: rls.Unit(d.unit), Multiplier: d.mult},
			HasHits:      d.hasHits,
			Hits:         d.hits,
			Refund:       d.refund,
			ExtraEntries: d.extra,
		}
	}
	w.reset()
}

// grow returns s with length n, reusing its array when it has room.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (c *rateLimitCall) keep(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	start := len(c.buf)
	c.buf = append(c.buf, b...)
	return unsafe.String(&c.buf[start], len(b))
}

func rateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	if tooLate(ctx, srv) {
		return nil, ErrTooLate
	}
	c := newRateLimitCall()
	if err := dec(c); err != nil {
		c.release()
		return nil, err
	}
	r := srv.(RateLimiter)
	if interceptor == nil {
		return c.decide(ctx, r)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: ShouldRateLimitMethod}
	return interceptor(ctx, c, info, func(ctx context.Context, req any) (any, error) {
		return req.(*rateLimitCall).decide(ctx, r)
	})
}

var errMalformedRateLimit = status.Error(codes.InvalidArgument, "the RateLimitRequest is not valid protobuf wire format")

func (c *rateLimitCall) decide(ctx context.Context, r RateLimiter) (any, error) {
	if c.malformed {
		c.release()
		return nil, errMalformedRateLimit
	}
	if err := r.Decide(ctx, &c.req, &c.resp); err != nil {
		c.release()
		return nil, rlsapi.GRPCError(err) // as rlsapi answers it
	}
	return c, nil
}

// encode writes the RateLimitResponse of c.resp into c.out, as rlsapi builds it:
//
//	overall_code
//	statuses {code, current_limit {requests_per_unit, unit, name, unit_multiplier {value}}, limit_remaining, duration_until_reset {seconds}} …
//	response_headers_to_add {key, value} × 3 (RateLimit-Limit, -Remaining, -Reset), when on
//	dynamic_metadata, when on
func (c *rateLimitCall) encode() {
	d := &c.resp
	b := appendVarintField(c.out[:0], 1, uint64(int64(d.Code)))
	for i := range d.Statuses {
		st := &d.Statuses[i]
		b = appendMessageHeader(b, 2, sizeStatus(st))
		b = appendStatus(b, st)
	}
	if d.Header >= 0 {
		st, names := &d.Statuses[d.Header], rlsapi.Names(d)
		var digits [20]byte
		b = appendNumberHeader(b, names[0], strconv.AppendUint(digits[:0], uint64(st.Limit.PerUnit), 10))
		b = appendNumberHeader(b, names[1], strconv.AppendUint(digits[:0], uint64(st.Remaining), 10))
		b = appendNumberHeader(b, names[2], strconv.AppendInt(digits[:0], st.Reset, 10))
	}
	if d.Metadata {
		// Only with RLS_RESPONSE_DYNAMIC_METADATA: built as rlsapi builds it.
		md, err := proto.Marshal(rlsapi.DynamicMetadata(&c.req, d))
		if err == nil {
			b = appendMessageHeader(b, 6, len(md))
			b = append(b, md...)
		}
	}
	c.out = b
}

// appendNumberHeader appends a response_headers_to_add {key, value}.
func appendNumberHeader(b []byte, key string, digits []byte) []byte {
	v := unsafe.String(&digits[0], len(digits))
	b = appendMessageHeader(b, 3, sizeHeaderValue(key, len(v)))
	return appendHeaderValue(b, key, v)
}

func sizeRateLimit(l *rls.CurrentLimit) int {
	n := sizeVarintField(1, uint64(l.PerUnit)) + sizeVarintField(2, uint64(int64(l.Unit))) + sizeStringField(3, l.Name)
	if l.Multiplier != 0 {
		n += sizeBytesField(4, sizeVarintField(1, uint64(l.Multiplier)))
	}
	return n
}

func sizeStatus(st *rls.Status) int {
	n := sizeVarintField(1, uint64(int64(st.Code))) + sizeVarintField(3, uint64(st.Remaining))
	if st.HasLimit {
		n += sizeBytesField(2, sizeRateLimit(&st.Limit)) + sizeBytesField(4, sizeVarintField(1, uint64(st.Reset)))
	}
	return n
}

func appendStatus(b []byte, st *rls.Status) []byte {
	b = appendVarintField(b, 1, uint64(int64(st.Code)))
	if st.HasLimit {
		l := &st.Limit
		b = appendMessageHeader(b, 2, sizeRateLimit(l))
		b = appendVarintField(b, 1, uint64(l.PerUnit))
		b = appendVarintField(b, 2, uint64(int64(l.Unit)))
		b = appendStringField(b, 3, l.Name)
		if l.Multiplier != 0 {
			b = appendMessageHeader(b, 4, sizeVarintField(1, uint64(l.Multiplier)))
			b = appendVarintField(b, 1, uint64(l.Multiplier))
		}
	}
	b = appendVarintField(b, 3, uint64(st.Remaining))
	if st.HasLimit {
		b = appendMessageHeader(b, 4, sizeVarintField(1, uint64(st.Reset)))
		b = appendVarintField(b, 1, uint64(st.Reset))
	}
	return b
}
