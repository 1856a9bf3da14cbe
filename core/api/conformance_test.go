package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/converger/edge/core/activity"
)

// Answers checked byte for byte against the documented behaviour of the system the core
// replaces: status, the headers that matter and the whole body (the request id is the
// one sent, so that the body is fixed).

// exact checks a response's status, headers (name → value; "" asserts the header is
// absent) and body.
func (r response) exact(t *testing.T, what string, status int, headers map[string]string, body string) {
	t.Helper()
	if r.status != status {
		t.Errorf("%s: status %d, want %d (body %s)", what, r.status, status, r.body)
	}
	for k, want := range headers {
		got, present := r.header.Get(k), len(r.header.Values(k)) > 0
		if want == "" && present {
			t.Errorf("%s: header %s: %q, want none", what, k, got)
		} else if want != "" && got != want {
			t.Errorf("%s: header %s: %q, want %q", what, k, got, want)
		}
	}
	if string(r.body) != body {
		t.Errorf("%s: body\n  %s\nwant\n  %s", what, r.body, body)
	}
}

// withRequestID adds x-request-id to h.
func withRequestID(h map[string]string, id string) map[string]string {
	return withHeader(h, "x-request-id", id)
}

// jsonError is the envelope of an error without details.
func jsonError(code, message, requestID string) string {
	return `{"error":{"code":"` + code + `","message":"` + message + `","details":{},"request_id":"` + requestID + `"}}`
}

// Item 1: an unbound token on a conversation of another channel of its tenant, of
// another tenant, or one that does not exist, answers exactly 404 not_found.
func TestConformanceUnboundTokenOnForeignConversation(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	unbound := e.clientToken(s.secret, nil).Token
	_, sibling := e.channel(s.tenantID, "webhook")
	siblingConv := e.startConversation(e.clientToken(sibling.Secret, nil).Token).ConversationID
	other := e.setup("webhook")
	for name, id := range map[string]string{"another channel's": siblingConv, "another tenant's": other.conv, "a missing": missingID} {
		for _, path := range []string{"/api/v1/converger/conversations/" + id, "/api/v1/converger/conversations/" + id + "/activities"} {
			r := e.do(http.MethodGet, path, nil, withRequestID(bearerHeader(unbound), "req-1"))
			r.exact(t, name+" conversation, GET "+path, 404, map[string]string{"content-type": "application/json", "x-request-id": "req-1"},
				jsonError("not_found", "Not found.", "req-1"))
		}
	}
}

// Item 2: an attachment without contentType is 422 with fields.attachments naming it.
func TestConformanceAttachmentWithoutContentType(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)
	want := `{"error":{"code":"validation_failed","message":"Some fields are invalid.","details":{"fields":{"attachments":["attachment 0: contentType can't be blank"]}},"request_id":"req-2"}}`
	body := map[string]any{"type": "message", "text": "a file", "attachments": []any{map[string]any{"contentUrl": "https://example.com/a.png"}}}
	e.do(http.MethodPost, "/api/v1/conversations/"+s.conv+"/activities", body, withRequestID(apiKey(s.key), "req-2")).
		exact(t, "tenant API", 422, map[string]string{"content-type": "application/json"}, want)
	e.do(http.MethodPost, "/api/v1/converger/conversations/"+conv.ConversationID+"/activities", body, withRequestID(bearerHeader(conv.Token), "req-2")).
		exact(t, "client API", 422, map[string]string{"content-type": "application/json"}, want)
	if n := e.count(`SELECT count(*) FROM activities`); n != 0 {
		t.Fatalf("%d activities stored", n)
	}
	// With a contentType it is stored.
	body["attachments"] = []any{map[string]any{"contentType": "image/png", "contentUrl": "https://example.com/a.png"}}
	if r := e.do(http.MethodPost, "/api/v1/conversations/"+s.conv+"/activities", body, apiKey(s.key)); r.status != 201 {
		t.Fatalf("with a contentType: %d %s", r.status, r.body)
	}
}

// Item 3: the conversationUpdate that a close appends says what happened and why, and
// so does the reopen's.
func TestConformanceCloseAndReopenEvents(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	tok := e.clientToken(s.secret, nil).Token
	for _, path := range []string{"/close", "/reopen"} {
		if r := e.do(http.MethodPost, "/api/v1/conversations/"+s.conv+path, nil, apiKey(s.key)); r.status != 200 {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
	}
	want := []string{
		`{"event":"conversation_closed","reason":"manual","status":"closed"}`,
		`{"event":"conversation_reopened","reason":"manual","status":"active"}`,
	}
	l := e.list(s.key, s.conv, "")
	dl := e.dlList(tok, s.conv, "")
	if len(l.Data) != 2 || len(dl.Activities) != 2 {
		t.Fatalf("activities: %+v %+v", l.Data, dl.Activities)
	}
	for i, w := range want {
		a, d := l.Data[i], dl.Activities[i]
		if a.Type != "conversationUpdate" || a.Sender != "system" || a.Text != "" || string(a.Attachments) != "[]" || string(a.Metadata) != w {
			t.Errorf("tenant API activity %d: %+v, want metadata %s", i, a, w)
		}
		if d.Type != "conversationUpdate" || d.From.ID != "system" || string(d.ChannelData) != w {
			t.Errorf("client API activity %d: %+v, want channelData %s", i, d, w)
		}
	}
}

// Item 4: a limit that is not a positive whole number is the default page size on both
// APIs, and a too large one is the maximum.
func TestConformanceListLimit(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	tok := e.clientToken(s.secret, nil).Token
	for i := range 101 {
		if _, _, err := e.store.CreateActivity(context.Background(), activity.Client{Text: fmt.Sprint(i)},
			activity.System{TenantID: s.tenantID, ConversationID: s.conv, Sender: "user"}); err != nil {
			t.Fatal(err)
		}
	}
	for q, want := range map[string]int{"bogus": 100, "": 100, "0": 100, "-1": 100, "1.5": 100, "2": 2,
		"5000": 101, "99999999999999999999": 101} {
		r := e.do(http.MethodGet, "/api/v1/conversations/"+s.conv+"/activities?limit="+q, nil, apiKey(s.key))
		var l activityList
		r.answer(t, 200, &l)
		wantLimit := min(want, 100)
		if want == 101 {
			wantLimit = 1000
		}
		if r.header.Get("content-type") != "application/json" || len(l.Data) != min(want, 101) || l.Meta.Limit != wantLimit ||
			l.Meta.HasMore != (want < 101) {
			t.Errorf("tenant API limit=%s: %d activities, meta %+v, content-type %q", q, len(l.Data), l.Meta, r.header.Get("content-type"))
		}
		dl := e.do(http.MethodGet, "/api/v1/converger/conversations/"+s.conv+"/activities?limit="+q, nil, bearerHeader(tok))
		var d dlList
		dl.answer(t, 200, &d)
		if len(d.Activities) != min(want, 101) || d.HasMore != (want < 101) {
			t.Errorf("client API limit=%s: %d activities, has_more %v", q, len(d.Activities), d.HasMore)
		}
	}
}

// Item 5: a signed inbound message with no text and no attachments is 422, and stores
// nothing (no conversation either); an event needs neither.
func TestConformanceEmptyInboundMessage(t *testing.T) {
	e := newInboundEnv(t)
	want := `{"error":{"code":"validation_failed","message":"Some fields are invalid.","details":{"fields":{"text":["no text and no attachments"]}},"request_id":"req-5"}}`
	before := e.count(`SELECT count(*) FROM conversations`)
	for _, body := range []string{`{}`, `{"sender":"+15550001","idempotency_key":"wamid.1"}`, `{"text":"  \n"}`,
		`{"type":"message","text":"","attachments":[]}`, `{"text":null,"attachments":null}`} {
		e.do(http.MethodPost, inboundPath(e.s.channelID), body, withRequestID(signed(e.s.secret, body, e.now), "req-5")).
			exact(t, body, 422, map[string]string{"content-type": "application/json"}, want)
	}
	if n := e.count(`SELECT count(*) FROM activities`); n != 0 {
		t.Fatalf("%d activities stored", n)
	}
	if n := e.count(`SELECT count(*) FROM conversations`); n != before {
		t.Fatalf("%d conversations opened", n-before)
	}
	for _, body := range []string{`{"text":"hi"}`, `{"attachments":[{"contentType":"image/png","contentUrl":"https://example.com/a.png"}]}`,
		`{"type":"event"}`, `{"type":"typing"}`} {
		if r := e.deliver(e.s.channelID, e.s.secret, body); r.status != 201 {
			t.Errorf("%s: %d %s", body, r.status, r.body)
		}
	}
}

// Item 6: the legacy token endpoint announces its deprecation as RFC 9745 does, on every
// answer, with the successor link kept; the deprecation link leads to a notice.
func TestConformanceLegacyTokenDeprecation(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	headers := map[string]string{
		"Deprecation": "@1796083200", // 2026-12-01T00:00:00Z
		"Link":        `</api/v1/converger/tokens/generate>; rel="successor-version", </api/v1/tokens/deprecation>; rel="deprecation"; type="text/plain"`,
	}
	r := e.do(http.MethodPost, "/api/v1/tokens", map[string]any{"conversation_id": s.conv, "user_id": "alice"}, apiKey(s.key))
	if r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	r.exact(t, "created", 201, headers, string(r.body))
	e.do(http.MethodPost, "/api/v1/tokens", map[string]any{"conversation_id": s.conv}, withRequestID(nil, "req-6")).
		exact(t, "no API key", 401, headers, jsonError("unauthorized", "A valid API key is required in the x-api-key header.", "req-6"))
	notice := e.do(http.MethodGet, "/api/v1/tokens/deprecation", nil, nil)
	if notice.status != 200 || notice.header.Get("content-type") != "text/plain; charset=utf-8" ||
		!strings.HasPrefix(string(notice.body), "POST /api/v1/tokens is deprecated since 2026-12-01T00:00:00Z.") {
		t.Fatalf("notice: %d %q %s", notice.status, notice.header.Get("content-type"), notice.body)
	}
}

// Item 7: a wrong method on an existing path is 405 with Allow; an unknown path stays
// 404.
func TestConformanceMethodNotAllowed(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPut, "/api/v1/conversations/" + s.conv, "GET, HEAD"},
		{http.MethodDelete, "/api/v1/conversations/" + s.conv, "GET, HEAD"},
		{http.MethodGet, "/api/v1/conversations/" + s.conv + "/close", "POST"},
		{http.MethodPatch, "/api/v1/conversations/" + s.conv + "/activities", "GET, HEAD, POST"},
		{http.MethodGet, "/api/v1/converger/tokens/generate", "POST"},
		{http.MethodPut, "/api/v1/converger/conversations/" + s.conv + "/activities", "GET, HEAD, POST"},
		{http.MethodGet, "/api/v1/channels/" + s.channelID + "/inbound", "POST"},
	} {
		e.do(c.method, c.path, nil, withRequestID(apiKey(s.key), "req-7")).exact(t, c.method+" "+c.path, 405,
			map[string]string{"content-type": "application/json", "allow": c.allow, "x-request-id": "req-7"},
			jsonError("method_not_allowed", "Method not allowed.", "req-7"))
	}
	e.do(http.MethodPut, "/api/v1/nothing/here", nil, withRequestID(nil, "req-7")).exact(t, "unknown path", 404,
		map[string]string{"content-type": "application/json", "allow": ""}, jsonError("not_found", "Not found.", "req-7"))
	// Nothing was changed by the refused requests.
	var c tenantConversation
	e.do(http.MethodGet, "/api/v1/conversations/"+s.conv, nil, apiKey(s.key)).data(t, 200, &c)
	if c.Status != "active" {
		t.Fatalf("conversation %+v", c)
	}
}

// Item 8: JSON answers do not escape "&", "<" and ">".
func TestConformanceJSONDoesNotEscapeHTML(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)
	e.dlPost(conv.Token, conv.ConversationID, map[string]any{"type": "message", "text": "a <b> & c"})
	wm := e.dlList(conv.Token, conv.ConversationID, "").Watermark
	r := e.do(http.MethodGet, "/api/v1/converger/conversations/"+conv.ConversationID+"?watermark="+wm, nil, bearerHeader(conv.Token))
	var a conversationAnswer
	r.answer(t, 200, &a)
	want := `{"conversationId":"` + conv.ConversationID + `","token":"` + a.Token + `","expires_in":1800,"streamUrl":"ws` +
		strings.TrimPrefix(e.base, "http") + `/api/v1/converger/conversations/` + conv.ConversationID + `/stream?t=` + a.Token +
		`&watermark=` + wm + `"}`
	r.exact(t, "reconnect", 200, map[string]string{"content-type": "application/json"}, want)
	for _, path := range []string{"/api/v1/converger/conversations/" + conv.ConversationID + "/activities"} {
		body := e.do(http.MethodGet, path, nil, bearerHeader(conv.Token)).body
		if !strings.Contains(string(body), `"text":"a <b> & c"`) || strings.Contains(string(body), `\u00`) {
			t.Errorf("GET %s: %s", path, body)
		}
	}
	body := e.do(http.MethodGet, "/api/v1/conversations/"+conv.ConversationID+"/activities", nil, apiKey(s.key)).body
	if !strings.Contains(string(body), `"text":"a <b> & c"`) || strings.Contains(string(body), `\u00`) {
		t.Errorf("tenant API list: %s", body)
	}
}
