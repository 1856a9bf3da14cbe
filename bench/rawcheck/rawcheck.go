// Package rawcheck sends pre-marshaled requests over gRPC and reads only what a load
// generator needs of the answers (for Envoy's ext_authz Check, the status codes), so that it
// costs little per call. Any reply type with a Parse method can be read.
package rawcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/converger/edge/bench/benchtls"
)

// Method is the full name of Authorization/Check.
const Method = "/envoy.service.auth.v3.Authorization/Check"

// Request is a pre-marshaled CheckRequest.
type Request struct{ B []byte }

// Reply is what the load generator reads of a CheckResponse.
type Reply struct {
	Code int32 // status.code: 0 allows
	HTTP int32 // denied_response.status.code, 0 when absent
}

// Allowed reports an OK answer.
func (r Reply) Allowed() bool { return r.Code == 0 }

// RateLimited reports a denial with status 429.
func (r Reply) RateLimited() bool { return r.Code != 0 && r.HTTP == 429 }

// Codec sends Requests as they are and hands the answer's bytes to the reply's Parse (for
// a Reply, the two status codes). Its name is "proto": on the wire nothing distinguishes it
// from the proto codec.
type Codec struct{}

// Parser reads an answer.
type Parser interface{ Parse(b []byte) error }

func (Codec) Name() string { return "proto" }

func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*Request)
	if !ok {
		return nil, fmt.Errorf("rawcheck: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(r.B)}, nil
}

func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(Parser)
	if !ok {
		return fmt.Errorf("rawcheck: cannot unmarshal into %T", v)
	}
	if len(data) == 1 {
		return r.Parse(data[0].ReadOnlyData())
	}
	return r.Parse(data.Materialize())
}

// ErrMalformed is the error of a response that does not parse.
var ErrMalformed = errors.New("malformed CheckResponse")

// Parse reads CheckResponse.status.code (fields 1.1) and
// CheckResponse.denied_response.status.code (fields 2.1.1).
func (r *Reply) Parse(b []byte) error {
	*r = Reply{}
	status, ok := field(b, 1)
	if !ok {
		return ErrMalformed
	}
	if status != nil {
		code, ok := varintField(status, 1)
		if !ok {
			return ErrMalformed
		}
		r.Code = int32(code)
	}
	denied, ok := field(b, 2)
	if !ok {
		return ErrMalformed
	}
	if denied != nil {
		st, ok := field(denied, 1)
		if !ok {
			return ErrMalformed
		}
		code, ok := varintField(st, 1)
		if !ok {
			return ErrMalformed
		}
		r.HTTP = int32(code)
	}
	return nil
}

// Field returns the last occurrence of the length-delimited field num of message b (nil
// when absent); ok is false when b is malformed.
func Field(b []byte, num protowire.Number) (v []byte, ok bool) { return field(b, num) }

// VarintField returns the varint field num of message b, 0 when absent.
func VarintField(b []byte, num protowire.Number) (v uint64, ok bool) { return varintField(b, num) }

// field returns the last occurrence of the length-delimited field num of message b (nil
// when absent); ok is false when b is malformed.
func field(b []byte, num protowire.Number) (v []byte, ok bool) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, false
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			x, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return nil, false
			}
			v = x
			if v == nil {
				v = []byte{}
			}
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return nil, false
		}
		b = b[l:]
	}
	return v, true
}

// varintField returns the varint field num of message b, 0 when absent.
func varintField(b []byte, num protowire.Number) (v uint64, ok bool) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return 0, false
		}
		b = b[l:]
		if n == num && typ == protowire.VarintType {
			x, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return 0, false
			}
			v, b = x, b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return 0, false
		}
		b = b[l:]
	}
	return v, true
}

// Dial opens n connections to addr that use the Codec (over mutual TLS when
// benchtls.DirEnv is set), and waits (at most 10 seconds)
// until all are ready. On error it closes those it opened.
func Dial(ctx context.Context, addr string, n int) (conns []*grpc.ClientConn, err error) {
	defer func() {
		if err != nil {
			Close(conns)
			conns = nil
		}
	}()
	creds, err := benchtls.ClientCredentials()
	if err != nil {
		return nil, err
	}
	for range n {
		c, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(Codec{})))
		if err != nil {
			return conns, err
		}
		conns = append(conns, c)
		c.Connect()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, c := range conns {
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				return conns, fmt.Errorf("connection not ready (%v): %w", s, ctx.Err())
			}
		}
	}
	return conns, nil
}

// Close closes connections.
func Close(conns []*grpc.ClientConn) {
	for _, c := range conns {
		c.Close()
	}
}
