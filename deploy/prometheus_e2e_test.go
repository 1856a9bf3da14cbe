package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/yaml"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

// absentHere are the selectors of alerts and panels that a healthy run of the programs
// does not produce, each with why; the test still checks that the metric exists.
var absentHere = map[string]string{
	`converger_core_requests_total{status=~"5.."}`: "the core answers no 5xx in a healthy run",
}

// TestPrometheusEndToEnd starts the real Prometheus scraping two sidecars (a cluster, with
// the rate limit service's rules; the second one's PostgreSQL unreachable) and a core
// (AUTHZ_ADDR and LIMITER_ADDR on the first sidecar), with the shipped rule files and the
// job names of the shipped scrape configuration; it sends some traffic, a denial and
// lookups the database cannot answer, then checks that every recording rule, every
// selector of every alert and every query of the dashboard returns a series: no rule or
// panel names a metric or a label value that the programs do not export.
func TestPrometheusEndToEnd(t *testing.T) {
	requirePrometheus(t)
	start := time.Now()
	bins := buildBinaries(t)
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	dir := t.TempDir()

	signingKey, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.ParseSigningKey(signingKey)
	if err != nil {
		t.Fatal(err)
	}
	rlsDir, err := filepath.Abs("../envoy/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	addr := func() string { return "127.0.0.1:" + strconv.Itoa(freeLoopbackPort(t)) }
	grpc1, http1, gossip1 := addr(), addr(), addr()
	grpc2, http2, gossip2 := addr(), addr(), addr()
	coreAddr, opsAddr, promAddr := addr(), addr(), addr()
	deadDB := "postgres://postgres@" + addr() + "/postgres?sslmode=disable&connect_timeout=1" // nothing listens there

	sidecarEnv := func(name, grpcAddr, httpAddr, gossip, db string) map[string]string {
		return map[string]string{
			"SIDECAR_GRPC_ADDR": grpcAddr, "SIDECAR_HTTP_ADDR": httpAddr, "DATABASE_URL": db,
			"TOKEN_VERIFY_KEYS": signer.PublicKey(), "RLS_CONFIG_DIR": rlsDir,
			"CLUSTER_STRATEGY": "static", "CLUSTER_JOIN": gossip1 + "," + gossip2, "CLUSTER_BIND_ADDR": gossip,
			"CLUSTER_INSECURE": "true", "CLUSTER_NODE_NAME": name,
		}
	}
	startProgram(t, bins["sidecar"], &container{where: "sidecar s1", env: sidecarEnv("s1", grpc1, http1, gossip1, dbURL)})
	startProgram(t, bins["sidecar"], &container{where: "sidecar s2 (no database)", env: sidecarEnv("s2", grpc2, http2, gossip2, deadDB)})
	startProgram(t, bins["core"], &container{where: "core", args: []string{"serve"}, env: map[string]string{
		"CORE_ADDR": coreAddr, "CORE_OPS_ADDR": opsAddr, "PUBLIC_URL": "http://" + coreAddr, "DATABASE_URL": dbURL,
		"TOKEN_SIGNING_KEY": signingKey, "ENCRYPTION_KEY": credentials.GenerateEncryptionKey(),
		"AUTHZ_ADDR": grpc1, "LIMITER_ADDR": grpc1,
	}})

	// Prometheus with the shipped rules and job names, scraping every second.
	shipped := readScrapeConfig(t, "prometheus.yml")
	targets := map[string][]string{"converger-sidecar": {http1, http2}, "converger-core": {opsAddr}} // no Envoy here
	var scrapes []map[string]any
	for _, sc := range shipped.ScrapeConfigs {
		if targets[sc.JobName] != nil {
			scrapes = append(scrapes, map[string]any{"job_name": sc.JobName, "static_configs": []any{map[string]any{"targets": targets[sc.JobName]}}})
		}
	}
	var ruleFiles []string
	for _, f := range shipped.RuleFiles {
		p, err := filepath.Abs(filepath.Join(prometheusDir, f))
		if err != nil {
			t.Fatal(err)
		}
		ruleFiles = append(ruleFiles, p)
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
		"rule_files":     ruleFiles,
		"scrape_configs": scrapes,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	startProgram(t, prometheusBinary, &container{where: "prometheus", args: []string{
		"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + promAddr, "--log.level=warn",
	}})
	prom := &promAPI{base: "http://" + promAddr, client: &http.Client{Timeout: 10 * time.Second}}

	t.Logf("%v: binaries built, programs and Prometheus started", time.Since(start).Round(time.Millisecond))
	// Every target scraped once before the traffic, so that its increase shows in rates.
	waitFor(t, 60*time.Second, "every target up", func() error {
		n, err := prom.count(`up == 1`)
		if err == nil && n != 3 {
			err = fmt.Errorf("%d of 3 targets up", n)
		}
		return err
	})

	t.Logf("%v: every target up", time.Since(start).Round(time.Millisecond))
	// Traffic: through the core (each request checked by s1, so s1 counts them and syncs
	// them to s2), token requests from one address until one is denied (10 a minute are
	// allowed; 25 fill one of the two wall-clock minutes they may straddle beyond that), the rate limit service's /json on s1, and checks on s2 whose API key it
	// cannot look up without its database.
	web := &http.Client{Timeout: 10 * time.Second}
	denied := 0
	for range 25 {
		resp, err := web.Post("http://"+coreAddr+"/api/v1/tokens", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			denied++
			break
		}
	}
	if denied == 0 {
		t.Fatal("25 token requests from one address: none was denied")
	}
	for _, path := range []string{"/", "/api/v1/conversations"} {
		if resp, err := web.Get("http://" + coreAddr + path); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for range 5 {
		body := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}`
		resp, err := web.Post("http://"+http1+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /json: %s", resp.Status)
		}
	}
	conn, err := grpc.NewClient(grpc2, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	authz := authv3.NewAuthorizationClient(conn)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/api/v1/conversations/c1/activities", Protocol: "HTTP/1.1",
				Headers: map[string]string{"x-api-key": fmt.Sprintf("cvg_live_%043d", i), ":path": "/api/v1/conversations/c1/activities"}},
		}}})
		cancel()
		if err != nil {
			t.Fatalf("Check on s2: %v", err)
		}
	}

	// What to query: every recording rule's series, every selector of every alert, every
	// query of the dashboard.
	type query struct{ where, expr string }
	var queries []query
	for _, r := range readRules(t, "rules.yml") {
		var m []string
		for k, v := range r.Labels {
			m = append(m, fmt.Sprintf("%s=%q", k, v))
		}
		queries = append(queries, query{"recording rule " + r.Record, r.Record + "{" + strings.Join(m, ",") + "}"})
	}
	var alertExprs []query
	for _, a := range readRules(t, "alerts.yml") {
		alertExprs = append(alertExprs, query{"alert " + a.Alert, a.Expr})
		for _, s := range promSelectors(a.Expr) {
			queries = append(queries, query{"alert " + a.Alert, s})
		}
	}
	for _, q := range dashboardQueries(t) {
		queries = append(queries, query{q[0], q[1]})
	}

	var missing []string
	waitFor(t, 45*time.Second, "every rule, alert selector and panel query answered", func() error {
		missing = missing[:0]
		for _, q := range queries {
			if absentHere[q.expr] != "" || onlyEnvoy(q.expr) {
				continue
			}
			n, err := prom.count(q.expr)
			if err != nil {
				return fmt.Errorf("%s: %s: %v", q.where, q.expr, err)
			}
			if n == 0 {
				missing = append(missing, q.where+": "+q.expr)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d without a series, e.g. %s", len(missing), missing[0])
		}
		return nil
	})
	for _, m := range missing {
		t.Errorf("no series: %s", m)
	}
	t.Logf("%v: %d queries answered", time.Since(start).Round(time.Millisecond), len(queries))

	// Every alert's whole expression evaluates, and the sidecar without its database is one
	// the database alert's condition finds (s1 may be found too, should a probe of its
	// database time out on a loaded machine).
	for _, a := range alertExprs {
		if _, err := prom.count(a.expr); err != nil {
			t.Errorf("%s: %v", a.where, err)
		}
	}
	expr := readAlert(t, "ConvergerSidecarDatabaseFailing").Expr
	if got, err := prom.instances(expr); err != nil || !slices.Contains(got, http2) {
		t.Errorf("ConvergerSidecarDatabaseFailing's condition holds for %v (%v), want s2 (%s) among them", got, err, http2)
	}
	if n, err := prom.count(`bucket:converger_rate_limit_exceeded:rate5m{bucket="token_create"} > 0`); err != nil || n != 1 {
		t.Errorf("the token_create denials: %d series (%v)", n, err)
	}
	// The selectors the programs do not export here are still metrics they export.
	for s, why := range absentHere {
		name := s[:strings.IndexByte(s, '{')]
		if n, err := prom.count(name); err != nil || n == 0 {
			t.Errorf("%s (absent here: %s): the metric %s itself has no series (%v)", s, why, name, err)
		}
	}
	// A query of something that does not exist is caught.
	if n, err := prom.count(`converger_sidecar_checks_total{bucket="no_such_bucket"}`); err != nil || n != 0 {
		t.Errorf("a selector that matches nothing: %d series (%v)", n, err)
	}
}

// onlyEnvoy reports whether every metric expr names is Envoy's (envoy_…): no Envoy runs in
// this test (Debian has no package); the names are those of Envoy's documentation and
// source (http.<stat_prefix>.ext_authz.failure_mode_allowed, cluster.<route cluster>.ext_authz.…
// and cluster.<route cluster>.ratelimit.failure_mode_allowed, with Envoy's tag extraction).
func onlyEnvoy(expr string) bool {
	sels := promSelectors(expr)
	for _, s := range sels {
		if !strings.HasPrefix(s, "envoy_") {
			return false
		}
	}
	return len(sels) > 0
}

func readAlert(t *testing.T, name string) rule {
	t.Helper()
	for _, a := range readRules(t, "alerts.yml") {
		if a.Alert == name {
			return a
		}
	}
	t.Fatalf("alerts.yml has no %s", name)
	return rule{}
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor retries f every 250 ms until it succeeds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: not within %v: %v", what, within, err)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// promAPI asks a Prometheus server's HTTP API.
type promAPI struct {
	base   string
	client *http.Client
}

type promSample struct {
	Metric map[string]string `json:"metric"`
}

// query runs an instant query and returns its samples (an error for a query Prometheus
// refuses or a result that is not a vector).
func (p *promAPI) query(expr string) ([]promSample, error) {
	resp, err := p.client.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	var r struct {
		Status, Error string
		Data          struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		}
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", resp.Status, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", r.Data.ResultType)
	}
	var out []promSample
	err = json.Unmarshal(r.Data.Result, &out)
	return out, err
}

func (p *promAPI) count(expr string) (int, error) {
	s, err := p.query(expr)
	return len(s), err
}

// instances are the instance labels of a query's samples.
func (p *promAPI) instances(expr string) ([]string, error) {
	s, err := p.query(expr)
	var out []string
	for _, x := range s {
		out = append(out, x.Metric["instance"])
	}
	return out, err
}

// promSelectors returns the vector selectors of a PromQL expression as written (metric
// name and matchers, without ranges or offsets): every identifier that is not a function,
// an aggregation, a keyword or a label of a by/without/on/ignoring/group_… list, with the
// matchers that follow it; strings and ranges are skipped.
func promSelectors(expr string) []string {
	keywords := map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"inf": true, "nan": true, "atan2": true, "start": true, "end": true}
	labelLists := map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	var out []string
	s := expr
	skipString := func(i int) int { // s[i] is a quote; returns the index after the closing one
		q := s[i]
		for j := i + 1; j < len(s); j++ {
			if s[j] == '\\' && q != '`' {
				j++
				continue
			}
			if s[j] == q {
				return j + 1
			}
		}
		return len(s)
	}
	closing := func(i int, open, close byte) int { // s[i] == open; the index after its close
		depth := 0
		for j := i; j < len(s); j++ {
			switch c := s[j]; {
			case c == '"' || c == '\'' || c == '`':
				j = skipString(j) - 1
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(s)
	}
	isIdent := func(c byte, first bool) bool {
		return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(i)
		case c == '[':
			i = closing(i, '[', ']')
		case c == '#': // a comment, to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case '0' <= c && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i], false) || s[i] == '.') {
				i++
			}
		case c == '{': // a selector without a name
			end := closing(i, '{', '}')
			out = append(out, s[i:end])
			i = end
		case isIdent(c, true):
			j := i
			for j < len(s) && isIdent(s[j], false) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n') {
				k++
			}
			switch {
			case labelLists[word] && k < len(s) && s[k] == '(':
				i = closing(k, '(', ')')
			case keywords[strings.ToLower(word)]:
				i = j
			case k < len(s) && s[k] == '(', strings.HasPrefix(s[k:], "by") || strings.HasPrefix(s[k:], "without"):
				i = j // a function, or an aggregation (its by or without may come first)
			case k < len(s) && s[k] == '{':
				end := closing(k, '{', '}')
				out = append(out, word+s[k:end])
				i = end
			default:
				out = append(out, word)
				i = j
			}
		default:
			i++
		}
	}
	return out
}

func TestPromSelectors(t *testing.T) {
	for expr, want := range map[string][]string{
		`up{job="converger-sidecar"} == 0`: {`up{job="converger-sidecar"}`},
		`sum by (instance, le) (rate(x_bucket{le="0.25", a=~"b|c"}[5m] offset 1m)) / on () group_left () count(up == 1)`: {`x_bucket{le="0.25", a=~"b|c"}`, `up`},
		`histogram_quantile(0.99, sum(rate(a:b:c[5m])) without (pod))`:                                                   {`a:b:c`},
		`label_replace(rate(m[5m]), "status_class", "${1}xx", "status", "([0-9])..") or vector(0) and bool 1e3`:          {`m`},
		`{__name__="x", job="y"} unless absent(z{a="}"})`:                                                                {`{__name__="x", job="y"}`, `z{a="}"}`},
		"sum(rate(a[5m]))\n  or sum by (instance) (b) * 0":                                                               {`a`, `b`},
	} {
		if got := promSelectors(expr); strings.Join(got, " ; ") != strings.Join(want, " ; ") {
			t.Errorf("promSelectors(%q) = %q, want %q", expr, got, want)
		}
	}
}
