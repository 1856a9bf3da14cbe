package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/store"
)

type tenantOut struct {
	ID, Name, Status string
	APIKeyPrefix     string `json:"api_key_prefix"`
	Channels         int
	AllowedOrigins   []string `json:"allowed_origins"`
}

type limitOut struct {
	Limit   uint32 `json:"limit"`
	ScaleMS int64  `json:"scale_ms"`
}

type limitsOut struct {
	TenantID          string          `json:"tenant_id"`
	Stored            json.RawMessage `json:"stored"`
	StoredError       *string         `json:"stored_error"`
	InstallationKnown bool            `json:"installation_known"`
	Buckets           []struct {
		Bucket, Per, Key, Source string
		Override, Installation   *limitOut
		BuiltIn                  *limitOut `json:"built_in"`
		Effective                *limitOut
	} `json:"buckets"`
}

func (l limitsOut) bucket(t *testing.T, name string) (override, installation, builtIn, effective *limitOut, source, key string) {
	t.Helper()
	for _, b := range l.Buckets {
		if b.Bucket == name {
			return b.Override, b.Installation, b.BuiltIn, b.Effective, b.Source, b.Key
		}
	}
	t.Fatalf("no bucket %s in %+v", name, l)
	return
}

// Who may call the API: a token (read-only on reads only), or the admin session with
// its CSRF token on writes; an Authorization header is judged alone.
func TestAuthentication(t *testing.T) {
	e := newEnv(t, envOptions{})
	alice := e.admin("alice@example.com")
	ten, _ := e.tenant("acme")
	_, readTok := e.token(alice, store.ScopeRead)
	revoked, revokedTok := e.token(alice, store.ScopeWrite)
	if _, _, err := e.st.As("test").RevokeAdminToken(context.Background(), revoked.ID); err != nil {
		t.Fatal(err)
	}
	limits := "/admin/api/v1/tenants/" + ten.ID + "/limits"
	body := map[string]any{"limits": map[string]any{"upload": map[string]any{"limit": 20, "scale_ms": 1000}}}

	anon := e.client()
	r := anon.do("GET", "/admin/api/v1/tenants", nil)
	r.errorCode(t, 401, "unauthorized")
	if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") || r.header.Get("Cache-Control") != "no-store" {
		t.Errorf("401 headers: %v", r.header)
	}
	for _, auth := range []string{"Basic YWxpY2U6eA==", "Bearer", "Bearer cvg_admin_short", "Bearer " + revokedTok,
		"Bearer cvg_admin_" + strings.Repeat("A", 43), "Bearer " + readTok + "x"} {
		anon.do("GET", "/admin/api/v1/tenants", nil, "authorization", auth).errorCode(t, 401, "unauthorized")
	}

	reader := e.tokenClient(readTok)
	reader.do("GET", "/admin/api/v1/tenants", nil).data(t, 200, nil)
	reader.do("GET", limits, nil).data(t, 200, nil)
	for _, w := range []struct {
		method, path string
		body         any
	}{{"PATCH", limits, body}, {"DELETE", limits, nil}, {"DELETE", limits + "/upload", nil},
		{"POST", "/admin/api/v1/tenants/" + ten.ID + "/deactivate", nil}, {"POST", "/admin/api/v1/tenants/" + ten.ID + "/activate", nil}} {
		if d := reader.do(w.method, w.path, w.body); d.status != 403 || !strings.Contains(string(d.body), "read-only") {
			t.Errorf("read-only token, %s %s: %d %s", w.method, w.path, d.status, d.body)
		}
	}

	s := e.client().signIn("alice@example.com")
	s.do("GET", "/admin/api/v1/tenants", nil).data(t, 200, nil)
	// A session's write without the CSRF token, or with another, is refused and changes nothing.
	for _, csrf := range []string{"", "not-the-token", strings.Repeat("A", 43)} {
		r := s.do("PATCH", limits, body, "x-csrf-token", csrf)
		if r.status != 403 || !strings.Contains(string(r.body), "x-csrf-token") {
			t.Errorf("CSRF %q: %d %s", csrf, r.status, r.body)
		}
	}
	if l, _ := e.st.Limits(context.Background(), ten.ID); len(l.Overrides) != 0 {
		t.Fatalf("a refused write changed the limits: %v", l.Overrides)
	}
	s.do("PATCH", limits, body).data(t, 200, nil)
	// A bad Authorization header is not saved by the session's cookie.
	s.do("GET", "/admin/api/v1/tenants", nil, "authorization", "Bearer nope").errorCode(t, 401, "unauthorized")
	// Another admin's CSRF token does not do for this session.
	e.admin("bob@example.com")
	bob := e.client().signIn("bob@example.com")
	s.do("DELETE", limits, nil, "x-csrf-token", bob.csrf).errorCode(t, 403, "forbidden")

	// Signed out, the session is worth nothing.
	page := s.do("GET", "/admin", nil)
	s.do("POST", "/admin/logout", url.Values{"_csrf": {formCSRF(t, page)}})
	s.do("GET", "/admin/api/v1/tenants", nil).errorCode(t, 401, "unauthorized")

	// A deactivated admin's tokens stop at once.
	if _, err := e.pool.Exec(context.Background(), `UPDATE admin_users SET status = 'inactive' WHERE id = $1`, alice.ID); err != nil {
		t.Fatal(err)
	}
	reader.do("GET", "/admin/api/v1/tenants", nil).errorCode(t, 401, "unauthorized")
}

func TestTenants(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeRead)
	c := e.tokenClient(tok)
	var made []store.Tenant
	for i := range 5 {
		ten, _ := e.tenant(fmt.Sprintf("Shop %d", 4-i))
		made = append(made, ten)
	}
	e.tenant("globex")
	var names []string
	next := ""
	for pages := 0; pages < 5; pages++ {
		var page []tenantOut
		meta := c.do("GET", "/admin/api/v1/tenants?q=SHOP&limit=2&cursor="+url.QueryEscape(next), nil).data(t, 200, &page)
		for _, p := range page {
			names = append(names, p.Name)
		}
		if meta["limit"] != float64(2) {
			t.Fatalf("meta %v", meta)
		}
		next, _ = meta["next_cursor"].(string)
		if meta["has_more"] != (next != "") {
			t.Fatalf("meta %v", meta)
		}
		if next == "" {
			break
		}
	}
	if got := strings.Join(names, ","); got != "Shop 0,Shop 1,Shop 2,Shop 3,Shop 4" {
		t.Fatalf("pages of the search: %s", got)
	}
	var one tenantOut
	c.do("GET", "/admin/api/v1/tenants/"+strings.ToUpper(made[0].ID), nil).data(t, 200, &one)
	if one.ID != made[0].ID || one.Name != "Shop 4" || one.Status != "active" || one.AllowedOrigins == nil ||
		!strings.HasPrefix(one.APIKeyPrefix, "cvg_live_") || len(one.APIKeyPrefix) > 13 {
		t.Fatalf("tenant %+v", one)
	}
	var byID []tenantOut
	c.do("GET", "/admin/api/v1/tenants?q="+made[2].ID, nil).data(t, 200, &byID)
	if len(byID) != 1 || byID[0].ID != made[2].ID {
		t.Fatalf("search by id: %+v", byID)
	}

	c.do("GET", "/admin/api/v1/tenants/00000000-0000-4000-8000-000000000000", nil).errorCode(t, 404, "not_found")
	c.do("GET", "/admin/api/v1/tenants/not-an-id", nil).errorCode(t, 404, "not_found")
	for _, q := range []string{"limit=0", "limit=201", "limit=ten", "cursor=%21", "cursor=bm9wZQ", "q=%ff", "q=" + strings.Repeat("a", 257), "q=a%00b"} {
		d := c.do("GET", "/admin/api/v1/tenants?"+q, nil).errorCode(t, 400, "bad_request")
		if want := strings.SplitN(q, "=", 2)[0]; d["parameter"] != want {
			t.Errorf("%s: details %v, want parameter %s", q, d, want)
		}
	}
	// Unknown paths and methods below the API are JSON, before authentication.
	anon := e.client()
	anon.do("GET", "/admin/api/v1/nope", nil).errorCode(t, 404, "not_found")
	r := anon.do("PUT", "/admin/api/v1/tenants/"+made[0].ID, nil)
	r.errorCode(t, 405, "method_not_allowed")
	if r.header.Get("Allow") != "GET, HEAD" {
		t.Errorf("Allow %q", r.header.Get("Allow"))
	}
	if r := anon.do("POST", "/admin/api/v1/tenants/"+made[0].ID+"/limits", "{}"); r.status != 405 || r.header.Get("Allow") != "GET, HEAD, PATCH, DELETE" {
		t.Errorf("POST limits: %d, Allow %q", r.status, r.header.Get("Allow"))
	}
}

// Deactivating through the API refuses the tenant's API key at the sidecar at once; it
// is audited as the admin, through the token, and a repeat changes nothing.
func TestActivateAndDeactivate(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.waitListening()
	u := e.admin("alice@example.com")
	tok, secret := e.token(u, store.ScopeWrite)
	c := e.tokenClient(secret)
	ten, apiKey := e.tenant("acme")
	activity := func() int {
		return e.allowedInWindow(1, "POST", "/api/v1/conversations/c/activities", map[string]string{"x-api-key": apiKey})
	}
	if activity() != 1 {
		t.Fatal("the tenant's key is refused before the deactivation")
	}
	var out tenantOut
	meta := c.do("POST", "/admin/api/v1/tenants/"+ten.ID+"/deactivate", nil).data(t, 200, &out)
	if out.Status != "inactive" || meta["changed"] != true {
		t.Fatalf("deactivate: %+v %v", out, meta)
	}
	deadline := time.Now().Add(5 * time.Second)
	for activity() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sidecar still accepts the deactivated tenant's key")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if meta := c.do("POST", "/admin/api/v1/tenants/"+ten.ID+"/deactivate", nil).data(t, 200, &out); meta["changed"] != false {
		t.Fatalf("a repeat: %v", meta)
	}
	if meta := c.do("POST", "/admin/api/v1/tenants/"+ten.ID+"/activate", nil).data(t, 200, &out); out.Status != "active" || meta["changed"] != true {
		t.Fatalf("activate: %+v %v", out, meta)
	}
	rows := e.auditOf("tenant:" + ten.ID)
	if len(rows) != 3 || rows[0].Action != "tenants.activate" || rows[1].Action != "tenants.deactivate" {
		t.Fatalf("audit %+v", rows)
	}
	for _, r := range rows[:2] {
		var ch map[string]any
		_ = json.Unmarshal(r.Changes, &ch)
		if r.Actor != "admin:"+u.ID || r.ActorEmail != "alice@example.com" || ch["via"] != "token:"+tok.ID {
			t.Errorf("audit row %+v (%s)", r, r.Changes)
		}
	}
	c.do("POST", "/admin/api/v1/tenants/00000000-0000-4000-8000-000000000000/activate", nil).errorCode(t, 404, "not_found")
}

func TestChannels(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeRead)
	c := e.tokenClient(tok)
	ten, _ := e.tenant("acme")
	for _, name := range []string{"web", "sms", "Bot"} {
		if _, _, err := e.st.As("test").CreateChannel(context.Background(), ten.ID, name, "echo", "duplex"); err != nil {
			t.Fatal(err)
		}
	}
	var page []map[string]any
	meta := c.do("GET", "/admin/api/v1/tenants/"+ten.ID+"/channels?limit=2", nil).data(t, 200, &page)
	if len(page) != 2 || page[0]["name"] != "Bot" || page[1]["name"] != "sms" || meta["has_more"] != true {
		t.Fatalf("first page %v %v", page, meta)
	}
	c.do("GET", "/admin/api/v1/tenants/"+ten.ID+"/channels?limit=2&cursor="+url.QueryEscape(meta["next_cursor"].(string)), nil).data(t, 200, &page)
	if len(page) != 1 || page[0]["name"] != "web" || page[0]["tenant_id"] != ten.ID || page[0]["require_signature"] != true {
		t.Fatalf("second page %v", page)
	}
	for _, ch := range page {
		for k := range ch {
			if strings.Contains(k, "secret") || strings.Contains(k, "key") {
				t.Errorf("a channel carries %s", k)
			}
		}
	}
	c.do("GET", "/admin/api/v1/tenants/00000000-0000-4000-8000-000000000000/channels", nil).errorCode(t, 404, "not_found")
	c.do("GET", "/admin/api/v1/tenants/"+ten.ID+"/channels?cursor=x", nil).errorCode(t, 400, "bad_request")
}

// The limits: every source and the winner, set and cleared with the validation of `core
// limits`, audited as the admin, applied by the sidecar's next Check.
func TestLimits(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.waitListening()
	u := e.admin("alice@example.com")
	c := e.client().signIn("alice@example.com")
	ten, apiKey := e.tenant("acme")
	path := "/admin/api/v1/tenants/" + ten.ID + "/limits"

	var l limitsOut
	c.do("GET", path, nil).data(t, 200, &l)
	if l.TenantID != ten.ID || string(l.Stored) != "{}" || l.StoredError != nil || !l.InstallationKnown || len(l.Buckets) != 5 {
		t.Fatalf("limits %+v", l)
	}
	o, in, b, eff, src, key := l.bucket(t, "inbound")
	if o != nil || *in != (limitOut{2000, 1000}) || *b != (limitOut{500, 1000}) || *eff != *in || src != "installation" || key != "inbound:channel:<channel id>" {
		t.Fatalf("inbound: %v %v %v %v %s %s", o, in, b, eff, src, key)
	}
	if _, in, b, eff, src, key := l.bucket(t, "activity_create"); in != nil || *eff != *b || src != "built_in" || key != "activity_create:tenant:"+ten.ID {
		t.Fatalf("activity_create: %v %v %v %s %s", in, b, eff, src, key)
	}

	// The sidecar has the tenant's (empty) overrides cached: only the NOTIFY can change that.
	act := func() int {
		return e.allowedInWindow(10, "POST", "/api/v1/conversations/c/activities", map[string]string{"x-api-key": apiKey})
	}
	if got := act(); got != 10 {
		t.Fatalf("before the override: %d of 10", got)
	}
	meta := c.do("PATCH", path, map[string]any{"limits": map[string]any{
		"activity_create": map[string]any{"limit": 3, "scale_ms": 1000},
		"inbound":         map[string]any{"limit": 50, "scale_ms": 60000},
	}}).data(t, 200, &l)
	if meta["changed"] != true {
		t.Fatalf("meta %v", meta)
	}
	if o, _, _, eff, src, _ := l.bucket(t, "activity_create"); *o != (limitOut{3, 1000}) || *eff != *o || src != "override" {
		t.Fatalf("after: %v %v %s", o, eff, src)
	}
	deadline := time.Now().Add(5 * time.Second)
	for tries := 0; act() != 3; tries++ {
		if time.Now().After(deadline) || tries > 50 {
			t.Fatal("the override set through the API did not apply to the sidecar's checks")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The same again changes nothing and writes no audit row.
	if meta := c.do("PATCH", path, map[string]any{"limits": map[string]any{"inbound": map[string]any{"limit": 50, "scale_ms": 60000}}}).data(t, 200, nil); meta["changed"] != false {
		t.Fatalf("a repeat: %v", meta)
	}
	// One bucket cleared, then all.
	c.do("DELETE", path+"/inbound", nil).data(t, 200, &l)
	if o, _, _, _, src, _ := l.bucket(t, "inbound"); o != nil || src != "installation" {
		t.Fatalf("inbound cleared: %v %s", o, src)
	}
	if meta := c.do("DELETE", path+"/inbound", nil).data(t, 200, nil); meta["changed"] != false {
		t.Fatalf("clearing what is not set: %v", meta)
	}
	c.do("DELETE", path, nil).data(t, 200, &l)
	if string(l.Stored) != "{}" {
		t.Fatalf("all cleared: %s", l.Stored)
	}
	deadline = time.Now().Add(5 * time.Second)
	for act() != 10 {
		if time.Now().After(deadline) {
			t.Fatal("the cleared override still applies")
		}
		time.Sleep(5 * time.Millisecond)
	}

	rows := e.auditOf("tenant:" + ten.ID)
	var actions []string
	for _, r := range rows {
		if r.Actor != "admin:"+u.ID || r.ActorEmail != "alice@example.com" {
			if r.Action != "tenants.create" {
				t.Errorf("row %s by %s", r.Action, r.Actor)
			}
			continue
		}
		var ch map[string]any
		_ = json.Unmarshal(r.Changes, &ch)
		if ch["via"] != "session" || ch["before"] == nil || ch["after"] == nil {
			t.Errorf("row %s: %s", r.Action, r.Changes)
		}
		actions = append(actions, r.Action)
	}
	if got := strings.Join(actions, ","); got != "limits.clear,limits.clear,limits.set" {
		t.Fatalf("audit: %s", got)
	}
}

// A PATCH is validated as `core limits set` validates, and nothing is written when any
// of it is wrong.
func TestLimitsValidation(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("alice@example.com")
	_, tok := e.token(u, store.ScopeWrite)
	c := e.tokenClient(tok)
	ten, _ := e.tenant("acme")
	path := "/admin/api/v1/tenants/" + ten.ID + "/limits"
	for _, tc := range []struct {
		body  string
		field string
	}{
		{`{"limits":{"login_ip":{"limit":5,"scale_ms":1000}}}`, "limits.login_ip"},
		{`{"limits":{"nope":{"limit":5,"scale_ms":1000}}}`, "limits.nope"},
		{`{"limits":{"upload":{"limit":0,"scale_ms":1000}}}`, "limits.upload"},
		{`{"limits":{"upload":{"limit":-1,"scale_ms":1000}}}`, "limits.upload"},
		{`{"limits":{"upload":{"limit":1.5,"scale_ms":1000}}}`, "limits.upload"},
		{`{"limits":{"upload":{"limit":"5","scale_ms":1000}}}`, "limits.upload"},
		{`{"limits":{"upload":{"limit":4294967296,"scale_ms":1000}}}`, "limits.upload"},
		{`{"limits":{"upload":{"limit":5,"scale_ms":86400001}}}`, "limits.upload"},
		{`{"limits":{"upload":{"limit":5}}}`, "limits.upload"},
		{`{"limits":{"upload":{"limit":5,"scale_ms":1000,"burst":2}}}`, "limits.upload"},
		{`{"limits":{"upload":"5/1s"}}`, "limits.upload"},
		{`{"limits":{}}`, "limits"},
		{`{"limits":[]}`, "limits"},
		{`{}`, "limits"},
		{`{"limits":{"upload":{"limit":5,"scale_ms":1000}},"extra":1}`, "extra"},
	} {
		d := c.do("PATCH", path, tc.body).errorCode(t, 422, "validation_failed")
		fields, _ := d["fields"].(map[string]any)
		if msgs, _ := fields[tc.field].([]any); len(msgs) == 0 {
			t.Errorf("%s: fields %v, want %s", tc.body, fields, tc.field)
		}
	}
	for _, body := range []string{`[]`, `"x"`, `{"limits":`, "\xff\xfe{}", `null`} {
		c.do("PATCH", path, body).errorCode(t, 400, "bad_request")
	}
	c.do("PATCH", path, `{"limits":{}}`, "content-type", "text/plain").errorCode(t, 415, "unsupported_media_type")
	c.do("PATCH", path, `{"limits":{}}`, "content-type", "").errorCode(t, 415, "unsupported_media_type")
	c.do("PATCH", path, `{"limits":{}}`, "content-encoding", "gzip").errorCode(t, 415, "unsupported_media_type")
	big := `{"limits":{"upload":{"limit":5,"scale_ms":1000}},"pad":"` + strings.Repeat("x", 70<<10) + `"}`
	if d := c.do("PATCH", path, big).errorCode(t, 413, "payload_too_large"); d["max_bytes"] != float64(64<<10) {
		t.Errorf("413 details %v", d)
	}
	c.do("DELETE", path+"/login_ip", nil).errorCode(t, 422, "validation_failed")
	c.do("PATCH", "/admin/api/v1/tenants/00000000-0000-4000-8000-000000000000/limits", `{"limits":{"upload":{"limit":5,"scale_ms":1000}}}`).errorCode(t, 404, "not_found")
	if l, _ := e.st.Limits(context.Background(), ten.ID); string(l.Raw) != "{}" {
		t.Fatalf("refused requests changed the limits: %s", l.Raw)
	}
	if rows := e.auditOf("tenant:" + ten.ID); len(rows) != 1 {
		t.Fatalf("refused requests were audited: %+v", rows)
	}
	// A stored document written by hand that does not parse is reported, and cleared.
	if _, err := e.pool.Exec(context.Background(), `UPDATE tenants SET limits = '{"upload":{"limit":"many"}}' WHERE id = $1`, ten.ID); err != nil {
		t.Fatal(err)
	}
	var l limitsOut
	c.do("GET", path, nil).data(t, 200, &l)
	if l.StoredError == nil || !strings.Contains(*l.StoredError, "upload") {
		t.Fatalf("stored error %v", l.StoredError)
	}
	if _, _, _, _, src, _ := l.bucket(t, "upload"); src != "built_in" {
		t.Fatalf("an invalid document's bucket comes from %s", src)
	}
	c.do("PATCH", path, `{"limits":{"inbound":{"limit":5,"scale_ms":1000}}}`).errorCode(t, 422, "validation_failed")
	c.do("DELETE", path, nil).data(t, 200, &l)
	if l.StoredError != nil {
		t.Fatalf("clearing all did not repair the document: %v", *l.StoredError)
	}
}

func TestAuditLog(t *testing.T) {
	e := newEnv(t, envOptions{})
	alice, bob := e.admin("alice@example.com"), e.admin("bob@example.com")
	_, aliceTok := e.token(alice, store.ScopeWrite)
	bobTok, bobSecret := e.token(bob, store.ScopeWrite)
	ten, _ := e.tenant("acme")
	a, b := e.tokenClient(aliceTok), e.tokenClient(bobSecret)
	path := "/admin/api/v1/tenants/" + ten.ID + "/limits"
	a.do("PATCH", path, `{"limits":{"upload":{"limit":20,"scale_ms":1000}}}`).data(t, 200, nil)
	b.do("PATCH", path, `{"limits":{"upload":{"limit":30,"scale_ms":1000}}}`).data(t, 200, nil)
	a.do("POST", "/admin/api/v1/tenants/"+ten.ID+"/deactivate", nil).data(t, 200, nil)

	type entry struct {
		ID                      int64
		Actor, Action, Resource string
		ActorEmail              string `json:"actor_email"`
		Changes                 map[string]any
	}
	var bobs []entry
	a.do("GET", "/admin/api/v1/audit?actor="+url.QueryEscape("admin:"+bob.ID), nil).data(t, 200, &bobs)
	// Bob's change is his, whoever reads the log.
	if len(bobs) != 1 || bobs[0].Action != "limits.set" || bobs[0].ActorEmail != "bob@example.com" || bobs[0].Changes["via"] != "token:"+bobTok.ID ||
		!strings.Contains(fmt.Sprint(bobs[0].Changes["after"]), "30") {
		t.Fatalf("bob's entries %+v", bobs)
	}
	var all []entry
	meta := a.do("GET", "/admin/api/v1/audit?resource=tenant:"+ten.ID+"&limit=2", nil).data(t, 200, &all)
	if len(all) != 2 || all[0].Action != "tenants.deactivate" || all[0].ActorEmail != "alice@example.com" || meta["has_more"] != true {
		t.Fatalf("newest two: %+v %v", all, meta)
	}
	var older []entry
	a.do("GET", fmt.Sprintf("/admin/api/v1/audit?resource=tenant:%s&before=%v", ten.ID, meta["next_before"]), nil).data(t, 200, &older)
	if len(older) != 2 || older[0].Action != "limits.set" || older[1].Action != "tenants.create" || older[1].Actor != "test" {
		t.Fatalf("older: %+v", older)
	}
	var sets []entry
	a.do("GET", "/admin/api/v1/audit?action=limits.set", nil).data(t, 200, &sets)
	if len(sets) != 2 {
		t.Fatalf("limits.set: %+v", sets)
	}
	for _, q := range []string{"before=0", "before=x", "limit=1000", "actor=%ff", "action=" + strings.Repeat("a", 300)} {
		a.do("GET", "/admin/api/v1/audit?"+q, nil).errorCode(t, 400, "bad_request")
	}
	// The log holds no secret: the tokens are not in it.
	var everything []entry
	r := a.do("GET", "/admin/api/v1/audit?limit=200", nil)
	r.data(t, 200, &everything)
	if strings.Contains(string(r.body), aliceTok[len("cvg_admin_"):]) || strings.Contains(string(r.body), bobSecret[len("cvg_admin_"):]) {
		t.Fatal("a token is in the audit log")
	}
}
