package api_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/api"
	"github.com/converger/edge/shared/token"
)

// coreInstance is one more core over an env's database and keys: two instances behind one
// Envoy share PostgreSQL and the token signing key.
type coreInstance struct {
	base     string
	listener *api.Listener
}

// streamInstance starts another core over e's store; deps changes its dependencies.
func (e *env) streamInstance(deps func(*api.Deps)) coreInstance {
	e.t.Helper()
	verifier, err := token.ParseVerifyKeys(e.signer.PublicKey())
	if err != nil {
		e.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	d := api.Deps{Store: e.store, Signer: e.signer, Verifier: verifier, PublicURL: base, Limits: activity.DefaultLimits,
		MaxUploadBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if deps != nil {
		deps(&d)
	}
	app, listener := api.New(d)
	ctx, cancel := context.WithCancel(context.Background())
	go listener.Run(ctx)
	go func() { _ = app.Listener(ln) }()
	e.t.Cleanup(func() {
		cancel()
		_ = app.ShutdownWithTimeout(5 * time.Second)
	})
	return coreInstance{base: base, listener: listener}
}

// streamConv is a tenant, a webhook channel (no echo replies) and a conversation, with
// a token bound to it.
type streamConv struct {
	tenantID, channelID, conv, tok string
}

func (e *env) streamConv() streamConv {
	e.t.Helper()
	tn, _ := e.tenant()
	ch, _ := e.channel(tn.ID, "webhook")
	conv, err := e.store.CreateConversation(context.Background(), tn.ID, ch.ID, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	s := streamConv{tenantID: tn.ID, channelID: ch.ID, conv: conv.ID}
	s.tok = e.streamToken(s, conv.ID, time.Now())
	return s
}

// streamToken issues a token of the conversation's channel bound to conv ("" for unbound).
func (e *env) streamToken(s streamConv, conv string, now time.Time) string {
	e.t.Helper()
	tok, err := e.signer.Issue(token.Claims{TenantID: s.tenantID, ChannelID: s.channelID, ConversationID: conv,
		Src: token.SrcSecret}, now)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// streamCreate stores an activity through the trusted path (as any instance would).
func (e *env) streamCreate(s streamConv, text string) activity.Activity {
	e.t.Helper()
	a, _, err := e.store.CreateActivity(context.Background(), activity.Client{Type: "message", Text: text},
		activity.System{TenantID: s.tenantID, ConversationID: s.conv, Sender: "user"})
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// streamPost posts a Direct Line activity through the client API of the core at base.
func (e *env) streamPost(base string, s streamConv, text string) {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"type": "message", "text": text, "from": map[string]string{"id": "u1"}})
	req, _ := http.NewRequest("POST", base+"/api/v1/converger/conversations/"+s.conv+"/activities", strings.NewReader(string(body)))
	req.Header.Set("content-type", "application/json")
	req.Header.Set("authorization", "Bearer "+s.tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		e.t.Fatalf("post via %s: %d %s", base, resp.StatusCode, b)
	}
}

func streamWatermark(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("seq:" + strconv.FormatInt(seq, 10)))
}

func streamPath(conv, tok, watermark string) string {
	p := "/api/v1/converger/conversations/" + conv + "/stream?t=" + tok
	if watermark != "" {
		p += "&watermark=" + watermark
	}
	return p
}

// streamFrame is a Direct Line stream frame.
type streamFrame struct {
	Activities []streamActivity `json:"activities"`
	Watermark  string           `json:"watermark"`
}

type streamActivity struct {
	ID             string              `json:"id"`
	Type           string              `json:"type"`
	From           struct{ ID string } `json:"from"`
	Text           string              `json:"text"`
	Timestamp      string              `json:"timestamp"`
	ConversationID string              `json:"conversationId"`
	Attachments    []map[string]any    `json:"attachments"`
	ChannelData    map[string]any      `json:"channelData"`
}

// wsClient is a stream client whose frames are read in the background (coder/websocket
// closes the connection when a Read's context ends, so reads are not bounded that way).
type wsClient struct {
	t      *testing.T
	c      *websocket.Conn
	frames chan streamFrame
	done   chan struct{}
	err    error // why reading stopped, once done is closed
	raw    chan string
}

// dialStream connects a stream; reading starts with start.
func dialStream(t *testing.T, base, path string, opts *websocket.DialOptions) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+path, opts)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial: %v (status %d)", err, status)
	}
	c.SetReadLimit(64 << 20)
	w := &wsClient{t: t, c: c, frames: make(chan streamFrame, 100000), done: make(chan struct{}), raw: make(chan string, 100)}
	t.Cleanup(func() { _ = c.CloseNow() })
	return w
}

func (w *wsClient) start() *wsClient {
	go func() {
		defer close(w.done)
		for {
			typ, b, err := w.c.Read(context.Background())
			if err != nil {
				w.err = err
				return
			}
			if typ != websocket.MessageText || len(b) == 0 {
				select {
				case w.raw <- string(b):
				default:
				}
				continue
			}
			var f streamFrame
			if err := json.Unmarshal(b, &f); err != nil {
				w.err = fmt.Errorf("frame is not JSON: %q", b)
				return
			}
			w.frames <- f
		}
	}()
	return w
}

// expect reads frames until it has len(texts) more activities and checks their texts
// in order; it returns the activities and the last frame's watermark.
func (w *wsClient) expect(timeout time.Duration, texts ...string) ([]streamActivity, string) {
	w.t.Helper()
	var got []streamActivity
	var watermark string
	deadline := time.After(timeout)
	for len(got) < len(texts) {
		select {
		case f := <-w.frames:
			if len(f.Activities) == 0 || f.Watermark == "" {
				w.t.Fatalf("frame without activities or watermark: %+v", f)
			}
			got = append(got, f.Activities...)
			watermark = f.Watermark
		case <-w.done:
			w.t.Fatalf("stream ended after %d of %d activities: %v", len(got), len(texts), w.err)
		case <-deadline:
			w.t.Fatalf("timed out after %d of %d activities", len(got), len(texts))
		}
	}
	for i, a := range got {
		if i >= len(texts) || a.Text != texts[i] {
			w.t.Fatalf("activity %d: %q, want the texts %q (got %d)", i, a.Text, texts, len(got))
		}
	}
	return got, watermark
}

// quiet checks that no frame arrives for d.
func (w *wsClient) quiet(d time.Duration) {
	w.t.Helper()
	select {
	case f := <-w.frames:
		w.t.Fatalf("unexpected frame: %+v", f)
	case <-time.After(d):
	}
}

// closed waits for the stream to end and returns its close status (-1: not a close).
func (w *wsClient) closed(timeout time.Duration) websocket.StatusCode {
	w.t.Helper()
	select {
	case <-w.done:
		return websocket.CloseStatus(w.err)
	case <-time.After(timeout):
		w.t.Fatal("the stream was not closed")
		return 0
	}
}

func streamTexts(prefix string, from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, prefix+strconv.Itoa(i))
	}
	return out
}

func TestStreamReplaysThenPushes(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.streamConv()
	for i := 1; i <= 3; i++ {
		e.streamCreate(s, "m"+strconv.Itoa(i))
	}
	// After a watermark: the activities after it, then the live ones.
	w := dialStream(t, e.base, streamPath(s.conv, s.tok, streamWatermark(1)), nil).start()
	got, wm := w.expect(5*time.Second, "m2", "m3")
	if wm != streamWatermark(3) {
		t.Fatalf("replay watermark %q, want %q", wm, streamWatermark(3))
	}
	a := got[0]
	if a.ID == "" || a.Type != "message" || a.From.ID != "user" || a.ConversationID != s.conv || a.Timestamp == "" ||
		a.Attachments == nil || a.ChannelData == nil {
		t.Fatalf("activity shape: %+v", a)
	}
	e.streamPost(e.base, s, "m4")
	if _, wm := w.expect(5*time.Second, "m4"); wm != streamWatermark(4) {
		t.Fatalf("live watermark %q, want %q", wm, streamWatermark(4))
	}
	w.quiet(200 * time.Millisecond)

	// No watermark, or an invalid one: from the beginning.
	for _, wm := range []string{"", "not-a-watermark", streamWatermark(0)} {
		w := dialStream(t, e.base, streamPath(s.conv, s.tok, wm), nil).start()
		w.expect(5*time.Second, "m1", "m2", "m3", "m4")
	}
	// A watermark at the end: nothing until something new.
	w = dialStream(t, e.base, streamPath(s.conv, s.tok, streamWatermark(4)), nil).start()
	w.quiet(200 * time.Millisecond)
	e.streamCreate(s, "m5")
	w.expect(5*time.Second, "m5")

	// The streamUrl of a reconnect works as it is, with its watermark.
	r := e.do("GET", "/api/v1/converger/conversations/"+s.conv+"?watermark="+streamWatermark(4), nil,
		map[string]string{"authorization": "Bearer " + s.tok})
	var conv struct {
		StreamURL string `json:"streamUrl"`
	}
	r.json(t, &conv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, conv.StreamURL, nil)
	if err != nil {
		t.Fatalf("dial the streamUrl %q: %v", conv.StreamURL, err)
	}
	c.SetReadLimit(1 << 20)
	w = &wsClient{t: t, c: c, frames: make(chan streamFrame, 100), done: make(chan struct{}), raw: make(chan string, 10)}
	t.Cleanup(func() { _ = c.CloseNow() })
	w.start()
	w.expect(5*time.Second, "m5")
}

func TestStreamNoGapNoDuplicateWhilePosting(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.streamConv()
	const n = 150
	all := streamTexts("n", 1, n)
	started := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i <= n; i++ {
			if i == 20 {
				close(started)
			}
			if _, _, err := e.store.CreateActivity(context.Background(), activity.Client{Type: "message", Text: "n" + strconv.Itoa(i)},
				activity.System{TenantID: s.tenantID, ConversationID: s.conv, Sender: "user"}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	<-started
	// Streams connect while activities are being created, each after a different
	// watermark: each must see exactly the activities after it, in order.
	var clients []*wsClient
	var froms []int
	for i := 0; i < 6; i++ {
		from := i * 5
		wm := ""
		if from > 0 {
			wm = streamWatermark(int64(from))
		}
		clients = append(clients, dialStream(t, e.base, streamPath(s.conv, s.tok, wm), nil).start())
		froms = append(froms, from)
		time.Sleep(3 * time.Millisecond)
	}
	wg.Wait()
	for i, w := range clients {
		got, wm := w.expect(10*time.Second, all[froms[i]:]...)
		if wm != streamWatermark(n) {
			t.Fatalf("client %d: last watermark %q", i, wm)
		}
		seen := map[string]bool{}
		for _, a := range got {
			if seen[a.ID] {
				t.Fatalf("client %d: duplicate %s", i, a.ID)
			}
			seen[a.ID] = true
		}
		w.quiet(50 * time.Millisecond)
	}
}

func TestStreamFansOutAcrossInstances(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.streamInstance(nil)
	s := e.streamConv()
	onA := dialStream(t, e.base, streamPath(s.conv, s.tok, ""), nil).start()
	onB := dialStream(t, b.base, streamPath(s.conv, s.tok, ""), nil).start()
	e.streamPost(b.base, s, "from B")
	e.streamPost(e.base, s, "from A")
	onA.expect(5*time.Second, "from B", "from A")
	onB.expect(5*time.Second, "from B", "from A")
	// Another conversation's stream gets nothing.
	other := e.streamConv()
	w := dialStream(t, b.base, streamPath(other.conv, other.tok, ""), nil).start()
	e.streamPost(e.base, s, "again")
	onB.expect(5*time.Second, "again")
	w.quiet(200 * time.Millisecond)
}

func TestStreamResyncsAfterListenReconnect(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.streamInstance(nil)
	s := e.streamConv()
	streamWaitFor(t, "listening", b.listener.Listening)
	w := dialStream(t, b.base, streamPath(s.conv, s.tok, ""), nil).start()
	e.streamCreate(s, "before")
	w.expect(5*time.Second, "before")
	// Cut every LISTEN connection; what is created while they reconnect must still
	// reach the stream.
	e.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN %'`)
	streamWaitFor(t, "not listening", func() bool { return !b.listener.Listening() })
	e.streamCreate(s, "during")
	streamWaitFor(t, "listening again", b.listener.Listening)
	w.expect(5*time.Second, "during")
	e.streamCreate(s, "after")
	w.expect(5*time.Second, "after")
}

func streamWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	streamWaitLong(t, 10*time.Second, what, cond)
}

func streamWaitLong(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var streamUpgradeHeaders = map[string]string{
	"connection": "Upgrade", "upgrade": "websocket", "sec-websocket-version": "13",
	"sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
}

func TestStreamRefusedBeforeUpgrade(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.streamConv()
	other := e.streamConv() // another tenant's conversation
	sibling, err := e.store.CreateConversation(context.Background(), s.tenantID, s.channelID, nil)
	if err != nil {
		t.Fatal(err)
	}
	expired := e.streamToken(s, s.conv, time.Now().Add(-2*time.Hour))
	// Bad tokens and a bound token on another conversation are 403; for an unbound
	// token, a conversation of another channel or tenant is 404, as a missing one.
	cases := []struct {
		name, path string
		status     int
		code       string
	}{
		{"no token", "/api/v1/converger/conversations/" + s.conv + "/stream", 403, "forbidden"},
		{"bad token", streamPath(s.conv, "garbage", ""), 403, "forbidden"},
		{"expired token", streamPath(s.conv, expired, ""), 403, "forbidden"},
		{"token of another conversation", streamPath(sibling.ID, s.tok, ""), 403, "forbidden"},
		{"another tenant's conversation", streamPath(other.conv, s.tok, ""), 403, "forbidden"},
		{"unbound token of another channel", streamPath(other.conv, e.streamToken(s, "", time.Now()), ""), 404, "not_found"},
		{"missing conversation", streamPath(missingID, e.streamToken(s, "", time.Now()), ""), 404, "not_found"},
		{"malformed id", streamPath("nope", e.streamToken(s, "", time.Now()), ""), 404, "not_found"},
	}
	for _, c := range cases {
		r := e.do("GET", c.path, nil, streamUpgradeHeaders)
		if r.status == http.StatusSwitchingProtocols {
			t.Fatalf("%s: upgraded", c.name)
		}
		r.errorCode(t, c.status, c.code)
		// A real client sees the refusal as a failed handshake.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.base, "http")+c.path, nil)
		cancel()
		if err == nil || resp == nil || resp.StatusCode != c.status {
			t.Fatalf("%s: dial answered %v %v", c.name, resp, err)
		}
	}
	// The other tenant's conversation answers exactly like a missing one.
	sameAnswer(t, "other tenant vs missing",
		e.do("GET", streamPath(other.conv, e.streamToken(s, "", time.Now()), ""), nil, streamUpgradeHeaders),
		e.do("GET", streamPath(missingID, e.streamToken(s, "", time.Now()), ""), nil, streamUpgradeHeaders))
	// A valid request that is not a WebSocket handshake.
	e.do("GET", streamPath(s.conv, s.tok, ""), nil, nil).errorCode(t, 400, "bad_request")
	// An unbound token of the channel may follow its conversations.
	w := dialStream(t, e.base, streamPath(sibling.ID, e.streamToken(s, "", time.Now()), ""), nil).start()
	w.quiet(100 * time.Millisecond)
	// A channel that became inactive refuses new streams.
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, s.channelID)
	e.do("GET", streamPath(s.conv, s.tok, ""), nil, streamUpgradeHeaders).errorCode(t, 403, "forbidden")
}

func TestStreamToleratesKeepAlives(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.streamConv()
	w := dialStream(t, e.base, streamPath(s.conv, s.tok, ""), nil).start()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		// botframework-directlinejs sends empty text frames as keep-alives.
		if err := w.c.Write(ctx, websocket.MessageText, nil); err != nil {
			t.Fatal(err)
		}
		if err := w.c.Ping(ctx); err != nil {
			t.Fatalf("ping: %v", err)
		}
	}
	if err := w.c.Write(ctx, websocket.MessageText, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	e.streamCreate(s, "still here")
	w.expect(5*time.Second, "still here")
	// A message over the read limit closes the stream with 1009: the server drains what
	// the client still sends, so the close frame is not lost to a reset. (The write
	// itself may fail once the server has closed.)
	_ = w.c.Write(ctx, websocket.MessageText, []byte(strings.Repeat("x", 10000)))
	if code := w.closed(5 * time.Second); code != websocket.StatusMessageTooBig {
		t.Fatalf("close status %v, want 1009", code)
	}
	// A client that closes is let go.
	w = dialStream(t, e.base, streamPath(s.conv, s.tok, ""), nil).start()
	w.expect(5*time.Second, "still here")
	if err := w.c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close handshake: %v", err)
	}
}

func TestStreamClosesWhenTheTokenExpires(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.streamConv()
	// Issued so that it expires in two seconds.
	tok := e.streamToken(s, s.conv, time.Now().Add(-token.Lifetime+2*time.Second))
	w := dialStream(t, e.base, streamPath(s.conv, tok, ""), nil).start()
	e.streamCreate(s, "one")
	w.expect(5*time.Second, "one")
	if code := w.closed(10 * time.Second); code != websocket.StatusPolicyViolation {
		t.Fatalf("close status %v (%v), want 1008", code, w.err)
	}
}

// smallReceiveBuffer dials with a tiny socket receive buffer, so that a client that
// does not read backs up quickly.
func smallReceiveBuffer() *websocket.DialOptions {
	d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	return &websocket.DialOptions{HTTPClient: &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}}
}

func TestStreamDropsASlowClientWithoutBlockingOthers(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.streamInstance(nil)
	s := e.streamConv()
	other := e.streamConv()
	slow := dialStream(t, b.base, streamPath(s.conv, s.tok, ""), smallReceiveBuffer()) // never reads (yet)
	fast := dialStream(t, b.base, streamPath(s.conv, s.tok, ""), nil).start()
	elsewhere := dialStream(t, b.base, streamPath(other.conv, other.tok, ""), nil).start()
	streamWaitFor(t, "three streams", func() bool { return b.listener.Streams() == 3 })

	// About 12 MB for a client that takes nothing: more than the socket buffers and the
	// stream's backlog, so its writes block. The others get everything meanwhile.
	const n = 200
	big := strings.Repeat("x", 60000)
	var want []string
	for i := 0; i < n; i++ {
		e.streamCreate(s, big)
		want = append(want, big)
	}
	e.streamCreate(other, "unaffected")
	fast.expect(20*time.Second, want...)
	elsewhere.expect(5*time.Second, "unaffected")
	// The slow one is disconnected once a write has been stuck for the write timeout
	// (10 s); the others are still there.
	streamWaitLong(t, 25*time.Second, "the slow stream dropped", func() bool { return b.listener.Streams() == 2 })
	slow.start()
	got := 0
	deadline := time.After(10 * time.Second)
	for ended := false; !ended; {
		select {
		case f := <-slow.frames:
			got += len(f.Activities)
		case <-slow.done:
			ended = true
		case <-deadline:
			t.Fatal("the slow client's connection was not closed")
		}
	}
	for len(slow.frames) > 0 {
		got += len((<-slow.frames).Activities)
	}
	if got >= n {
		t.Fatalf("the slow client got all %d activities", got)
	}
	e.streamCreate(s, "later")
	fast.expect(5*time.Second, "later")
}
