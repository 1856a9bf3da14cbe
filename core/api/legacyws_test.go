package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/shared/token"
)

// The legacy WebSocket (CORE_API.md §8), with a real WebSocket client against the app.

// legacyFrame is a frame of the legacy WebSocket: a reply or a push.
type legacyFrame struct {
	Event   string          `json:"event"`
	Ref     json.RawMessage `json:"ref"`
	Status  string          `json:"status"`
	Payload json.RawMessage `json:"payload"`
}

// legacyActivity is a pushed activity.
type legacyActivity struct {
	ID             string          `json:"id"`
	Seq            int64           `json:"seq"`
	Type           string          `json:"type"`
	Text           string          `json:"text"`
	Sender         string          `json:"sender"`
	Attachments    json.RawMessage `json:"attachments"`
	Metadata       json.RawMessage `json:"metadata"`
	InsertedAt     string          `json:"inserted_at"`
	ConversationID string          `json:"conversation_id"`
}

// legacyErr is the payload of an error reply.
type legacyErr struct {
	Reason       string              `json:"reason"`
	Message      string              `json:"message"`
	Errors       map[string][]string `json:"errors"`
	RetryAfterMS int64               `json:"retry_after_ms"`
}

// legacyClient reads its frames in the background, in order.
type legacyClient struct {
	t      *testing.T
	c      *websocket.Conn
	frames chan legacyFrame
	done   chan struct{}
	err    error // why reading stopped, once done is closed
	// early are pushes read while waiting for a reply.
	early []legacyActivity
}

// legacyToken asks the tenant API for a legacy token of s's conversation ("" user:
// a token without sub).
func (e *env) legacyToken(s setup, user string) string {
	e.t.Helper()
	body := map[string]any{"conversation_id": s.conv}
	if user != "" {
		body["user_id"] = user
	}
	var a struct {
		Token string `json:"token"`
	}
	e.do("POST", "/api/v1/tokens", body, apiKey(s.key)).answer(e.t, 201, &a)
	return a.Token
}

func legacyPath(tok string) string { return "/socket/websocket?token=" + url.QueryEscape(tok) }

func wsURL(base, path string) string { return "ws" + strings.TrimPrefix(base, "http") + path }

// dialLegacy connects to the legacy WebSocket of the core at base.
func dialLegacy(t *testing.T, base, tok string) *legacyClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL(base, legacyPath(tok)), nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial: %v (status %d)", err, status)
	}
	c.SetReadLimit(16 << 20)
	w := &legacyClient{t: t, c: c, frames: make(chan legacyFrame, 10000), done: make(chan struct{})}
	t.Cleanup(func() { _ = c.CloseNow() })
	go func() {
		defer close(w.done)
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				w.err = err
				return
			}
			var f legacyFrame
			if typ != websocket.MessageText || json.Unmarshal(b, &f) != nil {
				w.err = fmt.Errorf("not a JSON text frame: %q", b)
				return
			}
			w.frames <- f
		}
	}()
	return w
}

// write sends one frame.
func (w *legacyClient) write(typ websocket.MessageType, b []byte) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, typ, b); err != nil {
		w.t.Fatalf("write: %v", err)
	}
}

// send sends a message as JSON.
func (w *legacyClient) send(msg any) {
	w.t.Helper()
	b, err := json.Marshal(msg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.write(websocket.MessageText, b)
}

// next returns the next frame.
func (w *legacyClient) next(timeout time.Duration) legacyFrame {
	w.t.Helper()
	select {
	case f := <-w.frames:
		return f
	case <-w.done:
		// Frames read before the end are still there.
		select {
		case f := <-w.frames:
			return f
		default:
		}
		w.t.Fatalf("connection ended: %v", w.err)
	case <-time.After(timeout):
		w.t.Fatal("timed out waiting for a frame")
	}
	return legacyFrame{}
}

// reply returns the next reply, keeping the pushes read before it.
func (w *legacyClient) reply() legacyFrame {
	w.t.Helper()
	for {
		f := w.next(5 * time.Second)
		switch f.Event {
		case "reply":
			return f
		case "new_activity":
			w.early = append(w.early, pushed(w.t, f))
		default:
			w.t.Fatalf("unexpected frame %+v", f)
		}
	}
}

// call sends a message with a ref and returns its reply, checking the ref.
func (w *legacyClient) call(ref, event string, payload any) legacyFrame {
	w.t.Helper()
	msg := map[string]any{"event": event, "ref": ref}
	if payload != nil {
		msg["payload"] = payload
	}
	w.send(msg)
	f := w.reply()
	if string(f.Ref) != strconv.Quote(ref) {
		w.t.Fatalf("reply ref %s, want %q", f.Ref, ref)
	}
	return f
}

// created checks an ok reply to new_activity and returns its id and seq.
func (f legacyFrame) created(t *testing.T) (string, int64) {
	t.Helper()
	var p struct {
		ID  string `json:"id"`
		Seq int64  `json:"seq"`
	}
	if f.Status != "ok" || json.Unmarshal(f.Payload, &p) != nil || p.ID == "" || p.Seq < 1 {
		t.Fatalf("reply %+v (%s), want ok with id and seq", f, f.Payload)
	}
	return p.ID, p.Seq
}

// failure checks an error reply with a reason and returns its payload.
func (f legacyFrame) failure(t *testing.T, reason string) legacyErr {
	t.Helper()
	var p legacyErr
	if f.Status != "error" || json.Unmarshal(f.Payload, &p) != nil || p.Reason != reason {
		t.Fatalf("reply %+v (%s), want an error %q", f, f.Payload, reason)
	}
	return p
}

func pushed(t *testing.T, f legacyFrame) legacyActivity {
	t.Helper()
	var a legacyActivity
	if f.Event != "new_activity" || len(f.Ref) != 0 || json.Unmarshal(f.Payload, &a) != nil || a.ID == "" {
		t.Fatalf("frame %+v (%s), want a new_activity push", f, f.Payload)
	}
	return a
}

// push returns the next pushed activity.
func (w *legacyClient) push() legacyActivity {
	w.t.Helper()
	if len(w.early) > 0 {
		a := w.early[0]
		w.early = w.early[1:]
		return a
	}
	return pushed(w.t, w.next(5*time.Second))
}

// pushes reads pushed activities and checks their texts in order.
func (w *legacyClient) pushes(texts ...string) []legacyActivity {
	w.t.Helper()
	var got []legacyActivity
	for _, text := range texts {
		a := w.push()
		if a.Text != text {
			w.t.Fatalf("pushed %q, want %q (after %d)", a.Text, text, len(got))
		}
		got = append(got, a)
	}
	return got
}

// quiet checks that nothing arrives for d.
func (w *legacyClient) quiet(d time.Duration) {
	w.t.Helper()
	if len(w.early) > 0 {
		w.t.Fatalf("unexpected push %+v", w.early[0])
	}
	select {
	case f := <-w.frames:
		w.t.Fatalf("unexpected frame %+v (%s)", f, f.Payload)
	case <-time.After(d):
	}
}

// closed waits for the connection to end and returns its close status (-1: not a close).
func (w *legacyClient) closed(timeout time.Duration) websocket.StatusCode {
	w.t.Helper()
	select {
	case <-w.done:
		return websocket.CloseStatus(w.err)
	case <-time.After(timeout):
		w.t.Fatal("the connection was not closed")
		return 0
	}
}

// sender reads an activity's stored sender.
func (e *env) sender(id string) string {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), `SELECT sender FROM activities WHERE id = $1`, id).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

func TestLegacyWebSocketIgnoresServerFields(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	victim := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	payload := forged(victim.tenantID, victim.conv)
	payload["type"] = "message"
	payload["text"] = "hi"
	payload["sender"] = "bot"

	start := time.Now()
	id, seq := w.call("1", "new_activity", payload).created(t)
	if id == "11111111-1111-4111-8111-111111111111" || seq != 1 {
		t.Fatalf("created %s seq %d", id, seq)
	}
	r := e.row(id)
	if r.Key != "<null>" || r.Seq != 1 || r.TenantID != s.tenantID || r.ConversationID != s.conv ||
		r.InsertedAt.Before(start.Add(-time.Minute)) || r.InsertedAt.Year() == 1999 {
		t.Fatalf("stored %+v", r)
	}
	if got := e.sender(id); got != "alice" {
		t.Fatalf("stored sender %q, want the token's sub", got)
	}
	// The client's own activity is pushed too, after the reply.
	if len(w.early) != 0 {
		t.Fatalf("pushed before the reply: %+v", w.early)
	}
	a := w.push()
	if a.ID != id || a.Seq != 1 || a.Sender != "alice" || a.Text != "hi" || a.Type != "message" || a.ConversationID != s.conv ||
		strings.HasPrefix(a.InsertedAt, "1999") || string(a.Attachments) != "[]" || string(a.Metadata) != "{}" {
		t.Fatalf("pushed %+v", a)
	}
	// The payload's idempotency_key is none: the same payload is a new activity.
	id2, seq2 := w.call("2", "new_activity", payload).created(t)
	if id2 == id || seq2 != 2 {
		t.Fatalf("a payload idempotency_key was honoured: %s %d", id2, seq2)
	}
	w.pushes("hi")
	if n := e.count(`SELECT count(*) FROM activities WHERE conversation_id = $1`, victim.conv); n != 0 {
		t.Fatalf("%d activities in the conversation named in the payload", n)
	}

	// A token without sub: the sender is "user", whatever the payload says.
	anon := dialLegacy(t, e.base, e.legacyToken(s, ""))
	id3, _ := anon.call("a", "new_activity", map[string]any{"text": "anonymous", "sender": "alice"}).created(t)
	if got := e.sender(id3); got != "user" {
		t.Fatalf("stored sender %q, want user", got)
	}
	if a := anon.push(); a.ID != id3 || a.Sender != "user" {
		t.Fatalf("pushed %+v", a)
	}
	// The first connection sees it as well.
	if a := w.push(); a.ID != id3 || a.Sender != "user" {
		t.Fatalf("pushed %+v", a)
	}
	// And a token signed without any sub claim at all (not through the token API).
	tok, err := e.signer.IssueLegacy(s.conv, s.tenantID, "", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if cl, err := e.verifier().VerifyLegacy(tok); err != nil || cl.Subject != "" {
		t.Fatalf("claims %+v %v", cl, err)
	}
	signed := dialLegacy(t, e.base, tok)
	id4, _ := signed.call("b", "new_activity", map[string]any{"text": "signed"}).created(t)
	if got := e.sender(id4); got != "user" {
		t.Fatalf("stored sender %q, want user", got)
	}
}

func TestLegacyWebSocketInvalidActivities(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	l := activity.DefaultLimits
	for i, tc := range limitCases(l) {
		p := w.call("limit"+strconv.Itoa(i), "new_activity", tc.body).failure(t, "invalid_activity")
		if len(p.Errors[tc.field]) == 0 || len(p.Errors) != 1 {
			t.Fatalf("%s: errors %v, want only the field %s", tc.name, p.Errors, tc.field)
		}
	}
	for _, tc := range []struct {
		name    string
		payload any
		field   string
	}{
		{"no payload", nil, "payload"},
		{"payload not an object", "hello", "payload"},
		{"text not a string", map[string]any{"text": 5}, "text"},
		{"attachments not a list", map[string]any{"attachments": "x"}, "attachments"},
		{"metadata not an object", map[string]any{"metadata": []int{1}}, "metadata"},
	} {
		p := w.call(tc.name, "new_activity", tc.payload).failure(t, "invalid_activity")
		if len(p.Errors[tc.field]) == 0 {
			t.Fatalf("%s: errors %v, want the field %s", tc.name, p.Errors, tc.field)
		}
	}
	// Several violations at once are all named.
	p := w.call("many", "new_activity", map[string]any{"type": "bogus", "text": strings.Repeat("x", l.MaxTextBytes+1)}).
		failure(t, "invalid_activity")
	if p.Errors["type"] == nil || p.Errors["text"] == nil {
		t.Fatalf("errors %v", p.Errors)
	}
	if n := e.count(`SELECT count(*) FROM activities`); n != 0 {
		t.Fatalf("%d activities stored", n)
	}
	// The connection is still there, and an activity at every limit fits in a message,
	// also with a text of characters that JSON escapes.
	w.call("at limit", "new_activity", atLimit(l)).created(t)
	escaped := atLimit(l)
	escaped["text"] = strings.Repeat("\n", l.MaxTextBytes)
	w.call("escaped", "new_activity", escaped).created(t)
	w.pushes(strings.Repeat("t", l.MaxTextBytes), strings.Repeat("\n", l.MaxTextBytes))
}

func TestLegacyWebSocketClosedConversation(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	e.do("POST", "/api/v1/conversations/"+s.conv+"/close", nil, apiKey(s.key)).data(t, 200, &tenantConversation{})
	if a := w.push(); a.Type != "conversationUpdate" || a.Sender != "system" {
		t.Fatalf("pushed %+v", a)
	}
	w.call("1", "new_activity", map[string]any{"text": "too late"}).failure(t, "conversation_closed")
	// Validation comes first.
	w.call("2", "new_activity", map[string]any{"type": "bogus"}).failure(t, "invalid_activity")
	if w.call("3", "heartbeat", nil).Status != "ok" {
		t.Fatal("heartbeat on a closed conversation")
	}
	e.do("POST", "/api/v1/conversations/"+s.conv+"/reopen", nil, apiKey(s.key)).data(t, 200, &tenantConversation{})
	w.push()
	if _, seq := w.call("4", "new_activity", map[string]any{"text": "again"}).created(t); seq != 3 {
		t.Fatalf("seq %d after close and reopen", seq)
	}
	w.pushes("again")
}

func TestLegacyWebSocketPushes(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.streamInstance(nil)
	s := e.setup("webhook")
	other := e.setup("webhook")
	onA := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	onB := dialLegacy(t, b.base, e.legacyToken(s, "bob"))
	elsewhere := dialLegacy(t, e.base, e.legacyToken(other, "carol"))

	// An activity of the tenant API (on instance A) reaches both instances' sockets.
	before := time.Now()
	posted := e.post(s.key, s.conv, map[string]any{"text": "from the tenant API", "sender": "agent", "metadata": map[string]any{"k": "v"},
		"attachments": []any{map[string]any{"contentType": "text/plain", "content": "x"}}})
	for _, w := range []*legacyClient{onA, onB} {
		a := w.push()
		ts, err := time.Parse(time.RFC3339Nano, a.InsertedAt)
		if a.ID != posted.ID || a.Seq != 1 || a.Sender != "agent" || a.Type != "message" || a.ConversationID != s.conv ||
			string(a.Metadata) != `{"k":"v"}` || !strings.Contains(string(a.Attachments), `"content":"x"`) ||
			err != nil || ts.Before(before.Add(-time.Minute)) {
			t.Fatalf("pushed %+v (%v)", a, err)
		}
	}
	// One created on instance B's socket reaches instance A's.
	idB, _ := onB.call("1", "new_activity", map[string]any{"text": "from B"}).created(t)
	onB.pushes("from B")
	if a := onA.push(); a.ID != idB || a.Sender != "bob" {
		t.Fatalf("pushed %+v", a)
	}
	// And any other path (here the store itself, as the inbound webhooks do).
	if _, _, err := e.store.CreateActivity(context.Background(), activity.Client{Type: "event", Text: "from the store"},
		activity.System{TenantID: s.tenantID, ConversationID: s.conv, Sender: "external"}); err != nil {
		t.Fatal(err)
	}
	onA.pushes("from the store")
	onB.pushes("from the store")
	elsewhere.quiet(200 * time.Millisecond)

	// An echo channel answers a message of the socket: the reply first, then the
	// message and the echo, in order.
	echo := e.setup("echo")
	w := dialLegacy(t, e.base, e.legacyToken(echo, "alice"))
	id, seq := w.call("e", "new_activity", map[string]any{"type": "message", "text": "hello"}).created(t)
	got := w.pushes("hello", "echo: hello")
	if got[0].ID != id || got[0].Seq != seq || got[1].Sender != "bot" || got[1].Seq != seq+1 {
		t.Fatalf("pushed %+v", got)
	}
	// Typing is not echoed.
	w.call("t", "new_activity", map[string]any{"type": "typing"}).created(t)
	if a := w.push(); a.Type != "typing" {
		t.Fatalf("pushed %+v", a)
	}
	w.quiet(200 * time.Millisecond)

	// A client that leaves is unsubscribed.
	streamWaitFor(t, "one socket on B", func() bool { return b.listener.Streams() == 1 })
	if err := onB.c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close handshake: %v", err)
	}
	streamWaitFor(t, "no socket on B", func() bool { return b.listener.Streams() == 0 })
}

var legacyUpgradeHeaders = streamUpgradeHeaders

func TestLegacyWebSocketRefusedAtConnect(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	other := e.setup("webhook")
	legacy := func(conv, tenantID string, at time.Time) string {
		tok, err := e.signer.IssueLegacy(conv, tenantID, "alice", at)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	converger := e.clientToken(s.secret, nil).Token
	bound := e.startConversation(converger).Token
	cases := []struct{ name, path string }{
		{"no token", "/socket/websocket"},
		{"empty token", legacyPath("")},
		{"garbage", legacyPath("garbage")},
		{"Converger token", legacyPath(converger)},
		{"bound Converger token", legacyPath(bound)},
		{"channel secret", legacyPath(s.secret)},
		{"publishable key", legacyPath(s.publishable)},
		{"API key", legacyPath(s.key)},
		{"expired legacy token", legacyPath(legacy(s.conv, s.tenantID, time.Now().Add(-2*token.LegacyLifetime)))},
		{"token in another parameter", "/socket/websocket?t=" + url.QueryEscape(e.legacyToken(s, "alice"))},
		{"missing conversation", legacyPath(legacy(missingID, s.tenantID, time.Now()))},
		{"another tenant's conversation", legacyPath(legacy(other.conv, s.tenantID, time.Now()))},
	}
	for _, c := range cases {
		r := e.do("GET", c.path, nil, legacyUpgradeHeaders)
		if r.status == http.StatusSwitchingProtocols {
			t.Fatalf("%s: upgraded", c.name)
		}
		r.errorCode(t, 403, "forbidden")
		// A real client sees the 403 as a failed handshake.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, resp, err := websocket.Dial(ctx, wsURL(e.base, c.path), nil)
		cancel()
		if err == nil || resp == nil || resp.StatusCode != 403 {
			t.Fatalf("%s: dial answered %v %v", c.name, resp, err)
		}
	}
	sameAnswer(t, "another tenant's conversation vs a missing one",
		e.do("GET", legacyPath(legacy(other.conv, s.tenantID, time.Now())), nil, legacyUpgradeHeaders),
		e.do("GET", legacyPath(legacy(missingID, s.tenantID, time.Now())), nil, legacyUpgradeHeaders))
	// A valid token on a request that is no WebSocket handshake.
	tok := e.legacyToken(s, "alice")
	e.do("GET", legacyPath(tok), nil, nil).errorCode(t, 400, "bad_request")
	// Other methods are not the socket.
	r := e.do("POST", legacyPath(tok), nil, nil)
	r.errorCode(t, 405, "method_not_allowed")
	if r.header.Get("allow") != "GET, HEAD" {
		t.Fatalf("Allow %q", r.header.Get("allow"))
	}
	// Nothing of the above created anything.
	if n := e.count(`SELECT count(*) FROM activities`); n != 0 {
		t.Fatalf("%d activities", n)
	}
	// A channel that became inactive refuses the socket.
	dialLegacy(t, e.base, tok).call("1", "heartbeat", nil)
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, s.channelID)
	e.do("GET", legacyPath(tok), nil, legacyUpgradeHeaders).errorCode(t, 403, "forbidden")
}

func TestLegacyWebSocketMessages(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	f := w.call("x", "heartbeat", nil)
	if f.Status != "ok" || string(f.Payload) != "{}" {
		t.Fatalf("heartbeat reply %+v", f)
	}
	// A number ref is echoed as it is; no ref is a null one.
	w.write(websocket.MessageText, []byte(`{"event":"heartbeat","ref":7}`))
	if f := w.reply(); string(f.Ref) != "7" || f.Status != "ok" {
		t.Fatalf("reply %+v", f)
	}
	w.write(websocket.MessageText, []byte(`{"event":"heartbeat"}`))
	if f := w.reply(); string(f.Ref) != "null" || f.Status != "ok" {
		t.Fatalf("reply %+v", f)
	}
	for _, tc := range []struct {
		name  string
		typ   websocket.MessageType
		frame string
		ref   string
	}{
		{"not JSON", websocket.MessageText, "hello", "null"},
		{"empty frame", websocket.MessageText, "", "null"},
		{"JSON null", websocket.MessageText, "null", "null"},
		{"JSON array", websocket.MessageText, `[{"event":"heartbeat"}]`, "null"},
		{"unknown event", websocket.MessageText, `{"event":"phx_join","ref":"a"}`, `"a"`},
		{"no event", websocket.MessageText, `{"ref":"b","payload":{"text":"hi"}}`, `"b"`},
		{"event not a string", websocket.MessageText, `{"event":1,"ref":"c"}`, `"c"`},
		{"ref an object", websocket.MessageText, `{"event":"heartbeat","ref":{"a":1}}`, "null"},
		{"ref too long", websocket.MessageText, `{"event":"heartbeat","ref":"` + strings.Repeat("r", 300) + `"}`, "null"},
		{"binary frame", websocket.MessageBinary, `{"event":"heartbeat","ref":"d"}`, "null"},
	} {
		w.write(tc.typ, []byte(tc.frame))
		f := w.reply()
		if string(f.Ref) != tc.ref {
			t.Fatalf("%s: ref %s, want %s", tc.name, f.Ref, tc.ref)
		}
		if p := f.failure(t, "invalid_message"); p.Message == "" {
			t.Fatalf("%s: no message in %+v", tc.name, p)
		}
	}
	// The connection stays open.
	if w.call("y", "heartbeat", nil).Status != "ok" {
		t.Fatal("heartbeat after invalid messages")
	}
	if n := e.count(`SELECT count(*) FROM activities`); n != 0 {
		t.Fatalf("%d activities", n)
	}
	w.quiet(100 * time.Millisecond)
	if err := w.c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close handshake: %v", err)
	}
}

func TestLegacyWebSocketRateLimit(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	// 30 at once: the burst of 20 passes, then about 10 a second; the others are
	// refused, fewer than the 20 refusals in a row that close the connection.
	const n = 30
	start := time.Now()
	for i := 0; i < n; i++ {
		w.send(map[string]any{"event": "heartbeat", "ref": strconv.Itoa(i)})
	}
	ok, limited := 0, 0
	var retry int64
	for i := 0; i < n; i++ {
		f := w.reply()
		if string(f.Ref) != strconv.Quote(strconv.Itoa(i)) {
			t.Fatalf("reply %d has ref %s", i, f.Ref)
		}
		if f.Status == "ok" {
			ok++
			continue
		}
		p := f.failure(t, "rate_limited")
		if i < 20 {
			t.Fatalf("message %d refused within the burst", i)
		}
		limited++
		retry = p.RetryAfterMS
	}
	elapsed := time.Since(start)
	if most := 20 + int(math.Ceil(elapsed.Seconds()*10)) + 1; ok > most || limited == 0 {
		t.Fatalf("%d accepted and %d refused in %v, want at most %d accepted", ok, limited, elapsed, most)
	}
	if retry < 1 || retry > 100 {
		t.Fatalf("retry_after_ms %d, want at most the 100 ms of one token", retry)
	}
	// Refills: a little later messages pass again.
	time.Sleep(250 * time.Millisecond)
	w.call("later", "heartbeat", nil)
	if f := w.call("later activity", "new_activity", map[string]any{"text": "slow"}); f.Status != "ok" {
		t.Fatalf("reply %+v", f)
	}

	// A client that keeps sending over the bound is closed with 1008.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 100; i++ {
		if w.c.Write(ctx, websocket.MessageText, []byte(`{"event":"heartbeat"}`)) != nil {
			break
		}
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-w.frames:
			continue
		case <-w.done:
		case <-deadline:
			t.Fatal("the connection was not closed")
		}
		break
	}
	if code := websocket.CloseStatus(w.err); code != websocket.StatusPolicyViolation {
		t.Fatalf("close status %v (%v), want 1008", code, w.err)
	}
	// Each connection has its own bucket.
	dialLegacy(t, e.base, e.legacyToken(s, "alice")).call("fresh", "heartbeat", nil)
}

// The close over the rate bound (1008) comes after the replies to every frame before
// the one that closed it, also those still queued when the reader decided to close.
func TestLegacyWebSocketRepliesBeforeTheRateClose(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	// Creates take the burst and keep the connection's loop busy with the database, so
	// that the reader runs ahead of it; then heartbeats over the bound.
	// The bucket's burst is 20; 20 refusals in a row close.
	const creates, beats, maxRefused = 20, 60, 20
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range creates + beats {
		msg := fmt.Sprintf(`{"event":"heartbeat","ref":%d}`, i)
		if i < creates {
			msg = fmt.Sprintf(`{"event":"new_activity","ref":%d,"payload":{"text":"m%d"}}`, i, i)
		}
		if err := w.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			break // closed by the server meanwhile
		}
	}
	if code := w.closed(10 * time.Second); code != websocket.StatusPolicyViolation {
		t.Fatalf("close status %v (%v), want 1008", code, w.err)
	}
	var replies []legacyFrame
	for len(w.frames) > 0 {
		if f := <-w.frames; f.Event == "reply" {
			replies = append(replies, f)
		}
	}
	// Every frame up to the closing one has its reply, in order, and the 19 before it
	// are the refusals that led to the close.
	for i, f := range replies {
		if string(f.Ref) != strconv.Itoa(i) {
			t.Fatalf("reply %d has ref %s: replies were lost or reordered", i, f.Ref)
		}
	}
	n := len(replies)
	if n < creates+maxRefused-1 || n >= creates+beats {
		t.Fatalf("%d replies before the close, want at least %d", n, creates+maxRefused-1)
	}
	for _, f := range replies[n-(maxRefused-1):] {
		if f.Status != "error" || !strings.Contains(string(f.Payload), `"rate_limited"`) {
			t.Fatalf("reply %s before the close: %s %s, want rate_limited (the replies before the close were lost)", f.Ref, f.Status, f.Payload)
		}
	}
	for _, f := range replies[:creates] {
		if f.Status != "ok" {
			t.Fatalf("create %s: %s %s", f.Ref, f.Status, f.Payload)
		}
	}
	if stored := e.count(`SELECT count(*) FROM activities`); stored != creates {
		t.Fatalf("%d activities stored, want the %d acknowledged", stored, creates)
	}
}

func TestLegacyWebSocketSizeLimit(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	w.call("1", "heartbeat", nil)
	// 2×65536 + 10×4097 + 16384 + 4096 bytes is the bound with the default limits.
	big, _ := json.Marshal(map[string]any{"event": "new_activity", "ref": "2",
		"payload": map[string]any{"text": strings.Repeat("x", 200_000)}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The server may close before the whole message is written.
	_ = w.c.Write(ctx, websocket.MessageText, big)
	if code := w.closed(5 * time.Second); code != websocket.StatusMessageTooBig {
		t.Fatalf("close status %v (%v), want 1009", code, w.err)
	}
	if n := e.count(`SELECT count(*) FROM activities`); n != 0 {
		t.Fatalf("%d activities", n)
	}
}

func TestLegacyWebSocketClosesWhenTheTokenExpires(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	// Issued so that it expires in two seconds.
	tok, err := e.signer.IssueLegacy(s.conv, s.tenantID, "alice", time.Now().Add(-token.LegacyLifetime+2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w := dialLegacy(t, e.base, tok)
	w.call("1", "heartbeat", nil)
	if code := w.closed(10 * time.Second); code != websocket.StatusPolicyViolation {
		t.Fatalf("close status %v (%v), want 1008", code, w.err)
	}
}

// A number PostgreSQL's jsonb cannot hold (more than 16383 digits after the point once
// the exponent is applied), in metadata within the size limit, is a field error, not an
// internal one.
func TestLegacyWebSocketNumbersBeyondJSONB(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.setup("webhook")
	w := dialLegacy(t, e.base, e.legacyToken(s, "alice"))
	tooPrecise := json.RawMessage("0." + strings.Repeat("9", 15384) + "e-1000")
	p := w.call("1", "new_activity", map[string]any{"metadata": map[string]any{"n": tooPrecise}}).failure(t, "invalid_activity")
	if len(p.Errors["metadata"]) == 0 {
		t.Fatalf("errors %v", p.Errors)
	}
	// One digit less is stored.
	fits := json.RawMessage("0." + strings.Repeat("9", 15383) + "e-1000")
	w.call("2", "new_activity", map[string]any{"metadata": map[string]any{"n": fits}}).created(t)
}
