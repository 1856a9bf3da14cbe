package main

// The rate limit service end to end: the built sidecar with rule directories, asked by
// go-control-plane's RateLimitService client and over /json. Counted assertions use
// windows of an hour or a day, with the sidecar's clock 1 s into a fresh hour
// (SIDECAR_TEST_CLOCK_OFFSET_MS), so that no window ends during a test.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rlsNode is a sidecar with a RateLimitService client.
type rlsNode struct {
	*sidecar
	t          *testing.T
	grpcAddr   string
	httpAddr   string
	httpURL    string // http:// or https:// and httpAddr
	conn       *grpc.ClientConn
	rls        rlsv3.RateLimitServiceClient
	httpClient *http.Client
	tls        *portsTLS // nil in plain text
}

func startRLS(t *testing.T, env map[string]string) *rlsNode {
	t.Helper()
	return startRLSOver(t, plainText, env)
}

// startRLSOver starts a sidecar whose ports speak tr, with clients that do.
func startRLSOver(t *testing.T, tr transport, env map[string]string) *rlsNode {
	t.Helper()
	var p *portsTLS
	if tr == mutualTLS {
		p = newPortsTLS(t)
	}
	return startRLSWith(t, p, env)
}

// startRLSWith starts a sidecar whose ports speak mutual TLS with p (plain text when
// nil), with clients that do.
func startRLSWith(t *testing.T, p *portsTLS, env map[string]string) *rlsNode {
	t.Helper()
	full := map[string]string{
		"SIDECAR_GRPC_ADDR":            "127.0.0.1:0",
		"SIDECAR_HTTP_ADDR":            "127.0.0.1:0",
		"LOG_FORMAT":                   "json",
		"SIDECAR_TEST_CLOCK_OFFSET_MS": strconv.FormatInt(clockOffset(time.Hour), 10),
	}
	n := &rlsNode{t: t, httpClient: &http.Client{Timeout: 5 * time.Second}, tls: p}
	if p != nil {
		maps.Copy(full, n.tls.env)
		n.httpClient.Transport = &http.Transport{TLSClientConfig: n.tls.client.Clone()}
	}
	maps.Copy(full, env)
	n.sidecar = start(t, full)
	n.grpcAddr, n.httpAddr = n.sidecar.addrs(30 * time.Second)
	n.httpURL = "http://" + n.httpAddr
	if n.tls != nil {
		n.httpURL = "https://" + n.httpAddr
	}
	n.dial()
	return n
}

func (n *rlsNode) dial() {
	creds := insecure.NewCredentials()
	if n.tls != nil {
		creds = credentials.NewTLS(n.tls.client.Clone())
	}
	conn, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		n.t.Fatal(err)
	}
	n.conn, n.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	n.t.Cleanup(func() { conn.Close() })
}

// ask calls ShouldRateLimit and fails the test on an error.
func (n *rlsNode) ask(domain string, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	n.t.Helper()
	resp, err := n.call(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		n.t.Fatalf("ShouldRateLimit %s %v: %v", domain, ds, err)
	}
	return resp
}

func (n *rlsNode) call(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return n.rls.ShouldRateLimit(ctx, req)
}

// rd is a descriptor of key=value entries.
func rd(kvs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func withHits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// statusText is a status without its reset: code, limit, remaining.
func statusText(s *rlsv3.RateLimitResponse_DescriptorStatus) string {
	out := s.GetCode().String()
	if l := s.GetCurrentLimit(); l != nil {
		out += fmt.Sprintf(" %d/%s", l.GetRequestsPerUnit(), l.GetUnit())
		if m := l.GetUnitMultiplier(); m != nil {
			out += fmt.Sprintf("×%d", m.GetValue())
		}
		if l.GetName() != "" {
			out += "(" + l.GetName() + ")"
		}
	}
	if s.GetLimitRemaining() != 0 {
		out += fmt.Sprintf(" rem=%d", s.GetLimitRemaining())
	}
	return out
}

func (n *rlsNode) want(resp *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, statuses ...string) {
	n.t.Helper()
	var got []string
	for _, s := range resp.GetStatuses() {
		got = append(got, statusText(s))
		// Every limited status says when its window ends, in whole seconds.
		if s.GetCurrentLimit() != nil && (s.GetDurationUntilReset().GetSeconds() < 1 || s.GetDurationUntilReset().GetNanos() != 0) {
			n.t.Errorf("status %v: duration_until_reset %v", statusText(s), s.GetDurationUntilReset())
		}
	}
	if resp.GetOverallCode() != code || strings.Join(got, "; ") != strings.Join(statuses, "; ") {
		n.t.Fatalf("got %v [%s]\nwant %v [%s]", resp.GetOverallCode(), strings.Join(got, "; "), code, strings.Join(statuses, "; "))
	}
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// rulesShop exercises every feature of the reference's rule files.
const rulesShop = `domain: shop
descriptors:
  - key: client_id
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: client_id
    value: partner-7
    rate_limit: {unit: hour, requests_per_unit: 1, name: partner_default}
  - key: client_id
    value: healthcheck
    rate_limit: {unlimited: true}
  - key: promo
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: partner_default}]}
  - key: route
    value: /checkout*
    descriptors:
      - key: client_id
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: files
    value: 'img/*'
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    value: t1
    descriptors:
      - key: api
        value: tiles
        rate_limit: {unit: day, requests_per_unit: 50}
`

// rulesBeyond uses what the reference does not have, each an opt-in of its own.
const rulesBeyond = `domain: beyond
descriptors:
  - key: client
    rate_limits:
      - {unit: hour, requests_per_unit: 2, name: burst}
      - {unit: day, requests_per_unit: 3, name: daily}
  - key: window
    rate_limit: {unit: minute, unit_multiplier: 30, requests_per_unit: 1}
  - key: careful
    count_denied: false
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: job
    allow_refunds: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`

func writeRules(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Every behaviour of RLS.md over gRPC, with a go-control-plane client, in plain text
// and over mutual TLS.
func TestRLSShouldRateLimit(t *testing.T) {
	t.Parallel()
	overEachTransport(t, testRLSShouldRateLimit)
}

func testRLSShouldRateLimit(t *testing.T, tr transport) {
	dir := writeRules(t, map[string]string{"shop.yaml": rulesShop, "beyond.yml": rulesBeyond, "README": "not read"})
	n := startRLSOver(t, tr, map[string]string{"RLS_CONFIG_DIR": dir, "RLS_RESPONSE_HEADERS": "true"})

	// Matching and counting: a counter per value, the value's own rule, the whitelist.
	for i := range 3 {
		n.want(n.ask("shop", rd("client_id=c9"), rd("client_id=healthcheck"), rd("country=fr")),
			ok, "OK 3/HOUR"+rem(2-i), "OK rem=4294967295", "OK")
	}
	r := n.ask("shop", rd("client_id=c9"), rd("client_id=healthcheck"), rd("country=fr"))
	n.want(r, over, "OVER_LIMIT 3/HOUR", "OK rem=4294967295", "OK")
	wantHeaders(t, r, "3", "0", r.GetStatuses()[0].GetDurationUntilReset().GetSeconds())
	n.want(n.ask("shop", rd("client_id=c10")), ok, "OK 3/HOUR rem=2")
	n.want(n.ask("shop", rd("tenant=t1", "api=tiles")), ok, "OK 50/DAY rem=49")
	n.want(n.ask("shop", rd("tenant=t1"), rd("tenant=t1", "api=tiles", "zoom=3"), rd("api=tiles")), ok, "OK", "OK", "OK")
	n.want(n.ask("unknown-domain", rd("client_id=c9")), ok, "OK")

	// replaces: the promotion's limit alone; the named rule untouched.
	n.want(n.ask("shop", rd("client_id=partner-7"), rd("promo=spring")), ok, "OK", "OK 100/HOUR rem=99")
	n.want(n.ask("shop", rd("promo=spring"), rd("client_id=partner-7")), ok, "OK 100/HOUR rem=98", "OK")
	n.want(n.ask("shop", rd("client_id=partner-7")), ok, "OK 1/HOUR(partner_default)")
	n.want(n.ask("shop", rd("client_id=partner-7")), over, "OVER_LIMIT 1/HOUR(partner_default)")

	// Shadow mode per rule: counted, reported OK; quota mode: over only when all are.
	n.ask("shop", rd("route=/checkout/pay", "client_id=c1"))
	n.want(n.ask("shop", rd("route=/checkout/pay", "client_id=c1")), ok, "OK 1/HOUR")
	n.ask("shop", rd("quota=a"))
	n.want(n.ask("shop", rd("quota=a"), rd("quota=b")), ok, "OVER_LIMIT 1/DAY", "OK 1/DAY")
	n.want(n.ask("shop", rd("quota=a"), rd("quota=b")), over, "OVER_LIMIT 1/DAY", "OVER_LIMIT 1/DAY")

	// share_threshold: one counter for every value the wildcard matches.
	n.want(n.ask("shop", rd("files=img/a.png")), ok, "OK 2/HOUR rem=1")
	n.want(n.ask("shop", rd("files=img/b.png")), ok, "OK 2/HOUR")
	n.want(n.ask("shop", rd("files=img/c.png")), over, "OVER_LIMIT 2/HOUR")

	// hits_addend: the request's, a descriptor's, 0 to check without counting.
	req := &rlsv3.RateLimitRequest{Domain: "shop", HitsAddend: 2, Descriptors: []*rlv3.RateLimitDescriptor{rd("client_id=h1")}}
	if resp, err := n.call(req); err != nil || statusText(resp.GetStatuses()[0]) != "OK 3/HOUR rem=1" {
		t.Fatalf("request hits_addend 2: %v %v", resp, err)
	}
	n.want(n.ask("shop", withHits(rd("client_id=h1"), 0)), ok, "OK 3/HOUR rem=1")
	n.want(n.ask("shop", withHits(rd("client_id=h1"), 5)), over, "OVER_LIMIT 3/HOUR")
	n.want(n.ask("shop", withHits(rd("client_id=h1"), 0)), over, "OVER_LIMIT 3/HOUR")

	// The limit override: whatever matches, and an error (not a crash) without a unit.
	o := rd("client_id=healthcheck")
	o.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	n.want(n.ask("shop", o), ok, "OK 1/HOUR")
	n.want(n.ask("shop", o), over, "OVER_LIMIT 1/HOUR")
	o.Limit.Unit = typev3.RateLimitUnit_UNKNOWN
	if _, err := n.call(&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{o}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an override without a unit: %v, want InvalidArgument", err)
	}

	// The reference's errors, as gRPC errors.
	for _, tc := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{rd("a=b")}}, "rate limit domain must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "shop"}, "rate limit descriptor list must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: many(300)}, "at most 256 descriptors"},
	} {
		if _, err := n.call(tc.req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want InvalidArgument %q", tc.req, err, tc.want)
		}
	}

	// Beyond the reference: several limits, unit_multiplier, count_denied, refunds.
	n.want(n.ask("beyond", rd("client=c")), ok, "OK 2/HOUR(burst) rem=1")
	n.want(n.ask("beyond", rd("client=c")), ok, "OK 2/HOUR(burst)")
	n.want(n.ask("beyond", rd("client=c")), over, "OVER_LIMIT 2/HOUR(burst)")
	r = n.ask("beyond", rd("window=w"))
	n.want(r, ok, "OK 1/MINUTE×30")
	if s := r.GetStatuses()[0].GetDurationUntilReset().GetSeconds(); s < 1700 || s > 1800 {
		t.Errorf("a 30-minute window 1 s into the hour resets in %d s", s)
	}
	n.want(n.ask("beyond", rd("careful=c")), ok, "OK 2/HOUR rem=1")
	n.want(n.ask("beyond", rd("careful=c"), rd("client=c")), over, "OK 2/HOUR rem=1", "OVER_LIMIT 2/HOUR(burst)")
	n.want(n.ask("beyond", rd("careful=c")), ok, "OK 2/HOUR") // the denied request did not count
	n.want(n.ask("beyond", rd("job=j")), ok, "OK 2/HOUR rem=1")
	n.want(n.ask("beyond", rd("job=j")), ok, "OK 2/HOUR")
	refund := withHits(rd("job=j"), 1)
	refund.IsNegativeHits = true
	n.want(n.ask("beyond", refund), ok, "OK 2/HOUR rem=1")
	n.want(n.ask("beyond", rd("job=j")), ok, "OK 2/HOUR")

	// Per-rule metrics, labelled by rule, never by value.
	m := n.scrape()
	for _, want := range []string{
		`converger_rls_hits_total{domain="shop",rule="shop.client_id"} 12`,
		`converger_rls_over_limit_total{domain="shop",rule="shop.client_id"} 5`,
		`converger_rls_shadow_mode_total{domain="shop",rule="shop.route_/checkout*.client_id"} 1`,
		`converger_rls_hits_total{domain="beyond",rule="beyond.client@3600s"} 4`, // one in a request denied by another limit
		`converger_rls_config_loads_total{result="success"} 1`,
		`converger_rls_requests_total{result="over_limit"}`,
		`converger_rls_requests_total{result="error"} 4`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "converger_rls_hits"))
		}
	}
	if rlsLines := grepLines(m, "converger_rls"); strings.Contains(rlsLines, "c9") || strings.Contains(rlsLines, "spring") {
		t.Errorf("/metrics names request values:\n%s", grepLines(m, "converger_rls"))
	}

	// Health of the rate limit service under both names.
	health := healthpb.NewHealthClient(n.conn)
	for _, svc := range []string{"envoy.service.ratelimit.v3.RateLimitService", "ratelimit"} {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %s: %v %v", svc, resp, err)
		}
	}
}

// rem is how statusText writes a remaining count: not at all when 0.
func rem(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" rem=%d", n)
}

func many(n int) []*rlv3.RateLimitDescriptor {
	out := make([]*rlv3.RateLimitDescriptor, n)
	for i := range out {
		out[i] = rd("a=b")
	}
	return out
}

func wantHeaders(t *testing.T, r *rlsv3.RateLimitResponse, limit, remaining string, reset int64) {
	t.Helper()
	h := r.GetResponseHeadersToAdd()
	want := []string{"RateLimit-Limit=" + limit, "RateLimit-Remaining=" + remaining, "RateLimit-Reset=" + strconv.FormatInt(reset, 10)}
	var got []string
	for _, kv := range h {
		got = append(got, kv.GetKey()+"="+kv.GetValue())
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("response headers %v, want %v", got, want)
	}
}

func scrape(t *testing.T, httpAddr string) string {
	t.Helper()
	return scrapeURL(t, http.DefaultClient, "http://"+httpAddr)
}

// scrape reads the node's /metrics with its client.
func (n *rlsNode) scrape() string {
	n.t.Helper()
	return scrapeURL(n.t, n.httpClient, n.httpURL)
}

func scrapeURL(t *testing.T, client *http.Client, base string) string {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// postJSON posts body to /json and returns the status, the decoded body and the headers.
func (n *rlsNode) postJSON(body []byte, header map[string]string) (int, map[string]any, http.Header) {
	n.t.Helper()
	req, err := http.NewRequest(http.MethodPost, n.httpURL+"/json", bytes.NewReader(body))
	if err != nil {
		n.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := n.httpClient.Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		n.t.Fatalf("/json answered %d with a body that is not JSON: %v", resp.StatusCode, err)
	}
	return resp.StatusCode, out, resp.Header
}

// POST /json: the same decisions in protobuf's JSON mapping; 429 when over; clear 4xx
// with the error envelope for everything that is not a request. In plain text and over
// mutual TLS.
func TestRLSJSON(t *testing.T) {
	t.Parallel()
	overEachTransport(t, testRLSJSON)
}

func testRLSJSON(t *testing.T, tr transport) {
	dir := writeRules(t, map[string]string{"shop.yaml": rulesShop, "beyond.yaml": rulesBeyond})
	n := startRLSOver(t, tr, map[string]string{"RLS_CONFIG_DIR": dir, "RLS_RESPONSE_HEADERS": "true"})
	body := []byte(`{"domain":"shop","descriptors":[{"entries":[{"key":"client_id","value":"j1"}]},{"entries":[{"key":"client_id","value":"healthcheck"}]}]}`)
	for i := range 3 {
		code, out, _ := n.postJSON(body, nil)
		if code != 200 || out["overallCode"] != "OK" {
			t.Fatalf("request %d: %d %v", i, code, out)
		}
	}
	code, out, hdr := n.postJSON(body, nil)
	if code != 429 || out["overallCode"] != "OVER_LIMIT" {
		t.Fatalf("over the limit: %d %v", code, out)
	}
	st := out["statuses"].([]any)
	first, second := st[0].(map[string]any), st[1].(map[string]any)
	reset, _ := first["durationUntilReset"].(string)
	if first["code"] != "OVER_LIMIT" || first["currentLimit"].(map[string]any)["unit"] != "HOUR" || !strings.HasSuffix(reset, "s") ||
		second["limitRemaining"] != float64(math.MaxUint32) || second["currentLimit"] != nil {
		t.Errorf("statuses: %v", st)
	}
	if len(out["responseHeadersToAdd"].([]any)) != 3 || hdr.Get("RateLimit-Limit") != "" || hdr.Get("Content-Type") != "application/json" {
		t.Errorf("the RateLimit-* headers belong in the body only: %v %v", out["responseHeadersToAdd"], hdr)
	}
	// Proto field names, and the fields the reference's protos predate.
	code, out, _ = n.postJSON([]byte(`{"domain":"beyond","hits_addend":1,"descriptors":[{"entries":[{"key":"window","value":"x"}],"hitsAddend":"1","limit":{"requestsPerUnit":5,"unit":"HOUR","unitMultiplier":2}}]}`), nil)
	if code != 200 || !strings.Contains(fmt.Sprint(out), "unitMultiplier:2") {
		t.Errorf("proto names and unit_multiplier: %d %v", code, out)
	}

	for _, tc := range []struct {
		name   string
		body   []byte
		header map[string]string
		status int
		want   string
	}{
		{"not JSON", []byte(`{"domain":`), nil, 400, "not a RateLimitRequest"},
		{"unknown field", []byte(`{"domain":"shop","descriptors":[],"bogus":1}`), nil, 400, "bogus"},
		{"wrong type", []byte(`{"domain":5}`), nil, 400, "not a RateLimitRequest"},
		{"no domain", []byte(`{"descriptors":[{"entries":[]}]}`), nil, 400, "rate limit domain must not be empty"},
		{"no descriptors", []byte(`{"domain":"shop"}`), nil, 400, "rate limit descriptor list must not be empty"},
		{"override without a unit", []byte(`{"domain":"shop","descriptors":[{"limit":{"requestsPerUnit":1}}]}`), nil, 400, "no valid unit"},
		{"not UTF-8", []byte("{\"domain\":\"sh\xffop\",\"descriptors\":[{}]}"), nil, 400, "not a RateLimitRequest"},
		{"compressed", gzipped(body), map[string]string{"Content-Encoding": "gzip"}, 415, "Compressed"},
		{"oversized", append([]byte(`{"domain":"`), bytes.Repeat([]byte("x"), 2<<20)...), nil, 413, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, hdr := n.postJSON(tc.body, tc.header)
			e, _ := out["error"].(map[string]any)
			if code != tc.status || e == nil || !strings.Contains(fmt.Sprint(e["message"]), tc.want) || e["request_id"] == "" || hdr.Get("Content-Type") != "application/json" {
				t.Errorf("%d %v %v, want %d with an envelope saying %q", code, out, hdr, tc.status, tc.want)
			}
		})
	}
	resp, err := n.httpClient.Get(n.httpURL + "/json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /json: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	// The process is still up and serving.
	n.want(n.ask("shop", rd("client_id=after")), ok, "OK 3/HOUR rem=2")
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

// RLS_SHADOW_MODE: everything counted and decided, every answer OK overall.
func TestRLSGlobalShadowMode(t *testing.T) {
	t.Parallel()
	dir := writeRules(t, map[string]string{"shop.yaml": rulesShop})
	n := startRLS(t, map[string]string{"RLS_CONFIG_DIR": dir, "RLS_SHADOW_MODE": "true", "RLS_RESPONSE_HEADERS": "true"})
	n.ask("shop", withHits(rd("client_id=s"), 3))
	r := n.ask("shop", rd("client_id=s"), rd("client_id=t"))
	n.want(r, ok, "OVER_LIMIT 3/HOUR", "OK 3/HOUR rem=2")
	wantHeaders(t, r, "3", "0", r.GetStatuses()[0].GetDurationUntilReset().GetSeconds())
	if code, out, _ := n.postJSON([]byte(`{"domain":"shop","descriptors":[{"entries":[{"key":"client_id","value":"s"}]}]}`), nil); code != 200 || out["overallCode"] != "OK" {
		t.Errorf("/json in shadow mode: %d %v", code, out)
	}
	if m := scrape(t, n.httpAddr); !strings.Contains(m, "converger_rls_global_shadow_mode_total 2") {
		t.Error("global shadow mode not counted")
	}
	// No rules at all: OK with no limits.
	bare := startRLS(t, nil)
	bare.want(bare.ask("shop", rd("client_id=s")), ok, "OK")
}

// The example rules of envoy/ratelimit, with the descriptors envoy-ratelimit.yaml sends.
func TestRLSExampleRules(t *testing.T) {
	t.Parallel()
	n := startRLS(t, map[string]string{"RLS_CONFIG_DIR": "../../../envoy/ratelimit", "RLS_RESPONSE_HEADERS": "true"})
	// (remote_address): 50 a second. One call each, so no second can end between two.
	n.want(n.ask("edge", withHits(rd("remote_address=192.0.2.1"), 50)), ok, "OK 50/SECOND")
	n.want(n.ask("edge", withHits(rd("remote_address=192.0.2.2"), 51)), over, "OVER_LIMIT 50/SECOND")
	// (origin): 600 a minute per Origin; the platform's sites share 6000; the console none.
	n.want(n.ask("edge", withHits(rd("origin=https://shop.example"), 600)), ok, "OK 600/MINUTE")
	n.want(n.ask("edge", rd("origin=https://shop.example")), over, "OVER_LIMIT 600/MINUTE")
	n.want(n.ask("edge", withHits(rd("origin=https://www.converger.example"), 6000)), ok, "OK 6000/MINUTE")
	n.want(n.ask("edge", rd("origin=https://docs.converger.example")), over, "OVER_LIMIT 6000/MINUTE")
	n.want(n.ask("edge", withHits(rd("origin=https://console.converger.example"), 1e6)), ok, "OK rem=4294967295")
	// (generic_key=uploads, remote_address): a burst of 2 a second and 60 per 5 minutes;
	// denied uploads do not count: a denied burst leaves the whole quota.
	up := func(hits uint64) *rlv3.RateLimitDescriptor {
		return withHits(rd("generic_key=uploads", "remote_address=192.0.2.3"), hits)
	}
	n.want(n.ask("edge", up(3)), over, "OVER_LIMIT 2/SECOND(upload_burst)")
	n.want(n.ask("edge", up(0)), ok, "OK 2/SECOND(upload_burst) rem=2")
	r := n.ask("edge", up(0), rd("remote_address=192.0.2.3"))
	if q := r.GetStatuses()[0]; q.GetLimitRemaining() != 2 {
		t.Errorf("uploads: %v", statusText(q))
	}
}

// An invalid rule directory stops the sidecar at start (exit 2, file, line and key);
// check-config reports every problem, or what a valid directory holds.
func TestRLSInvalidRulesAtStart(t *testing.T) {
	t.Parallel()
	bad := writeRules(t, map[string]string{
		"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
		"b.yml":  "domain: b\ndescriptors:\n  - {key: k, ratelimit: {}}\n",
		"c.yaml": "domain: a\n",
	})
	for _, env := range []map[string]string{{"RLS_CONFIG_DIR": bad}, {"RLS_CONFIG_DIR": filepath.Join(bad, "missing")}} {
		s := start(t, env)
		if code := s.wait(10 * time.Second); code != 2 {
			t.Fatalf("exit status %d with %v; stderr:\n%s", code, env, s.stderr)
		}
	}
	s := start(t, map[string]string{"RLS_CONFIG_DIR": bad})
	s.wait(10 * time.Second)
	out := s.stderr.String()
	for _, want := range []string{
		"sidecar: invalid configuration: RLS_CONFIG_DIR " + bad,
		"a.yaml: line 4: descriptors[0].rate_limit: invalid rate limit unit 'fortnight'",
		"b.yml: line 3: descriptors[0].ratelimit: config error, unknown key 'ratelimit'",
		"c.yaml: line 1: domain: duplicate domain 'a' in config file (also in a.yaml)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr does not say %q:\n%s", want, out)
		}
	}

	check := func(env ...string) (int, string) {
		cmd := exec.Command(binary, "check-config")
		cmd.Env = append(os.Environ(), env...)
		b, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(b)
	}
	badYAML := writeTemp(t, "limits.yaml", "limits:\n  nope: {limit: 1, window: 1s}\n")
	code, out := check("RLS_CONFIG_DIR="+bad, "RATE_LIMIT_CONFIG="+badYAML)
	if code != 2 || strings.Count(out, "\n  ") < 3 || !strings.Contains(out, "limits.nope") || !strings.Contains(out, "b.yml: line 3") {
		t.Errorf("check-config of two bad files: %d\n%s", code, out)
	}
	code, out = check("RLS_CONFIG_DIR=../../../envoy/ratelimit", "RATE_LIMIT_CONFIG=")
	if code != 0 || !strings.Contains(out, "RLS_CONFIG_DIR ../../../envoy/ratelimit: valid, 1 files, domains edge") {
		t.Errorf("check-config of the example rules: %d\n%s", code, out)
	}
}

// The directory is watched: a valid change applies within a few seconds and keeps the
// window's counts; an invalid one keeps the rules whole, logged and counted; removing a
// file removes its domain; a ConfigMap-style link swap is a change like any other.
func TestRLSReload(t *testing.T) {
	t.Parallel()
	// A ConfigMap mount: shop.yaml -> ..data/shop.yaml, ..data -> ..v1.
	dir := t.TempDir()
	version := func(name, content string) {
		must(t, os.Mkdir(filepath.Join(dir, name), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, name, "shop.yaml"), []byte(content), 0o644))
		must(t, os.Symlink(name, filepath.Join(dir, "..data_tmp")))
		must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))) // atomic swap
	}
	version("..v1", "domain: shop\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1}}\n")
	must(t, os.Symlink("..data/shop.yaml", filepath.Join(dir, "shop.yaml")))
	n := startRLS(t, map[string]string{"RLS_CONFIG_DIR": dir})
	n.want(n.ask("shop", rd("k=x")), ok, "OK 1/HOUR")
	n.want(n.ask("shop", rd("k=x")), over, "OVER_LIMIT 1/HOUR")

	applied := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		eventually(t, 10*time.Second, what, func() (bool, string) { return cond(), "" })
		t.Logf("%s after %v", what, time.Since(start).Round(10*time.Millisecond))
	}
	version("..v2", "domain: shop\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 5}}\n")
	applied("the swapped ConfigMap applies", func() bool {
		return n.ask("shop", withHits(rd("k=x"), 0)).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 5
	})
	n.want(n.ask("shop", rd("k=x")), ok, "OK 5/HOUR rem=2") // 2 hits counted before the reload

	// A file written in place with a problem: the rules stay whole.
	loadsBefore := metricValue(scrape(t, n.httpAddr), `converger_rls_config_loads_total{result="error"}`)
	must(t, os.WriteFile(filepath.Join(dir, "extra.yaml"), []byte("domain: extra\ndescriptors:\n  - {key: k, rate_limit: {unit: sometimes}}\n"), 0o644))
	applied("the invalid change is counted", func() bool {
		return metricValue(scrape(t, n.httpAddr), `converger_rls_config_loads_total{result="error"}`) > loadsBefore
	})
	// The log line comes through the process's stderr pipe, maybe after the metric.
	eventually(t, 5*time.Second, "the problem is logged", func() (bool, string) {
		out := n.stderr.String()
		return strings.Contains(out, "extra.yaml: line 3: descriptors[0].rate_limit: invalid rate limit unit 'sometimes'"), tail(out)
	})
	n.want(n.ask("shop", rd("k=x")), ok, "OK 5/HOUR rem=1")
	n.want(n.ask("extra", rd("k=x")), ok, "OK")

	// Fixed: both files apply. Removed: its domain is gone.
	must(t, os.WriteFile(filepath.Join(dir, "extra.yaml"), []byte("domain: extra\ndescriptors:\n  - {key: k, rate_limit: {unit: day, requests_per_unit: 7}}\n"), 0o644))
	applied("the fixed file applies", func() bool { return statusText(n.ask("extra", rd("k=y")).GetStatuses()[0]) != "OK" })
	must(t, os.Remove(filepath.Join(dir, "extra.yaml")))
	applied("the removed file's domain is gone", func() bool { return statusText(n.ask("extra", rd("k=y")).GetStatuses()[0]) == "OK" })
	n.want(n.ask("shop", rd("k=x")), ok, "OK 5/HOUR")
	if m := scrape(t, n.httpAddr); metricValue(m, `converger_rls_config_loads_total{result="success"}`) < 4 || !strings.Contains(m, "converger_rls_config_domains 1") {
		t.Errorf("loads not counted:\n%s", grepLines(m, "converger_rls_config"))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// metricValue is the value of the sample that starts with series, 0 when absent.
func metricValue(metrics, series string) float64 {
	for line := range strings.Lines(metrics) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

func grepLines(s, substr string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// A 3-node cluster: a descriptor's budget used up on one node is denied on the others,
// and a node killed and restarted gets the windows back on join.
func TestClusterRLS(t *testing.T) {
	t.Parallel()
	dir := writeRules(t, map[string]string{"shop.yaml": rulesShop})
	nodes := startCluster(t, 3, hourLimits, clockOffset(time.Hour), func(_ int, env map[string]string) {
		env["RLS_CONFIG_DIR"] = dir
	})
	clients := make([]*rlsNode, len(nodes))
	for i, nd := range nodes {
		clients[i] = &rlsNode{t: t, sidecar: nd.sidecar, grpcAddr: nd.grpcAddr, httpAddr: nd.httpAddr}
		clients[i].dial()
	}
	n1 := clients[0]
	// client_id: 3 an hour. Four on n1: the fourth is over, and the count is 4.
	for i := range 3 {
		n1.want(n1.ask("shop", rd("client_id=shared")), ok, "OK 3/HOUR"+rem(2-i))
	}
	n1.want(n1.ask("shop", rd("client_id=shared")), over, "OVER_LIMIT 3/HOUR")
	start := time.Now()
	for _, c := range clients[1:] {
		eventually(t, 5*time.Second, "the other nodes deny the descriptor", func() (bool, string) {
			r := c.ask("shop", withHits(rd("client_id=shared"), 0)) // checked, not counted
			return r.GetOverallCode() == over, statusText(r.GetStatuses()[0])
		})
	}
	t.Logf("n2 and n3 denied the descriptor %v after n1 used it up (sync interval %v)", time.Since(start).Round(time.Millisecond), syncInterval)
	// Use on several nodes adds up: one each on n2 and n3 of another client.
	clients[1].ask("shop", rd("client_id=split"))
	clients[2].ask("shop", rd("client_id=split"))
	eventually(t, 5*time.Second, "n1 counts the others' hits", func() (bool, string) {
		r := n1.ask("shop", withHits(rd("client_id=split"), 0))
		return statusText(r.GetStatuses()[0]) == "OK 3/HOUR rem=1", statusText(r.GetStatuses()[0])
	})

	// n1 killed and restarted with the same name and ports: the join brings its windows.
	old := nodes[0]
	must(t, old.cmd.Process.Kill())
	old.wait(10 * time.Second)
	env := maps.Clone(old.env)
	env["SIDECAR_GRPC_ADDR"], env["SIDECAR_HTTP_ADDR"] = old.grpcAddr, old.httpAddr
	restarted := startNode(t, "", "n1", env)
	t.Cleanup(func() { terminate(t, restarted) })
	c := &rlsNode{t: t, sidecar: restarted.sidecar, grpcAddr: restarted.grpcAddr, httpAddr: restarted.httpAddr}
	c.dial()
	eventually(t, 10*time.Second, "the restarted node denies the descriptor", func() (bool, string) {
		r := c.ask("shop", withHits(rd("client_id=shared"), 0))
		return r.GetOverallCode() == over, statusText(r.GetStatuses()[0])
	})
}

// rawCodec sends bytes as they are, to put what no proto client would on the wire.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// Hostile gRPC input: malformed and non-UTF-8 messages are refused as the sender's
// mistake (InvalidArgument), oversized ones before they are read, and the sidecar keeps
// serving.
func TestRLSHostileGRPC(t *testing.T) {
	t.Parallel()
	n := startRLS(t, map[string]string{"RLS_CONFIG_DIR": writeRules(t, map[string]string{"shop.yaml": rulesShop})})
	domain := func(s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), s)
	}
	for _, tc := range []struct {
		name string
		msg  []byte
		want codes.Code
	}{
		{"malformed", []byte{0x0a, 0xff, 0xff, 0xff}, codes.InvalidArgument},
		{"non-UTF-8 domain", domain("sh\xffop"), codes.InvalidArgument},
		{"oversized", domain(strings.Repeat("x", 2<<20)), codes.ResourceExhausted},
	} {
		var reply []byte
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := n.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &tc.msg, &reply, grpc.ForceCodecV2(rawCodec{}))
		cancel()
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	n.want(n.ask("shop", rd("client_id=still-up")), ok, "OK 3/HOUR rem=2")
}
