package envoywire

import (
	"context"
	"fmt"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// typicalCheck is a CheckRequest as Envoy sends it for a client's POST of an activity:
// 20 headers, the source and destination addresses, the request's time and size.
func (e *env) typicalCheck(tb testing.TB) []byte {
	tb.Helper()
	names, msgs := e.recorded(tb, "check", newCheckRequest)
	for i, n := range names {
		if n == "http1-client-activity.json" {
			var req authv3.CheckRequest
			if err := proto.Unmarshal(msgs[i], &req); err != nil || len(req.GetAttributes().GetRequest().GetHttp().GetHeaders()) != 20 {
				tb.Fatalf("not the typical request: %v", err)
			}
			return msgs[i]
		}
	}
	tb.Fatal("no http1-client-activity.json")
	return nil
}

// typicalRateLimit is what Envoy sends for a route with two rate limits, per client and
// per route and client.
func typicalRateLimit(tb testing.TB, i int) []byte {
	ip := fmt.Sprintf("198.51.%d.%d", i/250%250, i%250)
	b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client_id", Value: ip}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "route", Value: "/checkout/cart"}, {Key: "client_id", Value: ip}}},
	}})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// answerCheck is the codec's whole answer to a CheckRequest: decode, decide, encode,
// and the answer's buffer freed (as gRPC frees it once written).
func answerCheck(a Authorizer, b []byte) error {
	c := newCheckCall()
	c.decode(b)
	v, err := c.decide(context.Background(), a)
	if err != nil {
		return err
	}
	bufs, _ := Codec{}.Marshal(v)
	bufs.Free()
	return nil
}

func answerRateLimit(r RateLimiter, b []byte) error {
	c := newRateLimitCall()
	c.decode(b)
	v, err := c.decide(context.Background(), r)
	if err != nil {
		return err
	}
	bufs, _ := Codec{}.Marshal(v)
	bufs.Free()
	return nil
}

// BenchmarkCheckRequest measures a typical CheckRequest (20 headers) answered through
// the codec (path=codec: decode, decide, encode) against the standard path's parts of
// it: proto.Unmarshal of the same bytes alone (path=proto-unmarshal), and unmarshal,
// Check and marshal (path=proto). Compare the paths with benchstat -col /path.
func BenchmarkCheckRequest(b *testing.B) {
	e := newEnv(b)
	msg := e.typicalCheck(b)
	b.Run("path=codec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := answerCheck(e.wire, msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("path=proto-unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req authv3.CheckRequest
			if err := proto.Unmarshal(msg, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("path=proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req authv3.CheckRequest
			if err := proto.Unmarshal(msg, &req); err != nil {
				b.Fatal(err)
			}
			resp, _ := e.stdAuthz.Check(context.Background(), &req)
			if _, err := proto.Marshal(resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRateLimitRequest is BenchmarkCheckRequest for a typical RateLimitRequest
// (two descriptors) over 10,000 client addresses.
func BenchmarkRateLimitRequest(b *testing.B) {
	e := newEnv(b)
	msgs := make([][]byte, 10_000)
	for i := range msgs {
		msgs[i] = typicalRateLimit(b, i)
	}
	b.Run("path=codec", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := answerRateLimit(e.wireRLS, msgs[i%len(msgs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("path=proto-unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			var req rlsv3.RateLimitRequest
			if err := proto.Unmarshal(msgs[i%len(msgs)], &req); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("path=proto", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			var req rlsv3.RateLimitRequest
			if err := proto.Unmarshal(msgs[i%len(msgs)], &req); err != nil {
				b.Fatal(err)
			}
			resp, err := e.stdRLS.ShouldRateLimit(context.Background(), &req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := proto.Marshal(resp); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
