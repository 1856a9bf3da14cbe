package forwardauth

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc/codes"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/sidecar/authz"
)

// request is a check as a proxy at peer sends it.
func request(peer string, headers ...string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.SetRequestURI("/check")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(peer), Port: 4000}, nil)
	return ctx
}

func handler(t testing.TB, v Verdict) *Handler {
	proxies, err := clientip.Parse("127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	return New(v, proxies, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
}

// The decision sees the original request: method, origin-form path, the proxy as the
// source, and the copied headers by lower-case name, repeated ones joined.
func TestServeRebuildsTheRequest(t *testing.T) {
	var got authz.Request
	var xff, key string
	h := handler(t, func(_ context.Context, r authz.Request) authz.Verdict {
		got, xff, key = r, r.Header("x-forwarded-for"), r.Header("x-api-key")
		return authz.Verdict{Code: codes.OK}
	})
	ctx := request("127.0.0.2", MethodHeader, "POST", URIHeader, "http://h.example/api/v1/x?y=1",
		"X-Forwarded-For", "192.0.2.1", "X-Forwarded-For", "192.0.2.2", "X-Api-Key", "k1")
	h.Serve(ctx)
	if ctx.Response.StatusCode() != 200 || len(ctx.Response.Body()) != 0 {
		t.Fatalf("allowed: %d %q", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if got.Method != "POST" || got.Path != "/api/v1/x?y=1" || got.Source != "127.0.0.2:4000" || xff != "192.0.2.1,192.0.2.2" || key != "k1" {
		t.Fatalf("decided on %+v, x-forwarded-for %q, x-api-key %q", got, xff, key)
	}
}

// A denial is the ext_authz denial; in nginx mode a 429 comes as a 403 with the real
// status and body in headers. Untrusted peers and bad forwarding headers are refused
// without a decision.
func TestServeAnswers(t *testing.T) {
	decided := 0
	h := handler(t, func(context.Context, authz.Request) authz.Verdict {
		decided++
		return authz.Verdict{Code: codes.ResourceExhausted, Denial: apierror.RateLimited, RetryAfterMS: 1500, RequestID: "rid1"}
	})
	fwd := []string{MethodHeader, "GET", URIHeader, "/"}
	ctx := request("127.0.0.2", fwd...)
	h.Serve(ctx)
	r := &ctx.Response
	if r.StatusCode() != 429 || string(r.Header.Peek("Retry-After")) != "2" || string(r.Header.ContentType()) != "application/json" ||
		string(r.Header.Peek("X-Request-Id")) != "rid1" || !strings.Contains(string(r.Body()), `"retry_after_ms":1500`) {
		t.Fatalf("denial: %s", r.String())
	}
	ctx = request("127.0.0.2", append(fwd, ModeHeader, "nginx")...)
	h.Serve(ctx)
	r = &ctx.Response
	if r.StatusCode() != 403 || string(r.Header.Peek(StatusHeader)) != "429" || string(r.Header.Peek(BodyHeader)) != string(r.Body()) {
		t.Fatalf("nginx mode: %s", r.String())
	}
	for name, c := range map[string]*fasthttp.RequestCtx{
		"untrusted":   request("127.0.0.1", fwd...),
		"two methods": request("127.0.0.2", append(fwd, MethodHeader, "POST")...),
		"no URI":      request("127.0.0.2", MethodHeader, "GET"),
		"long method": request("127.0.0.2", MethodHeader, strings.Repeat("G", maxMethod+1), URIHeader, "/"),
	} {
		before := decided
		h.Serve(c)
		if s := c.Response.StatusCode(); (s != 400 && s != 403) || decided != before || !strings.Contains(string(c.Response.Body()), `"request_id"`) {
			t.Errorf("%s: %d %q, decided %d", name, s, c.Response.Body(), decided-before)
		}
	}
}

// BenchmarkServe is the handler's own cost around a decision that allows: reading the
// forwarding headers and the ones the decision asks for, and the answer.
func BenchmarkServe(b *testing.B) {
	h := handler(b, func(_ context.Context, r authz.Request) authz.Verdict {
		for _, n := range authz.RequestHeaders {
			_ = r.Header(n)
		}
		return authz.Verdict{Code: codes.OK}
	})
	ctx := request("127.0.0.2", MethodHeader, "POST", URIHeader, "/api/v1/conversations/c1/activities",
		"X-Forwarded-For", "192.0.2.1", "X-Api-Key", "k1", "User-Agent", "bench", "X-Request-Id", "r1")
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		h.Serve(ctx)
	}
}
