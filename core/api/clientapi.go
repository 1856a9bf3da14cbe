package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/token"
)

// clientAPI registers the client API (Direct Line 3.0 compatible, camelCase JSON).
//
// Token scope: an unbound token (from a secret or a publishable key) may create
// conversations of its channel and touch any conversation of its channel; a token bound
// to a conversation touches only that one. A bound token on any other conversation is
// 403 (the token does not grant it, whatever the id). For an unbound token, every
// conversation it may not touch — another channel's, another tenant's, a malformed id —
// answers exactly like a missing one, 404 not_found: Direct Line clients take 403 as
// "token expired" and would start refreshing. requireToken re-checks on every request
// that the channel (and its tenant) is active.
func (s *server) clientAPI(r fiber.Router) {
	r.Post("/tokens/generate", s.clientGenerateToken)
	r.Post("/tokens/publishable", s.clientPublishableToken)
	r.Post("/tokens/refresh", s.requireToken, s.clientRefreshToken)
	r.Post("/conversations", s.requireToken, s.clientStartConversation)
	r.Get("/conversations/:id", s.requireToken, s.clientReconnect)
	r.Post("/conversations/:id/activities", s.requireToken, s.clientCreateActivity)
	r.Get("/conversations/:id/activities", s.requireToken, s.clientListActivities)
	s.streamRoutes(r)
	s.uploadRoutes(r)
}

var (
	errNoCredential = apierror.Forbidden.WithMessage("A channel credential is required in the Authorization header.")
	errCredential   = apierror.Forbidden.WithMessage("Invalid channel credential.")
	errTokenAsKey   = apierror.BadRequest.WithMessage("A token was sent where a channel credential is expected; refresh tokens with POST /tokens/refresh.")
	// errConversationAccess answers a bound token on another conversation than its own.
	errConversationAccess = apierror.Forbidden.WithMessage("The token does not grant access to this conversation.")
)

// maxCredential bounds a channel secret or publishable key before it is hashed.
const maxCredential = 256

// expiresIn is a Converger token's lifetime in seconds.
var expiresIn = int(token.Lifetime.Seconds())

// tokenBody is the answer of the token endpoints.
type tokenBody struct {
	ConversationID *string `json:"conversationId"`
	Token          string  `json:"token"`
	ExpiresIn      int     `json:"expires_in"`
}

// conversationBody is the answer of start and reconnect: a Direct Line conversation.
type conversationBody struct {
	ConversationID string `json:"conversationId"`
	Token          string `json:"token"`
	ExpiresIn      int    `json:"expires_in"`
	StreamURL      string `json:"streamUrl"`
}

// POST /tokens/generate: Authorization: Bearer <channel secret>.
func (s *server) clientGenerateToken(c *fiber.Ctx) error {
	return s.issueChannelToken(c, token.SrcSecret, s.Store.ChannelBySecret)
}

// POST /tokens/publishable: Authorization: Bearer <publishable key>.
func (s *server) clientPublishableToken(c *fiber.Ctx) error {
	return s.issueChannelToken(c, token.SrcPublishable, s.Store.ChannelByPublishableKey)
}

// issueChannelToken exchanges a channel credential for an unbound token of the channel,
// for the user named in the optional body {"user":{"id":…}}.
func (s *server) issueChannelToken(c *fiber.Ctx, src string, lookup func(context.Context, string) (store.Channel, error)) error {
	key := bearer(c)
	if key == "" {
		return fail(c, errNoCredential, nil)
	}
	// Secrets and publishable keys are base64url: a dotted credential is a token (JWT).
	if strings.Count(key, ".") == 2 {
		return fail(c, errTokenAsKey, nil)
	}
	if len(key) > maxCredential {
		return fail(c, errCredential, nil)
	}
	userID, errs, bad := tokenUser(c.Body())
	if bad {
		return fail(c, apierror.BadRequest.WithMessage("The body must be a JSON object."), nil)
	}
	if errs != nil {
		return failValidation(c, errs)
	}
	ch, err := lookup(c.UserContext(), key)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !ch.Active()) {
		return fail(c, errCredential, nil)
	}
	if err != nil {
		return err
	}
	if ok, err := s.checkTenantOrigin(c, ch.TenantID); !ok {
		return err
	}
	tok, err := s.Signer.Issue(token.Claims{TenantID: ch.TenantID, ChannelID: ch.ID, UserID: userID, Src: src}, s.Now())
	if err != nil {
		return err
	}
	return c.JSON(tokenBody{Token: tok, ExpiresIn: expiresIn})
}

// tokenUser reads the optional body {"user":{"id":"…"}} of a token request; bad is true
// when the body is not a JSON object.
func tokenUser(body []byte) (userID string, errs activity.FieldErrors, bad bool) {
	if len(bytes.TrimSpace(body)) == 0 {
		return "", nil, false
	}
	var b struct {
		User json.RawMessage `json:"user"`
	}
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) != nil || probe == nil {
		return "", nil, true
	}
	_ = json.Unmarshal(body, &b)
	if len(b.User) == 0 || string(bytes.TrimSpace(b.User)) == "null" {
		return "", nil, false
	}
	var user map[string]json.RawMessage
	if json.Unmarshal(b.User, &user) != nil || user == nil {
		return "", activity.FieldErrors{"user": {"must be an object"}}, false
	}
	id, ok := optionalString(user["id"])
	if !ok || !validUserID(id) {
		return "", activity.FieldErrors{"user.id": {"must be a string of at most " + strconv.Itoa(maxUserID) + " bytes"}}, false
	}
	return id, nil, false
}

// POST /tokens/refresh: a new token with the same claims (tenant, channel, conversation,
// user, source).
func (s *server) clientRefreshToken(c *fiber.Ctx) error {
	cl := claims(c)
	tok, err := s.Signer.Issue(token.Claims{TenantID: cl.TenantID, ChannelID: cl.ChannelID,
		ConversationID: cl.ConversationID, UserID: cl.UserID, Src: cl.Src}, s.Now())
	if err != nil {
		return err
	}
	var conv *string
	if cl.ConversationID != "" {
		conv = &cl.ConversationID
	}
	return c.JSON(tokenBody{ConversationID: conv, Token: tok, ExpiresIn: expiresIn})
}

// boundToken issues a token of the same user and source bound to a conversation.
func (s *server) boundToken(cl *token.Claims, conversationID string) (string, error) {
	return s.Signer.Issue(token.Claims{TenantID: cl.TenantID, ChannelID: cl.ChannelID,
		ConversationID: conversationID, UserID: cl.UserID, Src: cl.Src}, s.Now())
}

// streamURL is the WebSocket URL of a conversation's stream for a bound token, with the
// watermark to resume after ("" for the start).
func (s *server) streamURL(conversationID, tok, watermark string) string {
	base := strings.TrimRight(s.PublicURL, "/")
	switch {
	case strings.HasPrefix(base, "https://"):
		base = "wss://" + strings.TrimPrefix(base, "https://")
	case strings.HasPrefix(base, "http://"):
		base = "ws://" + strings.TrimPrefix(base, "http://")
	}
	u := base + "/api/v1/converger/conversations/" + conversationID + "/stream?t=" + url.QueryEscape(tok)
	if watermark != "" {
		u += "&watermark=" + url.QueryEscape(watermark)
	}
	return u
}

// POST /conversations (any body): with an unbound token, a new conversation on the
// token's channel (201); with a bound token, its own conversation (200, as Direct Line
// answers a start with a conversation-bound token). Either way a token bound to the
// conversation, for the same user and source, and its streamUrl.
func (s *server) clientStartConversation(c *fiber.Ctx) error {
	cl := claims(c)
	status := fiber.StatusCreated
	var conv store.Conversation
	var err error
	if cl.ConversationID != "" {
		conv, err = s.Store.Conversation(c.UserContext(), cl.TenantID, cl.ConversationID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && !tokenAllows(cl, conv)) {
			return fail(c, apierror.NotFound, nil)
		}
		status = fiber.StatusOK
	} else {
		conv, err = s.Store.CreateConversation(c.UserContext(), cl.TenantID, cl.ChannelID, nil)
		if errors.Is(err, store.ErrNotFound) {
			return fail(c, errToken, nil) // the channel went away after requireToken
		}
	}
	if err != nil {
		return err
	}
	tok, err := s.boundToken(cl, conv.ID)
	if err != nil {
		return err
	}
	return c.Status(status).JSON(conversationBody{ConversationID: conv.ID, Token: tok, ExpiresIn: expiresIn,
		StreamURL: s.streamURL(conv.ID, tok, "")})
}

// conversationID returns the conversation id of the URL when the token's scope can
// include it; otherwise it answers (403 for a bound token on another conversation, 404
// for a malformed id) and ok is false (err is the answer's error).
func conversationID(c *fiber.Ctx) (id string, ok bool, err error) {
	cl := claims(c)
	id, valid := pathID(c)
	switch {
	case cl.ConversationID != "" && cl.ConversationID != id:
		return "", false, fail(c, errConversationAccess, nil)
	case !valid:
		return "", false, fail(c, apierror.NotFound, nil)
	}
	return id, true, nil
}

// clientConversation returns the conversation of the URL when the token may touch it;
// otherwise it answers (see conversationID; a conversation of another channel or
// tenant is 404, as a missing one) and ok is false (err is the answer's error).
func (s *server) clientConversation(c *fiber.Ctx) (conv store.Conversation, ok bool, err error) {
	cl := claims(c)
	id, ok, err := conversationID(c)
	if !ok {
		return conv, false, err
	}
	conv, err = s.Store.Conversation(c.UserContext(), cl.TenantID, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !tokenAllows(cl, conv)) {
		return conv, false, fail(c, apierror.NotFound, nil)
	}
	if err != nil {
		return conv, false, err
	}
	return conv, true, nil
}

// GET /conversations/:id?watermark=: reconnect; a new bound token and streamUrl, with a
// valid watermark carried into the streamUrl (an invalid one is dropped: the stream
// would start from the beginning anyway).
func (s *server) clientReconnect(c *fiber.Ctx) error {
	conv, ok, err := s.clientConversation(c)
	if !ok {
		return err
	}
	tok, err := s.boundToken(claims(c), conv.ID)
	if err != nil {
		return err
	}
	watermark := c.Query("watermark")
	if _, valid := decodeWatermark(watermark); !valid {
		watermark = ""
	}
	return c.JSON(conversationBody{ConversationID: conv.ID, Token: tok, ExpiresIn: expiresIn,
		StreamURL: s.streamURL(conv.ID, tok, watermark)})
}

// POST /conversations/:id/activities: a Direct Line activity. Only its client fields
// are taken (channelData as the metadata); from.id is the sender (default "user"), the
// idempotency key comes from the header only. 200 {"id"} with the activity's id, the id
// the activity carries when it comes back on the stream or a list.
func (s *server) clientCreateActivity(c *fiber.Ctx) error {
	cl := claims(c)
	id, ok, err := conversationID(c)
	if !ok {
		return err
	}
	if cl.ConversationID == "" {
		// An unbound token: the conversation must be of its channel. (A bound token's
		// conversation was checked when the token was bound; the store's insert is keyed
		// by the token's tenant.)
		if _, ok, err := s.clientConversation(c); !ok {
			return err
		}
	}
	body := c.Body()
	headerErrs := activity.FieldErrors{}
	key := idempotencyKey(c, headerErrs)
	client, errs := activity.FromDirectLine(body)
	if errs := mergeErrors(headerErrs, errs); errs != nil {
		return failValidation(c, errs)
	}
	sys := activity.System{TenantID: cl.TenantID, ConversationID: id, Sender: activity.Sender(body, "user"), IdempotencyKey: key}
	a, created, err := s.Store.CreateActivity(c.UserContext(), client, sys)
	if err != nil {
		return activityError(c, channelDataErrors(body, err), apierror.NotFound)
	}
	if created {
		s.echo(c, a)
	}
	return c.JSON(fiber.Map{"id": a.ID})
}

// channelDataErrors names the metadata's field errors "channelData" when the Direct Line
// body sent its metadata as channelData, so that the 422 names the field the client sent.
func channelDataErrors(body []byte, err error) error {
	var fe activity.FieldErrors
	if !errors.As(err, &fe) || fe["metadata"] == nil {
		return err
	}
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) != nil {
		return err
	}
	if _, ok := probe["channelData"]; !ok {
		return err
	}
	out := activity.FieldErrors{}
	for k, v := range fe {
		if k == "metadata" {
			k = "channelData"
		}
		out[k] = v
	}
	return out
}

// GET /conversations/:id/activities?watermark=&limit=: the activities after the
// watermark in the Direct Line shape. An empty or invalid watermark starts from the
// beginning; an invalid limit is the default one. Never rate limited.
func (s *server) clientListActivities(c *fiber.Ctx) error {
	cl := claims(c)
	id, ok, err := conversationID(c)
	if !ok {
		return err
	}
	if cl.ConversationID == "" {
		if _, ok, err := s.clientConversation(c); !ok {
			return err
		}
	}
	sent := c.Query("watermark")
	after, ok := decodeWatermark(sent)
	if !ok {
		after, sent = 0, ""
	}
	limit := listLimit(c.Query("limit"))
	list, more, err := s.Store.ListActivities(c.UserContext(), cl.TenantID, id, after, limit)
	if errors.Is(err, store.ErrNotFound) {
		return fail(c, apierror.NotFound, nil)
	}
	if err != nil {
		return err
	}
	watermark := encodeWatermark(after)
	switch {
	case len(list) > 0:
		watermark = encodeWatermark(list[len(list)-1].Seq)
	case sent != "":
		watermark = sent
	}
	// Uploaded files' contentUrls are signed and expire: sign them afresh, as the
	// stream does.
	for i := range list {
		list[i].Attachments = s.freshAttachmentURLs(list[i].Attachments)
	}
	return c.JSON(fiber.Map{"activities": directLineActivities(list), "watermark": watermark, "has_more": more})
}
