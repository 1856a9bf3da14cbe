package api

// The legacy WebSocket (CORE_API.md §8; ADR-0005's ConversationChannel path):
// GET /socket/websocket?token=<legacy conversation token>. A client bound to one
// conversation by its token sends JSON text frames
//
//	{"event":"new_activity","ref":"1","payload":{"type","text","attachments","metadata"}}
//	{"event":"heartbeat","ref":"2"}
//
// and gets one reply per frame, {"event":"reply","ref":…,"status":"ok"|"error","payload":…},
// plus every new activity of its conversation, pushed as {"event":"new_activity",
// "payload":{…}} — its own included, always after the reply to the frame that created
// it. Pushes reuse the stream's hub (LISTEN/NOTIFY, so activities created on any core
// instance arrive) and the stream's writer and close handshake.
//
// Trust boundary: only the payload's client fields are read (activity.FromBody); the
// sender is the token's sub ("user" when the token has none), the tenant and the
// conversation are the token's, there is no idempotency key, and the server stamps seq
// and inserted_at. Activities are created only through Store.CreateActivity.
//
// Bounds per connection: the message size (legacyReadLimit; above it the connection is
// closed with 1009), the message rate (a token bucket of legacyRate per second with a
// burst of legacyBurst; over it a frame is answered rate_limited, and legacyMaxRefused
// refusals in a row close with 1008), the backlog and write timeout of the stream
// (streamMaxPendingBytes, streamMaxPendingFrames, streamWriteTimeout), pings and the
// read timeout of the stream, and the token's expiry (1008). Per core: at most
// legacyMaxSocketsPerToken sockets per token and legacyMaxSocketsPerConversation per
// conversation (beyond them the upgrade is answered 429). Every activity is counted in
// activity_create for the token's tenant through the sidecar's Limiter service, with
// the budget the tenant API and the client API share (over it: a rate_limited reply).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/fasthttp/websocket"
	fiberws "github.com/gofiber/contrib/websocket"
	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/token"
)

const (
	// legacyMinReadLimit is the smallest bound on one message from the client. The
	// bound grows with the activity limits (legacyReadLimit), so that an activity at
	// every limit fits even when each byte of its text is sent as a two-byte escape.
	legacyMinReadLimit = 128 << 10
	// legacyRate and legacyBurst are the token bucket of each connection: every frame
	// the client sends takes a token; the bucket holds legacyBurst and refills at
	// legacyRate per second.
	legacyRate  = 10
	legacyBurst = 20
	// legacyMaxRefused rate-limited frames in a row close the connection (1008).
	legacyMaxRefused = 20
	// legacyCreateTimeout bounds the creation of one activity.
	legacyCreateTimeout = 10 * time.Second
	// legacyMaxRef bounds the "ref" a client sends, in bytes of JSON.
	legacyMaxRef = 256
	// legacyInbox is how many decoded frames wait for the connection's loop; past it
	// the connection stops reading (the client's sends back up in TCP).
	legacyInbox = 8
	// legacyLocal carries the checked request to the upgraded connection.
	legacyLocal = "converger.legacy"
	// legacyDefaultSender is the sender of a token without a sub.
	legacyDefaultSender = "user"
)

// The events of the legacy WebSocket.
const (
	legacyEventNewActivity = "new_activity"
	legacyEventHeartbeat   = "heartbeat"
	legacyEventReply       = "reply"
)

// The reasons of error replies.
const (
	legacyInvalidMessage     = "invalid_message"
	legacyInvalidActivity    = "invalid_activity"
	legacyConversationClosed = "conversation_closed"
	legacyRateLimited        = "rate_limited"
	legacyInternalError      = "internal_error"
)

var errLegacyNotWebSocket = apierror.BadRequest.WithMessage(
	"The legacy channel is a WebSocket: connect with a WebSocket client (Upgrade: websocket).")

// legacyRoutes registers GET /socket/websocket. The token and its conversation are
// checked before the upgrade, so a refusal is an HTTP answer with the envelope.
func (s *server) legacyRoutes(r fiber.Router) {
	r.Get("/socket/websocket", s.legacyCheck, fiberws.New(s.serveLegacy, fiberws.Config{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4096,
		WriteBufferSize:  4096,
		RecoverHandler:   s.legacyRecover,
	}))
}

// legacyStart is what the checks before the upgrade established.
type legacyStart struct {
	claims    *token.LegacyClaims
	conv      store.Conversation
	requestID string
	slot      *socketSlot
}

// legacyCheck accepts a valid legacy conversation token whose conversation exists for
// its tenant on an active channel; every other credential or state answers the same
// 403 (a Converger token, a channel secret, an expired or malformed token, none).
func (s *server) legacyCheck(c *fiber.Ctx) error {
	cl, err := s.Verifier.VerifyLegacy(c.Query("token"))
	if err != nil {
		return fail(c, errToken, nil)
	}
	ctx := c.UserContext()
	conv, err := s.Store.Conversation(ctx, cl.TenantID, strings.ToLower(cl.ConversationID))
	if errors.Is(err, store.ErrNotFound) {
		return fail(c, errToken, nil)
	}
	if err != nil {
		return err
	}
	ch, err := s.Store.ChannelByID(ctx, conv.ChannelID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !ch.Active()) {
		return fail(c, errToken, nil)
	}
	if err != nil {
		return err
	}
	if !fiberws.IsWebSocketUpgrade(c) {
		return fail(c, errLegacyNotWebSocket, nil)
	}
	slot, bound := s.sockets.acquire(
		socketKey{boundLegacyToken, tokenKey(c.Query("token")), legacyMaxSocketsPerToken},
		socketKey{boundLegacyConversation, conv.ID, legacyMaxSocketsPerConversation},
		socketKey{boundClientIP, s.clientKey(c), s.MaxSocketsPerIP})
	if slot == nil {
		return refuseSocket(c, bound)
	}
	c.Locals(legacyLocal, &legacyStart{claims: cl, conv: conv, requestID: requestID(c), slot: slot})
	err = c.Next()
	// The connection starts after this handler returns; one that never does gives its
	// slot back later.
	slot.releaseUnstarted(c.Response().StatusCode() == fiber.StatusSwitchingProtocols)
	return err
}

// legacyRecover logs a panic of a connection without the request (its URL holds the
// token).
func (s *server) legacyRecover(*fiberws.Conn) {
	if r := recover(); r != nil {
		s.Logger.Error("panic in a legacy WebSocket", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	}
}

// legacySender is the sender of a connection's activities: the token's sub, or
// legacyDefaultSender when it has none (or one that cannot be stored).
func legacySender(sub string) string {
	if sub == "" || len(sub) > maxUserID || strings.ContainsRune(sub, 0) {
		return legacyDefaultSender
	}
	return sub
}

// legacyReadLimit is the bound on one message: legacyMinReadLimit, or more when the
// activity limits need it.
func legacyReadLimit(l activity.Limits) int64 {
	need := 2*l.MaxTextBytes + l.MaxAttachments*(l.MaxAttachmentBytes+1) + l.MaxMetadataBytes + 4096
	return int64(max(legacyMinReadLimit, need))
}

// legacyConn is one connected client.
type legacyConn struct {
	s *server
	// st is the connection as the stream drives it: its writer (backlog, write
	// timeout, pings) and its close handshake.
	st        *stream
	claims    *token.LegacyClaims
	conv      store.Conversation
	sender    string
	requestID string
	sub       *subscription
	// last is the seq of the newest activity pushed (or of the conversation when the
	// handshake was checked).
	last int64
	// in carries the client's frames from the reader to the connection's loop, which
	// answers them in order.
	in chan legacyInbound
	// bucket and refused belong to the reader.
	bucket  legacyBucket
	refused int
}

// legacyInbound is a frame of the client: an activity to create, or a reply decided
// by the reader; or, last, the reader's decision to close the connection over the rate
// bound, once the replies before it are sent.
type legacyInbound struct {
	ref     json.RawMessage
	create  bool
	payload json.RawMessage
	reply   legacyReply
	closing bool
}

// legacyReply is a reply frame.
type legacyReply struct {
	Event   string          `json:"event"`
	Ref     json.RawMessage `json:"ref"`
	Status  string          `json:"status"`
	Payload any             `json:"payload"`
}

// legacyError is the payload of an error reply.
type legacyError struct {
	Reason       string               `json:"reason"`
	Message      string               `json:"message,omitempty"`
	Errors       activity.FieldErrors `json:"errors,omitempty"`
	RetryAfterMS int64                `json:"retry_after_ms,omitempty"`
}

// legacyCreated is the payload of the reply to a created activity.
type legacyCreated struct {
	ID  string `json:"id"`
	Seq int64  `json:"seq"`
}

// legacyPush is a pushed activity.
type legacyPush struct {
	Event   string             `json:"event"`
	Payload legacyActivityJSON `json:"payload"`
}

// legacyActivityJSON is an activity as the legacy WebSocket pushes it.
type legacyActivityJSON struct {
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

func okReply(ref json.RawMessage, payload any) legacyReply {
	return legacyReply{Event: legacyEventReply, Ref: ref, Status: "ok", Payload: payload}
}

func errorReply(ref json.RawMessage, e legacyError) legacyReply {
	return legacyReply{Event: legacyEventReply, Ref: ref, Status: "error", Payload: e}
}

func invalidMessage(ref json.RawMessage, msg string) legacyReply {
	return errorReply(ref, legacyError{Reason: legacyInvalidMessage, Message: msg})
}

func (s *server) serveLegacy(conn *fiberws.Conn) {
	start, _ := conn.Locals(legacyLocal).(*legacyStart)
	if start == nil {
		return
	}
	start.slot.started.Store(true)
	defer start.slot.release()
	// Only the stream's writer, stop, finish and failure handling drive this connection;
	// its Direct Line fields (claims, last, sub) stay unset.
	st := &stream{s: s, ws: conn.Conn, conv: start.conv, out: make(chan []byte, streamMaxPendingFrames),
		drained: make(chan struct{}, 1), readerDone: make(chan struct{})}
	st.ctx, st.cancel = context.WithCancel(s.hub.ctx)
	lc := &legacyConn{s: s, st: st, claims: start.claims, conv: start.conv, sender: legacySender(start.claims.Subject),
		requestID: start.requestID, last: start.conv.LastSeq, in: make(chan legacyInbound, legacyInbox),
		bucket: newLegacyBucket(time.Now())}
	// Subscribed before the first read: whatever is created after the handshake was
	// checked is pushed.
	lc.sub = s.hub.subscribe(lc.conv.ID)
	defer s.hub.unsubscribe(lc.sub)
	lc.sub.resync.Store(true)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); defer close(st.readerDone); lc.readLoop() }()
	go func() { defer wg.Done(); st.writeLoop() }()
	lc.run()
	st.finish()
	wg.Wait()
}

// run answers the client's frames and pushes new activities until the connection ends:
// the client goes, the token expires, the channel becomes inactive, or the server stops.
func (lc *legacyConn) run() {
	st := lc.st
	expiry, stopExpiry := st.tokenExpiry(lc.claims.ExpiresAt)
	defer stopExpiry()
	recheck := time.NewTicker(streamRecheckInterval)
	defer recheck.Stop()
	if err := lc.push(); err != nil {
		lc.failed(err)
		return
	}
	for {
		select {
		case <-st.ctx.Done():
			return
		case m := <-lc.in:
			if m.closing {
				// Every frame before this one has its reply queued: send them, then
				// close (finish writes the close frame).
				lc.flush()
				st.stop(closePolicy, "rate limit exceeded", true)
				return
			}
			if err := lc.answer(m); err != nil {
				lc.failed(err)
				return
			}
		case <-lc.sub.wake:
			if err := lc.push(); err != nil {
				lc.failed(err)
				return
			}
		case <-expiry:
			st.stop(closePolicy, "token expired", true)
			return
		case <-recheck.C:
			if st.channelGone(lc.conv.ChannelID) {
				return
			}
		}
	}
}

// failed ends the connection after an error of run.
func (lc *legacyConn) failed(err error) {
	lc.st.failed(err, "legacy WebSocket", "request_id", lc.requestID)
}

// answer handles one frame of the client and queues its reply.
func (lc *legacyConn) answer(m legacyInbound) error {
	reply := m.reply
	if m.create {
		var err error
		if reply, err = lc.create(m.ref, m.payload); err != nil {
			return err
		}
	}
	frame, err := marshalJSON(reply)
	if err != nil {
		return err
	}
	return lc.queue(frame)
}

// create stores the activity of a new_activity frame: the payload's client fields,
// the token's sender, tenant and conversation. Errors the client can act on are
// replies; others end the connection.
func (lc *legacyConn) create(ref, payload json.RawMessage) (legacyReply, error) {
	// Counted first, as the sidecar counts the REST APIs' requests before the core
	// validates them.
	if r, ok := lc.s.countActivity(lc.st.ctx, lc.claims.TenantID); !ok {
		return errorReply(ref, legacyError{Reason: legacyRateLimited,
			Message:      "Too many activities for this tenant. Please try again later.",
			RetryAfterMS: max(1, r.RetryAfter.Milliseconds())}), nil
	}
	client, errs := activity.FromBody(payload)
	if errs != nil {
		return errorReply(ref, legacyError{Reason: legacyInvalidActivity, Errors: payloadErrors(errs)}), nil
	}
	ctx, cancel := context.WithTimeout(lc.st.ctx, legacyCreateTimeout)
	defer cancel()
	sys := activity.System{TenantID: lc.claims.TenantID, ConversationID: lc.conv.ID, Sender: lc.sender}
	a, _, err := lc.s.Store.CreateActivity(ctx, client, sys)
	var fe activity.FieldErrors
	switch {
	case errors.As(err, &fe):
		return errorReply(ref, legacyError{Reason: legacyInvalidActivity, Errors: payloadErrors(fe)}), nil
	case errors.Is(err, store.ErrConversationClosed):
		return errorReply(ref, legacyError{Reason: legacyConversationClosed, Message: "The conversation is closed."}), nil
	case err != nil && lc.st.ctx.Err() == nil && !errors.Is(err, store.ErrNotFound):
		lc.s.Logger.Warn("legacy WebSocket: activity not created", "request_id", lc.requestID,
			"conversation_id", lc.conv.ID, "error", err)
		return errorReply(ref, legacyError{Reason: legacyInternalError, Message: "Something went wrong."}), nil
	case err != nil:
		// The conversation is gone, or the connection is ending.
		return legacyReply{}, err
	}
	// Created (there is no idempotency key on this path): the echo channel answers
	// before the reply, as on the other paths.
	lc.s.echoReply(lc.st.ctx, lc.requestID, a)
	return okReply(ref, legacyCreated{ID: a.ID, Seq: a.Seq}), nil
}

// payloadErrors names the frame's payload where FromBody names the request body.
func payloadErrors(errs activity.FieldErrors) activity.FieldErrors {
	if msgs, ok := errs["body"]; ok {
		delete(errs, "body")
		errs["payload"] = msgs
	}
	return errs
}

// push sends every activity after the last one pushed, when the hub announced one (or
// asked for a resync).
func (lc *legacyConn) push() error {
	for {
		resync := lc.sub.resync.Swap(false)
		if !resync && lc.sub.notified.Load() <= lc.last {
			return nil
		}
		list, more, err := lc.s.Store.ListActivities(lc.st.ctx, lc.claims.TenantID, lc.conv.ID, lc.last, streamPageSize)
		if err != nil {
			return err
		}
		if len(list) == 0 {
			// Announced but not readable (NOTIFY is delivered after the commit, so this
			// cannot happen); wait for the next wake-up rather than spin.
			return nil
		}
		for _, a := range list {
			frame, err := marshalJSON(legacyPush{Event: legacyEventNewActivity, Payload: legacyActivityJSON{
				ID: a.ID, Seq: a.Seq, Type: a.Type, Text: a.Text, Sender: a.Sender,
				Attachments:    orEmpty(lc.s.freshAttachmentURLs(a.Attachments), "[]"),
				Metadata:       orEmpty(a.Metadata, "{}"),
				InsertedAt:     jsonTime(a.InsertedAt),
				ConversationID: a.ConversationID,
			}})
			if err != nil {
				return err
			}
			if err := lc.queue(frame); err != nil {
				return err
			}
			lc.last = a.Seq
		}
		if more {
			// Read the next page without waiting for an announcement.
			lc.sub.resync.Store(true)
		}
	}
}

// queue hands a frame to the stream's writer. While the client's backlog is over its
// bound it waits for the writer; a client that takes nothing is dropped by the
// writer's deadline.
func (lc *legacyConn) queue(frame []byte) error {
	st := lc.st
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
		return nil
	case <-st.ctx.Done():
		return st.ctx.Err()
	}
}

// flush waits until the writer has sent every queued frame (at most streamWriteTimeout:
// a client that takes nothing is dropped anyway).
func (lc *legacyConn) flush() {
	st := lc.st
	timeout := time.NewTimer(streamWriteTimeout)
	defer timeout.Stop()
	for st.pending.Load() > 0 {
		select {
		case <-st.drained:
		case <-st.ctx.Done():
			return
		case <-timeout.C:
			return
		}
	}
}

// readLoop reads the client's frames, applies the rate bound and decodes them for run.
// A close, an error or a message over the size bound ends the connection. Over the rate
// bound, run is told to close after the replies it owes, and the client's frames are
// read and dropped meanwhile, so that its close handshake (or a reset) is seen.
func (lc *legacyConn) readLoop() {
	st := lc.st
	ws := st.ws
	ws.SetReadLimit(legacyReadLimit(lc.s.Limits))
	alive := st.keepAlive()
	for {
		typ, data, err := ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			switch {
			case errors.As(err, &ce):
				// The library answered the client's close frame already.
				st.stop(websocket.CloseNormalClosure, "", false)
			case errors.Is(err, websocket.ErrReadLimit):
				// The library sent the close frame already.
				lc.st.refuse(websocket.CloseMessageTooBig, "message too big", false)
			default:
				st.stop(websocket.CloseAbnormalClosure, "", false)
			}
			return
		}
		alive()
		m, ok := lc.inbound(typ, data, time.Now())
		if !ok {
			select {
			case lc.in <- legacyInbound{closing: true}:
			case <-st.ctx.Done():
				return
			}
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
			}
		}
		select {
		case lc.in <- m:
		case <-st.ctx.Done():
			return
		}
	}
}

// inbound decodes one frame of the client, after the rate bound; false when the client
// keeps sending over the bound and the connection ends.
func (lc *legacyConn) inbound(typ int, data []byte, now time.Time) (legacyInbound, bool) {
	var fields map[string]json.RawMessage
	isObject := typ == websocket.TextMessage && json.Unmarshal(data, &fields) == nil && fields != nil
	var ref json.RawMessage
	refOK := true
	if isObject {
		ref, refOK = legacyRef(fields["ref"])
	}
	if allowed, wait := lc.bucket.take(now); !allowed {
		lc.refused++
		if lc.refused >= legacyMaxRefused {
			return legacyInbound{}, false
		}
		return legacyInbound{reply: errorReply(ref, legacyError{Reason: legacyRateLimited,
			Message: "Too many messages. Please slow down.", RetryAfterMS: max(1, wait.Milliseconds())})}, true
	}
	lc.refused = 0
	switch {
	case typ != websocket.TextMessage:
		return legacyInbound{reply: invalidMessage(nil, "Messages are JSON text frames; binary frames are not accepted.")}, true
	case !isObject:
		return legacyInbound{reply: invalidMessage(nil, "A message is a JSON object with an event.")}, true
	case !refOK:
		return legacyInbound{reply: invalidMessage(nil, fmt.Sprintf("ref must be a string or a number of at most %d bytes.", legacyMaxRef))}, true
	}
	var event string
	if raw, present := fields["event"]; !present || json.Unmarshal(raw, &event) != nil {
		return legacyInbound{ref: ref, reply: invalidMessage(ref, "event must be a string.")}, true
	}
	switch event {
	case legacyEventHeartbeat:
		return legacyInbound{ref: ref, reply: okReply(ref, struct{}{})}, true
	case legacyEventNewActivity:
		return legacyInbound{ref: ref, create: true, payload: fields["payload"]}, true
	}
	return legacyInbound{ref: ref, reply: invalidMessage(ref, fmt.Sprintf("Unknown event; the events are %q and %q.",
		legacyEventNewActivity, legacyEventHeartbeat))}, true
}

// legacyRef checks the ref of a frame: absent or null (the reply's ref is null), a
// string or a number, of at most legacyMaxRef bytes of JSON, echoed as sent.
func legacyRef(raw json.RawMessage) (json.RawMessage, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, true
	}
	if len(raw) > legacyMaxRef {
		return nil, false
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil, false
	}
	switch v.(type) {
	case string, float64:
		return append(json.RawMessage(nil), raw...), true
	}
	return nil, false
}

// legacyBucket is a connection's token bucket; only its reader uses it.
type legacyBucket struct {
	tokens float64
	last   time.Time
}

func newLegacyBucket(now time.Time) legacyBucket {
	return legacyBucket{tokens: legacyBurst, last: now}
}

// take takes a token at now, or says how long until one is there.
func (b *legacyBucket) take(now time.Time) (bool, time.Duration) {
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(legacyBurst, b.tokens+elapsed.Seconds()*legacyRate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / legacyRate * float64(time.Second))
}
