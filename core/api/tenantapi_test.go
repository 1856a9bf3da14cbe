package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/token"
)

// Helpers shared by the package's tests.

const missingID = "00000000-0000-4000-8000-000000000000"

// apiKey is the x-api-key header.
func apiKey(key string) map[string]string { return map[string]string{"x-api-key": key} }

// withHeader returns h plus one header.
func withHeader(h map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for hk, hv := range h {
		out[hk] = hv
	}
	return out
}

// tenantActivity is the tenant API's activity.
type tenantActivity struct {
	ID             string          `json:"id"`
	Type           string          `json:"type"`
	Sender         string          `json:"sender"`
	Text           string          `json:"text"`
	Attachments    json.RawMessage `json:"attachments"`
	Metadata       json.RawMessage `json:"metadata"`
	Seq            int64           `json:"seq"`
	ConversationID string          `json:"conversation_id"`
	TenantID       string          `json:"tenant_id"`
	InsertedAt     string          `json:"inserted_at"`
}

// tenantConversation is the tenant API's conversation.
type tenantConversation struct {
	ID         string          `json:"id"`
	TenantID   string          `json:"tenant_id"`
	ChannelID  string          `json:"channel_id"`
	Status     string          `json:"status"`
	LastSeq    int64           `json:"last_seq"`
	Metadata   json.RawMessage `json:"metadata"`
	InsertedAt string          `json:"inserted_at"`
	UpdatedAt  string          `json:"updated_at"`
}

type activityList struct {
	Data []tenantActivity `json:"data"`
	Meta struct {
		Watermark string `json:"watermark"`
		HasMore   bool   `json:"has_more"`
		Limit     int    `json:"limit"`
	} `json:"meta"`
}

// data decodes a {"data": …} answer after checking its status.
func (r response) data(t *testing.T, status int, v any) {
	t.Helper()
	if r.status != status {
		t.Fatalf("got %d %s, want %d", r.status, r.body, status)
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	r.json(t, &env)
	if err := json.Unmarshal(env.Data, v); err != nil || len(env.Data) == 0 {
		t.Fatalf("no data in %s", r.body)
	}
}

// conversation creates a conversation on a channel through the tenant API.
func (e *env) conversation(key, channelID string) tenantConversation {
	e.t.Helper()
	var c tenantConversation
	e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": channelID}, apiKey(key)).data(e.t, 201, &c)
	return c
}

// post creates an activity through the tenant API.
func (e *env) post(key, convID string, body any) tenantActivity {
	e.t.Helper()
	var a tenantActivity
	e.do("POST", "/api/v1/conversations/"+convID+"/activities", body, apiKey(key)).data(e.t, 201, &a)
	return a
}

// list reads a page of activities through the tenant API.
func (e *env) list(key, convID, query string) activityList {
	e.t.Helper()
	r := e.do("GET", "/api/v1/conversations/"+convID+"/activities"+query, nil, apiKey(key))
	if r.status != 200 {
		e.t.Fatalf("list: %d %s", r.status, r.body)
	}
	var l activityList
	r.json(e.t, &l)
	return l
}

// setup is a tenant with its key, an echo-less (webhook) channel and a conversation.
type setup struct {
	tenantID, key, channelID, conv string
	secret, publishable            string
}

func (e *env) setup(channelType string) setup {
	e.t.Helper()
	t, key := e.tenant()
	ch, sec := e.channel(t.ID, channelType)
	conv := e.conversation(key, ch.ID)
	return setup{tenantID: t.ID, key: key, channelID: ch.ID, conv: conv.ID, secret: sec.Secret, publishable: sec.Publishable}
}

// sameAnswer checks that two error answers are identical apart from the request id.
func sameAnswer(t *testing.T, what string, a, b response) {
	t.Helper()
	strip := func(r response) string {
		var env map[string]map[string]any
		if json.Unmarshal(r.body, &env) != nil || env["error"] == nil {
			t.Fatalf("%s: not an error envelope: %d %s", what, r.status, r.body)
		}
		delete(env["error"], "request_id")
		b, _ := json.Marshal(env)
		return fmt.Sprintf("%d %s", r.status, b)
	}
	if sa, sb := strip(a), strip(b); sa != sb {
		t.Fatalf("%s: answers differ:\n  %s\n  %s", what, sa, sb)
	}
}

// verifier verifies the env's tokens.
func (e *env) verifier() *token.Verifier {
	e.t.Helper()
	v, err := token.ParseVerifyKeys(e.signer.PublicKey())
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

// exec runs SQL on the env's database.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

// count runs a counting query.
func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func TestTenantAPIRequiresAnAPIKey(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	for _, h := range []map[string]string{nil, apiKey("cvg_live_nope"), apiKey(strings.Repeat("k", 300))} {
		e.do("GET", "/api/v1/conversations/"+s.conv, nil, h).errorCode(t, 401, "unauthorized")
		e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": s.channelID}, h).errorCode(t, 401, "unauthorized")
		e.do("POST", "/api/v1/tokens", map[string]any{"conversation_id": s.conv}, h).errorCode(t, 401, "unauthorized")
	}
	// A deactivated tenant's key no longer works, once the change's notification has
	// emptied the core's memory of keys (apikeys.go).
	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, s.tenantID)
	waitFor(t, "the deactivated tenant's key refused", func() bool {
		return e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey(s.key)).status == 401
	})
	e.do("GET", "/api/v1/conversations/"+s.conv, nil, apiKey(s.key)).errorCode(t, 401, "unauthorized")
}

func TestTenantConversations(t *testing.T) {
	e := newEnv(t, envOptions{})
	tn, key := e.tenant()
	ch, _ := e.channel(tn.ID, "webhook")

	var c tenantConversation
	e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": ch.ID, "metadata": map[string]any{"customer": "42"}},
		apiKey(key)).data(t, 201, &c)
	if c.ID == "" || c.TenantID != tn.ID || c.ChannelID != ch.ID || c.Status != "active" || c.LastSeq != 0 ||
		string(c.Metadata) != `{"customer":"42"}` || c.InsertedAt == "" {
		t.Fatalf("created %+v", c)
	}
	if _, err := time.Parse(time.RFC3339Nano, c.InsertedAt); err != nil {
		t.Fatalf("inserted_at %q: %v", c.InsertedAt, err)
	}
	var got tenantConversation
	e.do("GET", "/api/v1/conversations/"+c.ID, nil, apiKey(key)).data(t, 200, &got)
	if got.ID != c.ID || string(got.Metadata) != `{"customer":"42"}` {
		t.Fatalf("got %+v", got)
	}
	// Upper-case ids are the same conversation.
	e.do("GET", "/api/v1/conversations/"+strings.ToUpper(c.ID), nil, apiKey(key)).data(t, 200, &got)

	// Without metadata (or with null) it is {}.
	var bare tenantConversation
	e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": ch.ID, "metadata": nil}, apiKey(key)).data(t, 201, &bare)
	if string(bare.Metadata) != `{}` {
		t.Fatalf("metadata %s, want {}", bare.Metadata)
	}

	// Field errors.
	for _, tc := range []struct {
		body  any
		field string
	}{
		{map[string]any{}, "channel_id"},
		{"", "channel_id"},
		{map[string]any{"channel_id": 7}, "channel_id"},
		{map[string]any{"channel_id": ch.ID, "metadata": "x"}, "metadata"},
		{map[string]any{"channel_id": ch.ID, "metadata": []int{1}}, "metadata"},
		{map[string]any{"channel_id": ch.ID, "metadata": map[string]string{"k": strings.Repeat("x", 16384)}}, "metadata"},
		{`{"channel_id":"` + ch.ID + `","metadata":{"k":"a\u0000b"}}`, "metadata"},
		{"[1]", "body"},
		{"{", "body"},
	} {
		d := e.do("POST", "/api/v1/conversations", tc.body, apiKey(key)).errorCode(t, 422, "validation_failed")
		if fields, _ := d["fields"].(map[string]any); fields[tc.field] == nil {
			t.Fatalf("%v: details %v, want field %s", tc.body, d, tc.field)
		}
	}
	// An unknown channel, a malformed id and another tenant's channel are missing.
	other, _ := e.tenant()
	otherCh, _ := e.channel(other.ID, "webhook")
	missing := e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": missingID}, apiKey(key))
	missing.errorCode(t, 404, "not_found")
	sameAnswer(t, "another tenant's channel", missing,
		e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": otherCh.ID}, apiKey(key)))
	sameAnswer(t, "a malformed channel id", missing,
		e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": "nope"}, apiKey(key)))
	// An inactive channel takes no new conversations.
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, ch.ID)
	d := e.do("POST", "/api/v1/conversations", map[string]any{"channel_id": ch.ID}, apiKey(key)).errorCode(t, 422, "validation_failed")
	if fields, _ := d["fields"].(map[string]any); fields["channel_id"] == nil {
		t.Fatalf("details %v", d)
	}
	// Missing and malformed conversation ids.
	e.do("GET", "/api/v1/conversations/"+missingID, nil, apiKey(key)).errorCode(t, 404, "not_found")
	e.do("GET", "/api/v1/conversations/nope", nil, apiKey(key)).errorCode(t, 404, "not_found")
}

func TestTenantCloseAndReopen(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	e.post(s.key, s.conv, map[string]any{"text": "before"})

	var c tenantConversation
	e.do("POST", "/api/v1/conversations/"+s.conv+"/close", nil, apiKey(s.key)).data(t, 200, &c)
	if c.Status != "closed" || c.LastSeq != 2 {
		t.Fatalf("closed %+v", c)
	}
	// Idempotent: no second lifecycle activity.
	e.do("POST", "/api/v1/conversations/"+s.conv+"/close", nil, apiKey(s.key)).data(t, 200, &c)
	if c.Status != "closed" || c.LastSeq != 2 {
		t.Fatalf("closed twice %+v", c)
	}
	e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", map[string]any{"text": "x"}, apiKey(s.key)).
		errorCode(t, 409, "conversation_closed")
	// Reads still work.
	if l := e.list(s.key, s.conv, ""); len(l.Data) != 2 {
		t.Fatalf("list of a closed conversation: %+v", l)
	}

	e.do("POST", "/api/v1/conversations/"+s.conv+"/reopen", nil, apiKey(s.key)).data(t, 200, &c)
	if c.Status != "active" || c.LastSeq != 3 {
		t.Fatalf("reopened %+v", c)
	}
	e.do("POST", "/api/v1/conversations/"+s.conv+"/reopen", nil, apiKey(s.key)).data(t, 200, &c)
	if c.LastSeq != 3 {
		t.Fatalf("reopened twice %+v", c)
	}
	e.post(s.key, s.conv, map[string]any{"text": "after"})

	l := e.list(s.key, s.conv, "")
	var got []string
	for _, a := range l.Data {
		got = append(got, fmt.Sprintf("%d %s %s %s %s", a.Seq, a.Sender, a.Type, a.Text, a.Metadata))
	}
	want := []string{
		"1 user message before {}",
		`2 system conversationUpdate  {"event":"conversation_closed","reason":"manual","status":"closed"}`,
		`3 system conversationUpdate  {"event":"conversation_reopened","reason":"manual","status":"active"}`,
		"4 user message after {}",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("activities:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	e.do("POST", "/api/v1/conversations/"+missingID+"/close", nil, apiKey(s.key)).errorCode(t, 404, "not_found")
	e.do("POST", "/api/v1/conversations/nope/reopen", nil, apiKey(s.key)).errorCode(t, 404, "not_found")
}

func TestTenantActivities(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")

	a := e.post(s.key, s.conv, map[string]any{"text": "hello"})
	if a.ID == "" || a.Type != "message" || a.Sender != "user" || a.Text != "hello" || string(a.Attachments) != "[]" ||
		string(a.Metadata) != "{}" || a.Seq != 1 || a.ConversationID != s.conv || a.TenantID != s.tenantID {
		t.Fatalf("created %+v", a)
	}
	if ts, err := time.Parse(time.RFC3339Nano, a.InsertedAt); err != nil || time.Since(ts) > time.Minute {
		t.Fatalf("inserted_at %q: %v", a.InsertedAt, err)
	}
	// The raw JSON has every field, attachments and metadata never null.
	r := e.do("POST", "/api/v1/conversations/"+s.conv+"/activities",
		map[string]any{"type": "event", "sender": "agent-7", "attachments": []any{map[string]any{"contentType": "image/png"}},
			"metadata": map[string]any{"k": []int{1, 2}}, "text": nil}, apiKey(s.key))
	var raw map[string]map[string]any
	r.json(t, &raw)
	for _, k := range []string{"id", "type", "sender", "text", "attachments", "metadata", "seq", "conversation_id", "tenant_id", "inserted_at"} {
		if v, ok := raw["data"][k]; !ok || v == nil {
			t.Fatalf("field %s missing or null in %s", k, r.body)
		}
	}
	var b tenantActivity
	r.data(t, 201, &b)
	if b.Type != "event" || b.Sender != "agent-7" || b.Seq != 2 || string(b.Attachments) != `[{"contentType":"image/png"}]` ||
		string(b.Metadata) != `{"k":[1,2]}` {
		t.Fatalf("created %+v", b)
	}

	// Idempotency: a repeated key answers the original with 201, whatever the body.
	h := withHeader(apiKey(s.key), "x-idempotency-key", "order-1")
	var first, again tenantActivity
	e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", map[string]any{"text": "once"}, h).data(t, 201, &first)
	e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", map[string]any{"text": "twice"}, h).data(t, 201, &again)
	if first.ID != again.ID || again.Text != "once" || again.Seq != 3 {
		t.Fatalf("repeat %+v of %+v", again, first)
	}
	// The key is per conversation.
	other := e.conversation(s.key, s.channelID)
	var elsewhere tenantActivity
	e.do("POST", "/api/v1/conversations/"+other.ID+"/activities", map[string]any{"text": "once"}, h).data(t, 201, &elsewhere)
	if elsewhere.ID == first.ID {
		t.Fatal("an idempotency key crossed conversations")
	}
	// Keys are bounded and printable.
	for _, k := range []string{strings.Repeat("k", 256), "a\tb", "a\xffb"} {
		d := e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", map[string]any{"text": "x"},
			withHeader(apiKey(s.key), "x-idempotency-key", k)).errorCode(t, 422, "validation_failed")
		if fields, _ := d["fields"].(map[string]any); fields["x-idempotency-key"] == nil {
			t.Fatalf("details %v", d)
		}
	}
	e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", map[string]any{"text": "x"},
		withHeader(apiKey(s.key), "x-idempotency-key", strings.Repeat("k", 255))).data(t, 201, &b)

	// Missing and malformed conversations.
	e.do("POST", "/api/v1/conversations/"+missingID+"/activities", map[string]any{"text": "x"}, apiKey(s.key)).errorCode(t, 404, "not_found")
	e.do("POST", "/api/v1/conversations/nope/activities", map[string]any{"text": "x"}, apiKey(s.key)).errorCode(t, 404, "not_found")
	e.do("GET", "/api/v1/conversations/"+missingID+"/activities", nil, apiKey(s.key)).errorCode(t, 404, "not_found")

	// Bodies that are no object, and strings PostgreSQL cannot store, are 422, never 500.
	for _, tc := range []struct{ body, field string }{
		{`[]`, "body"},
		{`nope`, "body"},
		{`{"text":5}`, "text"},
		{`{"attachments":{}}`, "attachments"},
		{`{"text":"a\u0000b"}`, "text"},
		{`{"metadata":{"a\u0000":1}}`, "metadata"},
		{`{"attachments":[{"x":"\u0000"}]}`, "attachments"},
		{`{"metadata":{"n":1e999999}}`, "metadata"},
	} {
		d := e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", tc.body, apiKey(s.key)).errorCode(t, 422, "validation_failed")
		if fields, _ := d["fields"].(map[string]any); fields[tc.field] == nil {
			t.Fatalf("%s: details %v, want field %s", tc.body, d, tc.field)
		}
	}
	// A lone surrogate is stored as U+FFFD rather than refused by jsonb; a NUL-bearing
	// sender falls back to "user".
	var lone tenantActivity
	e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", `{"metadata":{"s":"\ud800"},"sender":"a\u0000"}`, apiKey(s.key)).data(t, 201, &lone)
	if string(lone.Metadata) != `{"s":"`+"\uFFFD"+`"}` || lone.Sender != "user" {
		t.Fatalf("stored %+v", lone)
	}
}

func TestTenantListActivities(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	for i := 1; i <= 5; i++ {
		e.post(s.key, s.conv, map[string]any{"text": fmt.Sprint(i)})
	}
	all := e.list(s.key, s.conv, "")
	if len(all.Data) != 5 || all.Meta.HasMore || all.Meta.Limit != 100 {
		t.Fatalf("list %+v", all.Meta)
	}
	for i, a := range all.Data {
		if a.Seq != int64(i+1) || a.Text != fmt.Sprint(i+1) {
			t.Fatalf("item %d: %+v", i, a)
		}
	}
	// Paging with the watermark.
	p1 := e.list(s.key, s.conv, "?limit=2")
	if len(p1.Data) != 2 || !p1.Meta.HasMore || p1.Meta.Limit != 2 || p1.Data[1].Seq != 2 {
		t.Fatalf("page 1 %+v", p1)
	}
	p2 := e.list(s.key, s.conv, "?limit=2&watermark="+p1.Meta.Watermark)
	if len(p2.Data) != 2 || !p2.Meta.HasMore || p2.Data[0].Seq != 3 {
		t.Fatalf("page 2 %+v", p2)
	}
	p3 := e.list(s.key, s.conv, "?limit=2&watermark="+p2.Meta.Watermark)
	if len(p3.Data) != 1 || p3.Meta.HasMore || p3.Data[0].Seq != 5 || p3.Meta.Watermark != all.Meta.Watermark {
		t.Fatalf("page 3 %+v", p3)
	}
	// An empty page echoes the watermark sent.
	empty := e.list(s.key, s.conv, "?watermark="+p3.Meta.Watermark)
	if len(empty.Data) != 0 || empty.Meta.Watermark != p3.Meta.Watermark || empty.Meta.HasMore {
		t.Fatalf("empty page %+v", empty)
	}
	// The watermark is opaque: not the bare seq.
	if p1.Meta.Watermark == "2" || strings.Contains(p1.Meta.Watermark, "seq") {
		t.Fatalf("watermark %q is not opaque", p1.Meta.Watermark)
	}
	// A new activity appears after the watermark.
	e.post(s.key, s.conv, map[string]any{"text": "6"})
	if l := e.list(s.key, s.conv, "?watermark="+p3.Meta.Watermark); len(l.Data) != 1 || l.Data[0].Text != "6" {
		t.Fatalf("after the watermark: %+v", l)
	}
	// The limit is capped.
	if l := e.list(s.key, s.conv, "?limit=5000"); l.Meta.Limit != 1000 {
		t.Fatalf("limit %d, want 1000", l.Meta.Limit)
	}
	// Malformed watermarks are 400.
	for _, q := range []string{"?watermark=nope!", "?watermark=MTI", "?watermark=c2VxOi0x", "?watermark=" + strings.Repeat("A", 100)} {
		e.do("GET", "/api/v1/conversations/"+s.conv+"/activities"+q, nil, apiKey(s.key)).errorCode(t, 400, "bad_request")
	}
	// An empty conversation answers an empty list, never null.
	fresh := e.conversation(s.key, s.channelID)
	r := e.do("GET", "/api/v1/conversations/"+fresh.ID+"/activities", nil, apiKey(s.key))
	if r.status != 200 || !bytes.Contains(r.body, []byte(`"data":[]`)) {
		t.Fatalf("empty list %d %s", r.status, r.body)
	}
}

func TestLegacyToken(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	r := e.do("POST", "/api/v1/tokens", map[string]any{"conversation_id": s.conv, "user_id": "alice"}, apiKey(s.key))
	var body struct {
		Token     string `json:"token"`
		ExpiresIn int    `json:"expires_in"`
	}
	r.json(t, &body)
	if r.status != 201 || body.ExpiresIn != 3600 || body.Token == "" {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	if r.header.Get("Deprecation") != "@1796083200" || !strings.Contains(r.header.Get("Link"), `rel="successor-version"`) ||
		!strings.Contains(r.header.Get("Link"), "</api/v1/converger/tokens/generate>") {
		t.Fatalf("headers Deprecation %q Link %q", r.header.Get("Deprecation"), r.header.Get("Link"))
	}
	cl, err := e.verifier().VerifyLegacy(body.Token)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Subject != "alice" || cl.ConversationID != s.conv || cl.TenantID != s.tenantID {
		t.Fatalf("claims %+v", cl)
	}
	if exp := cl.ExpiresAt.Sub(cl.IssuedAt.Time); exp != time.Hour {
		t.Fatalf("lifetime %v", exp)
	}
	// It is no Converger token: the client API refuses it.
	e.do("POST", "/api/v1/converger/tokens/refresh", nil, map[string]string{"authorization": "Bearer " + body.Token}).
		errorCode(t, 403, "forbidden")
	// Without a user.
	var anon struct {
		Token string `json:"token"`
	}
	e.do("POST", "/api/v1/tokens", map[string]any{"conversation_id": s.conv}, apiKey(s.key)).json(t, &anon)
	if cl, err := e.verifier().VerifyLegacy(anon.Token); err != nil || cl.Subject != "" {
		t.Fatalf("anonymous token: %+v %v", cl, err)
	}
	for _, tc := range []struct {
		body  any
		field string
	}{
		{map[string]any{}, "conversation_id"},
		{map[string]any{"conversation_id": 1}, "conversation_id"},
		{map[string]any{"conversation_id": s.conv, "user_id": 5}, "user_id"},
		{map[string]any{"conversation_id": s.conv, "user_id": strings.Repeat("u", 257)}, "user_id"},
	} {
		d := e.do("POST", "/api/v1/tokens", tc.body, apiKey(s.key)).errorCode(t, 422, "validation_failed")
		if fields, _ := d["fields"].(map[string]any); fields[tc.field] == nil {
			t.Fatalf("%v: details %v", tc.body, d)
		}
	}
	e.do("POST", "/api/v1/tokens", map[string]any{"conversation_id": missingID}, apiKey(s.key)).errorCode(t, 404, "not_found")
}

// Another tenant's conversation answers every tenant endpoint exactly like a missing one.
func TestTenantOtherTenantLooksMissing(t *testing.T) {
	e := newEnv(t, envOptions{})
	mine := e.setup("webhook")
	theirs := e.setup("webhook")
	e.post(theirs.key, theirs.conv, map[string]any{"text": "secret"})
	for _, ep := range []struct {
		method, path string
		body         func(id string) any
	}{
		{"GET", "/api/v1/conversations/%s", nil},
		{"POST", "/api/v1/conversations/%s/close", nil},
		{"POST", "/api/v1/conversations/%s/reopen", nil},
		{"POST", "/api/v1/conversations/%s/activities", func(string) any { return map[string]any{"text": "x"} }},
		{"GET", "/api/v1/conversations/%s/activities", nil},
		{"POST", "/api/v1/tokens", func(id string) any { return map[string]any{"conversation_id": id} }},
	} {
		call := func(id string) response {
			var body any
			if ep.body != nil {
				body = ep.body(id)
			}
			path := ep.path
			if strings.Contains(path, "%s") {
				path = fmt.Sprintf(path, id)
			}
			return e.do(ep.method, path, body, apiKey(mine.key))
		}
		missing := call(missingID)
		missing.errorCode(t, 404, "not_found")
		sameAnswer(t, ep.method+" "+ep.path, missing, call(theirs.conv))
	}
	// Nothing of theirs changed.
	var c tenantConversation
	e.do("GET", "/api/v1/conversations/"+theirs.conv, nil, apiKey(theirs.key)).data(t, 200, &c)
	if c.Status != "active" || c.LastSeq != 1 {
		t.Fatalf("their conversation %+v", c)
	}
}
