// Package envoywire is the gRPC codec of the sidecar's Envoy services, ext_authz's
// Authorization/Check and the rate limit service's ShouldRateLimit: it reads their
// requests straight from the wire (protowire), keeping only the fields the decisions read,
// and writes their answers from reused buffers, with no allocation per call. Every other
// message (the Limiter service, health, reflection) goes through gRPC's standard proto
// codec.
//
// A request the codec reads is checked as proto.Unmarshal checks it (schema.go), so both
// accept and refuse the same messages, and a decision gets the same fields from both;
// where proto.Unmarshal fails (gRPC then answers Internal), the codec's services answer
// InvalidArgument.
package envoywire

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Codec is the server's codec: the codec's own messages (the calls of the services
// RegisterAuthorization and RegisterRateLimitService register) are read and written
// here, every other message by gRPC's proto codec.
type Codec struct{}

// ServerOption makes a server use Codec for every message.
func ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(Codec{}) }

var protoCodec = encoding.GetCodecV2(proto.Name)

// Name is the proto codec's: the content-subtype is the same.
func (Codec) Name() string { return proto.Name }

// call is a message of the codec's own.
type call interface {
	decode(b []byte)
	encode()
	buffers() mem.BufferSlice
}

// Marshal writes an answer of the codec's services into its call's buffer, which gRPC
// frees once the answer is written; that puts the call back in its pool.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	c, ok := v.(call)
	if !ok {
		return protoCodec.Marshal(v)
	}
	c.encode()
	return c.buffers(), nil
}

// Unmarshal reads a request of the codec's services into its call. It does not fail: a
// message proto.Unmarshal refuses is marked so, and its service answers InvalidArgument.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	c, ok := v.(call)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	c.decode(buf.ReadOnlyData())
	return nil
}

// maxPooled bounds the buffers a pooled call keeps: a call that needed more (a huge
// request or answer) is left to the garbage collector.
const maxPooled = 64 << 10

// minAnswer is the room an answer buffer starts with: above gRPC's pooling threshold
// (mem.IsBelowBufferPoolingThreshold), so that mem.NewBuffer hands it back to its pool.
const minAnswer = 2 << 10

// answer is a call's response bytes, handed to gRPC as a mem.Buffer whose pool is the
// answer itself: when gRPC frees the buffer, Put releases the call.
type answer struct {
	out     []byte
	body    []byte // scratch for a denial's envelope
	bufs    [1]mem.Buffer
	release func()
}

// buffers wraps out in a buffer whose pool is a.
func (a *answer) buffers() mem.BufferSlice {
	if cap(a.out) < minAnswer+1 {
		grown := make([]byte, len(a.out), max(minAnswer+1, 2*len(a.out)))
		copy(grown, a.out)
		a.out = grown
	}
	a.bufs[0] = mem.NewBuffer(&a.out, a)
	return a.bufs[:]
}

// Get is never called: mem.NewBuffer only puts.
func (a *answer) Get(n int) *[]byte {
	panic(fmt.Sprintf("envoywire: an answer's pool asked for %d bytes", n))
}

// Put releases the call once gRPC has written its answer.
func (a *answer) Put(*[]byte) {
	a.bufs[0] = nil
	a.release()
}

// The sizes and appends of protobuf fields.

func sizeVarintField(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func sizeBytesField(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func sizeStringField(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return sizeBytesField(num, len(s))
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendMessageHeader(b []byte, num protowire.Number, size int) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(size))
}

// sizeHeaderValue is the size of a HeaderValue {key, value}.
func sizeHeaderValue(key string, valueLen int) int {
	n := sizeStringField(1, key)
	if valueLen > 0 {
		n += sizeBytesField(2, valueLen)
	}
	return n
}

func appendHeaderValue(b []byte, key, value string) []byte {
	return appendStringField(appendStringField(b, 1, key), 2, value)
}
