package main_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/shared/tracing"
	"github.com/converger/edge/sidecar/service"
)

// receiver is an OTLP collector in the test: the trace service over gRPC and over HTTP
// (POST /v1/traces), keeping every span it is sent.
type receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []span
}

// span is what the test reads of one span.
type span struct {
	service, name             string
	traceID, spanID, parentID string
	attrs                     map[string]string
	kind                      string
}

func (r *receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.keep(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *receiver) keep(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := value(attrsOf(rs.GetResource().GetAttributes())["service.name"])
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				attrs := map[string]string{}
				for k, v := range attrsOf(s.Attributes) {
					attrs[k] = value(v)
				}
				r.spans = append(r.spans, span{service: service, name: s.Name, traceID: hex.EncodeToString(s.TraceId),
					spanID: hex.EncodeToString(s.SpanId), parentID: hex.EncodeToString(s.ParentSpanId), attrs: attrs, kind: s.Kind.String()})
			}
		}
	}
}

func attrsOf(kvs []*commonpb.KeyValue) map[string]*commonpb.AnyValue {
	out := map[string]*commonpb.AnyValue{}
	for _, kv := range kvs {
		out[kv.Key] = kv.Value
	}
	return out
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	}
	return fmt.Sprint(v)
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	var msg coltracepb.ExportTraceServiceRequest
	if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &msg) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	r.keep(&msg)
	b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(b)
}

func (r *receiver) all() []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]span(nil), r.spans...)
}

// startReceiver serves the receiver over gRPC and HTTP on loopback, and returns their
// base URLs.
func startReceiver(t *testing.T) (*receiver, string, string) {
	r := &receiver{}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, r)
	go gs.Serve(gl)
	t.Cleanup(gs.Stop)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: r}
	go hs.Serve(hl)
	t.Cleanup(func() { hs.Close() })
	return r, "http://" + gl.Addr().String(), "http://" + hl.Addr().String()
}

// TestTracesFromTheProxyToPostgreSQL: a request that arrives with Envoy's traceparent
// makes one trace: the core's span below Envoy's, its Check call to the sidecar and the
// sidecar's decision below that, and the request's queries — exported over OTLP gRPC by
// the core and OTLP HTTP by the sidecar, with no credential in any span.
func TestTracesFromTheProxyToPostgreSQL(t *testing.T) {
	rec, grpcURL, httpURL := startReceiver(t)
	f := newFixture(t, "", 1)

	// The sidecar in this process, its spans over HTTP.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	stop, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: httpURL + "/v1/traces", Protocol: "http/protobuf"}, "converger-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	sc := service.StartForTest(t, map[string]string{"DATABASE_URL": f.url}, "", service.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})

	// The core as it runs, its spans over gRPC.
	core := newProc(t, f.env(map[string]string{"AUTHZ_ADDR": sc.GRPCAddr.String(), "OTEL_EXPORTER_OTLP_ENDPOINT": grpcURL,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "core-under-test"})).start(t)

	const traceID, envoySpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("POST", core.base+"/api/v1/conversations/"+f.convs[0]+"/activities", bytes.NewBufferString(`{"type":"message","text":"hello"}`))
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", f.apiKey)
	req.Header.Set("traceparent", "00-"+traceID+"-"+envoySpan+"-01")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("the activity: %d", resp.StatusCode)
	}

	// Both exporters flush every 50 ms.
	find := func(spans []span, ok func(span) bool) *span {
		for i := range spans {
			if ok(spans[i]) {
				return &spans[i]
			}
		}
		return nil
	}
	var spans []span
	var server, call, check, query *span
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		spans = rec.all()
		server = find(spans, func(s span) bool {
			return s.service == "core-under-test" && s.kind == "SPAN_KIND_SERVER" && s.traceID == traceID
		})
		if server == nil {
			continue
		}
		call = find(spans, func(s span) bool {
			return s.parentID == server.spanID && strings.HasSuffix(s.name, "Authorization/Check")
		})
		query = find(spans, func(s span) bool {
			return s.service == "core-under-test" && s.parentID == server.spanID && s.attrs["db.system.name"] == "postgresql"
		})
		if call != nil {
			check = find(spans, func(s span) bool { return s.service == "converger-sidecar" && s.parentID == call.spanID })
		}
		if call != nil && check != nil && query != nil {
			break
		}
	}
	if server == nil || call == nil || check == nil || query == nil {
		t.Fatalf("server %v, Check call %v, sidecar's check %v, query %v among:\n%s", server != nil, call != nil, check != nil, query != nil, dump(spans))
	}
	if server.traceID != traceID || server.parentID != envoySpan {
		t.Errorf("the core's span is in trace %s below %s, want %s below Envoy's %s", server.traceID, server.parentID, traceID, envoySpan)
	}
	if server.name != "POST /api/v1/conversations/:id/activities" || server.attrs["http.response.status_code"] != "201" {
		t.Errorf("the core's span: %q %v", server.name, server.attrs)
	}
	if check.name != "converger.check" || check.traceID != traceID || check.attrs["converger.bucket"] != "activity_create" || check.attrs["converger.decision"] != "allowed" {
		t.Errorf("the sidecar's span: %+v", *check)
	}
	if !strings.HasPrefix(query.name, "INSERT") && !strings.HasPrefix(query.name, "WITH") && !strings.HasPrefix(query.name, "SELECT") && !strings.HasPrefix(query.name, "BEGIN") {
		t.Errorf("the query's span: %+v", *query)
	}
	// Queries outside a traced request (the core's caches, LISTEN) start no trace.
	if s := find(spans, func(s span) bool { return s.attrs["db.system.name"] != "" && s.parentID == "" }); s != nil {
		t.Errorf("a query outside a request has a trace of its own: %+v", *s)
	}
	for _, s := range spans {
		for k, v := range s.attrs {
			if strings.Contains(v, f.apiKey) || strings.Contains(v, f.apiKey[len(f.apiKey)-12:]) || strings.Contains(strings.ToLower(v), "bearer") {
				t.Errorf("span %q has a credential in %s: %q", s.name, k, v)
			}
		}
	}
}

func dump(spans []span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %q %s trace %s span %s parent %s %v\n", s.service, s.name, s.kind, s.traceID, s.spanID, s.parentID, s.attrs)
	}
	return b.String()
}
