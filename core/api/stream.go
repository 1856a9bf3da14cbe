package api

// The Direct Line stream (the streamUrl): a WebSocket that replays a conversation after
// a watermark and then pushes each new activity, on whichever core instance the
// activity was created. Fan-out goes through PostgreSQL: Store.CreateActivity runs
// NOTIFY activities '<conversation id>:<seq>' in its transaction, every instance's
// Listener LISTENs and hands the notification to its hub, and the hub wakes the streams
// of that conversation, which read the new activities from the store themselves. The
// hub never waits on a stream: a wake-up is a flag. Each stream reads at the pace of
// its client, with a bounded backlog (what it has not read yet stays in the database),
// and a client that takes nothing for streamWriteTimeout is disconnected.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fasthttp/websocket"
	fiberws "github.com/gofiber/contrib/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/golang-jwt/jwt/v5"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/token"
)

const (
	// streamPageSize is how many activities a stream reads (and sends in one frame) at
	// a time.
	streamPageSize = 100
	// streamMaxPendingBytes and streamMaxPendingFrames bound what a stream has read but
	// its client has not taken yet: past them the stream stops reading (the rest waits
	// in the database) until the client catches up.
	streamMaxPendingBytes  = 1 << 20
	streamMaxPendingFrames = 64
	// streamWriteTimeout bounds each write to the client: a client that takes nothing
	// for that long is disconnected (it reconnects with its watermark and misses
	// nothing).
	streamWriteTimeout = 10 * time.Second
	// streamPingInterval is how often the server pings the client. Clients answer pings
	// (browsers do it themselves) and botframework-directlinejs also sends an empty
	// text frame every 20 s; streamReadTimeout without either closes the stream.
	streamPingInterval = 25 * time.Second
	streamReadTimeout  = 2*streamPingInterval + 10*time.Second
	// streamRecheckInterval is how often a stream checks that its channel (and tenant)
	// is still active.
	streamRecheckInterval = time.Minute
	// streamReadLimit bounds a message from the client: Direct Line clients send only
	// empty keep-alive frames.
	streamReadLimit = 4096
	// streamCloseWait bounds the close handshake.
	streamCloseWait = time.Second
	// streamLocal carries the checked request to the upgraded connection (a string key:
	// the WebSocket middleware copies only those).
	streamLocal = "converger.stream"
)

// Close codes of the stream (RFC 6455 §7.4).
const (
	closePolicy    = websocket.ClosePolicyViolation   // 1008: token expired, channel inactive
	closeInternal  = websocket.CloseInternalServerErr // 1011
	closeGoingAway = websocket.CloseGoingAway         // 1001: the server stops
)

// subscription is one stream's interest in a conversation.
type subscription struct {
	conv string
	// wake holds one pending wake-up; more coalesce.
	wake chan struct{}
	// notified is the highest seq announced for the conversation.
	notified atomic.Int64
	// resync asks the stream to read everything after its last seq (notifications may
	// have been missed while the LISTEN connection was down).
	resync atomic.Bool
}

func (s *subscription) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// hub hands new activities to the streams of their conversation.
type hub struct {
	mu    sync.RWMutex
	convs map[string]map[*subscription]struct{}
	// ctx ends when the listener stops (the server shuts down): every stream closes.
	ctx    context.Context
	cancel context.CancelFunc
}

func newHub() *hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &hub{convs: map[string]map[*subscription]struct{}{}, ctx: ctx, cancel: cancel}
}

// subscribe registers interest in a conversation (by its canonical id).
func (h *hub) subscribe(conv string) *subscription {
	sub := &subscription{conv: strings.ToLower(conv), wake: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	subs := h.convs[sub.conv]
	if subs == nil {
		subs = map[*subscription]struct{}{}
		h.convs[sub.conv] = subs
	}
	subs[sub] = struct{}{}
	return sub
}

func (h *hub) unsubscribe(sub *subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if subs := h.convs[sub.conv]; subs != nil {
		delete(subs, sub)
		if len(subs) == 0 {
			delete(h.convs, sub.conv)
		}
	}
}

// notify announces an activity: the streams of its conversation wake up. It never
// blocks on a stream.
func (h *hub) notify(conv string, seq int64) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for sub := range h.convs[strings.ToLower(conv)] {
		for {
			cur := sub.notified.Load()
			if seq <= cur || sub.notified.CompareAndSwap(cur, seq) {
				break
			}
		}
		sub.signal()
	}
}

// resyncAll makes every stream read what it may have missed.
func (h *hub) resyncAll() {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, subs := range h.convs {
		for sub := range subs {
			sub.resync.Store(true)
			sub.signal()
		}
	}
}

// dispatch handles the payload of a NOTIFY activities: "<conversation id>:<seq>".
func (h *hub) dispatch(payload string) {
	i := strings.LastIndexByte(payload, ':')
	if i <= 0 {
		return
	}
	seq, err := strconv.ParseInt(payload[i+1:], 10, 64)
	if err != nil || seq <= 0 {
		return
	}
	h.notify(payload[:i], seq)
}

// subscribers counts the streams (for tests and diagnostics).
func (h *hub) subscribers() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	n := 0
	for _, subs := range h.convs {
		n += len(subs)
	}
	return n
}

// Listener follows NOTIFY activities, so that streams on every core instance push
// activities created by any of them.
type Listener struct {
	s         *server
	listening atomic.Bool
}

// Listening reports whether the LISTEN connection is up.
func (l *Listener) Listening() bool { return l.listening.Load() }

// Streams returns how many WebSocket connections (Direct Line streams and legacy sockets)
// are connected to this instance.
func (l *Listener) Streams() int { return l.s.hub.subscribers() }

// Run runs the API's background work until ctx ends: the cancellation of requests whose
// client went away (watchInFlight), the tenants' CORS origins (cors.go, kept loaded and
// followed through NOTIFY tenant_changes on the same connection as the stream, which
// also empties the cache of API keys: apikeys.go), and the
// stream's fan-out, which listens on a connection of its own taken out of the store's
// pool. When that connection breaks it reconnects with backoff, and once listening again
// every stream re-reads from its last seq, since notifications may have been missed. When
// Run returns, every stream is closed (1001, going away).
func (l *Listener) Run(ctx context.Context) {
	defer l.s.hub.cancel()
	go l.s.cors.run(ctx, l.s.Store, l.s.Logger)
	watched := make(chan struct{})
	defer func() { <-watched }()
	go func() { defer close(watched); l.s.watchInFlight(ctx) }()
	const firstBackoff = 100 * time.Millisecond
	backoff := firstBackoff
	reported := false // the current interruption has been logged
	for ctx.Err() == nil {
		err := l.listenOnce(ctx)
		if l.listening.Swap(false) {
			backoff, reported = firstBackoff, false
		}
		if ctx.Err() != nil {
			return
		}
		level := slog.LevelWarn
		if reported {
			level = slog.LevelDebug
		}
		l.s.Logger.Log(ctx, level, "activity notifications interrupted; retrying", "error", err, "retry_in", backoff)
		reported = true
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (l *Listener) listenOnce(ctx context.Context) error {
	pooled, err := l.s.Store.Pool().Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection stays in LISTEN state: it is taken out of the pool and closed after.
	conn := pooled.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+store.NotifyActivities+"; LISTEN "+store.NotifyTenantChanges); err != nil {
		return err
	}
	l.listening.Store(true)
	// Whatever was created or changed while nobody listened is read now.
	l.s.hub.resyncAll()
	l.s.cors.reload()
	l.s.apiKeys.reset(true)
	defer l.s.apiKeys.reset(false)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("waiting for notifications: %w", err)
		}
		if n.Channel == store.NotifyTenantChanges {
			l.s.apiKeys.reset(true)
			l.s.cors.reload()
			continue
		}
		l.s.hub.dispatch(n.Payload)
	}
}

// streamRoutes registers the stream: GET /conversations/:id/stream?t=<token>&watermark=.
// The token and the conversation are checked before the upgrade, so a refusal is an
// HTTP answer with the envelope, not a WebSocket.
func (s *server) streamRoutes(r fiber.Router) {
	r.Get("/conversations/:id/stream", s.requireToken, s.streamCheck, fiberws.New(s.serveStream, fiberws.Config{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   1024,
		WriteBufferSize:  4096,
		RecoverHandler:   s.streamRecover,
	}))
}

var errNotWebSocket = apierror.BadRequest.WithMessage("The stream is a WebSocket: connect with a WebSocket client (Upgrade: websocket).")

// streamStart is what the checks before the upgrade established.
type streamStart struct {
	claims *token.Claims
	conv   store.Conversation
	after  int64
	slot   *socketSlot
}

func (s *server) streamCheck(c *fiber.Ctx) error {
	// Every conversation the token may not touch answers the client API's same 403.
	conv, ok, err := s.clientConversation(c)
	if !ok {
		return err
	}
	if !fiberws.IsWebSocketUpgrade(c) {
		return fail(c, errNotWebSocket, nil)
	}
	// An empty watermark is the start, an invalid one the beginning too (Direct Line).
	after, ok := decodeWatermark(c.Query("watermark"))
	if !ok {
		after = 0
	}
	slot, bound := s.sockets.acquire(
		socketKey{boundStreamToken, tokenKey(c.Query("t") + bearer(c)), s.MaxStreamsPerToken},
		socketKey{boundStreamConversation, conv.ID, s.MaxStreamsPerConversation},
		socketKey{boundClientIP, s.clientKey(c), s.MaxSocketsPerIP})
	if slot == nil {
		return refuseSocket(c, bound)
	}
	c.Locals(streamLocal, &streamStart{claims: claims(c), conv: conv, after: after, slot: slot})
	err = c.Next()
	slot.releaseUnstarted(c.Response().StatusCode() == fiber.StatusSwitchingProtocols)
	return err
}

// streamRecover logs a panic of a stream without the request (its URL holds the token).
func (s *server) streamRecover(conn *fiberws.Conn) {
	if r := recover(); r != nil {
		s.Logger.Error("panic in a stream", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	}
}

// stream is one connected client.
type stream struct {
	s      *server
	ws     *websocket.Conn
	claims *token.Claims
	conv   store.Conversation
	sub    *subscription
	// last is the seq of the newest activity handed to the writer.
	last int64

	ctx    context.Context
	cancel context.CancelFunc
	out    chan []byte
	// pending is the bytes in out and being written; drained wakes send when the
	// writer took a frame.
	pending atomic.Int64
	drained chan struct{}
	// readerDone is closed when the reader has stopped.
	readerDone chan struct{}

	mu         sync.Mutex
	closeCode  int // 0: not decided (the server stops)
	closeText  string
	closeFrame bool // send a close frame (not to a client that does not read)
}

func (s *server) serveStream(conn *fiberws.Conn) {
	start, _ := conn.Locals(streamLocal).(*streamStart)
	if start == nil {
		return
	}
	start.slot.started.Store(true)
	defer start.slot.release()
	st := &stream{s: s, ws: conn.Conn, claims: start.claims, conv: start.conv, last: start.after,
		out: make(chan []byte, streamMaxPendingFrames), drained: make(chan struct{}, 1), readerDone: make(chan struct{})}
	st.ctx, st.cancel = context.WithCancel(s.hub.ctx)
	// Subscribed before the replay reads: whatever is created from now on wakes the
	// stream, and what the replay already sent is skipped by seq.
	st.sub = s.hub.subscribe(st.conv.ID)
	defer s.hub.unsubscribe(st.sub)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); defer close(st.readerDone); st.readLoop() }()
	go func() { defer wg.Done(); st.writeLoop() }()
	st.run()
	st.finish()
	wg.Wait()
}

// stop ends the stream with a close code; the first reason wins.
func (st *stream) stop(code int, text string, frame bool) {
	st.mu.Lock()
	if st.closeCode == 0 {
		st.closeCode, st.closeText, st.closeFrame = code, text, frame
	}
	st.mu.Unlock()
	st.cancel()
}

// finish sends the close frame and waits (bounded) for the client's answer, so that
// the client sees the close code rather than a reset, then ends the reader and the
// writer. Closing the connection itself is left to the server once the handler
// returns (fasthttp ignores Close on a hijacked connection before that), so they are
// woken by deadlines in the past; each of them sets its own deadline before it checks
// the stream's context, so neither can push the deadline back after this.
func (st *stream) finish() {
	st.cancel()
	st.mu.Lock()
	code, text, frame := st.closeCode, st.closeText, st.closeFrame
	st.mu.Unlock()
	if code == 0 {
		code, text, frame = closeGoingAway, "server stopping", true
	}
	if frame {
		deadline := time.Now().Add(streamCloseWait)
		if st.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), deadline) == nil {
			select {
			case <-st.readerDone:
			case <-time.After(time.Until(deadline)):
			}
		}
	}
	_ = st.ws.NetConn().SetDeadline(time.Now())
}

// readLoop takes the client's messages: keep-alives (empty frames, pings), which keep
// the stream alive, and nothing else of interest. A close or an error ends the stream.
func (st *stream) readLoop() {
	ws := st.ws
	ws.SetReadLimit(streamReadLimit)
	alive := st.keepAlive()
	for {
		if _, _, err := ws.NextReader(); err != nil {
			var ce *websocket.CloseError
			switch {
			case errors.As(err, &ce):
				// The library answered the client's close frame already.
				st.stop(websocket.CloseNormalClosure, "", false)
			case errors.Is(err, websocket.ErrReadLimit):
				// The library sent the close frame already.
				st.refuse(websocket.CloseMessageTooBig, "message too big", false)
			default:
				st.stop(websocket.CloseAbnormalClosure, "", false)
			}
			return
		}
		alive()
	}
}

// refuse ends the connection from the reader for a client that broke a bound: it sends
// the close frame (unless the library did), then reads and drops what the client still
// sends until it closes its side, for at most streamCloseWait, so that closing the
// socket with unread bytes does not reset the connection under the close frame.
func (st *stream) refuse(code int, text string, sendFrame bool) {
	ws := st.ws
	if sendFrame {
		_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(streamCloseWait))
	}
	_ = ws.NetConn().SetReadDeadline(time.Now().Add(streamCloseWait))
	_, _ = io.Copy(io.Discard, ws.NetConn())
	st.stop(code, text, false)
}

// keepAlive gives the reader streamReadTimeout from now, and again after every pong or
// ping of the client; the reader calls the function it returns after every frame. Once
// the connection is ending, the deadline is now, so the reader stops.
func (st *stream) keepAlive() (alive func()) {
	ws := st.ws
	alive = func() {
		_ = ws.SetReadDeadline(time.Now().Add(streamReadTimeout))
		if st.ctx.Err() != nil {
			_ = ws.SetReadDeadline(time.Now())
		}
	}
	alive()
	ws.SetPongHandler(func(string) error { alive(); return nil })
	ping := ws.PingHandler()
	ws.SetPingHandler(func(data string) error { alive(); return ping(data) })
	return alive
}

// writeLoop sends the frames in order and pings the client.
func (st *stream) writeLoop() {
	ping := time.NewTicker(streamPingInterval)
	defer ping.Stop()
	for {
		select {
		case <-st.ctx.Done():
			return
		case f := <-st.out:
			_ = st.ws.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
			if st.ctx.Err() != nil {
				return
			}
			err := st.ws.WriteMessage(websocket.TextMessage, f)
			st.pending.Add(-int64(len(f)))
			select {
			case st.drained <- struct{}{}:
			default:
			}
			if err != nil {
				// Most often the client took nothing for streamWriteTimeout: it is
				// dropped, and reconnects with its watermark.
				st.stop(websocket.CloseAbnormalClosure, "", false)
				return
			}
		case <-ping.C:
			if st.ctx.Err() != nil {
				return
			}
			if err := st.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(streamWriteTimeout)); err != nil {
				st.stop(websocket.CloseAbnormalClosure, "", false)
				return
			}
		}
	}
}

// run replays, then pushes what the hub announces, until the stream ends: the client
// goes, the token expires, the channel becomes inactive, or the server stops.
func (st *stream) run() {
	expiry, stopExpiry := st.tokenExpiry(st.claims.ExpiresAt)
	defer stopExpiry()
	recheck := time.NewTicker(streamRecheckInterval)
	defer recheck.Stop()
	if err := st.readAll(); err != nil {
		st.failed(err, "stream")
		return
	}
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-st.sub.wake:
			if err := st.catchUp(); err != nil {
				st.failed(err, "stream")
				return
			}
		case <-expiry:
			st.stop(closePolicy, "token expired", true)
			return
		case <-recheck.C:
			if st.channelGone(st.claims.ChannelID) {
				return
			}
		}
	}
}

// tokenExpiry returns a channel that fires when a token expiring at exp runs out (nil
// when it never does), and what stops its timer. Expiry is by the verifier's clock,
// which judged the token at the handshake.
func (st *stream) tokenExpiry(exp *jwt.NumericDate) (<-chan time.Time, func()) {
	if exp == nil {
		return nil, func() {}
	}
	t := time.NewTimer(exp.Sub(st.s.Verifier.Now()))
	return t.C, func() { t.Stop() }
}

// channelGone closes the connection with 1008 when its channel has become inactive
// or was deleted, and reports whether it did. A failed lookup keeps the connection.
func (st *stream) channelGone(channelID string) bool {
	ch, err := st.s.Store.ChannelByID(st.ctx, channelID)
	if err == nil && !ch.Active() || errors.Is(err, store.ErrNotFound) {
		st.stop(closePolicy, "channel inactive", true)
		return true
	}
	return false
}

// failed ends the connection after an error of its loop; what names the connection
// in the log ("stream", "legacy WebSocket").
func (st *stream) failed(err error, what string, logAttrs ...any) {
	switch {
	case st.ctx.Err() != nil:
		// Already ending.
	case errors.Is(err, store.ErrNotFound):
		st.stop(closePolicy, "conversation not found", true)
	default:
		st.s.Logger.Warn(what+" failed", append(logAttrs, "conversation_id", st.conv.ID, "error", err)...)
		st.stop(closeInternal, "internal error", true)
	}
}

// catchUp sends what the hub announced beyond the last seq sent: the next activity by
// itself when it is the only one, else everything after the last seq in order (a
// notification that arrived out of order, several at once, or a resync).
func (st *stream) catchUp() error {
	for {
		resync := st.sub.resync.Swap(false)
		target := st.sub.notified.Load()
		if !resync && target <= st.last {
			return nil
		}
		if !resync && target == st.last+1 {
			a, err := st.s.Store.Activity(st.ctx, st.conv.ID, target)
			if err == nil {
				if err := st.send([]activity.Activity{a}); err != nil {
					return err
				}
				continue
			}
			if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		if err := st.readAll(); err != nil {
			return err
		}
		if st.sub.notified.Load() > st.last && !st.sub.resync.Load() {
			// Announced but not readable (cannot happen: NOTIFY is delivered after the
			// commit); wait for the next wake-up rather than spin.
			return nil
		}
	}
}

// readAll sends every activity after the last seq sent, a page per frame.
func (st *stream) readAll() error {
	for {
		list, more, err := st.s.Store.ListActivities(st.ctx, st.claims.TenantID, st.conv.ID, st.last, streamPageSize)
		if err != nil {
			return err
		}
		if len(list) > 0 {
			if err := st.send(list); err != nil {
				return err
			}
		}
		if !more {
			return nil
		}
	}
}

// send queues one frame for the writer. While the client's backlog is over its bound
// it waits for the writer (what is not read yet stays in the database); a client that
// takes nothing is dropped by the writer's deadline.
func (st *stream) send(list []activity.Activity) error {
	for i := range list {
		list[i].Attachments = st.s.freshAttachmentURLs(list[i].Attachments)
	}
	last := list[len(list)-1].Seq
	frame, err := marshalJSON(directLineActivitySet{Activities: directLineActivities(list), Watermark: encodeWatermark(last)})
	if err != nil {
		return err
	}
	for st.pending.Load() > streamMaxPendingBytes {
		select {
		case <-st.drained:
		case <-st.ctx.Done():
			return st.ctx.Err()
		}
	}
	st.pending.Add(int64(len(frame)))
	select {
	case st.out <- frame:
	case <-st.ctx.Done():
		return st.ctx.Err()
	}
	st.last = last
	return nil
}
