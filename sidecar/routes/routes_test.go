package routes

import (
	"strings"
	"testing"

	"github.com/converger/edge/shared/buckets"
)

func builtIn(t *testing.T) *Table {
	t.Helper()
	tb, err := New(BuiltIn())
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// Every row of the reference's "Limited endpoints" table is in the built-in table.
func TestBuiltInCoversEveryLimitedEndpoint(t *testing.T) {
	tb := builtIn(t)
	rows := []struct {
		method, path, bucket string
		per                  buckets.Per
		from                 Source
	}{
		{"POST", "/api/v1/conversations/c1/activities", buckets.ActivityCreate, buckets.PerTenant, FromAPIKey},
		{"POST", "/api/v1/converger/conversations/c1/activities", buckets.ActivityCreate, buckets.PerTenant, FromToken},
		{"POST", "/api/v1/converger/conversations/c1/upload", buckets.Upload, buckets.PerTenant, FromToken},
		{"POST", "/api/v1/channels/ch1/inbound", buckets.Inbound, buckets.PerChannel, FromPath},
		{"POST", "/api/v1/channels/ch1/status", buckets.Inbound, buckets.PerChannel, FromPath},
		{"POST", "/api/v1/converger/tokens/generate", buckets.TokenGenerate, buckets.PerChannel, FromChannelSecret},
		{"POST", "/api/v1/converger/tokens/refresh", buckets.TokenGenerate, buckets.PerChannel, FromToken},
		{"POST", "/api/v1/converger/tokens/publishable", buckets.PublishableTokenIP, buckets.PerIP, FromIP},
		{"POST", "/api/v1/tokens", buckets.TokenCreate, buckets.PerIP, FromIP},
		{"POST", "/admin/password/reset", buckets.PasswordResetIP, buckets.PerIP, FromIP},
		{"POST", "/portal/password/reset", buckets.PasswordResetIP, buckets.PerIP, FromIP},
		{"PATCH", "/admin/api/v1/tenants/t1/limits", buckets.AdminWrite, buckets.PerIP, FromIP},
		{"DELETE", "/Admin/API/v1/tenants/t1/limits/inbound/", buckets.AdminWrite, buckets.PerIP, FromIP},
		{"POST", "/admin/tenants/t1/status", buckets.AdminWrite, buckets.PerIP, FromIP},
	}
	covered := map[string]bool{}
	for _, row := range rows {
		r, _, ok := tb.Match(row.method, row.path)
		if !ok || len(r.Steps) == 0 {
			t.Errorf("%s %s: no limited route", row.method, row.path)
			continue
		}
		s := r.Steps[0]
		if s.Bucket != row.bucket || s.Per != row.per || s.From != row.from {
			t.Errorf("%s %s: %+v, want %s per %s from %s", row.method, row.path, s, row.bucket, row.per, row.from)
		}
		for _, s := range r.Steps {
			covered[s.Bucket] = true
			if s.PublishableBucket != "" {
				covered[s.PublishableBucket] = true
			}
		}
	}
	// The refresh of a publishable token and the publishable exchange count
	// publishable_token; the logins are the core's (Limiter service).
	refresh, _, _ := tb.Match("POST", "/api/v1/converger/tokens/refresh")
	if refresh.Steps[0].PublishableBucket != buckets.PublishableToken {
		t.Errorf("refresh of a publishable token counts %q", refresh.Steps[0].PublishableBucket)
	}
	pub, _, _ := tb.Match("POST", "/api/v1/converger/tokens/publishable")
	if len(pub.Steps) != 2 || pub.Steps[1].Bucket != buckets.PublishableToken || pub.Steps[1].From != FromPublishableKey {
		t.Errorf("publishable: %+v, want the IP step then publishable_token per channel", pub.Steps)
	}
	for _, p := range []string{"/admin/login", "/portal/login", "/admin/login/totp", "/portal/login/totp"} {
		if r, _, ok := tb.Match("POST", p); !ok || !r.Core || len(r.Steps) != 0 {
			t.Errorf("%s: want a core-counted row", p)
		}
	}
	for _, b := range buckets.BuiltIn {
		if b.Per != buckets.PerAccount && b.Name != buckets.LoginIP && !covered[b.Name] {
			t.Errorf("bucket %s is counted on no route", b.Name)
		}
	}
}

func TestMatchExtractsTheRawChannelID(t *testing.T) {
	tb := builtIn(t)
	for path, want := range map[string]string{
		"/api/v1/channels/not-a-uuid/inbound":                        "not-a-uuid",
		"/api/v1/channels/0b9d7d2e-13a4-4c55/status?x=1":             "0b9d7d2e-13a4-4c55",
		"/api/v1/channels/%61bc/inbound":                             "abc",
		"//api/v1//channels/x/inbound/":                              "x",
		"/api/v1/channels/" + strings.Repeat("z", 1000) + "/inbound": strings.Repeat("z", 1000),
	} {
		r, id, ok := tb.Match("POST", path)
		if !ok || r.Steps[0].Bucket != buckets.Inbound || id != want {
			t.Errorf("Match(%.60q) = %v %q %v; want inbound with id %.20q", path, r, id, ok, want)
		}
	}
}

// The core's HTTP server routes case-insensitively, ignores a trailing slash, merges
// slashes, decodes escapes and resolves dot segments, so the table does too: none of
// these spellings gets past the limit.
func TestMatchIsAsLooseAsTheCoresRouter(t *testing.T) {
	tb := builtIn(t)
	for _, p := range []string{
		"/api/v1/tokens", "/API/V1/Tokens", "/api/v1/tokens/", "//api//v1/tokens", "/api/v1/tokens?x=1",
		"/api/v1/%74okens", "/api/v1/x/../tokens", "/api/./v1/tokens", "/api/v1/tokens#frag",
	} {
		if r, _, ok := tb.Match("POST", p); !ok || r.Steps[0].Bucket != buckets.TokenCreate {
			t.Errorf("%s: not matched as token_create", p)
		}
	}
	if _, _, ok := tb.Match("post", "/api/v1/tokens"); !ok {
		t.Error("lower-case method not matched")
	}
}

func TestMatchMisses(t *testing.T) {
	tb := builtIn(t)
	for _, c := range [][2]string{
		{"GET", "/api/v1/conversations/c1/activities"},
		{"GET", "/api/v1/converger/conversations/c1/activities"},
		{"POST", "/api/v1/conversations"},
		{"POST", "/api/v1/conversations/c1/activities/extra"},
		{"POST", "/api/v1/channels//inbound"},
		{"POST", "/api/v1/tokensx"},
		{"POST", ""},
		{"", "/api/v1/tokens"},
		{"POST", "/" + strings.Repeat("a/", 50_000)},
	} {
		if r, _, ok := tb.Match(c[0], c[1]); ok {
			t.Errorf("%s %.40s matched %s", c[0], c[1], r.Pattern)
		}
	}
}

func TestNewRejectsBadRoutes(t *testing.T) {
	for _, r := range []Route{
		{Method: "", Pattern: "/x", Steps: []Step{ipStep("b")}},
		{Method: "P0ST", Pattern: "/x", Steps: []Step{ipStep("b")}},
		{Method: "POST", Pattern: "x", Steps: []Step{ipStep("b")}},
		{Method: "POST", Pattern: "/x?y", Steps: []Step{ipStep("b")}},
		{Method: "POST", Pattern: "/x/:a/:a", Steps: []Step{ipStep("b")}},
		{Method: "POST", Pattern: "/x"},
		{Method: "POST", Pattern: "/x", Steps: []Step{ipStep("Bad-Name")}},
		{Method: "POST", Pattern: "/x", Steps: []Step{channelStep("b", FromPath)}},
		{Method: "POST", Pattern: "/x", Steps: []Step{{Bucket: "b", Per: buckets.PerTenant, From: FromIP}}},
	} {
		if _, err := New([]Route{r}); err == nil {
			t.Errorf("New accepted %+v", r)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	tb, _ := New(BuiltIn())
	paths := []string{
		"/api/v1/converger/conversations/0b9d7d2e-13a4-4c55-8f0e-6e2f1b7a9c21/activities",
		"/api/v1/channels/0b9d7d2e-13a4-4c55-8f0e-6e2f1b7a9c21/inbound",
		"/api/v1/converger/conversations/0b9d7d2e-13a4-4c55-8f0e-6e2f1b7a9c21/activities?watermark=x",
		"/portal/password/reset",
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tb.Match("POST", paths[i%len(paths)])
		i++
	}
}
