package console_test

import (
	"context"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/converger/edge/core/store"
)

type liveOut struct {
	NowMS   int64 `json:"now_ms"`
	Nodes   int
	Buckets []struct {
		Bucket  string
		Allowed uint64
		Denied  uint64
		Minutes []struct {
			StartMS int64 `json:"start_ms"`
			Allowed uint64
			Denied  uint64
		}
		Busiest []struct {
			Key        string
			Count      uint64
			Limit      uint64
			WindowMS   uint64 `json:"window_ms"`
			ResetsInMS int64  `json:"resets_in_ms"`
			Over       bool
		}
	}
	Cluster struct {
		Backend string
		Members []any
	}
}

// Traffic driven through the sidecar's Check shows in the live view: the minute counts
// and the busiest keys, with the limit and the time to reset.
func TestLiveView(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeRead)
	c := e.tokenClient(tok)
	for range 14 { // token_create: 10 a minute per client IP
		e.check("POST", "/api/v1/tokens", "203.0.113.77", nil)
	}
	var v liveOut
	c.do("GET", "/admin/api/v1/live?top=5", nil).data(t, 200, &v)
	if v.Nodes != 1 || v.Cluster.Backend != "local" || v.NowMS != e.clock.now().UnixMilli() {
		t.Fatalf("live %+v", v)
	}
	found := false
	for _, b := range v.Buckets {
		if b.Bucket != "token_create" {
			continue
		}
		found = true
		cur := b.Minutes[len(b.Minutes)-1]
		if len(b.Minutes) != 60 || cur.Allowed != 10 || cur.Denied != 4 || b.Allowed != 10 || b.Denied != 4 {
			t.Errorf("minutes: %d, current %+v", len(b.Minutes), cur)
		}
		if len(b.Busiest) != 1 {
			t.Fatalf("busiest %+v", b.Busiest)
		}
		k := b.Busiest[0]
		// The window is a minute, and the clock is 10 s into it.
		if k.Key != "token_create:ip:203.0.113.77" || k.Count != 14 || k.Limit != 10 || k.WindowMS != 60000 || !k.Over || k.ResetsInMS != 50000 {
			t.Errorf("busiest key %+v", k)
		}
	}
	if !found {
		t.Fatalf("no token_create in %+v", v)
	}
	c.do("GET", "/admin/api/v1/live?top=0", nil).errorCode(t, 400, "bad_request")
	c.do("GET", "/admin/api/v1/live?top=101", nil).errorCode(t, 400, "bad_request")

	// The page shows the same, says it is for admins only, and refreshes itself.
	s := e.client().signIn("alice@example.com")
	p := s.do("GET", "/admin/limits", nil)
	body := string(p.body)
	if p.status != 200 || !strings.Contains(body, `id="admins-only"`) || !strings.Contains(body, "For admins only") ||
		!strings.Contains(body, `<meta http-equiv="refresh" content="5">`) ||
		!strings.Contains(body, `data-key="token_create:ip:203.0.113.77"`) || !strings.Contains(body, "14 / 10") ||
		!regexp.MustCompile(`id="chart-token_create"[^>]*data-denied-now="4"`).MatchString(body) ||
		!strings.Contains(body, `id="backend-local"`) {
		t.Fatalf("limits page %d:\n%s", p.status, body)
	}
	checkPageHeaders(t, p)
}

func checkPageHeaders(t *testing.T, p response) {
	t.Helper()
	csp := p.header.Get("Content-Security-Policy")
	if !strings.HasPrefix(csp, "default-src 'none'") || strings.Contains(csp, "script-src") || p.header.Get("Cache-Control") != "no-store" ||
		p.header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("headers %v", p.header)
	}
	if strings.Contains(string(p.body), "<script") {
		t.Error("a page carries a script")
	}
}

// The pages: sign-in first; the tenants, a tenant with its channels and limits (which
// source wins), the edit form (CSRF, validation, set and clear), the status form, the
// audit log.
func TestPages(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("alice@example.com")
	ten, _ := e.tenant("acme")
	if _, _, err := e.st.As("test").CreateChannel(context.Background(), ten.ID, "web", "echo", "duplex"); err != nil {
		t.Fatal(err)
	}
	anon := e.client()
	for _, path := range []string{"/admin/tenants", "/admin/tenants/" + ten.ID, "/admin/audit", "/admin/limits"} {
		if r := anon.do("GET", path, nil); r.status != 303 || r.header.Get("Location") != "/admin/login" {
			t.Errorf("%s without a session: %d %s", path, r.status, r.header.Get("Location"))
		}
	}
	if r := anon.do("POST", "/admin/tenants/"+ten.ID+"/limits", url.Values{"limit.upload": {"5/1s"}}); r.status != 303 {
		t.Errorf("a form without a session: %d", r.status)
	}

	s := e.client().signIn("alice@example.com")
	home := string(s.do("GET", "/admin", nil).body)
	for _, id := range []string{"console-tenants", "console-limits", "console-audit"} {
		if !strings.Contains(home, `id="`+id+`"`) {
			t.Errorf("the landing page has no link %s", id)
		}
	}
	list := s.do("GET", "/admin/tenants?q=acm", nil)
	if list.status != 200 || !strings.Contains(string(list.body), `href="/admin/tenants/`+ten.ID+`"`) {
		t.Fatalf("tenants page %d:\n%s", list.status, list.body)
	}
	checkPageHeaders(t, list)

	page := s.do("GET", "/admin/tenants/"+ten.ID, nil)
	body := string(page.body)
	if page.status != 200 || !strings.Contains(body, ">web<") || !regexp.MustCompile(`id="limit-inbound" data-source="installation"`).MatchString(body) ||
		!regexp.MustCompile(`id="limit-upload" data-source="built_in"`).MatchString(body) || !strings.Contains(body, "2000/1s") {
		t.Fatalf("tenant page %d:\n%s", page.status, body)
	}
	csrf := formCSRF(t, page)
	form := func(values map[string]string) url.Values {
		v := url.Values{"_csrf": {csrf}}
		for k, val := range values {
			v.Set(k, val)
		}
		return v
	}
	// Without the CSRF token nothing changes.
	bad := form(map[string]string{"limit.upload": "5/1s"})
	bad.Set("_csrf", "forged")
	if r := s.do("POST", "/admin/tenants/"+ten.ID+"/limits", bad); r.status != 403 {
		t.Errorf("forged CSRF: %d", r.status)
	}
	// Invalid values: 422, the form again with the message, nothing saved.
	r := s.do("POST", "/admin/tenants/"+ten.ID+"/limits", form(map[string]string{"limit.upload": "5/1s", "limit.inbound": "0/1s", "limit.activity_create": "lots"}))
	if r.status != 422 || !strings.Contains(string(r.body), "must be a positive integer") || !strings.Contains(string(r.body), `value="lots"`) {
		t.Fatalf("invalid form: %d\n%s", r.status, r.body)
	}
	if l, _ := e.st.Limits(context.Background(), ten.ID); len(l.Overrides) != 0 {
		t.Fatalf("an invalid form saved %v", l.Overrides)
	}
	r = s.do("POST", "/admin/tenants/"+ten.ID+"/limits", form(map[string]string{"limit.upload": "5/1s", "limit.inbound": "3000/1s"}))
	if r.status != 303 || r.header.Get("Location") != "/admin/tenants/"+ten.ID+"?done=limits" {
		t.Fatalf("saving: %d %s", r.status, r.header.Get("Location"))
	}
	after := string(s.do("GET", r.header.Get("Location"), nil).body)
	if !regexp.MustCompile(`id="limit-upload" data-source="override"`).MatchString(after) || !strings.Contains(after, `id="notice"`) ||
		!strings.Contains(after, `value="5/1s"`) {
		t.Fatalf("after saving:\n%s", after)
	}
	// Emptying a field clears its override, in the same change as setting another.
	r = s.do("POST", "/admin/tenants/"+ten.ID+"/limits", form(map[string]string{"limit.inbound": "3000/1s", "limit.token_generate": "20/1m"}))
	if r.status != 303 {
		t.Fatalf("clearing: %d %s", r.status, r.body)
	}
	l, _ := e.st.Limits(context.Background(), ten.ID)
	if string(l.Overrides.JSON()) != `{"inbound":{"limit":3000,"scale_ms":1000},"token_generate":{"limit":20,"scale_ms":60000}}` {
		t.Fatalf("stored %s", l.Overrides.JSON())
	}
	if r := s.do("POST", "/admin/tenants/"+ten.ID+"/limits", form(map[string]string{"limit.inbound": "3000/1s", "limit.token_generate": "20/1m"})); r.header.Get("Location") != "/admin/tenants/"+ten.ID+"?done=unchanged" {
		t.Fatalf("unchanged: %s", r.header.Get("Location"))
	}

	// The status form.
	r = s.do("POST", "/admin/tenants/"+ten.ID+"/status", form(map[string]string{"status": "inactive"}))
	if r.status != 303 || !strings.HasSuffix(r.header.Get("Location"), "done=deactivated") {
		t.Fatalf("deactivating: %d %s", r.status, r.header.Get("Location"))
	}
	if p := string(s.do("GET", "/admin/tenants/"+ten.ID, nil).body); !strings.Contains(p, `id="activate"`) {
		t.Fatal("no activate button on a deactivated tenant's page")
	}
	if r := s.do("POST", "/admin/tenants/"+ten.ID+"/status", form(map[string]string{"status": "gone"})); r.status != 400 {
		t.Errorf("an unknown status: %d", r.status)
	}
	if r := s.do("GET", "/admin/tenants/00000000-0000-4000-8000-000000000000", nil); r.status != 404 {
		t.Errorf("no such tenant: %d", r.status)
	}

	// Every change is in the audit log as alice, through her session.
	rows := e.auditOf("tenant:" + ten.ID)
	var actions []string
	for _, row := range rows {
		if row.Actor == "admin:"+u.ID {
			var ch map[string]any
			_ = json.Unmarshal(row.Changes, &ch)
			if ch["via"] != "session" {
				t.Errorf("%s: via %v", row.Action, ch["via"])
			}
			actions = append(actions, row.Action)
		}
	}
	if got := strings.Join(actions, ","); got != "tenants.deactivate,limits.set,limits.set" {
		t.Fatalf("audit: %s", got)
	}
	audit := s.do("GET", "/admin/audit?resource="+url.QueryEscape("tenant:"+ten.ID), nil)
	if audit.status != 200 || strings.Count(string(audit.body), `class="entry"`) != 4 || !strings.Contains(string(audit.body), "alice@example.com") {
		t.Fatalf("audit page %d:\n%s", audit.status, audit.body)
	}
	if r := s.do("GET", "/admin/audit?before=x", nil); r.status != 400 {
		t.Errorf("a bad filter: %d", r.status)
	}
}

// Without a sidecar the Limits page says so; with a hung one it answers 503 within the
// timeout, and says it tries again.
func TestLimitsPageWithoutSidecar(t *testing.T) {
	for _, o := range []envOptions{{noSidecar: true}, {sidecar: hungSidecar{}}} {
		e := newEnv(t, o)
		e.admin("alice@example.com")
		s := e.client().signIn("alice@example.com")
		p := s.do("GET", "/admin/limits", nil)
		want := 200
		if !o.noSidecar {
			want = 503
		}
		if p.status != want || !strings.Contains(string(p.body), `id="error"`) || !strings.Contains(string(p.body), "For admins only") {
			t.Errorf("limits page %d (want %d):\n%s", p.status, want, p.body)
		}
	}
}
