package api

import (
	"github.com/gofiber/fiber/v2"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/converger/edge/shared/tracing"
)

// startSpan starts a request's span, below the traceparent the request brought (Envoy's
// span), and makes it the parent of everything the request does: its queries, its call
// to the sidecar (AUTHZ_ADDR) and the Limiter service. Only while tracing is on.
func startSpan(c *fiber.Ctx) trace.Span {
	ctx := tracing.Extract(c.UserContext(), func(name string) string { return c.Get(name) })
	ctx, span := tracing.Start(ctx, c.Method(), trace.SpanKindServer, attribute.String("http.request.method", methodLabel(c.Method())))
	c.SetUserContext(ctx)
	return span
}

// endSpan names a request's span after its route's pattern, never its path or query
// (they can carry tokens), and records the answer's status.
func endSpan(c *fiber.Ctx, span trace.Span) {
	route := routePattern(c)
	status := c.Response().StatusCode()
	span.SetName(methodLabel(c.Method()) + " " + route)
	span.SetAttributes(attribute.String("http.route", route), attribute.Int("http.response.status_code", status),
		attribute.String("converger.request_id", requestID(c)))
	if status >= 500 {
		span.SetStatus(otelcodes.Error, "")
	}
	span.End()
}
