package rawcheck

import (
	"context"
	"net"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/bench/noop"
)

func TestCheckReplyParse(t *testing.T) {
	for _, c := range []struct {
		name       string
		resp       *authv3.CheckResponse
		code, http int32
	}{
		{"allow", &authv3.CheckResponse{Status: &rpcstatus.Status{Code: 0}}, 0, 0},
		{"empty", &authv3.CheckResponse{}, 0, 0},
		{"429", &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: 8, Message: "rate_limited"},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
				Body:   `{"error":{"code":"rate_limited"}}`,
			}},
		}, 8, 429},
		{"403", &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: 7},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_Forbidden},
			}},
		}, 7, 403},
	} {
		b, err := proto.Marshal(c.resp)
		if err != nil {
			t.Fatal(err)
		}
		var r Reply
		if err := r.Parse(b); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if r.Code != c.code || r.HTTP != c.http {
			t.Errorf("%s: parsed code %d, http %d; want %d, %d", c.name, r.Code, r.HTTP, c.code, c.http)
		}
	}
	var r Reply
	if err := r.Parse([]byte{0x0a, 0x05, 0x08}); err == nil {
		t.Error("a truncated response should not parse")
	}
}

// TestRawCodec sends pre-marshaled requests through gRPC to the no-op server.
func TestRawCodec(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := noop.NewGRPCServer()
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conns, err := Dial(ctx, l.Addr().String(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(conns)
	b, err := proto.Marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/", Headers: map[string]string{"x-request-id": "1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, conn := range conns {
		reply := Reply{Code: -1, HTTP: -1}
		if err := conn.Invoke(ctx, Method, &Request{b}, &reply); err != nil {
			t.Fatal(err)
		}
		if reply.Code != 0 || reply.HTTP != 0 || !reply.Allowed() || reply.RateLimited() {
			t.Errorf("no-op reply: code %d, http %d; want an OK", reply.Code, reply.HTTP)
		}
	}
}
