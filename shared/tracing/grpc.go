package tracing

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// UnaryClientInterceptor traces a gRPC client's calls while tracing is on: a client
// span per call, named after the method, whose context goes in the call's metadata
// (traceparent), so that the server's span continues the trace.
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !Enabled() {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		service, name := splitMethod(method)
		ctx, span := Start(ctx, service+"/"+name, trace.SpanKindClient,
			attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", service), attribute.String("rpc.method", name))
		defer span.End()
		var kv []string
		Inject(ctx, func(k, v string) { kv = append(kv, k, v) })
		err := invoker(metadata.AppendToOutgoingContext(ctx, kv...), method, req, reply, cc, opts...)
		code := status.Code(err)
		span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(code)))
		if err != nil {
			span.SetStatus(otelcodes.Error, code.String())
		}
		return err
	}
}

// FromIncoming returns ctx with the remote span of a gRPC call's traceparent (Envoy's
// span of its ext_authz or rate limit call, or a client's of UnaryClientInterceptor), or
// ctx when the call has none.
func FromIncoming(ctx context.Context) context.Context {
	if v := metadata.ValueFromIncomingContext(ctx, "traceparent"); len(v) == 0 {
		return ctx
	}
	return Extract(ctx, func(name string) string {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 {
			return v[0]
		}
		return ""
	})
}

// splitMethod splits "/package.Service/Method".
func splitMethod(full string) (service, method string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[:i], full[i+1:]
	}
	return full, ""
}
