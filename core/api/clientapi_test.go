package api_test

import (
	"encoding/json"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/token"
)

func bearerHeader(cred string) map[string]string {
	return map[string]string{"authorization": "Bearer " + cred}
}

type tokenAnswer struct {
	ConversationID *string `json:"conversationId"`
	Token          string  `json:"token"`
	ExpiresIn      int     `json:"expires_in"`
}

type conversationAnswer struct {
	ConversationID string `json:"conversationId"`
	Token          string `json:"token"`
	ExpiresIn      int    `json:"expires_in"`
	StreamURL      string `json:"streamUrl"`
}

// clientActivity is the client API's (Direct Line) activity.
type clientActivity struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	From struct {
		ID string `json:"id"`
	} `json:"from"`
	Text           string          `json:"text"`
	Timestamp      string          `json:"timestamp"`
	Attachments    json.RawMessage `json:"attachments"`
	ConversationID string          `json:"conversationId"`
	ChannelData    json.RawMessage `json:"channelData"`
}

type dlList struct {
	Activities []clientActivity `json:"activities"`
	Watermark  string           `json:"watermark"`
	HasMore    bool             `json:"has_more"`
}

// answer decodes a successful answer after checking its status.
func (r response) answer(t *testing.T, status int, v any) {
	t.Helper()
	if r.status != status {
		t.Fatalf("got %d %s, want %d", r.status, r.body, status)
	}
	r.json(t, v)
}

// clientToken generates an unbound token from a channel secret.
func (e *env) clientToken(secret string, body any) tokenAnswer {
	e.t.Helper()
	var a tokenAnswer
	e.do("POST", "/api/v1/converger/tokens/generate", body, bearerHeader(secret)).answer(e.t, 200, &a)
	return a
}

// startConversation starts a conversation with a token.
func (e *env) startConversation(tok string) conversationAnswer {
	e.t.Helper()
	var a conversationAnswer
	e.do("POST", "/api/v1/converger/conversations", nil, bearerHeader(tok)).answer(e.t, 201, &a)
	return a
}

// dlPost posts a Direct Line activity and returns its id.
func (e *env) dlPost(tok, convID string, body any) string {
	e.t.Helper()
	var a struct {
		ID string `json:"id"`
	}
	e.do("POST", "/api/v1/converger/conversations/"+convID+"/activities", body, bearerHeader(tok)).answer(e.t, 200, &a)
	if a.ID == "" {
		e.t.Fatal("no id")
	}
	return a.ID
}

// dlList lists a conversation's activities through the client API.
func (e *env) dlList(tok, convID, query string) dlList {
	e.t.Helper()
	var l dlList
	e.do("GET", "/api/v1/converger/conversations/"+convID+"/activities"+query, nil, bearerHeader(tok)).answer(e.t, 200, &l)
	return l
}

func TestClientGenerateToken(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	v := e.verifier()

	r := e.do("POST", "/api/v1/converger/tokens/generate", nil, bearerHeader(s.secret))
	if r.status != 200 || !strings.Contains(string(r.body), `"conversationId":null`) {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	var a tokenAnswer
	r.json(t, &a)
	if a.ExpiresIn != 1800 || a.ConversationID != nil {
		t.Fatalf("answer %+v", a)
	}
	cl, err := v.Verify(a.Token)
	if err != nil {
		t.Fatal(err)
	}
	if cl.TenantID != s.tenantID || cl.ChannelID != s.channelID || cl.ConversationID != "" || cl.UserID != "" || cl.Src != token.SrcSecret {
		t.Fatalf("claims %+v", cl)
	}
	// With a user.
	a = e.clientToken(s.secret, map[string]any{"user": map[string]any{"id": "dl_alice", "name": "Alice"}})
	if cl, err := v.Verify(a.Token); err != nil || cl.UserID != "dl_alice" {
		t.Fatalf("claims %+v %v", cl, err)
	}
	// Bad credentials are 403, a token in place of a secret 400.
	for _, h := range []map[string]string{nil, bearerHeader("nope"), bearerHeader(s.publishable), {"authorization": "Basic " + s.secret},
		bearerHeader(strings.Repeat("s", 300))} {
		e.do("POST", "/api/v1/converger/tokens/generate", nil, h).errorCode(t, 403, "forbidden")
	}
	e.do("POST", "/api/v1/converger/tokens/generate", nil, bearerHeader(a.Token)).errorCode(t, 400, "bad_request")
	// Bodies.
	e.do("POST", "/api/v1/converger/tokens/generate", "nope", bearerHeader(s.secret)).errorCode(t, 400, "bad_request")
	for _, tc := range []struct {
		body  any
		field string
	}{
		{map[string]any{"user": "alice"}, "user"},
		{map[string]any{"user": map[string]any{"id": 5}}, "user.id"},
		{map[string]any{"user": map[string]any{"id": strings.Repeat("u", 257)}}, "user.id"},
	} {
		d := e.do("POST", "/api/v1/converger/tokens/generate", tc.body, bearerHeader(s.secret)).errorCode(t, 422, "validation_failed")
		if fields, _ := d["fields"].(map[string]any); fields[tc.field] == nil {
			t.Fatalf("%v: details %v", tc.body, d)
		}
	}
	// An inactive channel, or a channel of an inactive tenant, issues nothing.
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, s.channelID)
	e.do("POST", "/api/v1/converger/tokens/generate", nil, bearerHeader(s.secret)).errorCode(t, 403, "forbidden")
	e.exec(`UPDATE channels SET status = 'active' WHERE id = $1`, s.channelID)
	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, s.tenantID)
	e.do("POST", "/api/v1/converger/tokens/generate", nil, bearerHeader(s.secret)).errorCode(t, 403, "forbidden")
}

func TestClientPublishableAndRefresh(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	v := e.verifier()

	var pub tokenAnswer
	e.do("POST", "/api/v1/converger/tokens/publishable", map[string]any{"user": map[string]any{"id": "web-1"}},
		bearerHeader(s.publishable)).answer(t, 200, &pub)
	cl, err := v.Verify(pub.Token)
	if err != nil || cl.Src != token.SrcPublishable || cl.ChannelID != s.channelID || cl.UserID != "web-1" || pub.ExpiresIn != 1800 {
		t.Fatalf("publishable: %+v %+v %v", pub, cl, err)
	}
	e.do("POST", "/api/v1/converger/tokens/publishable", nil, bearerHeader(s.secret)).errorCode(t, 403, "forbidden")
	e.do("POST", "/api/v1/converger/tokens/publishable", nil, nil).errorCode(t, 403, "forbidden")
	e.do("POST", "/api/v1/converger/tokens/publishable", nil, bearerHeader(pub.Token)).errorCode(t, 400, "bad_request")

	// Refreshing an unbound token keeps every claim but the times and id.
	var ref tokenAnswer
	e.do("POST", "/api/v1/converger/tokens/refresh", nil, bearerHeader(pub.Token)).answer(t, 200, &ref)
	rc, err := v.Verify(ref.Token)
	if err != nil || ref.ConversationID != nil || ref.ExpiresIn != 1800 {
		t.Fatalf("refresh: %+v %v", ref, err)
	}
	if rc.TenantID != cl.TenantID || rc.ChannelID != cl.ChannelID || rc.UserID != "web-1" || rc.Src != token.SrcPublishable ||
		rc.ConversationID != "" || rc.ID == cl.ID {
		t.Fatalf("refreshed claims %+v of %+v", rc, cl)
	}
	// A bound token stays bound, and the answer names its conversation.
	conv := e.startConversation(pub.Token)
	e.do("POST", "/api/v1/converger/tokens/refresh", nil, bearerHeader(conv.Token)).answer(t, 200, &ref)
	rc, err = v.Verify(ref.Token)
	if err != nil || ref.ConversationID == nil || *ref.ConversationID != conv.ConversationID || rc.ConversationID != conv.ConversationID ||
		rc.UserID != "web-1" || rc.Src != token.SrcPublishable {
		t.Fatalf("refresh of a bound token: %+v %+v %v", ref, rc, err)
	}
	// The refreshed token works.
	e.dlPost(ref.Token, conv.ConversationID, map[string]any{"type": "message", "text": "hi"})
	// Refresh wants a token.
	e.do("POST", "/api/v1/converger/tokens/refresh", nil, bearerHeader(s.secret)).errorCode(t, 403, "forbidden")
	e.do("POST", "/api/v1/converger/tokens/refresh", nil, nil).errorCode(t, 403, "forbidden")
}

func TestClientConversations(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	v := e.verifier()
	unbound := e.clientToken(s.secret, map[string]any{"user": map[string]any{"id": "alice"}})

	// Any body is accepted.
	var c conversationAnswer
	e.do("POST", "/api/v1/converger/conversations", `{"whatever":[1,2]}`, bearerHeader(unbound.Token)).answer(t, 201, &c)
	cl, err := v.Verify(c.Token)
	if err != nil || cl.ConversationID != c.ConversationID || cl.UserID != "alice" || cl.Src != token.SrcSecret || c.ExpiresIn != 1800 {
		t.Fatalf("start: %+v %+v %v", c, cl, err)
	}
	want := "ws" + strings.TrimPrefix(e.base, "http") + "/api/v1/converger/conversations/" + c.ConversationID + "/stream?t=" + url.QueryEscape(c.Token)
	if c.StreamURL != want {
		t.Fatalf("streamUrl %q, want %q", c.StreamURL, want)
	}
	// The conversation is on the token's channel, as the tenant API sees it.
	var tc tenantConversation
	e.do("GET", "/api/v1/conversations/"+c.ConversationID, nil, apiKey(s.key)).data(t, 200, &tc)
	if tc.ChannelID != s.channelID || tc.Status != "active" {
		t.Fatalf("conversation %+v", tc)
	}
	// Starting with a bound token answers its own conversation.
	var again conversationAnswer
	e.do("POST", "/api/v1/converger/conversations", nil, bearerHeader(c.Token)).answer(t, 200, &again)
	if again.ConversationID != c.ConversationID || again.Token == "" || !strings.Contains(again.StreamURL, c.ConversationID) {
		t.Fatalf("start with a bound token: %+v", again)
	}
	// Two starts with an unbound token are two conversations.
	if other := e.startConversation(unbound.Token); other.ConversationID == c.ConversationID {
		t.Fatal("one conversation for two starts")
	}

	// Reconnect: a new bound token and streamUrl, the watermark carried over.
	id := e.dlPost(c.Token, c.ConversationID, map[string]any{"type": "message", "text": "hi"})
	l := e.dlList(c.Token, c.ConversationID, "")
	if len(l.Activities) != 1 || l.Activities[0].ID != id {
		t.Fatalf("list %+v", l)
	}
	for _, tok := range []string{c.Token, unbound.Token} {
		var rc conversationAnswer
		e.do("GET", "/api/v1/converger/conversations/"+c.ConversationID+"?watermark="+l.Watermark, nil, bearerHeader(tok)).answer(t, 200, &rc)
		rcl, err := v.Verify(rc.Token)
		if err != nil || rc.ConversationID != c.ConversationID || rcl.ConversationID != c.ConversationID || rcl.UserID != "alice" {
			t.Fatalf("reconnect: %+v %+v %v", rc, rcl, err)
		}
		u, err := url.Parse(rc.StreamURL)
		if err != nil || u.Query().Get("t") != rc.Token || u.Query().Get("watermark") != l.Watermark ||
			u.Path != "/api/v1/converger/conversations/"+c.ConversationID+"/stream" {
			t.Fatalf("streamUrl %q", rc.StreamURL)
		}
	}
	// An invalid watermark is not carried.
	var rc conversationAnswer
	e.do("GET", "/api/v1/converger/conversations/"+c.ConversationID+"?watermark=bogus", nil, bearerHeader(c.Token)).answer(t, 200, &rc)
	if strings.Contains(rc.StreamURL, "watermark") {
		t.Fatalf("streamUrl %q carries an invalid watermark", rc.StreamURL)
	}
}

func TestClientActivities(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)
	tok, id := conv.Token, conv.ConversationID

	// What botframework-directlinejs and Web Chat post.
	channelData := `{"clientActivityID":"1700000000000-abc","clientTimestamp":"2026-01-01T00:00:00.000Z","nested":{"n":1.5,"list":[true,null,"x"]}}`
	body := `{"type":"message","id":"client-chosen","from":{"id":"dl_user","name":"You","role":"user"},"locale":"en-US",` +
		`"text":"hello","textFormat":"plain","timestamp":"2001-01-01T00:00:00.000Z","channelData":` + channelData + `}`
	posted := e.dlPost(tok, id, body)
	if posted == "client-chosen" {
		t.Fatal("the client chose the id")
	}

	r := e.do("GET", "/api/v1/converger/conversations/"+id+"/activities", nil, bearerHeader(tok))
	var l dlList
	r.answer(t, 200, &l)
	if len(l.Activities) != 1 || l.HasMore || l.Watermark == "" {
		t.Fatalf("list %s", r.body)
	}
	a := l.Activities[0]
	if a.ID != posted || a.Type != "message" || a.From.ID != "dl_user" || a.Text != "hello" || a.ConversationID != id ||
		string(a.Attachments) != "[]" {
		t.Fatalf("activity %+v", a)
	}
	ts, err := time.Parse(time.RFC3339Nano, a.Timestamp)
	if err != nil || !strings.HasSuffix(a.Timestamp, "Z") || len(a.Timestamp) != len("2006-01-02T15:04:05.000Z") || time.Since(ts) > time.Minute {
		t.Fatalf("timestamp %q: %v", a.Timestamp, err)
	}
	var want, got any
	_ = json.Unmarshal([]byte(channelData), &want)
	_ = json.Unmarshal(a.ChannelData, &got)
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("channelData %s, want %s", a.ChannelData, channelData)
	}
	// The raw shape: camelCase, the Direct Line keys, nothing null.
	var raw struct {
		Activities []map[string]any `json:"activities"`
	}
	r.json(t, &raw)
	for _, k := range []string{"id", "type", "from", "text", "timestamp", "attachments", "conversationId", "channelData"} {
		if v, ok := raw.Activities[0][k]; !ok || v == nil {
			t.Fatalf("key %s missing or null in %s", k, r.body)
		}
	}

	// Defaults: from.id "user"; metadata accepted when channelData is absent.
	e.dlPost(tok, id, map[string]any{"type": "event", "metadata": map[string]any{"m": 1}})
	// The tenant API sees the same activities.
	tl := e.list(s.key, id, "")
	if len(tl.Data) != 2 || tl.Data[0].ID != posted || tl.Data[0].Sender != "dl_user" || tl.Data[1].Sender != "user" ||
		string(tl.Data[1].Metadata) != `{"m":1}` {
		t.Fatalf("tenant view %+v", tl.Data)
	}

	// Watermarks: paging, an empty page echoes, an invalid or empty one starts over.
	for i := 0; i < 3; i++ {
		e.dlPost(tok, id, map[string]any{"type": "message", "text": "more"})
	}
	p1 := e.dlList(tok, id, "?limit=2")
	if len(p1.Activities) != 2 || !p1.HasMore || p1.Activities[0].ID != posted {
		t.Fatalf("page 1 %+v", p1)
	}
	p2 := e.dlList(tok, id, "?limit=1000&watermark="+p1.Watermark)
	if len(p2.Activities) != 3 || p2.HasMore {
		t.Fatalf("page 2 %+v", p2)
	}
	if p3 := e.dlList(tok, id, "?watermark="+p2.Watermark); len(p3.Activities) != 0 || p3.Watermark != p2.Watermark {
		t.Fatalf("empty page %+v", p3)
	}
	// The tenant API's and the client API's watermarks are the same.
	if tl := e.list(s.key, id, "?watermark="+p1.Watermark); len(tl.Data) != 3 || tl.Meta.Watermark != p2.Watermark {
		t.Fatalf("tenant list after a client watermark: %+v", tl.Meta)
	}
	for _, q := range []string{"?watermark=", "?watermark=bogus!", "?watermark=" + strings.Repeat("A", 200), "?limit=x"} {
		if l := e.dlList(tok, id, q); len(l.Activities) != 5 || l.Activities[0].ID != posted {
			t.Fatalf("%s: %d activities", q, len(l.Activities))
		}
	}
	// An empty conversation lists [], never null.
	fresh := e.startConversation(e.clientToken(s.secret, nil).Token)
	r = e.do("GET", "/api/v1/converger/conversations/"+fresh.ConversationID+"/activities", nil, bearerHeader(fresh.Token))
	if r.status != 200 || !strings.Contains(string(r.body), `"activities":[]`) {
		t.Fatalf("empty list %d %s", r.status, r.body)
	}

	// Idempotency through the header.
	h := map[string]string{"authorization": "Bearer " + tok, "x-idempotency-key": "k1"}
	var first, second struct {
		ID string `json:"id"`
	}
	e.do("POST", "/api/v1/converger/conversations/"+id+"/activities", map[string]any{"type": "message", "text": "a"}, h).answer(t, 200, &first)
	e.do("POST", "/api/v1/converger/conversations/"+id+"/activities", map[string]any{"type": "message", "text": "b"}, h).answer(t, 200, &second)
	if first.ID != second.ID {
		t.Fatalf("ids %s and %s for one key", first.ID, second.ID)
	}

	// Field errors name the field the client sent.
	for _, tc := range []struct {
		body  any
		field string
	}{
		{map[string]any{"type": "invoke"}, "type"},
		{map[string]any{"type": "message", "channelData": "x"}, "channelData"},
		{map[string]any{"type": "message", "metadata": "x"}, "metadata"},
		{"[]", "body"},
	} {
		d := e.do("POST", "/api/v1/converger/conversations/"+id+"/activities", tc.body, bearerHeader(tok)).errorCode(t, 422, "validation_failed")
		if fields, _ := d["fields"].(map[string]any); fields[tc.field] == nil {
			t.Fatalf("%v: details %v", tc.body, d)
		}
	}
}

// A bound token touches only its own conversation: any other is 403 "The token does not
// grant access to this conversation.". An unbound one touches only its channel's: any
// other conversation — another channel's, another tenant's, a malformed id — answers
// exactly like a missing one, 404 not_found (Direct Line clients take 403 as "token
// expired").
func TestClientTokenScope(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	unbound := e.clientToken(s.secret, nil).Token
	a := e.startConversation(unbound)
	b := e.startConversation(unbound)
	// Another channel of the same tenant, and another tenant.
	otherCh, otherSec := e.channel(s.tenantID, "webhook")
	otherChConv := e.startConversation(e.clientToken(otherSec.Secret, nil).Token)
	other := e.setup("webhook")

	type call struct{ method, path, body string }
	calls := func(id string) []call {
		return []call{
			{"GET", "/api/v1/converger/conversations/" + id, ""},
			{"POST", "/api/v1/converger/conversations/" + id + "/activities", `{"type":"message","text":"x"}`},
			{"GET", "/api/v1/converger/conversations/" + id + "/activities", ""},
			{"POST", "/api/v1/converger/conversations/" + id + "/upload", ""},
		}
	}
	do := func(tok string, c call) response {
		var body any
		if c.body != "" {
			body = c.body
		}
		return e.do(c.method, c.path, body, bearerHeader(tok))
	}
	for i, c := range calls(missingID) {
		missing := do(unbound, c)
		if missing.status != 404 || missing.header.Get("content-type") != "application/json" ||
			!strings.HasPrefix(string(missing.body), `{"error":{"code":"not_found","message":"Not found.","details":{},"request_id":"`) {
			t.Fatalf("unbound %s %s on a missing conversation: %d %s %s", c.method, c.path, missing.status,
				missing.header.Get("content-type"), missing.body)
		}
		// The unbound token on another channel's and another tenant's conversation, and
		// on a malformed id.
		for _, id := range []string{otherChConv.ConversationID, other.conv, "nope"} {
			sameAnswer(t, "unbound "+c.method+" "+c.path, missing, do(unbound, calls(id)[i]))
		}
		// A's bound token on B, on another channel's and another tenant's conversation,
		// on a missing one and on a malformed id.
		foreign := do(a.Token, calls(b.ConversationID)[i])
		foreign.errorCode(t, 403, "forbidden")
		if !strings.Contains(string(foreign.body), `"message":"The token does not grant access to this conversation."`) {
			t.Fatalf("bound %s %s on another conversation: %s", c.method, c.path, foreign.body)
		}
		for _, id := range []string{otherChConv.ConversationID, other.conv, missingID, "nope"} {
			sameAnswer(t, "bound "+c.method+" "+c.path, foreign, do(a.Token, calls(id)[i]))
		}
		if c.method == "POST" && strings.HasSuffix(c.path, "/upload") {
			continue // no multipart body here; uploads are tested with files elsewhere
		}
		// The unbound token on its channel's conversations, and the bound one on its own.
		if r := do(unbound, calls(b.ConversationID)[i]); r.status != 200 {
			t.Fatalf("unbound on its channel: %d %s", r.status, r.body)
		}
		if r := do(a.Token, calls(a.ConversationID)[i]); r.status != 200 {
			t.Fatalf("bound on its own: %d %s", r.status, r.body)
		}
	}
	_ = otherCh
	// Nothing was written where the tokens had no business.
	if n := e.count(`SELECT count(*) FROM activities WHERE conversation_id = ANY($1::uuid[])`,
		[]string{otherChConv.ConversationID, other.conv}); n != 0 {
		t.Fatalf("%d activities written through foreign tokens", n)
	}
}

// An invalid or expired token is 403 on every client endpoint; so is a token of a
// channel that was deactivated since.
func TestClientInvalidTokens(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)

	expired, err := e.signer.Issue(token.Claims{TenantID: s.tenantID, ChannelID: s.channelID, ConversationID: conv.ConversationID,
		Src: token.SrcSecret}, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _ := token.GenerateKey()
	otherSigner, _ := token.ParseSigningKey(otherKey)
	forged, _ := otherSigner.Issue(token.Claims{TenantID: s.tenantID, ChannelID: s.channelID, ConversationID: conv.ConversationID,
		Src: token.SrcSecret}, time.Now())
	legacy, _ := e.signer.IssueLegacy(conv.ConversationID, s.tenantID, "u", time.Now())
	// A token naming a channel of another tenant.
	other := e.setup("webhook")
	mixed, _ := e.signer.Issue(token.Claims{TenantID: s.tenantID, ChannelID: other.channelID, Src: token.SrcSecret}, time.Now())

	paths := []struct{ method, path string }{
		{"POST", "/api/v1/converger/tokens/refresh"},
		{"POST", "/api/v1/converger/conversations"},
		{"GET", "/api/v1/converger/conversations/" + conv.ConversationID},
		{"POST", "/api/v1/converger/conversations/" + conv.ConversationID + "/activities"},
		{"GET", "/api/v1/converger/conversations/" + conv.ConversationID + "/activities"},
	}
	for _, p := range paths {
		for name, h := range map[string]map[string]string{
			"none": nil, "garbage": bearerHeader("x.y.z"), "expired": bearerHeader(expired), "forged": bearerHeader(forged),
			"legacy": bearerHeader(legacy), "secret": bearerHeader(s.secret), "mixed": bearerHeader(mixed),
			"long": bearerHeader(strings.Repeat("a", 3000)),
		} {
			r := e.do(p.method, p.path, `{"type":"message","text":"x"}`, h)
			if r.status != 403 {
				t.Fatalf("%s %s with a %s token: %d %s", p.method, p.path, name, r.status, r.body)
			}
			r.errorCode(t, 403, "forbidden")
		}
	}
	// A channel deactivated after the token was issued.
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, s.channelID)
	for _, p := range paths {
		e.do(p.method, p.path, `{"type":"message","text":"x"}`, bearerHeader(conv.Token)).errorCode(t, 403, "forbidden")
	}
	if n := e.count(`SELECT count(*) FROM activities`); n != 0 {
		t.Fatalf("%d activities written with invalid tokens", n)
	}
}

// A closed conversation refuses every write path with 409; reads go on.
func TestClosedConversationRefusesWrites(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("echo")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)
	h := map[string]string{"authorization": "Bearer " + conv.Token, "x-idempotency-key": "before-close"}
	var before struct {
		ID string `json:"id"`
	}
	e.do("POST", "/api/v1/converger/conversations/"+conv.ConversationID+"/activities", map[string]any{"type": "message", "text": "hi"}, h).
		answer(t, 200, &before)
	e.do("POST", "/api/v1/conversations/"+conv.ConversationID+"/close", nil, apiKey(s.key)).data(t, 200, &tenantConversation{})

	e.do("POST", "/api/v1/conversations/"+conv.ConversationID+"/activities", map[string]any{"text": "x"}, apiKey(s.key)).
		errorCode(t, 409, "conversation_closed")
	e.do("POST", "/api/v1/converger/conversations/"+conv.ConversationID+"/activities", map[string]any{"type": "message", "text": "x"},
		bearerHeader(conv.Token)).errorCode(t, 409, "conversation_closed")
	// Validation still comes first.
	e.do("POST", "/api/v1/converger/conversations/"+conv.ConversationID+"/activities", map[string]any{"type": "nope"},
		bearerHeader(conv.Token)).errorCode(t, 422, "validation_failed")
	// A repeat of an activity stored before the close answers the original.
	var again struct {
		ID string `json:"id"`
	}
	e.do("POST", "/api/v1/converger/conversations/"+conv.ConversationID+"/activities", map[string]any{"type": "message", "text": "hi"}, h).
		answer(t, 200, &again)
	if again.ID != before.ID {
		t.Fatalf("repeat after close: %s, want %s", again.ID, before.ID)
	}
	// Reads and reconnects go on.
	if l := e.dlList(conv.Token, conv.ConversationID, ""); len(l.Activities) != 3 {
		t.Fatalf("closed conversation lists %d activities, want message, echo, close", len(l.Activities))
	}
	var rc conversationAnswer
	e.do("GET", "/api/v1/converger/conversations/"+conv.ConversationID, nil, bearerHeader(conv.Token)).answer(t, 200, &rc)
	// Reopened, it takes writes again.
	e.do("POST", "/api/v1/conversations/"+conv.ConversationID+"/reopen", nil, apiKey(s.key)).data(t, 200, &tenantConversation{})
	e.dlPost(conv.Token, conv.ConversationID, map[string]any{"type": "message", "text": "back"})
}

// An echo channel answers each user message with "echo: <text>" from "bot", right
// after it, through both APIs; never its own messages, the system's or other types.
func TestEchoChannel(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("echo")
	conv := e.startConversation(e.clientToken(s.secret, map[string]any{"user": map[string]any{"id": "alice"}}).Token)
	id := conv.ConversationID

	e.dlPost(conv.Token, id, map[string]any{"type": "message", "text": "hi", "from": map[string]any{"id": "alice"}})
	e.post(s.key, id, map[string]any{"text": "from the tenant", "sender": "agent"})
	e.dlPost(conv.Token, id, map[string]any{"type": "typing"})
	e.dlPost(conv.Token, id, map[string]any{"type": "event", "text": "ev"})
	e.post(s.key, id, map[string]any{"text": "bot says", "sender": "bot"})
	e.dlPost(conv.Token, id, map[string]any{"type": "message", "text": "héllo <b>&</b>"})
	// A repeat (idempotency) is not echoed again.
	h := map[string]string{"authorization": "Bearer " + conv.Token, "x-idempotency-key": "once"}
	for range 2 {
		var a struct {
			ID string `json:"id"`
		}
		e.do("POST", "/api/v1/converger/conversations/"+id+"/activities", map[string]any{"type": "message", "text": "once"}, h).answer(t, 200, &a)
	}
	// The system's lifecycle activities are not echoed.
	e.do("POST", "/api/v1/conversations/"+id+"/close", nil, apiKey(s.key)).data(t, 200, &tenantConversation{})
	e.do("POST", "/api/v1/conversations/"+id+"/reopen", nil, apiKey(s.key)).data(t, 200, &tenantConversation{})

	l := e.dlList(conv.Token, id, "")
	var got []string
	for _, a := range l.Activities {
		got = append(got, a.From.ID+" "+a.Type+" "+a.Text)
	}
	want := []string{
		"alice message hi",
		"bot message echo: hi",
		"agent message from the tenant",
		"bot message echo: from the tenant",
		"user typing ",
		"user event ev",
		"bot message bot says",
		"user message héllo <b>&</b>",
		"bot message echo: héllo <b>&</b>",
		"user message once",
		"bot message echo: once",
		"system conversationUpdate ",
		"system conversationUpdate ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("activities:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The echo is stored as the user message's successor, before the POST answered.
	tl := e.list(s.key, id, "")
	for i := 0; i+1 < len(tl.Data); i++ {
		if tl.Data[i].Seq+1 != tl.Data[i+1].Seq {
			t.Fatalf("seqs not consecutive: %d then %d", tl.Data[i].Seq, tl.Data[i+1].Seq)
		}
	}

	// A webhook channel does not echo.
	w := e.setup("webhook")
	e.post(w.key, w.conv, map[string]any{"text": "hi"})
	if l := e.list(w.key, w.conv, ""); len(l.Data) != 1 {
		t.Fatalf("a webhook channel echoed: %+v", l.Data)
	}
}

// Only the stream takes its token from the URL; elsewhere a token in the query string
// is no credential, so tokens stay out of URLs and access logs.
func TestClientTokenInQueryOnlyForTheStream(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	tok := e.clientToken(s.secret, nil).Token
	conv := e.startConversation(tok)
	path := "/api/v1/converger/conversations/" + conv.ConversationID + "/activities?t=" + url.QueryEscape(tok)
	e.do("GET", path, nil, nil).errorCode(t, 403, "forbidden")
	e.do("POST", path, map[string]any{"type": "message", "text": "x"}, nil).errorCode(t, 403, "forbidden")
	e.dlList(tok, conv.ConversationID, "") // the same token as a bearer works
}
