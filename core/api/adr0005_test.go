package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/activity"
)

// ADR-0005: the fields only the server sets are ignored in a body, and the request
// succeeds; each limit is a 422 naming the field.

// forged are the server fields a client might try to set.
func forged(otherTenant, otherConv string) map[string]any {
	return map[string]any{
		"inserted_at":     "1999-01-01T00:00:00Z",
		"seq":             999,
		"id":              "11111111-1111-4111-8111-111111111111",
		"tenant_id":       otherTenant,
		"conversation_id": otherConv,
		"idempotency_key": "body-key",
	}
}

// storedRow reads what the database holds for an activity.
type storedRow struct {
	TenantID, ConversationID, Key string
	Seq                           int64
	InsertedAt                    time.Time
}

func (e *env) row(id string) storedRow {
	e.t.Helper()
	var r storedRow
	if err := e.pool.QueryRow(context.Background(), `SELECT tenant_id::text, conversation_id::text, coalesce(idempotency_key, '<null>'), seq, inserted_at
		FROM activities WHERE id = $1`, id).Scan(&r.TenantID, &r.ConversationID, &r.Key, &r.Seq, &r.InsertedAt); err != nil {
		e.t.Fatalf("activity %s: %v", id, err)
	}
	return r
}

func TestADR0005TenantAPIIgnoresServerFields(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	victim := e.setup("webhook")
	body := forged(victim.tenantID, victim.conv)
	body["text"] = "hi"
	body["sender"] = "agent" // the tenant API's caller names the sender (server to server)

	start := time.Now()
	a := e.post(s.key, s.conv, body)
	if a.ID == "11111111-1111-4111-8111-111111111111" || a.Seq != 1 || a.TenantID != s.tenantID || a.ConversationID != s.conv ||
		a.Sender != "agent" || a.Text != "hi" {
		t.Fatalf("created %+v", a)
	}
	r := e.row(a.ID)
	if r.Key != "<null>" || r.Seq != 1 || r.TenantID != s.tenantID || r.ConversationID != s.conv ||
		r.InsertedAt.Before(start.Add(-time.Minute)) || r.InsertedAt.Year() == 1999 {
		t.Fatalf("stored %+v", r)
	}
	// The body's idempotency_key is no idempotency key: the same body is a new activity.
	if b := e.post(s.key, s.conv, body); b.ID == a.ID || b.Seq != 2 {
		t.Fatalf("a body idempotency_key was honoured: %+v", b)
	}
	if n := e.count(`SELECT count(*) FROM activities WHERE conversation_id = $1`, victim.conv); n != 0 {
		t.Fatalf("%d activities in the conversation named in the body", n)
	}
}

func TestADR0005ClientAPIIgnoresServerFields(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	victim := e.setup("webhook")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)
	body := forged(victim.tenantID, victim.conv)
	body["type"] = "message"
	body["text"] = "hi"
	body["timestamp"] = "1999-01-01T00:00:00.000Z"
	body["localTimestamp"] = "1999-01-01T00:00:00.000+01:00"
	body["conversationId"] = victim.conv
	body["conversation"] = map[string]any{"id": victim.conv}
	body["from"] = map[string]any{"id": "dl_user"}

	start := time.Now()
	id := e.dlPost(conv.Token, conv.ConversationID, body)
	r := e.row(id)
	if id == "11111111-1111-4111-8111-111111111111" || r.Key != "<null>" || r.Seq != 1 || r.TenantID != s.tenantID ||
		r.ConversationID != conv.ConversationID || r.InsertedAt.Before(start.Add(-time.Minute)) {
		t.Fatalf("stored %s %+v", id, r)
	}
	l := e.dlList(conv.Token, conv.ConversationID, "")
	if len(l.Activities) != 1 || l.Activities[0].ConversationID != conv.ConversationID || strings.HasPrefix(l.Activities[0].Timestamp, "1999") ||
		l.Activities[0].From.ID != "dl_user" {
		t.Fatalf("listed %+v", l.Activities)
	}
	if id2 := e.dlPost(conv.Token, conv.ConversationID, body); id2 == id {
		t.Fatal("a body idempotency_key was honoured")
	}
	if n := e.count(`SELECT count(*) FROM activities WHERE conversation_id = $1`, victim.conv); n != 0 {
		t.Fatalf("%d activities in the conversation named in the body", n)
	}
}

// limitCase is a body over one limit and the field the 422 must name.
type limitCase struct {
	name  string
	body  map[string]any
	field string
}

func limitCases(l activity.Limits) []limitCase {
	att := func(n int) map[string]any {
		return map[string]any{"contentType": "text/plain", "content": strings.Repeat("a", n)}
	}
	// The JSON overhead of att: {"content":"","contentType":"text/plain"}.
	attOverhead := len(`{"content":"","contentType":"text/plain"}`)
	many := make([]any, l.MaxAttachments+1)
	for i := range many {
		many[i] = att(1)
	}
	metaOverhead := len(`{"k":""}`)
	return []limitCase{
		{"text", map[string]any{"type": "message", "text": strings.Repeat("é", l.MaxTextBytes/2) + "x"}, "text"},
		{"attachment count", map[string]any{"type": "message", "attachments": many}, "attachments"},
		{"attachment size", map[string]any{"type": "message", "attachments": []any{att(l.MaxAttachmentBytes - attOverhead + 1)}}, "attachments"},
		{"metadata size", map[string]any{"type": "message", "metadata": map[string]any{"k": strings.Repeat("m", l.MaxMetadataBytes-metaOverhead+1)}}, "metadata"},
		{"unknown type", map[string]any{"type": "bogus"}, "type"},
	}
}

// atLimit is a body exactly at every limit, which must be accepted.
func atLimit(l activity.Limits) map[string]any {
	attOverhead := len(`{"content":"","contentType":"text/plain"}`)
	atts := make([]any, l.MaxAttachments)
	for i := range atts {
		atts[i] = map[string]any{"contentType": "text/plain", "content": strings.Repeat("a", l.MaxAttachmentBytes-attOverhead)}
	}
	return map[string]any{"type": "message", "text": strings.Repeat("t", l.MaxTextBytes), "attachments": atts,
		"metadata": map[string]any{"k": strings.Repeat("m", l.MaxMetadataBytes-len(`{"k":""}`))}}
}

// checkLimits posts every limit case through both APIs.
func checkLimits(t *testing.T, e *env, l activity.Limits) {
	s := e.setup("webhook")
	conv := e.startConversation(e.clientToken(s.secret, nil).Token)
	for _, tc := range limitCases(l) {
		d := e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", tc.body, apiKey(s.key)).errorCode(t, 422, "validation_failed")
		fields, _ := d["fields"].(map[string]any)
		if fields[tc.field] == nil || len(fields) != 1 {
			t.Fatalf("tenant API, %s: details %v, want only the field %s", tc.name, d, tc.field)
		}
		d = e.do("POST", "/api/v1/converger/conversations/"+conv.ConversationID+"/activities", tc.body, bearerHeader(conv.Token)).
			errorCode(t, 422, "validation_failed")
		fields, _ = d["fields"].(map[string]any)
		if fields[tc.field] == nil || len(fields) != 1 {
			t.Fatalf("client API, %s: details %v, want only the field %s", tc.name, d, tc.field)
		}
	}
	// Everything at its limit passes.
	e.post(s.key, s.conv, atLimit(l))
	e.dlPost(conv.Token, conv.ConversationID, atLimit(l))
	// Nothing over a limit was stored.
	if n := e.count(`SELECT count(*) FROM activities`); n != 2 {
		t.Fatalf("%d activities stored, want the 2 at the limits", n)
	}
	// Several violations at once are all named.
	d := e.do("POST", "/api/v1/conversations/"+s.conv+"/activities",
		map[string]any{"type": "bogus", "text": strings.Repeat("x", l.MaxTextBytes+1)}, apiKey(s.key)).errorCode(t, 422, "validation_failed")
	if fields, _ := d["fields"].(map[string]any); fields["type"] == nil || fields["text"] == nil {
		t.Fatalf("details %v", d)
	}
}

func TestADR0005DefaultLimits(t *testing.T) {
	e := newEnv(t, envOptions{})
	checkLimits(t, e, activity.DefaultLimits)
}

func TestADR0005ConfiguredLimits(t *testing.T) {
	l := activity.Limits{MaxTextBytes: 10, MaxAttachments: 2, MaxAttachmentBytes: 100, MaxMetadataBytes: 50}
	e := newEnv(t, envOptions{limits: l})
	checkLimits(t, e, l)
	// A text the defaults allow is over the configured limit, and the 422 says so.
	s := e.setup("webhook")
	d := e.do("POST", "/api/v1/conversations/"+s.conv+"/activities", map[string]any{"text": strings.Repeat("x", 11)}, apiKey(s.key)).
		errorCode(t, 422, "validation_failed")
	fields, _ := d["fields"].(map[string]any)
	if msgs, _ := fields["text"].([]any); len(msgs) != 1 || !strings.Contains(fmt.Sprint(msgs[0]), "10") {
		t.Fatalf("details %v", d)
	}
	// The conversation metadata of the tenant API follows the configured metadata limit.
	big, _ := json.Marshal(map[string]any{"channel_id": s.channelID, "metadata": map[string]any{"k": strings.Repeat("m", 50)}})
	e.do("POST", "/api/v1/conversations", big, apiKey(s.key)).errorCode(t, 422, "validation_failed")
	// An echo reply to a message at the text limit fits the limit.
	echo := e.setup("echo")
	e.post(echo.key, echo.conv, map[string]any{"text": "0123456789"})
	if l := e.list(echo.key, echo.conv, ""); len(l.Data) != 2 || l.Data[1].Text != "echo: 0123" {
		t.Fatalf("echo at the limit: %+v", l.Data)
	}
}
