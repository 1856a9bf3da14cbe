package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want Config
		err  string
	}{
		{env: nil, want: Config{Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			want: Config{Endpoint: "http://collector:4318/v1/traces", Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:443/custom"},
			want: Config{Endpoint: "https://c:443/custom", Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			want: Config{Endpoint: "http://collector:4317", Protocol: "grpc"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}, want: Config{}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, want: Config{}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "zipkin"}, err: "only otlp"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, err: "use grpc or http/protobuf"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, err: "not an http:// or https:// URL"},
	} {
		got, err := FromEnv(func(k string) string { return tc.env[k] })
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v %v, want %+v", tc.env, got, err, tc.want)
		}
	}
}

// Off, nothing is set up and every hook stays a no-op.
func TestOffByDefault(t *testing.T) {
	stop, err := Setup(context.Background(), Config{}, "x")
	if err != nil || Enabled() {
		t.Fatalf("enabled %v, err %v", Enabled(), err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A malformed traceparent continues nothing; a good one does.
	if sc := trace.SpanContextFromContext(Extract(context.Background(), func(string) string { return "garbage" })); sc.IsValid() {
		t.Fatalf("a garbage traceparent gave %v", sc)
	}
	good := func(n string) string {
		if n == "traceparent" {
			return "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		}
		return ""
	}
	if sc := trace.SpanContextFromContext(Extract(context.Background(), good)); sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !sc.IsRemote() {
		t.Fatalf("traceparent read as %v", sc)
	}
}
