// Package tracing sends both programs' OpenTelemetry traces over OTLP (gRPC or HTTP):
// off unless OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set,
// with the standard OTEL_* variables honoured, and W3C trace context carried across
// Envoy, the sidecar, the core and PostgreSQL.
//
// While it is off, every hook here costs one atomic load: hot paths ask Enabled first.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// instrumentation names the tracer of both programs.
const instrumentation = "github.com/converger/edge"

var (
	enabled atomic.Bool
	tracer  atomic.Pointer[trace.Tracer]
	// propagator reads and writes W3C traceparent and tracestate (never baggage: a
	// client's baggage would otherwise reach every service behind the edge).
	propagator = propagation.TraceContext{}
)

func init() {
	t := noop.NewTracerProvider().Tracer(instrumentation)
	tracer.Store(&t)
}

// Enabled reports whether traces are being sent.
func Enabled() bool { return enabled.Load() }

// Config is what Setup reads from the environment (FromEnv).
type Config struct {
	// Endpoint is the collector's URL (http://host:4317 for gRPC, or the full URL that
	// takes the spans over HTTP, http://host:4318/v1/traces): empty, tracing is off.
	// FromEnv reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, or
	// OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces added for HTTP.
	Endpoint string
	// Protocol is "grpc" or "http/protobuf" (the default, as the OpenTelemetry
	// specification has it): OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
	// OTEL_EXPORTER_OTLP_PROTOCOL.
	Protocol string
}

// FromEnv reads the configuration; an error names a value that cannot work.
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn tracing off even with an
// endpoint. The exporter and the SDK read the other OTEL_* variables themselves
// (headers, timeout, certificates, compression, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and its argument).
func FromEnv(getenv func(string) string) (Config, error) {
	first := func(names ...string) string {
		for _, n := range names {
			if v := strings.TrimSpace(getenv(n)); v != "" {
				return v
			}
		}
		return ""
	}
	c := Config{
		Endpoint: first("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
		Protocol: first("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
	}
	base := c.Endpoint == ""
	if base {
		c.Endpoint = first("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return Config{}, nil
	}
	switch exp := strings.ToLower(first("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return Config{}, nil
	default:
		return Config{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: only otlp (or none) is supported", exp)
	}
	switch c.Protocol {
	case "":
		c.Protocol = "http/protobuf"
	case "grpc", "http/protobuf":
	default:
		return Config{}, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: use grpc or http/protobuf", c.Protocol)
	}
	if c.Endpoint == "" {
		return c, nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Config{}, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT=%s: not an http:// or https:// URL", c.Endpoint)
	}
	if base && c.Protocol == "http/protobuf" {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
		c.Endpoint = u.String()
	}
	return c, nil
}

// Setup starts sending traces as service when c has an endpoint, and returns what
// flushes and stops it (a no-op when off). Call it once, before serving.
func Setup(ctx context.Context, c Config, service string) (shutdown func(context.Context) error, err error) {
	if c.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	// The endpoint as given (http:// is in clear); the exporters read the rest of their
	// OTEL_EXPORTER_OTLP_* variables (headers, timeout, certificates, compression).
	var exp *otlptrace.Exporter
	if c.Protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(c.Endpoint))
	} else {
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(c.Endpoint))
	}
	if err != nil {
		return nil, fmt.Errorf("the OTLP exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read last, win over the defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("the trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagator)
	t := tp.Tracer(instrumentation)
	tracer.Store(&t)
	enabled.Store(true)
	return func(ctx context.Context) error {
		enabled.Store(false)
		return tp.Shutdown(ctx)
	}, nil
}

// SetupFromEnv is FromEnv of the process's environment, then Setup.
func SetupFromEnv(ctx context.Context, service string) (func(context.Context) error, error) {
	c, err := FromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	return Setup(ctx, c, service)
}

// Start starts a span below the one in ctx (the caller asks Enabled first).
func Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return (*tracer.Load()).Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// Header reads a request's headers by lower-case name.
type Header func(name string) string

// Extract returns ctx with the remote span of a request's traceparent and tracestate,
// or ctx when it has none that parses.
func Extract(ctx context.Context, h Header) context.Context {
	return propagator.Extract(ctx, headerCarrier(h))
}

// Inject writes ctx's span as traceparent (and tracestate) with set.
func Inject(ctx context.Context, set func(name, value string)) {
	propagator.Inject(ctx, setCarrier(set))
}

type headerCarrier Header

func (h headerCarrier) Get(key string) string { return h(strings.ToLower(key)) }
func (h headerCarrier) Set(string, string)    {}
func (h headerCarrier) Keys() []string        { return []string{"traceparent", "tracestate"} }

type setCarrier func(name, value string)

func (s setCarrier) Get(string) string     { return "" }
func (s setCarrier) Set(key, value string) { s(key, value) }
func (s setCarrier) Keys() []string        { return nil }
