package envoywire

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/sidecar/authz"
)

// serve starts a gRPC server on loopback with the codec, e's codec-side deciders, health
// and reflection, and opts; it returns a client connection.
func serve(t *testing.T, e *env, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	s := grpc.NewServer(append(opts, ServerOption())...)
	RegisterAuthorization(s, e.wire)
	RegisterRateLimitService(s, e.wireRLS)
	h := health.NewServer()
	h.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rawRequest is a message sent as its bytes, whatever they are.
type rawRequest []byte

// rawCodec sends rawRequests and reads answers with the proto codec.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return protoCodec.Marshal(v)
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error { return protoCodec.Unmarshal(data, v) }

// Over a real connection, with Envoy's own client stubs: Check and ShouldRateLimit are
// answered by the codec as the standard path answers them, a message that is not one is
// InvalidArgument and the server stays up, and health and reflection, on the standard
// codec, still work.
func TestServerThroughTheCodec(t *testing.T) {
	e := newEnv(t)
	var calls atomic.Int32
	conn := serve(t, e, grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return handler(ctx, req)
	}))
	ctx := t.Context()
	az, rl := authv3.NewAuthorizationClient(conn), rlsv3.NewRateLimitServiceClient(conn)

	_, msgs := e.checkRequests(t, 200)
	sent := 0
	for _, b := range msgs {
		var req authv3.CheckRequest
		if proto.Unmarshal(b, &req) != nil {
			continue
		}
		got, err := az.Check(ctx, &req)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := e.stdAuthz.Check(ctx, &req)
		if rid := authz.RequestOf(&req).Header(authz.HeaderRequestID); apierror.RequestID(rid) != rid {
			sameRequestID(want, got)
		}
		if !proto.Equal(want, got) {
			t.Fatalf("over gRPC:\nstandard %v\ncodec    %v", want, got)
		}
		sent++
	}
	_, rmsgs := e.rateLimitRequests(t, 200)
	for _, b := range rmsgs {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &req) != nil {
			continue
		}
		got, gerr := rl.ShouldRateLimit(ctx, &req)
		want, werr := e.stdRLS.ShouldRateLimit(ctx, &req)
		if status.Code(gerr) != status.Code(werr) || status.Convert(gerr).Message() != status.Convert(werr).Message() || !proto.Equal(want, got) {
			t.Fatalf("over gRPC:\nstandard %v %v\ncodec    %v %v", want, werr, got, gerr)
		}
		sent++
	}
	if int(calls.Load()) != sent {
		t.Errorf("the interceptor saw %d calls of %d", calls.Load(), sent)
	}

	for _, c := range []struct {
		method string
		b      []byte
	}{
		{CheckMethod, []byte{0x0a, 0xff}},
		{CheckMethod, craftedChecks()["non-UTF-8 header value"]},
		{ShouldRateLimitMethod, craftedRateLimits()["domain not UTF-8"]},
		{ShouldRateLimitMethod, []byte{0x0e}},
	} {
		err := conn.Invoke(ctx, c.method, rawRequest(c.b), new(authv3.CheckResponse), grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s %x: %v, want InvalidArgument", c.method, c.b, err)
		}
	}
	_, err := rl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shop"})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "rate limit descriptor list must not be empty" {
		t.Errorf("no descriptors: %v", err)
	}

	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: authv3.Authorization_ServiceDesc.ServiceName})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hr, err)
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*reflectionpb.ServerReflectionRequest{
		{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}},
		{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: authv3.Authorization_ServiceDesc.ServiceName}},
	} {
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection: %v", e)
		}
		if l := resp.GetListServicesResponse(); l != nil {
			names := map[string]bool{}
			for _, s := range l.GetService() {
				names[s.GetName()] = true
			}
			if !names[authv3.Authorization_ServiceDesc.ServiceName] || !names[rlsv3.RateLimitService_ServiceDesc.ServiceName] {
				t.Errorf("reflection lists %v", l.GetService())
			}
		}
	}
	if err := stream.CloseSend(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
