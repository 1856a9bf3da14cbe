package config_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/sidecar/config"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/routes"

	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
)

// load runs config.Load over env alone.
func load(env map[string]string) (*config.Config, error) {
	return config.Load(func(k string) string { return env[k] })
}

func verifyKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(pub)
}

func TestDefaults(t *testing.T) {
	c, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"GRPCAddr", c.GRPCAddr, "127.0.0.1:8081"},
		{"HTTPAddr", c.HTTPAddr, "127.0.0.1:8082"},
		{"DatabaseURL", c.DatabaseURL, ""},
		{"Backend", c.Backend, "local"},
		{"SyncInterval", c.SyncInterval, 100 * time.Millisecond},
		{"LogLevel", c.LogLevel, slog.LevelInfo},
		{"LogFormat", c.LogFormat, "json"},
		{"OverrideTTL", c.OverrideTTL, 30 * time.Second},
		{"CleanPeriod", c.CleanPeriod, 60 * time.Second},
		{"CredentialTTL", c.CredentialTTL, 30 * time.Second},
		{"DBWait", c.DBWait, 50 * time.Millisecond},
		{"len(Limits)", len(c.Limits), 0},
		{"Verifier is nil", c.Verifier == nil, true},
		{"MaxChecksInFlight", c.MaxChecksInFlight, 256},
		{"HTTPMaxConns", c.HTTPMaxConns, 0},
		{"HTTPMaxConnsPerIP", c.HTTPMaxConnsPerIP, 512},
		{"GCHeadroomMB", c.GCHeadroomMB, 128},
		{"GrantWait", c.GrantWait, 100 * time.Millisecond},
		{"GrantMaxLimit", c.GrantMaxLimit, uint32(100)},
		{"Cluster.Replication", c.Cluster.Replication, "owner"},
	} {
		if f.got != f.want {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
	if c.TrustedProxies == nil || c.TrustedProxies.Trusted(netip.MustParseAddr("10.0.0.1")) {
		t.Error("by default no proxy is trusted")
	}
	if !reflect.DeepEqual(c.Routes, routes.BuiltIn()) {
		t.Errorf("Routes = %v, want the built-in table", c.Routes)
	}
	// Without a file, limits are the built-in defaults.
	for _, b := range buckets.BuiltIn {
		if l, ok := c.BaseLimit(b.Name, buckets.Limit{}); !ok || l != b.Default {
			t.Errorf("BaseLimit(%s) = %v, %v; want the default %v", b.Name, l, ok, b.Default)
		}
	}
	if _, ok := c.BaseLimit("no_such_bucket", buckets.Limit{}); ok {
		t.Error("BaseLimit of an unknown bucket without a route limit has a limit")
	}
}

func TestValidEnvironment(t *testing.T) {
	key1, key2 := verifyKey(t), verifyKey(t)
	c, err := load(map[string]string{
		"SIDECAR_GRPC_ADDR":           "0.0.0.0:9081",
		"SIDECAR_HTTP_ADDR":           "[::1]:0",
		"DATABASE_URL":                " postgres://sidecar:secret@db.internal:5432/converger?sslmode=disable ",
		"RATE_LIMIT_BACKEND":          "local",
		"CLUSTER_STRATEGY":            "none",
		"RATE_LIMIT_SYNC_INTERVAL_MS": "250",
		"RATE_LIMIT_GRANT_WAIT_MS":    "0",
		"RATE_LIMIT_GRANT_MAX_LIMIT":  "1000",
		"CLUSTER_REPLICATION":         "broadcast",
		"TRUSTED_PROXIES":             "10.0.0.0/8, 192.168.1.7 ,::ffff:172.16.0.0/108",
		"TOKEN_VERIFY_KEYS":           key1 + "," + key2,
		"LOG_LEVEL":                   "DEBUG",
		"LOG_FORMAT":                  "text",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.GRPCAddr != "0.0.0.0:9081" || c.HTTPAddr != "[::1]:0" {
		t.Errorf("addresses %s, %s", c.GRPCAddr, c.HTTPAddr)
	}
	if c.DatabaseURL != "postgres://sidecar:secret@db.internal:5432/converger?sslmode=disable" {
		t.Errorf("DatabaseURL = %q", c.DatabaseURL)
	}
	if c.SyncInterval != 250*time.Millisecond || c.LogLevel != slog.LevelDebug || c.LogFormat != "text" || c.Backend != "local" {
		t.Errorf("SyncInterval %v, LogLevel %v, LogFormat %s, Backend %s", c.SyncInterval, c.LogLevel, c.LogFormat, c.Backend)
	}
	for a, want := range map[string]bool{"10.1.2.3": true, "192.168.1.7": true, "192.168.1.8": false, "172.16.9.9": true, "172.32.0.1": false, "8.8.8.8": false} {
		if got := c.TrustedProxies.Trusted(netip.MustParseAddr(a)); got != want {
			t.Errorf("Trusted(%s) = %v, want %v", a, got, want)
		}
	}
	if c.Verifier == nil {
		t.Error("TOKEN_VERIFY_KEYS set but no verifier")
	}
	if c.GrantWait != 0 || c.GrantMaxLimit != 1000 || c.Cluster.Replication != "broadcast" {
		t.Errorf("GrantWait %v, GrantMaxLimit %d, Cluster.Replication %s", c.GrantWait, c.GrantMaxLimit, c.Cluster.Replication)
	}
}

func TestInvalidEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name, val string
	}{
		{"SIDECAR_GRPC_ADDR", "localhost"},
		{"SIDECAR_GRPC_ADDR", "127.0.0.1:99999"},
		{"SIDECAR_GRPC_ADDR", "127.0.0.1:-1"},
		{"SIDECAR_GRPC_ADDR", "127.0.0.1:grpc"},
		{"SIDECAR_GRPC_ADDR", "[::1:8081"},
		{"SIDECAR_HTTP_ADDR", "8082"},
		{"SIDECAR_HTTP_ADDR", "127.0.0.1:65536"},
		{"SIDECAR_HTTP_ADDR", "127.0.0.1:"},
		{"SIDECAR_MAX_CHECKS_IN_FLIGHT", "0"},
		{"SIDECAR_HTTP_MAX_CONNS", "lots"},
		{"SIDECAR_HTTP_MAX_CONNS_PER_IP", "-5"},
		{"DATABASE_URL", "postgres://sidecar:hunter2@db:notaport/converger"},
		{"DATABASE_URL", "postgres://db/converger?sslmode=sometimes&password=hunter2"},
		{"DATABASE_URL", "host=db password=hunter2 nonsense"},
		{"RATE_LIMIT_BACKEND", "foo"},
		{"RATE_LIMIT_BACKEND", "cluster"},
		{"RATE_LIMIT_BACKEND", "bogus"},
		{"CLUSTER_STRATEGY", "static"},
		{"CLUSTER_STRATEGY", "dns"},
		{"CLUSTER_STRATEGY", "mesh"},
		{"CLUSTER_REPLICATION", "gossip"},
		{"CLUSTER_REPLICATION", "Owner"},
		{"RATE_LIMIT_SYNC_INTERVAL_MS", "0"},
		{"RATE_LIMIT_GRANT_MAX_LIMIT", "0"},
		{"RATE_LIMIT_GRANT_MAX_LIMIT", "-5"},
		{"RATE_LIMIT_GRANT_MAX_LIMIT", "4294967296"},
		{"RATE_LIMIT_GRANT_MAX_LIMIT", "ten"},
		{"RATE_LIMIT_GRANT_WAIT_MS", "1001"},
		{"RATE_LIMIT_SYNC_INTERVAL_MS", "-1"},
		{"RATE_LIMIT_SYNC_INTERVAL_MS", "abc"},
		{"RATE_LIMIT_SYNC_INTERVAL_MS", "1.5"},
		{"RATE_LIMIT_SYNC_INTERVAL_MS", "100ms"},
		{"RATE_LIMIT_SYNC_INTERVAL_MS", "99999999999"},
		{"TRUSTED_PROXIES", "nonsense"},
		{"TRUSTED_PROXIES", "10.0.0.0/8,nonsense"},
		{"TRUSTED_PROXIES", "10.0.0.0/33"},
		{"TRUSTED_PROXIES", "fe80::1%eth0"},
		{"TOKEN_VERIFY_KEYS", "short"},
		{"TOKEN_VERIFY_KEYS", base64.StdEncoding.EncodeToString(make([]byte, 31))},
		{"TOKEN_VERIFY_KEYS", base64.StdEncoding.EncodeToString(make([]byte, 32)) + ",short"},
		{"TOKEN_VERIFY_KEYS", ","},
		{"LOG_LEVEL", "loud"},
		{"LOG_LEVEL", "trace"},
		{"LOG_FORMAT", "xml"},
		{"RATE_LIMIT_CONFIG", "/nonexistent/limits.yaml"},
		{"RATE_LIMIT_CONFIG", t.TempDir()}, // a directory
		{"RLS_SHADOW_MODE", "maybe"},
		{"RLS_RESPONSE_HEADERS", "2"},
		{"RLS_CONFIG_DIR", "/nonexistent/rules"},
		{"RLS_CONFIG_DIR", writeFile(t, "limits: {}\n")}, // a file
	} {
		t.Run(tc.name+"="+tc.val, func(t *testing.T) {
			c, err := load(map[string]string{tc.name: tc.val})
			if err == nil {
				t.Fatalf("accepted (DatabaseURL %q, Limits %v)", c.DatabaseURL, c.Limits)
			}
			if !strings.Contains(err.Error(), tc.name) {
				t.Errorf("the error does not name %s: %v", tc.name, err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error repeats a password: %v", err)
			}
		})
	}
}

// writeFile writes a RATE_LIMIT_CONFIG document and returns its path.
func writeFile(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func loadFile(t *testing.T, doc string) (*config.Config, error) {
	t.Helper()
	return load(map[string]string{"RATE_LIMIT_CONFIG": writeFile(t, doc)})
}

const validFile = `
# Installation-wide limits.
limits:
  activity_create: {limit: 50, window: 1s}
  token_generate:
    limit: 20
    window: 60s
  password_reset_account: {limit: 2, window: 1h}
  report_export: {limit: 3, window: 1h}
override_cache_ttl_ms: 5000
clean_period_ms: 120000
credential_cache_ttl_ms: 10000
database_wait_ms: 25
routes:
  - method: post
    path: /api/v1/reports/:id/export
    bucket: report_export
    per: tenant
    from: api_key
    limit: 5
    window: 60s
  - method: GET
    path: /api/v1/search
    bucket: search
    per: ip
    limit: 30
    window: 1s
  - method: POST
    path: /api/v1/channels/:channel_id/replay
    bucket: inbound
    per: channel
    from: path
`

func TestValidFile(t *testing.T) {
	c, err := loadFile(t, validFile)
	if err != nil {
		t.Fatal(err)
	}
	if c.OverrideTTL != 5*time.Second || c.CleanPeriod != 2*time.Minute || c.CredentialTTL != 10*time.Second || c.DBWait != 25*time.Millisecond {
		t.Errorf("OverrideTTL %v, CleanPeriod %v, CredentialTTL %v, DBWait %v", c.OverrideTTL, c.CleanPeriod, c.CredentialTTL, c.DBWait)
	}
	wantLimits := map[string]buckets.Limit{
		"activity_create":        {Count: 50, Window: time.Second},
		"token_generate":         {Count: 20, Window: time.Minute},
		"password_reset_account": {Count: 2, Window: time.Hour},
		"report_export":          {Count: 3, Window: time.Hour},
	}
	if !reflect.DeepEqual(c.Limits, wantLimits) {
		t.Errorf("Limits = %v, want %v", c.Limits, wantLimits)
	}

	builtIn := routes.BuiltIn()
	if len(c.Routes) != 3+len(builtIn) {
		t.Fatalf("%d routes, want the 3 configured ones then %d built-in ones", len(c.Routes), len(builtIn))
	}
	if !reflect.DeepEqual(c.Routes[3:], builtIn) {
		t.Error("the built-in routes do not follow the configured ones")
	}
	wantSteps := []routes.Step{
		{Bucket: "report_export", Per: buckets.PerTenant, From: routes.FromAPIKey, Limit: buckets.Limit{Count: 5, Window: time.Minute}},
		{Bucket: "search", Per: buckets.PerIP, From: routes.FromIP, Limit: buckets.Limit{Count: 30, Window: time.Second}},
		{Bucket: "inbound", Per: buckets.PerChannel, From: routes.FromPath},
	}
	wantPaths := []string{"/api/v1/reports/:id/export", "/api/v1/search", "/api/v1/channels/:channel_id/replay"}
	for i := range 3 {
		r := c.Routes[i]
		if r.Pattern != wantPaths[i] || len(r.Steps) != 1 || r.Steps[0] != wantSteps[i] {
			t.Errorf("route %d = %s %s %+v, want %s %+v", i, r.Method, r.Pattern, r.Steps, wantPaths[i], wantSteps[i])
		}
	}
	// The configured routes match, earlier ones first.
	table, err := routes.New(c.Routes)
	if err != nil {
		t.Fatal(err)
	}
	if r, _, ok := table.Match("POST", "/api/v1/reports/r1/export"); !ok || r.Steps[0].Bucket != "report_export" {
		t.Errorf("the configured route does not match (method written in lower case)")
	}

	// BaseLimit: the installation config, then the route's ad-hoc limit, then the
	// built-in default.
	for _, tc := range []struct {
		bucket string
		route  buckets.Limit
		want   buckets.Limit
		ok     bool
	}{
		{"activity_create", buckets.Limit{}, buckets.Limit{Count: 50, Window: time.Second}, true},                              // installation over built-in
		{"activity_create", buckets.Limit{Count: 7, Window: time.Second}, buckets.Limit{Count: 50, Window: time.Second}, true}, // installation over route
		{"report_export", c.Routes[0].Steps[0].Limit, buckets.Limit{Count: 3, Window: time.Hour}, true},                        // installation over route
		{"search", c.Routes[1].Steps[0].Limit, buckets.Limit{Count: 30, Window: time.Second}, true},                            // route
		{"upload", buckets.Limit{Count: 7, Window: 2 * time.Second}, buckets.Limit{Count: 7, Window: 2 * time.Second}, true},   // route over built-in
		{"upload", buckets.Limit{}, buckets.Limit{Count: 10, Window: time.Second}, true},                                       // built-in
		{"inbound", c.Routes[2].Steps[0].Limit, buckets.Limit{Count: 500, Window: time.Second}, true},                          // built-in
		{"password_reset_account", buckets.Limit{}, buckets.Limit{Count: 2, Window: time.Hour}, true},
		{"unknown", buckets.Limit{}, buckets.Limit{}, false},
	} {
		if got, ok := c.BaseLimit(tc.bucket, tc.route); got != tc.want || ok != tc.ok {
			t.Errorf("BaseLimit(%s, %v) = %v, %v; want %v, %v", tc.bucket, tc.route, got, ok, tc.want, tc.ok)
		}
	}
}

func TestEmptyFiles(t *testing.T) {
	for _, doc := range []string{"", "# nothing\n", "---\n", "limits: {}\nroutes: []\n"} {
		c, err := loadFile(t, doc)
		if err != nil {
			t.Errorf("%q: %v", doc, err)
			continue
		}
		if len(c.Limits) != 0 || c.OverrideTTL != 30*time.Second || len(c.Routes) != len(routes.BuiltIn()) {
			t.Errorf("%q: not the defaults: %+v", doc, c)
		}
	}
}

func TestInvalidFile(t *testing.T) {
	route := func(fields string) string {
		return "routes:\n  - {" + fields + "}\n"
	}
	for _, tc := range []struct {
		name string
		doc  string
		want []string // in the error, besides RATE_LIMIT_CONFIG
	}{
		{"unknown top-level key", "limits: {}\nburst: 5\n", []string{"burst"}},
		{"misspelt key", "overide_cache_ttl_ms: 5000\n", []string{"overide_cache_ttl_ms"}},
		{"unknown bucket", "limits:\n  unknown_bucket: {limit: 5, window: 1s}\n", []string{"limits.unknown_bucket"}},
		{"unknown key in a limit", "limits:\n  upload:\n    limit: 5\n    window: 1s\n    burst: 2\n", []string{"limits.upload.burst", "line 5"}},
		{"limit 0", "limits:\n  upload: {limit: 0, window: 1s}\n", []string{"limits.upload", "limit"}},
		{"negative limit", "limits:\n  upload: {limit: -3, window: 1s}\n", []string{"limits.upload", "limit"}},
		{"limit above 2^32", "limits:\n  upload: {limit: 4294967296, window: 1s}\n", []string{"limits.upload", "limit"}},
		{"fractional limit", "limits:\n  upload: {limit: 2.5, window: 1s}\n", []string{"limits.upload", "2.5"}},
		{"limit not a number", "limits:\n  upload:\n    limit: many\n    window: 1s\n", []string{"limits.upload.limit", "many"}},
		{"missing limit", "limits:\n  upload: {window: 1s}\n", []string{"limits.upload", "limit"}},
		{"window 1x", "limits:\n  upload: {limit: 5, window: 1x}\n", []string{"limits.upload", "window", "1x"}},
		{"window 0s", "limits:\n  upload: {limit: 5, window: 0s}\n", []string{"limits.upload", "window", "0s"}},
		{"window 25h", "limits:\n  upload: {limit: 5, window: 25h}\n", []string{"limits.upload", "window", "25h"}},
		{"window -1s", "limits:\n  upload: {limit: 5, window: -1s}\n", []string{"limits.upload", "window"}},
		{"window below a millisecond", "limits:\n  upload: {limit: 5, window: 1500us}\n", []string{"limits.upload", "window"}},
		{"window missing", "limits:\n  upload: {limit: 5}\n", []string{"limits.upload", "window"}},
		{"window a bare number", "limits:\n  upload: {limit: 5, window: 60}\n", []string{"limits.upload", "window"}},
		{"override_cache_ttl_ms 0", "override_cache_ttl_ms: 0\n", []string{"override_cache_ttl_ms"}},
		{"override_cache_ttl_ms negative", "override_cache_ttl_ms: -1\n", []string{"override_cache_ttl_ms"}},
		{"override_cache_ttl_ms a duration", "override_cache_ttl_ms: 30s\n", []string{"override_cache_ttl_ms"}},
		{"override_cache_ttl_ms fractional", "override_cache_ttl_ms: 1.5\n", []string{"override_cache_ttl_ms"}},
		{"clean_period_ms 0", "clean_period_ms: 0\n", []string{"clean_period_ms"}},
		{"clean_period_ms over a day", "clean_period_ms: 86400001\n", []string{"clean_period_ms"}},
		{"credential_cache_ttl_ms 0", "credential_cache_ttl_ms: 0\n", []string{"credential_cache_ttl_ms"}},
		{"database_wait_ms 0", "database_wait_ms: 0\n", []string{"database_wait_ms"}},
		{"route bad method", route("method: G T, path: /x, bucket: upload, per: tenant, from: api_key"), []string{"routes[0]", "method"}},
		{"route no method", route("path: /x, bucket: upload, per: tenant, from: api_key"), []string{"routes[0]", "method"}},
		{"route bad path", route("method: GET, path: x/y, bucket: upload, per: tenant, from: api_key"), []string{"routes[0]", "path"}},
		{"route path with a wildcard", route("method: GET, path: /x/*, bucket: upload, per: tenant, from: api_key"), []string{"routes[0]", "path"}},
		{"route bad per", route("method: GET, path: /x, bucket: upload, per: galaxy, from: api_key"), []string{"routes[0]", "per", "galaxy"}},
		{"route no per", route("method: GET, path: /x, bucket: upload, from: api_key"), []string{"routes[0]", "per"}},
		{"route bad from", route("method: GET, path: /x, bucket: upload, per: tenant, from: cookie"), []string{"routes[0]", "cookie"}},
		{"route no from", route("method: GET, path: /x, bucket: upload, per: tenant"), []string{"routes[0]", "from"}},
		{"route from that does not fit per", route("method: GET, path: /x, bucket: upload, per: tenant, from: channel_secret"), []string{"routes[0]", "channel_secret"}},
		{"route path identity without :channel_id", route("method: GET, path: /x/:id, bucket: inbound, per: channel, from: path"), []string{"routes[0]", "channel_id"}},
		{"route non-built-in bucket without a limit", route("method: GET, path: /x, bucket: custom, per: ip"), []string{"routes[0]", "custom", "limit"}},
		{"route bad bucket name", route("method: GET, path: /x, bucket: Bad-Name, per: ip, limit: 1, window: 1s"), []string{"routes[0]", "bucket"}},
		{"route limit without window", route("method: GET, path: /x, bucket: custom, per: ip, limit: 5"), []string{"routes[0]", "window"}},
		{"route window without limit", route("method: GET, path: /x, bucket: custom, per: ip, window: 1s"), []string{"routes[0]", "limit"}},
		{"route unknown key", "routes:\n  - method: GET\n    path: /x\n    bucket: upload\n    per: ip\n    burst: 3\n", []string{"routes[0].burst"}},
		{"second route bad", route("method: GET, path: /x, bucket: upload, per: ip") + "  - {method: GET, path: /y, bucket: upload, per: ip, window: 1h}\n", []string{"routes[1]", "limit"}},
		{"limits of a bucket only a later file would know", "limits:\n  custom: {limit: 5, window: 1s}\n", []string{"limits.custom"}},
		{"not a mapping", "- limits\n", []string{"mapping"}},
		{"a scalar", "limits\n", []string{"mapping"}},
		{"two documents", "limits: {}\n---\nlimits:\n  upload: {limit: 5, window: 1s}\n", []string{"document"}},
		{"syntax error", "limits: {upload: [\n", []string{"line"}},
		{"duplicate key", "database_wait_ms: 10\ndatabase_wait_ms: 20\n", []string{"database_wait_ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadFile(t, tc.doc)
			if err == nil {
				t.Fatalf("accepted:\n%s\nLimits %v, OverrideTTL %v", tc.doc, c.Limits, c.OverrideTTL)
			}
			for _, w := range append([]string{"RATE_LIMIT_CONFIG"}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
		})
	}
}

func TestFileTooLarge(t *testing.T) {
	doc := "# " + strings.Repeat("x", 1<<20) + "\nlimits:\n  upload: {limit: 5, window: 1s}\n"
	c, err := loadFile(t, doc)
	if err == nil {
		t.Fatalf("a file over 1 MiB was accepted, cut short: Limits %v", c.Limits)
	}
	if !strings.Contains(err.Error(), "RATE_LIMIT_CONFIG") {
		t.Errorf("the error does not name RATE_LIMIT_CONFIG: %v", err)
	}
}

// RLS_CONFIG_DIR: the rules are read at load, and the error names every problem.
func TestRLSConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "shop.yaml"), []byte("domain: shop\ndescriptors:\n  - {key: k, rate_limit: {unit: hour}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := load(map[string]string{"RLS_CONFIG_DIR": dir, "RLS_SHADOW_MODE": "true", "RLS_RESPONSE_HEADERS": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	if c.RLSRules == nil || strings.Join(c.RLSRules.Domains(), ",") != "shop" || !c.RLSShadowMode || !c.RLSResponseHeaders || c.RLSDir != dir {
		t.Fatalf("%+v", c)
	}
	if c, err := load(nil); err != nil || c.RLSRules != nil || c.RLSShadowMode || c.RLSResponseHeaders {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yml"), []byte("domain: bad\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1.5}}\n  - {value: v}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = load(map[string]string{"RLS_CONFIG_DIR": dir})
	if err == nil || !strings.Contains(err.Error(), "RLS_CONFIG_DIR "+dir+":\n  bad.yml: line 3: descriptors[0].rate_limit.requests_per_unit: error checking config") ||
		!strings.Contains(err.Error(), "\n  bad.yml: line 4: descriptors[1]: descriptor has empty key") {
		t.Fatalf("%v", err)
	}
	summary, err := config.CheckFiles(func(k string) string { return map[string]string{"RLS_CONFIG_DIR": dir}[k] })
	if err == nil || len(summary) != 1 || !strings.Contains(summary[0], "RATE_LIMIT_CONFIG: unset") {
		t.Fatalf("CheckFiles: %v %v", summary, err)
	}
}

// The rate limit service's options, each under this project's name and the reference's.
func TestRLSOptionsAndAliases(t *testing.T) {
	c, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.RLSConfigType != config.ConfigTypeFile || c.RLSHeaderNames != rls.DefaultHeaderNames || c.GRPCMaxConnectionAge != 24*time.Hour || c.GRPCMaxConnectionAgeGrace != time.Hour || c.RLSQuotaMode || c.RLSMergeDomains || c.RLSDynamicMetadata {
		t.Errorf("defaults: %+v", c)
	}
	for _, names := range [][2]map[string]string{
		{{"RLS_QUOTA_MODE": "true", "RLS_MERGE_DOMAIN_CONFIG": "true", "RLS_RESPONSE_DYNAMIC_METADATA": "true", "RLS_SHADOW_MODE": "true", "RLS_RESPONSE_HEADERS": "true",
			"RLS_LIMIT_HEADER": "X-L", "RLS_REMAINING_HEADER": "X-R", "RLS_RESET_HEADER": "X-S",
			"SIDECAR_GRPC_MAX_CONNECTION_AGE": "10m", "SIDECAR_GRPC_MAX_CONNECTION_AGE_GRACE": "30s",
			"RLS_CONFIG_TYPE": "GRPC_XDS_SOTW", "RLS_XDS_SERVER_URL": "127.0.0.1:18000", "RLS_XDS_NODE_ID": "n1", "RLS_XDS_NODE_METADATA": "zone=a,team=b",
			"RLS_XDS_CLIENT_ADDITIONAL_HEADERS": "x-token:t", "RLS_XDS_BACKOFF_INITIAL_INTERVAL": "100ms", "RLS_XDS_BACKOFF_MAX_INTERVAL": "2s"}},
		{{"QUOTA_MODE": "true", "MERGE_DOMAIN_CONFIG": "true", "RESPONSE_DYNAMIC_METADATA": "true", "SHADOW_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
			"LIMIT_LIMIT_HEADER": "X-L", "LIMIT_REMAINING_HEADER": "X-R", "LIMIT_RESET_HEADER": "X-S",
			"GRPC_MAX_CONNECTION_AGE": "10m", "GRPC_MAX_CONNECTION_AGE_GRACE": "30s",
			"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "127.0.0.1:18000", "CONFIG_GRPC_XDS_NODE_ID": "n1", "CONFIG_GRPC_XDS_NODE_METADATA": "zone=a,team=b",
			"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-token:t", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "2s"}},
	} {
		c, err := load(names[0])
		if err != nil {
			t.Fatal(err)
		}
		x := c.RLSXDS
		if !c.RLSQuotaMode || !c.RLSMergeDomains || !c.RLSDynamicMetadata || !c.RLSShadowMode || !c.RLSResponseHeaders ||
			c.RLSHeaderNames != (rls.HeaderNames{"X-L", "X-R", "X-S"}) || c.GRPCMaxConnectionAge != 10*time.Minute || c.GRPCMaxConnectionAgeGrace != 30*time.Second ||
			c.RLSConfigType != config.ConfigTypeXDS || x.ServerURL != "127.0.0.1:18000" || x.NodeID != "n1" || x.Metadata["zone"] != "a" || x.Metadata["team"] != "b" ||
			x.Headers["x-token"] != "t" || x.BackoffInitial != 100*time.Millisecond || x.BackoffMax != 2*time.Second {
			t.Errorf("%v: %+v", names[0], c)
		}
	}
	for env, want := range map[string]map[string]string{
		"disagree":                   {"RLS_QUOTA_MODE": "true", "QUOTA_MODE": "false"},
		"must be FILE":               {"CONFIG_TYPE": "REDIS"},
		"from one or the other":      {"RLS_CONFIG_TYPE": "GRPC_XDS_SOTW", "RLS_CONFIG_DIR": "/tmp"},
		"must be an HTTP header":     {"LIMIT_LIMIT_HEADER": "bad header"},
		"must be a duration":         {"GRPC_MAX_CONNECTION_AGE": "forever"},
		"CONFIG_GRPC_XDS_SERVER_URL": {"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "nowhere"},
		"key=value pairs":            {"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA": "zone"},
	} {
		if _, err := load(want); err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%v: %v, want %q", want, err, env)
		}
	}
}

// The ports' TLS: our variables, envoyproxy/ratelimit's as aliases of the gRPC port's, and
// a problem named by its variable.
func TestTLSVariables(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA("config test CA")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Issue(testpki.Localhost("sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(p, dir, "sidecar"); err != nil {
		t.Fatal(err)
	}
	load := func(env map[string]string) (*config.Config, error) {
		return config.Load(func(k string) string { return env[k] })
	}

	c, err := load(map[string]string{"SIDECAR_HTTP_TLS_CERT_FILE": p.CertFile, "SIDECAR_HTTP_TLS_KEY_FILE": p.KeyFile})
	if err != nil || c.HTTPTLS == nil || c.HTTPTLS.ClientAuth != tlsconfig.NoClientCert || c.GRPCTLS != nil {
		t.Fatalf("HTTP port on TLS: %+v %v", c, err)
	}
	ref := map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": p.CertFile, "GRPC_SERVER_TLS_KEY": p.KeyFile,
		"GRPC_CLIENT_TLS_CACERT": p.CAFile, "GRPC_CLIENT_TLS_SAN": "envoy.edge.svc"}
	c, err = load(ref)
	if err != nil || c.GRPCTLS == nil || c.GRPCTLS.ClientAuth != tlsconfig.RequireClientCert ||
		len(c.GRPCTLS.AllowedClients) != 1 || c.GRPCTLS.AllowedClients[0] != "envoy.edge.svc" {
		t.Fatalf("the reference's variables: %+v %v", c.GRPCTLS, err)
	}
	ref["GRPC_SERVER_USE_TLS"] = "false"
	if c, err = load(ref); err != nil || c.GRPCTLS != nil {
		t.Fatalf("GRPC_SERVER_USE_TLS=false: %+v %v", c.GRPCTLS, err)
	}
	_, err = load(map[string]string{"SIDECAR_GRPC_TLS_CERT_FILE": p.CertFile, "SIDECAR_GRPC_TLS_KEY_FILE": p.CAFile})
	if err == nil || !strings.Contains(err.Error(), "SIDECAR_GRPC_TLS_KEY_FILE") {
		t.Fatalf("a key file that is not a key: %v", err)
	}
}

// The xDS client's TLS: our variables, envoyproxy/ratelimit's as aliases with
// CONFIG_GRPC_XDS_SERVER_USE_TLS=true, and a problem named by its variable.
func TestXDSTLSVariables(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA("config test CA")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Issue(testpki.Leaf{Name: "edge", URIs: []string{"spiffe://cluster.local/ns/edge/sa/sidecar"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(p, dir, "client"); err != nil {
		t.Fatal(err)
	}
	xds := func(more map[string]string) map[string]string {
		env := map[string]string{"RLS_CONFIG_TYPE": "GRPC_XDS_SOTW", "RLS_XDS_SERVER_URL": "xds.example.com:18000"}
		for k, v := range more {
			env[k] = v
		}
		return env
	}
	want := tlsconfig.ClientFiles{Name: "RLS_XDS_TLS", CAFile: p.CAFile, CertFile: p.CertFile, KeyFile: p.KeyFile, ServerName: "xds.internal"}

	c, err := load(xds(nil))
	if err != nil || c.RLSXDS.TLS != nil {
		t.Fatalf("no TLS variables: %+v %v, want plain text", c.RLSXDS.TLS, err)
	}
	ours := map[string]string{"RLS_XDS_TLS_CA_FILE": p.CAFile, "RLS_XDS_TLS_CERT_FILE": p.CertFile,
		"RLS_XDS_TLS_KEY_FILE": p.KeyFile, "RLS_XDS_TLS_SERVER_NAME": "xds.internal"}
	if c, err = load(xds(ours)); err != nil || c.RLSXDS.TLS == nil || *c.RLSXDS.TLS != want {
		t.Fatalf("RLS_XDS_TLS_*: %+v %v", c.RLSXDS.TLS, err)
	}
	ref := map[string]string{"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": p.CAFile,
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": p.CertFile, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": p.KeyFile, "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "xds.internal"}
	if c, err = load(xds(ref)); err != nil || c.RLSXDS.TLS == nil || *c.RLSXDS.TLS != want {
		t.Fatalf("the reference's variables: %+v %v", c.RLSXDS.TLS, err)
	}
	// Ours win over the reference's.
	mixed := xds(ref)
	mixed["RLS_XDS_TLS_SERVER_NAME"] = "ours.internal"
	if c, err = load(mixed); err != nil || c.RLSXDS.TLS == nil || c.RLSXDS.TLS.ServerName != "ours.internal" {
		t.Fatalf("both names: %+v %v", c.RLSXDS.TLS, err)
	}
	// Without USE_TLS=true the reference's names are not read, as in the reference.
	ref["CONFIG_GRPC_XDS_SERVER_USE_TLS"] = "false"
	if c, err = load(xds(ref)); err != nil || c.RLSXDS.TLS != nil {
		t.Fatalf("CONFIG_GRPC_XDS_SERVER_USE_TLS=false: %+v %v", c.RLSXDS.TLS, err)
	}

	for want, env := range map[string]map[string]string{
		// A CA that cannot be read, a key that is not the certificate's: refused at boot.
		"RLS_XDS_TLS_CA_FILE: open " + dir + "/missing.crt": xds(map[string]string{"RLS_XDS_TLS_CA_FILE": dir + "/missing.crt"}),
		"RLS_XDS_TLS_KEY_FILE " + p.CAFile: xds(map[string]string{"RLS_XDS_TLS_CA_FILE": p.CAFile,
			"RLS_XDS_TLS_CERT_FILE": p.CertFile, "RLS_XDS_TLS_KEY_FILE": p.CAFile}),
		"(given as CONFIG_GRPC_XDS_SERVER_TLS_CACERT, CONFIG_GRPC_XDS_CLIENT_TLS_CERT, CONFIG_GRPC_XDS_CLIENT_TLS_KEY)": xds(map[string]string{
			"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": p.CAFile,
			"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": p.CertFile, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": p.CAFile}),
		"RLS_XDS_TLS_CERT_FILE and RLS_XDS_TLS_KEY_FILE: set both": xds(map[string]string{"RLS_XDS_TLS_CA_FILE": p.CAFile, "RLS_XDS_TLS_CERT_FILE": p.CertFile}),
		"need RLS_XDS_TLS_CA_FILE":                                 xds(map[string]string{"RLS_XDS_TLS_CERT_FILE": p.CertFile, "RLS_XDS_TLS_KEY_FILE": p.KeyFile}),
		// TLS asked for with no CA to verify the server: refused, not plain text.
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT": xds(map[string]string{"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true"}),
		`CONFIG_GRPC_XDS_SERVER_USE_TLS="maybe": must be true or false`:               xds(map[string]string{"CONFIG_GRPC_XDS_SERVER_USE_TLS": "maybe"}),
		"RLS_XDS_TLS_CA_FILE is set but RLS_CONFIG_TYPE is not GRPC_XDS_SOTW":         {"RLS_XDS_TLS_CA_FILE": p.CAFile},
	} {
		if _, err := load(env); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want %q", env, err, want)
		}
	}
}
