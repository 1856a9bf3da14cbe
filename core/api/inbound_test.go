package api_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/inbound"
)

// The inbound provider webhooks (CORE_API.md §6).

// inboundEnv is a core whose clock stands still at now, with a webhook channel.
type inboundEnv struct {
	*env
	now  time.Time
	logs *lockedBuffer
	s    setup
}

// lockedBuffer collects the core's log.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newInboundEnv(t *testing.T) *inboundEnv {
	t.Helper()
	now := time.Now().Truncate(time.Second)
	logs := &lockedBuffer{}
	e := newEnv(t, envOptions{deps: func(d *api.Deps, _ string) {
		d.Now = func() time.Time { return now }
		d.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}})
	return &inboundEnv{env: e, now: now, logs: logs, s: e.setup("webhook")}
}

func inboundPath(channelID string) string { return "/api/v1/channels/" + channelID + "/inbound" }
func statusPath(channelID string) string  { return "/api/v1/channels/" + channelID + "/status" }

// signed is the signature header of body with secret at t.
func signed(secret, body string, t time.Time) map[string]string {
	return map[string]string{inbound.SignatureHeader: inbound.Sign(t, []byte(body), []byte(secret))}
}

// deliver posts a signed body to a channel's inbound webhook.
func (e *inboundEnv) deliver(channelID, secret, body string) response {
	e.t.Helper()
	return e.do("POST", inboundPath(channelID), body, signed(secret, body, e.now))
}

// unauthorized checks a 401 and the reason in its details.
func unauthorized(t *testing.T, r response, reason string) {
	t.Helper()
	if d := r.errorCode(t, 401, "unauthorized"); d["reason"] != reason {
		t.Fatalf("reason %v, want %s: %s", d["reason"], reason, r.body)
	}
}

func TestInboundSignatures(t *testing.T) {
	e := newInboundEnv(t)
	path := inboundPath(e.s.channelID)
	body := `{"text":"hello","idempotency_key":"wamid.1"}`
	ts := strconv.FormatInt(e.now.Unix(), 10)
	macAt := func(t time.Time, secret, body string) string {
		h := inbound.Sign(t, []byte(body), []byte(secret))
		return h[strings.Index(h, "v1=")+3:]
	}
	valid := macAt(e.now, e.s.secret, body)
	wrong := macAt(e.now, "another secret", body)

	t.Run("valid", func(t *testing.T) {
		var a tenantActivity
		e.deliver(e.s.channelID, e.s.secret, body).data(t, 201, &a)
		if a.Text != "hello" || a.Sender != "external" || a.Type != "message" || a.Seq != 1 || a.TenantID != e.s.tenantID ||
			a.ConversationID == "" || a.ConversationID == e.s.conv || string(a.Attachments) != "[]" || string(a.Metadata) != "{}" {
			t.Fatalf("%+v", a)
		}
		// The activity is the tenant's, in a new conversation of the channel.
		var conv tenantConversation
		e.do("GET", "/api/v1/conversations/"+a.ConversationID, nil, apiKey(e.s.key)).data(t, 200, &conv)
		if conv.ChannelID != e.s.channelID || conv.Status != "active" {
			t.Fatalf("%+v", conv)
		}
		if l := e.list(e.s.key, a.ConversationID, ""); len(l.Data) != 1 || l.Data[0].ID != a.ID {
			t.Fatalf("%+v", l)
		}
	})
	t.Run("several v1, one valid", func(t *testing.T) {
		b := `{"text":"rotated"}`
		h := inbound.Sign(e.now, []byte(b), []byte("the old secret"), []byte(e.s.secret))
		if r := e.do("POST", path, b, map[string]string{inbound.SignatureHeader: h}); r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		b = `{"text":"rotated again"}`
		h = "t=" + ts + ",v1=" + wrong + ",v1=" + macAt(e.now, e.s.secret, b) + ",v1=" + wrong
		if r := e.do("POST", path, b, map[string]string{inbound.SignatureHeader: h}); r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("tolerance", func(t *testing.T) {
		for _, d := range []time.Duration{-300 * time.Second, 300 * time.Second} {
			b := fmt.Sprintf(`{"text":"skew %v"}`, d)
			if r := e.do("POST", path, b, signed(e.s.secret, b, e.now.Add(d))); r.status != 201 {
				t.Fatalf("%v: %d %s", d, r.status, r.body)
			}
		}
		for _, d := range []time.Duration{-301 * time.Second, 301 * time.Second} {
			unauthorized(t, e.do("POST", path, body, signed(e.s.secret, body, e.now.Add(d))), "stale")
		}
	})
	t.Run("wrong key", func(t *testing.T) {
		unauthorized(t, e.do("POST", path, body, signed("another secret", body, e.now)), "mismatch")
		// Another channel's secret is a wrong key too.
		other := e.setup("webhook")
		unauthorized(t, e.do("POST", path, body, signed(other.secret, body, e.now)), "mismatch")
	})
	t.Run("tampered body", func(t *testing.T) {
		h := signed(e.s.secret, body, e.now)
		for _, b := range []string{`{"text":"hellO","idempotency_key":"wamid.1"}`, body + " ", " " + body, ""} {
			unauthorized(t, e.do("POST", path, b, h), "mismatch")
		}
	})
	t.Run("malformed", func(t *testing.T) {
		sig := func(h string) map[string]string { return map[string]string{inbound.SignatureHeader: h} }
		for name, h := range map[string]string{
			"no t":           "v1=" + valid,
			"no v1":          "t=" + ts,
			"non-hex":        "t=" + ts + ",v1=" + strings.Repeat("xy", 32),
			"short hex":      "t=" + ts + ",v1=" + valid[:40],
			"duplicate t":    "t=" + ts + ",t=" + ts + ",v1=" + valid,
			"garbage":        "garbage",
			"space":          "t=" + ts + ", v1=" + valid,
			"inner space":    "t=" + ts + ",v1 =" + valid,
			"semicolon":      "t=" + ts + ";v1=" + valid,
			"sha256 legacy":  "sha256=" + valid,
			"sha256 with t":  "t=" + ts + ",sha256=" + valid,
			"sha256 in v1":   "t=" + ts + ",v1=sha256=" + valid,
			"milliseconds t": "t=" + ts + "000,v1=" + valid,
			"negative t":     "t=-" + ts + ",v1=" + valid,
			"long":           "t=" + ts + ",v1=" + valid + ",x=" + strings.Repeat("a", 3000),
		} {
			t.Run(name, func(t *testing.T) { unauthorized(t, e.do("POST", path, body, sig(h)), "malformed") })
		}
		// The sha256= form is refused even with the right HMAC of the body alone.
		legacy := hex.EncodeToString(hmacSHA256([]byte(e.s.secret), []byte(body)))
		unauthorized(t, e.do("POST", path, body, sig("sha256="+legacy)), "malformed")
	})
	t.Run("missing or empty", func(t *testing.T) {
		unauthorized(t, e.do("POST", path, body, nil), "missing")
		unauthorized(t, e.do("POST", path, body, map[string]string{inbound.SignatureHeader: ""}), "missing")
	})
	t.Run("status is signed the same way", func(t *testing.T) {
		b := `{"provider_message_id":"m","status":"sent"}`
		unauthorized(t, e.do("POST", statusPath(e.s.channelID), b, nil), "missing")
		unauthorized(t, e.do("POST", statusPath(e.s.channelID), b, signed("nope", b, e.now)), "mismatch")
		if r := e.do("POST", statusPath(e.s.channelID), b, signed(e.s.secret, b, e.now)); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	// Only the valid deliveries were stored: one, two rotated, two within the tolerance.
	if n := e.count(`SELECT count(*) FROM activities a JOIN conversations c ON c.id = a.conversation_id WHERE c.channel_id = $1`, e.s.channelID); n != 5 {
		t.Fatalf("%d activities stored, want 5", n)
	}
	if strings.Contains(e.logs.String(), e.s.secret) {
		t.Fatal("the channel secret is in the log")
	}
}

func TestInboundWithoutRequireSignature(t *testing.T) {
	e := newInboundEnv(t)
	e.exec(`UPDATE channels SET require_signature = false WHERE id = $1`, e.s.channelID)
	path := inboundPath(e.s.channelID)
	var a tenantActivity
	e.do("POST", path, `{"text":"unsigned"}`, nil).data(t, 201, &a)
	if a.Text != "unsigned" {
		t.Fatalf("%+v", a)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "deprecated") || !strings.Contains(logs, "channel_id="+e.s.channelID) ||
		strings.Contains(logs, e.s.secret) || strings.Contains(logs, "unsigned\"") {
		t.Fatalf("want one warning naming the channel only; logs:\n%s", logs)
	}
	// A signature that is there must still be right.
	unauthorized(t, e.do("POST", path, `{"text":"x"}`, signed("wrong", `{"text":"x"}`, e.now)), "mismatch")
	unauthorized(t, e.do("POST", path, `{"text":"x"}`, map[string]string{inbound.SignatureHeader: "garbage"}), "malformed")
	unauthorized(t, e.do("POST", path, `{"text":"x"}`, signed(e.s.secret, `{"text":"x"}`, e.now.Add(-time.Hour))), "stale")
	if r := e.deliver(e.s.channelID, e.s.secret, `{"text":"signed"}`); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestInboundRefusingChannels(t *testing.T) {
	e := newInboundEnv(t)
	body := `{"text":"x"}`
	status := `{"delivery_id":"d1","status":"queued"}`

	t.Run("unknown channel", func(t *testing.T) {
		for _, id := range []string{missingID, "not-a-uuid", "0", strings.Repeat("a", 300), "%00"} {
			e.do("POST", inboundPath(id), body, signed(e.s.secret, body, e.now)).errorCode(t, 404, "not_found")
			e.do("POST", statusPath(id), status, signed(e.s.secret, status, e.now)).errorCode(t, 404, "not_found")
		}
		// Upper-case UUIDs name the same channel.
		if r := e.deliver(strings.ToUpper(e.s.channelID), e.s.secret, body); r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("outbound mode", func(t *testing.T) {
		t.Cleanup(func() { e.exec(`UPDATE channels SET mode = 'duplex' WHERE id = $1`, e.s.channelID) })
		e.exec(`UPDATE channels SET mode = 'outbound' WHERE id = $1`, e.s.channelID)
		r := e.deliver(e.s.channelID, e.s.secret, body)
		r.errorCode(t, 400, "bad_request")
		if !strings.Contains(string(r.body), "outbound") {
			t.Fatalf("the message should say why: %s", r.body)
		}
		// Delivery statuses are about messages the channel sent: an outbound channel takes them.
		if r := e.do("POST", statusPath(e.s.channelID), status, signed(e.s.secret, status, e.now)); r.status != 200 {
			t.Fatalf("status on an outbound channel: %d %s", r.status, r.body)
		}
		// An inbound-only channel takes messages.
		e.exec(`UPDATE channels SET mode = 'inbound' WHERE id = $1`, e.s.channelID)
		if r := e.deliver(e.s.channelID, e.s.secret, `{"text":"y"}`); r.status != 201 {
			t.Fatalf("inbound mode: %d %s", r.status, r.body)
		}
	})
	t.Run("inactive channel", func(t *testing.T) {
		t.Cleanup(func() { e.exec(`UPDATE channels SET status = 'active' WHERE id = $1`, e.s.channelID) })
		e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, e.s.channelID)
		r := e.deliver(e.s.channelID, e.s.secret, body)
		r.errorCode(t, 400, "bad_request")
		if !strings.Contains(string(r.body), "inactive") {
			t.Fatalf("%s", r.body)
		}
		e.do("POST", statusPath(e.s.channelID), status, signed(e.s.secret, status, e.now)).errorCode(t, 400, "bad_request")
		// The signature comes first: an unsigned request learns nothing more.
		unauthorized(t, e.do("POST", inboundPath(e.s.channelID), body, nil), "missing")
	})
	t.Run("inactive tenant", func(t *testing.T) {
		t.Cleanup(func() { e.exec(`UPDATE tenants SET status = 'active' WHERE id = $1`, e.s.tenantID) })
		e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, e.s.tenantID)
		r := e.deliver(e.s.channelID, e.s.secret, body)
		r.errorCode(t, 400, "bad_request")
		if !strings.Contains(string(r.body), "tenant") {
			t.Fatalf("%s", r.body)
		}
	})
	t.Run("other methods", func(t *testing.T) {
		r := e.do("GET", inboundPath(e.s.channelID), nil, nil)
		r.errorCode(t, 405, "method_not_allowed")
		if r.header.Get("allow") != "POST" {
			t.Fatalf("Allow %q", r.header.Get("allow"))
		}
	})
}

func TestInboundBodyErrors(t *testing.T) {
	e := newInboundEnv(t)
	send := func(body string) response {
		t.Helper()
		return e.deliver(e.s.channelID, e.s.secret, body)
	}
	t.Run("not an object", func(t *testing.T) {
		for _, b := range []string{``, `null`, `[]`, `"text"`, `12`, `{"text":`, `{"text":"a"} trailing`, "\xff\xfe", `{"text":"a"}{}`} {
			r := send(b)
			r.errorCode(t, 400, "bad_request")
		}
	})
	t.Run("field types and limits", func(t *testing.T) {
		for b, field := range map[string]string{
			`{"text":1}`:          "text",
			`{"type":7}`:          "type",
			`{"type":"bogus"}`:    "type",
			`{"attachments":"x"}`: "attachments",
			`{"attachments":[1]}`: "attachments",
			`{"metadata":[]}`:     "metadata",
			`{"sender":{}}`:       "sender",
			`{"sender":"` + strings.Repeat("s", 257) + `"}`: "sender",
			`{"idempotency_key":42}`:                        "idempotency_key",
			`{"conversation_id":1}`:                         "conversation_id",
			`{"text":"` + strings.Repeat("a", 65537) + `"}`: "text",
			`{"text":"a\u0000b"}`:                           "text",
			`{"metadata":{"n":1e5000}}`:                     "metadata",
		} {
			d := send(b).errorCode(t, 422, "validation_failed")
			fields, _ := d["fields"].(map[string]any)
			if fields[field] == nil {
				t.Errorf("%.60s: fields %v, want %s", b, fields, field)
			}
		}
	})
	t.Run("too large", func(t *testing.T) {
		b := `{"text":"` + strings.Repeat("a", inbound.MaxBodyBytes) + `"}`
		send(b).errorCode(t, 413, "payload_too_large")
		// Checked before the signature: no need to sign.
		e.do("POST", inboundPath(e.s.channelID), b, nil).errorCode(t, 413, "payload_too_large")
		// At the bound, the limits of the activity speak.
		b = `{"metadata":{"k":"` + strings.Repeat("a", inbound.MaxBodyBytes-21) + `"}}`
		if len(b) != inbound.MaxBodyBytes {
			t.Fatalf("%d bytes", len(b))
		}
		send(b).errorCode(t, 422, "validation_failed")
	})
	t.Run("compressed", func(t *testing.T) {
		b := `{"text":"x"}`
		h := signed(e.s.secret, b, e.now)
		h["content-encoding"] = "gzip"
		e.do("POST", inboundPath(e.s.channelID), b, h).errorCode(t, 400, "bad_request")
	})
	t.Run("conversation", func(t *testing.T) {
		other := e.setup("webhook")
		for _, id := range []string{other.conv, missingID, "nope", e.s.channelID} {
			send(`{"text":"x","conversation_id":"`+id+`"}`).errorCode(t, 404, "not_found")
		}
		e.do("POST", "/api/v1/conversations/"+e.s.conv+"/close", nil, apiKey(e.s.key))
		send(`{"text":"x","conversation_id":"`+e.s.conv+`"}`).errorCode(t, 409, "conversation_closed")
		send(`{"text":"x","idempotency_key":"k-closed","conversation_id":"`+e.s.conv+`"}`).errorCode(t, 409, "conversation_closed")
		e.do("POST", "/api/v1/conversations/"+e.s.conv+"/reopen", nil, apiKey(e.s.key))
		var a tenantActivity
		send(`{"text":"x","idempotency_key":"k-closed","conversation_id":"`+strings.ToUpper(e.s.conv)+`"}`).data(t, 201, &a)
		if a.ConversationID != e.s.conv {
			t.Fatalf("%+v", a)
		}
	})
	t.Run("server fields are the adapter's", func(t *testing.T) {
		victim := e.setup("webhook")
		body := forged(victim.tenantID, victim.conv)
		delete(body, "conversation_id")
		delete(body, "idempotency_key")
		body["text"], body["sender"], body["type"] = "hi", "+15550009", "event"
		body["metadata"] = map[string]any{"k": "v"}
		body["attachments"] = []any{map[string]any{"contentType": "text/plain"}}
		raw := mustJSON(t, body)
		var a tenantActivity
		send(raw).data(t, 201, &a)
		if a.ID == "11111111-1111-4111-8111-111111111111" || a.Seq != 1 || a.TenantID != e.s.tenantID || a.Sender != "+15550009" ||
			a.Type != "event" || string(a.Metadata) != `{"k":"v"}` || string(a.Attachments) != `[{"contentType":"text/plain"}]` {
			t.Fatalf("%+v", a)
		}
		if r := e.row(a.ID); r.Key != "<null>" || r.InsertedAt.Year() == 1999 || r.TenantID != e.s.tenantID {
			t.Fatalf("%+v", r)
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// hmacSHA256 is the legacy form's MAC: of the body alone.
func hmacSHA256(key, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(body)
	return h.Sum(nil)
}

// sameActivity reports whether two answers are the same activity, field for field.
func sameActivity(a, b tenantActivity) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

func TestInboundIdempotency(t *testing.T) {
	e := newInboundEnv(t)
	path := inboundPath(e.s.channelID)

	t.Run("repeat", func(t *testing.T) {
		var first, again tenantActivity
		e.deliver(e.s.channelID, e.s.secret, `{"text":"one","idempotency_key":"wamid.A"}`).data(t, 201, &first)
		e.deliver(e.s.channelID, e.s.secret, `{"text":"changed","sender":"x","idempotency_key":"wamid.A"}`).data(t, 201, &again)
		if !sameActivity(again, first) {
			t.Fatalf("repeat %+v, want the original %+v", again, first)
		}
		// Into an explicit conversation, the repeat is the original too.
		var c1, c2 tenantActivity
		b := `{"text":"into","idempotency_key":"wamid.B","conversation_id":"` + e.s.conv + `"}`
		e.deliver(e.s.channelID, e.s.secret, b).data(t, 201, &c1)
		e.deliver(e.s.channelID, e.s.secret, b).data(t, 201, &c2)
		if !sameActivity(c1, c2) || c1.ConversationID != e.s.conv {
			t.Fatalf("%+v %+v", c1, c2)
		}
	})

	t.Run("20 parallel deliveries", func(t *testing.T) {
		const n = 20
		headersFor := func(body string) map[string]string { return signed(e.s.secret, body, e.now) }
		ids := make([]string, n)
		convs := make([]string, n)
		errs := make([]string, n)
		parallel(n, func(i int) {
			body := fmt.Sprintf(`{"text":"delivery %d","idempotency_key":"wamid.PARALLEL"}`, i)
			status, b, err := e.rawPost(path, body, headersFor(body))
			if err != nil || status != 201 {
				errs[i] = fmt.Sprintf("%d %s %v", status, b, err)
				return
			}
			ids[i] = dataID(b)
			var a struct {
				Data tenantActivity `json:"data"`
			}
			response{status: status, body: b}.json(t, &a)
			convs[i] = a.Data.ConversationID
		})
		for i := range n {
			if errs[i] != "" {
				t.Fatalf("delivery %d: %s", i, errs[i])
			}
			if ids[i] != ids[0] || convs[i] != convs[0] || ids[i] == "" {
				t.Fatalf("delivery %d answered %s in %s, delivery 0 %s in %s", i, ids[i], convs[i], ids[0], convs[0])
			}
		}
		if got := e.count(`SELECT count(*) FROM activities WHERE idempotency_key = 'wamid.PARALLEL'`); got != 1 {
			t.Fatalf("%d activities, want 1", got)
		}
		if got := e.count(`SELECT count(*) FROM conversations c WHERE c.channel_id = $1
			AND EXISTS (SELECT 1 FROM activities a WHERE a.conversation_id = c.id AND a.idempotency_key = 'wamid.PARALLEL')`, e.s.channelID); got != 1 {
			t.Fatalf("%d conversations, want 1", got)
		}
		if got := e.count(`SELECT count(*) FROM conversations c WHERE c.channel_id = $1 AND last_seq = 0`, e.s.channelID); got != 0 {
			t.Fatalf("%d empty conversations left behind", got)
		}
	})
}

func TestInboundStatus(t *testing.T) {
	e := newInboundEnv(t)
	type statusAnswer struct {
		ProviderMessageID string `json:"provider_message_id"`
		DeliveryID        string `json:"delivery_id"`
		Status            string `json:"status"`
		Applied           bool   `json:"applied"`
		UpdatedAt         string `json:"updated_at"`
	}
	post := func(body string) statusAnswer {
		t.Helper()
		var a statusAnswer
		e.do("POST", statusPath(e.s.channelID), body, signed(e.s.secret, body, e.now)).data(t, 200, &a)
		return a
	}
	for i, step := range []struct {
		status, want string
		applied      bool
	}{
		{"queued", "queued", true},
		{"delivered", "delivered", true},
		{"sent", "delivered", false}, // backwards: ignored
		{"queued", "delivered", false},
		{"delivered", "delivered", false},
		{"failed", "delivered", false}, // failed only from queued or sent
		{"read", "read", true},
		{"delivered", "read", false},
	} {
		a := post(`{"provider_message_id":"wamid.S","status":"` + step.status + `"}`)
		if a.ProviderMessageID != "wamid.S" || a.Status != step.want || a.Applied != step.applied || a.UpdatedAt == "" {
			t.Fatalf("step %d (%s): %+v, want %s applied=%v", i, step.status, a, step.want, step.applied)
		}
	}
	if a := post(`{"delivery_id":"d-1","status":"sent"}`); a.DeliveryID != "d-1" || a.Status != "sent" || !a.Applied {
		t.Fatalf("%+v", a)
	}
	if a := post(`{"delivery_id":"d-1","status":"failed"}`); a.Status != "failed" || !a.Applied {
		t.Fatalf("%+v", a)
	}
	if a := post(`{"delivery_id":"d-1","status":"read"}`); a.Status != "failed" || a.Applied {
		t.Fatalf("failed is final: %+v", a)
	}

	for _, b := range []string{``, `[]`, `{`, `"x"`} {
		e.do("POST", statusPath(e.s.channelID), b, signed(e.s.secret, b, e.now)).errorCode(t, 400, "bad_request")
	}
	for b, field := range map[string]string{
		`{"status":"sent"}`: "provider_message_id",
		`{"provider_message_id":"a","delivery_id":"b","status":"sent"}`:      "delivery_id",
		`{"provider_message_id":"a","status":"seen"}`:                        "status",
		`{"provider_message_id":"a"}`:                                        "status",
		`{"provider_message_id":7,"status":"sent"}`:                          "provider_message_id",
		`{"delivery_id":"` + strings.Repeat("d", 256) + `","status":"sent"}`: "delivery_id",
	} {
		d := e.do("POST", statusPath(e.s.channelID), b, signed(e.s.secret, b, e.now)).errorCode(t, 422, "validation_failed")
		if fields, _ := d["fields"].(map[string]any); fields[field] == nil {
			t.Errorf("%s: %v, want %s", b, d, field)
		}
	}
}

// An echo channel answers an inbound message as any other, through the trusted create.
func TestInboundOnAnEchoChannel(t *testing.T) {
	e := newInboundEnv(t)
	s := e.setup("echo")
	var a tenantActivity
	e.deliver(s.channelID, s.secret, `{"text":"ping","idempotency_key":"e1"}`).data(t, 201, &a)
	l := e.list(s.key, a.ConversationID, "")
	if len(l.Data) != 2 || l.Data[1].Text != "echo: ping" || l.Data[1].Sender != "bot" {
		t.Fatalf("%+v", l.Data)
	}
	// A repeat is not answered again.
	e.deliver(s.channelID, s.secret, `{"text":"ping","idempotency_key":"e1"}`).data(t, 201, &a)
	if l := e.list(s.key, a.ConversationID, ""); len(l.Data) != 2 {
		t.Fatalf("%+v", l.Data)
	}
}

// A signed request is single use within its tolerance: one signed body without a
// provider id sent 5 times, one after another and then 5 times at once, creates one
// activity and one conversation; the others are 401 "replayed". With a provider id a
// replay answers the original. The signature, not the header, is what counts: another
// header with the same t and body (a subset of its v1) is a replay too. Once stale, the
// records are purged.
func TestInboundReplayIsRefused(t *testing.T) {
	e := newInboundEnv(t)
	body := `{"text":"captured"}`
	header := signed(e.s.secret, body, e.now)
	var first tenantActivity
	e.do("POST", inboundPath(e.s.channelID), body, header).data(t, 201, &first)
	for range 4 {
		unauthorized(t, e.do("POST", inboundPath(e.s.channelID), body, header), "replayed")
	}
	// The same t and body under another v1 list.
	h := inbound.Sign(e.now, []byte(body), []byte("an old secret"), []byte(e.s.secret))
	unauthorized(t, e.do("POST", inboundPath(e.s.channelID), body, map[string]string{inbound.SignatureHeader: h}), "replayed")
	// The same body signed at another second is a new request.
	if r := e.do("POST", inboundPath(e.s.channelID), body, signed(e.s.secret, body, e.now.Add(-time.Second))); r.status != 201 {
		t.Fatalf("a fresh signature: %d %s", r.status, r.body)
	}

	// Five at once.
	parallel := `{"text":"captured in parallel"}`
	ph := signed(e.s.secret, parallel, e.now)
	statuses := make([]int, 5)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Go(func() { statuses[i] = e.do("POST", inboundPath(e.s.channelID), parallel, ph).status })
	}
	wg.Wait()
	if n := strings.Count(fmt.Sprint(statuses), "201"); n != 1 || strings.Count(fmt.Sprint(statuses), "401") != 4 {
		t.Fatalf("parallel replays: %v, want one 201 and four 401", statuses)
	}
	if n := e.count(`SELECT count(*) FROM conversations WHERE channel_id = $1 AND id <> $2`, e.s.channelID, e.s.conv); n != 3 {
		t.Fatalf("%d new conversations, want 3 (one per signed request)", n)
	}
	if n := e.count(`SELECT count(*) FROM activities a JOIN conversations c ON c.id = a.conversation_id WHERE c.channel_id = $1`, e.s.channelID); n != 3 {
		t.Fatalf("%d activities, want 3", n)
	}

	// With a provider id, the replay answers the original.
	keyed := `{"text":"keyed","idempotency_key":"wamid.replay"}`
	kh := signed(e.s.secret, keyed, e.now)
	var a, b tenantActivity
	e.do("POST", inboundPath(e.s.channelID), keyed, kh).data(t, 201, &a)
	e.do("POST", inboundPath(e.s.channelID), keyed, kh).data(t, 201, &b)
	if !sameActivity(a, b) {
		t.Fatalf("the replay of a keyed message: %+v, want the original %+v", b, a)
	}

	// A status replay is not applied again: it answers the current status.
	st := `{"provider_message_id":"p-replay","status":"sent"}`
	sh := signed(e.s.secret, st, e.now)
	for i, applied := range []bool{true, false} {
		var d struct {
			Data struct {
				Status  string `json:"status"`
				Applied bool   `json:"applied"`
			} `json:"data"`
		}
		r := e.do("POST", statusPath(e.s.channelID), st, sh)
		r.json(t, &d)
		if r.status != 200 || d.Data.Status != "sent" || d.Data.Applied != applied {
			t.Fatalf("status %d: %d %s", i+1, r.status, r.body)
		}
	}

	// Recorded until the signature is stale, then purged.
	if n, err := e.store.PurgeInboundSignatures(context.Background(), e.now); err != nil || n != 0 {
		t.Fatalf("purge before expiry: %d %v", n, err)
	}
	if n, err := e.store.PurgeInboundSignatures(context.Background(), e.now.Add(inbound.Tolerance+time.Second)); err != nil || n != 5 {
		t.Fatalf("purge after expiry: %d %v, want 5 records", n, err)
	}
}
