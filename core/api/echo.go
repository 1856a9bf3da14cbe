package api

import (
	"context"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/activity"
)

// The echo channel: a channel of type "echo" answers each user message with
// "echo: <text>" from sender "bot", through the trusted create path. The reply is
// created synchronously after the user's activity committed, before the request is
// answered, so it follows the message it answers (seq + 1 unless another writer of the
// conversation came in between) and a client sees it on its next read.

const (
	echoChannelType = "echo"
	echoSender      = "bot"
	echoPrefix      = "echo: "
	echoTimeout     = 5 * time.Second
)

// channelTypes caches the type of channels by id. A channel's type never changes once
// created, and ids are UUIDs, so entries never go stale (a deleted channel's entry is
// never asked for again).
var channelTypes sync.Map // channel id → type

// channelType returns a channel's type, from the cache or the store.
func (s *server) channelType(ctx context.Context, channelID string) (string, error) {
	if t, ok := channelTypes.Load(channelID); ok {
		return t.(string), nil
	}
	ch, err := s.Store.ChannelByID(ctx, channelID)
	if err != nil {
		return "", err
	}
	channelTypes.Store(ch.ID, ch.Type)
	return ch.Type, nil
}

// shouldEcho reports whether an activity is one the echo channel answers: a message
// from anyone but the bot itself or the system.
func shouldEcho(a activity.Activity) bool {
	return a.Type == "message" && a.Sender != echoSender && a.Sender != "system"
}

// echo answers a newly created activity when its conversation is on an echo channel.
// A failure is logged and does not fail the user's request, whose activity is stored.
func (s *server) echo(c *fiber.Ctx, a activity.Activity) {
	s.echoReply(c.UserContext(), requestID(c), a)
}

// echoReply is echo for a caller without a request (the legacy WebSocket), with the
// request id to log.
func (s *server) echoReply(parent context.Context, reqID string, a activity.Activity) {
	if !shouldEcho(a) {
		return
	}
	channelID := a.ChannelID
	if t, ok := channelTypes.Load(channelID); ok && t.(string) != echoChannelType {
		return // the common case: no echo, known without a lookup
	}
	// The reply must not be lost because the client went away after its message was
	// stored.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), echoTimeout)
	defer cancel()
	if channelID == "" {
		conv, err := s.Store.Conversation(ctx, a.TenantID, a.ConversationID)
		if err != nil {
			s.Logger.Warn("echo: conversation lookup failed", "request_id", reqID, "conversation_id", a.ConversationID, "error", err)
			return
		}
		channelID = conv.ChannelID
	}
	typ, err := s.channelType(ctx, channelID)
	if err != nil {
		s.Logger.Warn("echo: channel lookup failed", "request_id", reqID, "channel_id", channelID, "error", err)
		return
	}
	if typ != echoChannelType {
		return
	}
	reply := activity.Client{Type: "message", Text: echoText(a.Text, s.maxTextBytes())}
	sys := activity.System{TenantID: a.TenantID, ConversationID: a.ConversationID, Sender: echoSender}
	if _, _, err := s.Store.CreateActivity(ctx, reply, sys); err != nil {
		// A conversation closed in between is expected; anything else is worth a look.
		s.Logger.Warn("echo: reply not created", "request_id", reqID, "conversation_id", a.ConversationID, "error", err)
	}
}

func (s *server) maxTextBytes() int {
	if s.Limits.MaxTextBytes > 0 {
		return s.Limits.MaxTextBytes
	}
	return activity.DefaultLimits.MaxTextBytes
}

// echoText is "echo: <text>", cut at a character boundary to fit max bytes.
func echoText(text string, max int) string {
	out := echoPrefix + text
	if len(out) <= max {
		return out
	}
	out = out[:max]
	for len(out) > 0 && !utf8.ValidString(out) {
		out = out[:len(out)-1]
	}
	return out
}
