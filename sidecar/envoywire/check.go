package envoywire

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/converger/edge/sidecar/authz"
)

// Authorizer decides Check requests: *authz.Server.
type Authorizer interface {
	Verdict(context.Context, authz.Request) authz.Verdict
}

// CheckMethod is the full name of Authorization/Check.
const CheckMethod = "/envoy.service.auth.v3.Authorization/Check"

// authorizationDesc is Authorization with a Check whose request and answer are the
// codec's own checkCall.
var authorizationDesc = grpc.ServiceDesc{
	ServiceName: authv3.Authorization_ServiceDesc.ServiceName,
	HandlerType: (*Authorizer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Check", Handler: checkHandler}},
	Metadata:    authv3.Authorization_ServiceDesc.Metadata,
}

// RegisterAuthorization registers Envoy's Authorization service on s, answered by a
// through the codec: s must have been built with ServerOption.
func RegisterAuthorization(s grpc.ServiceRegistrar, a Authorizer) {
	s.RegisterService(&authorizationDesc, a)
}

// The captured fields of a CheckRequest: what authz.Request is made of.
const (
	capMethod capture = iota + 1
	capPath
	capHeaders         // the headers map
	capHeaderMap       // header_map, which Envoy sends instead with encode_raw_headers
	capHeaderValue     // one of header_map's headers
	capHeaderKey       // its key
	capHeaderValueStr  // its value
	capHeaderRawValue  // its raw_value
	capSocketAddress   // the source address's socket_address, one of its oneof
	capOtherAddress    // its pipe or envoy_internal_address, the others
	capSocketAddressIP // socket_address.address
)

var checkSchema = compile((&authv3.CheckRequest{}).ProtoReflect().Descriptor(), map[string]capture{
	"attributes.request.http.method":                       capMethod,
	"attributes.request.http.path":                         capPath,
	"attributes.request.http.headers":                      capHeaders,
	"attributes.request.http.header_map":                   capHeaderMap,
	"attributes.request.http.header_map.headers":           capHeaderValue,
	"attributes.request.http.header_map.headers.key":       capHeaderKey,
	"attributes.request.http.header_map.headers.value":     capHeaderValueStr,
	"attributes.request.http.header_map.headers.raw_value": capHeaderRawValue,
	"attributes.source.address.socket_address":             capSocketAddress,
	"attributes.source.address.pipe":                       capOtherAddress,
	"attributes.source.address.envoy_internal_address":     capOtherAddress,
	"attributes.source.address.socket_address.address":     capSocketAddressIP,
})

// numHeaders is len(authz.RequestHeaders), checked when the package starts.
const numHeaders = 4

func init() {
	if len(authz.RequestHeaders) != numHeaders {
		panic("envoywire: authz.RequestHeaders changed: update numHeaders")
	}
}

// headerIndex returns the position of a header name in authz.RequestHeaders, -1 for
// others: the name as the headers map has it (exact).
func headerIndex(name []byte) int {
	for i, h := range authz.RequestHeaders {
		if string(name) == h {
			return i
		}
	}
	return -1
}

// checkCall is one Check: the request as read from the wire, the verdict, and the
// answer's bytes. It is pooled: its buffers are reused from call to call, and the
// strings of its request point into them. It goes back to the pool when gRPC frees the
// answer's buffer (it is the answer's mem.BufferPool), or when the call fails.
type checkCall struct {
	// What the walk captures, over the message's bytes; valid during Unmarshal.
	w checkWalk

	malformed bool
	req       authz.Request
	headers   [numHeaders]string
	header    func(string) string // c.lookup, made once
	buf       []byte              // the request's strings
	verdict   authz.Verdict
	answer
}

// checkWalk is the captor of a CheckRequest: it keeps the last method, path and source
// address, and for each header of authz.RequestHeaders the last value in the headers
// map and the first in header_map, as proto.Unmarshal and authz read them.
type checkWalk struct {
	method, path []byte
	// source is socket_address.address while the source address's oneof holds a
	// socket_address (socket), else empty.
	source []byte
	socket bool

	mapHeaders  [numHeaders][]byte
	mapEntries  bool // the headers map has an entry
	headerMap   bool // header_map is set
	listHeaders [numHeaders][]byte
	listFound   [numHeaders]bool
	// The header_map header being read.
	key, value, raw []byte
}

func (w *checkWalk) scalar(id capture, v []byte, _ uint64) {
	switch id {
	case capMethod:
		w.method = v
	case capPath:
		w.path = v
	case capSocketAddressIP:
		w.source = v
	case capHeaderKey:
		w.key = v
	case capHeaderValueStr:
		w.value = v
	case capHeaderRawValue:
		w.raw = v
	}
}

func (w *checkWalk) enter(id capture) {
	switch id {
	case capHeaderMap:
		w.headerMap = true
	case capHeaderValue:
		w.key, w.value, w.raw = nil, nil, nil
	case capSocketAddress:
		// Another socket_address merges into this one; after another member of the
		// oneof, it starts afresh.
		if !w.socket {
			w.socket, w.source = true, nil
		}
	case capOtherAddress:
		w.socket, w.source = false, nil
	}
}

func (w *checkWalk) leave(id capture) {
	if id != capHeaderValue {
		return
	}
	// authz reads header_map by the first header whose key is the name in any case
	// (strings.EqualFold), its value, or its raw_value when the value is empty.
	v := w.value
	if len(v) == 0 {
		v = w.raw
	}
	key := unsafe.String(unsafe.SliceData(w.key), len(w.key))
	for i, h := range authz.RequestHeaders {
		if !w.listFound[i] && strings.EqualFold(key, h) {
			w.listFound[i], w.listHeaders[i] = true, v
		}
	}
}

func (w *checkWalk) entry(_ capture, k, v []byte) {
	w.mapEntries = true
	if i := headerIndex(k); i >= 0 {
		w.mapHeaders[i] = v
	}
}

// decode reads a CheckRequest. A message proto.Unmarshal refuses is malformed.
func (c *checkCall) decode(b []byte) {
	c.reset()
	if !walk(b, checkSchema, protowire.DefaultRecursionLimit, &c.w) {
		c.malformed = true
		return
	}
	// authz reads header_map only when the headers map is empty.
	headers := &c.w.mapHeaders
	if c.w.headerMap && !c.w.mapEntries {
		headers = &c.w.listHeaders
	}
	n := len(c.w.method) + len(c.w.path)
	if c.w.socket {
		n += len(c.w.source)
	}
	for _, h := range headers {
		n += len(h)
	}
	if cap(c.buf) < n {
		c.buf = make([]byte, 0, n+n/2)
	}
	c.req.Method = c.keep(c.w.method)
	c.req.Path = c.keep(c.w.path)
	if c.w.socket {
		c.req.Source = c.keep(c.w.source)
	}
	for i, h := range headers {
		c.headers[i] = c.keep(h)
	}
	c.req.Header = c.header
	c.w = checkWalk{}
}

// keep copies b into c.buf, which has room for it, and returns it as a string.
func (c *checkCall) keep(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	start := len(c.buf)
	c.buf = append(c.buf, b...)
	return unsafe.String(&c.buf[start], len(b))
}

// lookup is the request's Header.
func (c *checkCall) lookup(name string) string {
	switch name {
	case authz.RequestHeaders[0]:
		return c.headers[0]
	case authz.RequestHeaders[1]:
		return c.headers[1]
	case authz.RequestHeaders[2]:
		return c.headers[2]
	case authz.RequestHeaders[3]:
		return c.headers[3]
	}
	return ""
}

func (c *checkCall) reset() {
	c.malformed = false
	c.req = authz.Request{}
	c.headers = [numHeaders]string{}
	c.buf = c.buf[:0]
	c.verdict = authz.Verdict{}
	c.w = checkWalk{}
}

var checkCalls sync.Pool

func init() {
	checkCalls.New = func() any {
		c := &checkCall{}
		c.header = c.lookup
		c.answer.release = c.release
		return c
	}
}

func newCheckCall() *checkCall { return checkCalls.Get().(*checkCall) }

// release puts c back in the pool, unless its buffers grew past what is worth keeping.
func (c *checkCall) release() {
	c.reset()
	if cap(c.buf) > maxPooled || cap(c.out) > maxPooled {
		return
	}
	checkCalls.Put(c)
}

func checkHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	if tooLate(ctx, srv) {
		return nil, ErrTooLate // before it is decoded: the time it waited was its budget
	}
	c := newCheckCall()
	if err := dec(c); err != nil {
		c.release()
		return nil, err
	}
	a := srv.(Authorizer)
	if interceptor == nil {
		return c.decide(ctx, a)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: CheckMethod}
	return interceptor(ctx, c, info, func(ctx context.Context, req any) (any, error) {
		return req.(*checkCall).decide(ctx, a)
	})
}

// errMalformedCheck answers a CheckRequest proto.Unmarshal refuses.
var errMalformedCheck = status.Error(codes.InvalidArgument, "the CheckRequest is not valid protobuf wire format")

func (c *checkCall) decide(ctx context.Context, a Authorizer) (any, error) {
	if c.malformed {
		c.release()
		return nil, errMalformedCheck
	}
	c.verdict = a.Verdict(ctx, c.req)
	return c, nil
}

// allowBytes is the CheckResponse of an allowed request: a status with code OK (0,
// which is not written), {status: {}}.
var allowBytes = protowire.AppendTag(nil, 1, protowire.BytesType)

func init() { allowBytes = protowire.AppendVarint(allowBytes, 0) }

// encode writes the CheckResponse of c's verdict into c.out, as authz.Verdict.Response
// builds it: allowed, {status: {}}; denied,
//
//	status {code, message: the envelope's code}
//	denied_response {
//	  status {code: the HTTP status}
//	  headers {header {key: "retry-after", value}, append_action: OVERWRITE_IF_EXISTS_OR_ADD} (rate limited or overloaded)
//	  headers {header {key: "content-type", value: "application/json"}, append_action: …}
//	  headers {header {key: "x-request-id", value}, append_action: …}
//	  body: the envelope
//	}
func (c *checkCall) encode() {
	v := &c.verdict
	b := c.out[:0]
	if v.Allowed() {
		c.out = append(b, allowBytes...)
		return
	}
	var digits [20]byte
	retry := digits[:0]
	if v.Retry() {
		retry = strconv.AppendInt(retry, v.RetryAfterSeconds(), 10)
	}
	c.body = v.Denial.AppendBody(c.body[:0], v.Details(), v.RequestID)

	statusLen := sizeVarintField(1, uint64(v.Code)) + sizeBytesField(2, len(v.Denial.Code))
	httpStatusLen := sizeVarintField(1, uint64(v.Denial.Status))
	deniedLen := sizeBytesField(1, httpStatusLen) +
		sizeHeaderOption(authz.HeaderContentType, len(authz.ContentTypeJSON)) +
		sizeHeaderOption(authz.HeaderRequestID, len(v.RequestID)) +
		sizeBytesField(3, len(c.body))
	if len(retry) > 0 {
		deniedLen += sizeHeaderOption(authz.HeaderRetryAfter, len(retry))
	}

	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(statusLen))
	b = appendVarintField(b, 1, uint64(v.Code))
	b = appendStringField(b, 2, v.Denial.Code)

	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(deniedLen))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(httpStatusLen))
	b = appendVarintField(b, 1, uint64(v.Denial.Status))
	if len(retry) > 0 {
		b = appendHeaderOption(b, authz.HeaderRetryAfter, unsafe.String(&retry[0], len(retry)))
	}
	b = appendHeaderOption(b, authz.HeaderContentType, authz.ContentTypeJSON)
	b = appendHeaderOption(b, authz.HeaderRequestID, v.RequestID)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendBytes(b, c.body)
	c.out = b
}

// appendOverwrite is HeaderValueOption.append_action OVERWRITE_IF_EXISTS_OR_ADD.
const appendOverwrite = 2

// sizeHeaderOption is the size of a DeniedHttpResponse.headers field (2) holding
// {header {key, value}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}.
func sizeHeaderOption(key string, valueLen int) int {
	return sizeBytesField(2, sizeHeaderOptionBody(key, valueLen))
}

func sizeHeaderOptionBody(key string, valueLen int) int {
	return sizeBytesField(1, sizeHeaderValue(key, valueLen)) + sizeVarintField(3, appendOverwrite)
}

func appendHeaderOption(b []byte, key, value string) []byte {
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(sizeHeaderOptionBody(key, len(value))))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(sizeHeaderValue(key, len(value))))
	b = appendHeaderValue(b, key, value)
	return appendVarintField(b, 3, appendOverwrite)
}
