package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/ids"
	"github.com/converger/edge/shared/token"
)

// tenantAPI registers the tenant API (server to server, x-api-key, snake_case JSON).
//
// requireTenant is attached per route, not with r.Use: a Use on the /api/v1 group would
// also run for the client API under /api/v1/converger and the inbound webhooks.
func (s *server) tenantAPI(r fiber.Router) {
	r.Post("/conversations", s.requireTenant, s.tenantCreateConversation)
	r.Get("/conversations/:id", s.requireTenant, s.tenantGetConversation)
	r.Post("/conversations/:id/close", s.requireTenant, s.tenantSetStatus("closed"))
	r.Post("/conversations/:id/reopen", s.requireTenant, s.tenantSetStatus("active"))
	r.Post("/conversations/:id/activities", s.requireTenant, s.tenantCreateActivity)
	r.Get("/conversations/:id/activities", s.requireTenant, s.tenantListActivities)
	r.Post("/tokens", legacyTokenDeprecation, s.requireTenant, s.tenantLegacyToken)
	r.Get(legacyTokenNoticePath[len("/api/v1"):], legacyTokenNotice)
}

// The legacy token endpoint's deprecation (RFC 9745): since legacyTokenDeprecatedAt,
// announced on every answer with Deprecation and a Link to the notice, beside the
// successor-version link to the client API's tokens.
var legacyTokenDeprecatedAt = time.Date(2026, time.December, 1, 0, 0, 0, 0, time.UTC)

const (
	legacyTokenNoticePath = "/api/v1/tokens/deprecation"
	legacyTokenSuccessor  = "/api/v1/converger/tokens/generate"
)

// legacyTokenLink is the Link header of the legacy token endpoint.
var legacyTokenLink = `<` + legacyTokenSuccessor + `>; rel="successor-version", <` + legacyTokenNoticePath + `>; rel="deprecation"; type="text/plain"`

// legacyTokenDeprecation announces the deprecation on every answer of the endpoint,
// its errors included.
func legacyTokenDeprecation(c *fiber.Ctx) error {
	c.Set("Deprecation", "@"+strconv.FormatInt(legacyTokenDeprecatedAt.Unix(), 10))
	c.Set("Link", legacyTokenLink)
	return c.Next()
}

// GET /tokens/deprecation: what the legacy token endpoint's deprecation link points to.
func legacyTokenNotice(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMETextPlainCharsetUTF8)
	return c.SendString("POST /api/v1/tokens is deprecated since " + legacyTokenDeprecatedAt.Format(time.RFC3339) +
		". It issues tokens for the legacy WebSocket (/socket/websocket) only.\n" +
		"Use the client API instead: POST " + legacyTokenSuccessor + " with the channel secret\n" +
		"(or POST /api/v1/converger/tokens/publishable with the publishable key) gives a Converger token,\n" +
		"and POST /api/v1/converger/conversations a conversation and its stream (Direct Line 3.0).\n")
}

// Paging of activity lists.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// listLimit reads the limit parameter of an activity list, the same on both APIs: the
// default when it is absent or not a positive whole number, and at most maxListLimit
// (a larger one, however large, is the maximum).
func listLimit(q string) int {
	n, err := strconv.Atoi(q)
	if ne := (*strconv.NumError)(nil); errors.As(err, &ne) && ne.Err == strconv.ErrRange && !strings.HasPrefix(q, "-") {
		return maxListLimit
	}
	if err != nil || n < 1 {
		return defaultListLimit
	}
	return min(n, maxListLimit)
}

// maxIdempotencyKey bounds the x-idempotency-key header, in bytes.
const maxIdempotencyKey = 255

// maxUserID bounds user ids named in token requests, in bytes.
const maxUserID = 256

var errBadWatermark = apierror.BadRequest.WithMessage("The watermark is malformed.")

// pathID returns the :id of the URL in its canonical (lower-case) form, or false when it
// is no UUID (which answers like a missing resource).
func pathID(c *fiber.Ctx) (string, bool) {
	id := c.Params("id")
	if !ids.IsUUID(id) {
		return "", false
	}
	return strings.ToLower(id), true
}

// idempotencyKey reads the x-idempotency-key header: at most maxIdempotencyKey bytes of
// UTF-8 without control characters ("" when absent).
func idempotencyKey(c *fiber.Ctx, errs activity.FieldErrors) string {
	key := c.Get("x-idempotency-key")
	if key == "" {
		return ""
	}
	ok := len(key) <= maxIdempotencyKey && utf8.ValidString(key)
	for _, r := range key {
		if r < 0x20 || r == 0x7f {
			ok = false
		}
	}
	if !ok {
		errs["x-idempotency-key"] = append(errs["x-idempotency-key"],
			"must be at most "+strconv.Itoa(maxIdempotencyKey)+" bytes of UTF-8 without control characters")
		return ""
	}
	return strings.Clone(key)
}

// mergeErrors adds b's field errors to a and returns a (nil when both are empty).
func mergeErrors(a, b activity.FieldErrors) activity.FieldErrors {
	for k, v := range b {
		a[k] = append(a[k], v...)
	}
	if len(a) == 0 {
		return nil
	}
	return a
}

// bodyObject decodes a body that must be a JSON object (an empty body is {}).
func bodyObject(body []byte) (map[string]json.RawMessage, activity.FieldErrors) {
	if len(bytes.TrimSpace(body)) == 0 {
		return map[string]json.RawMessage{}, nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil || m == nil {
		return nil, activity.FieldErrors{"body": {"must be a JSON object"}}
	}
	return m, nil
}

// optionalString reads a string field that may be absent or null.
func optionalString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return "", true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// validUserID reports whether a user id named by a caller can go in a token.
func validUserID(s string) bool {
	return len(s) <= maxUserID && !strings.ContainsRune(s, 0)
}

func (s *server) maxMetadataBytes() int {
	if s.Limits.MaxMetadataBytes > 0 {
		return s.Limits.MaxMetadataBytes
	}
	return activity.DefaultLimits.MaxMetadataBytes
}

// activityError answers the errors of Store.CreateActivity: 422 with the field errors,
// 409 on a closed conversation, notFound for a missing one; others reach the error
// handler (500).
func activityError(c *fiber.Ctx, err error, notFound apierror.Error) error {
	var fe activity.FieldErrors
	switch {
	case errors.As(err, &fe):
		return failValidation(c, fe)
	case errors.Is(err, store.ErrConversationClosed):
		return fail(c, errConversationClosed, nil)
	case errors.Is(err, store.ErrNotFound):
		return fail(c, notFound, nil)
	}
	return err
}

// POST /conversations: body channel_id (a channel of the tenant) and an optional
// metadata object.
func (s *server) tenantCreateConversation(c *fiber.Ctx) error {
	t := tenant(c)
	body, errs := bodyObject(c.Body())
	if errs != nil {
		return failValidation(c, errs)
	}
	errs = activity.FieldErrors{}
	channelID, ok := optionalString(body["channel_id"])
	if !ok || channelID == "" {
		errs["channel_id"] = []string{"is required and must be a string"}
	}
	var metadata json.RawMessage
	if raw, present := body["metadata"]; present && string(bytes.TrimSpace(raw)) != "null" {
		norm, msg := activity.CheckObject(raw, s.maxMetadataBytes())
		if msg != "" {
			errs["metadata"] = []string{msg}
		}
		metadata = norm
	}
	if len(errs) > 0 {
		return failValidation(c, errs)
	}
	// A channel that does not exist, or is another tenant's, is a missing resource.
	if !ids.IsUUID(channelID) {
		return fail(c, apierror.NotFound, nil)
	}
	ch, err := s.Store.ChannelByID(c.UserContext(), channelID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && ch.TenantID != t.ID) {
		return fail(c, apierror.NotFound, nil)
	}
	if err != nil {
		return err
	}
	if !ch.Active() {
		return failValidation(c, activity.FieldErrors{"channel_id": {"is inactive"}})
	}
	conv, err := s.Store.CreateConversation(c.UserContext(), t.ID, ch.ID, metadata)
	if errors.Is(err, store.ErrNotFound) {
		return fail(c, apierror.NotFound, nil)
	}
	if err != nil {
		return err
	}
	return c.Status(fiber.StatusCreated).JSON(fiber.Map{"data": tenantConversation(conv)})
}

// GET /conversations/:id.
func (s *server) tenantGetConversation(c *fiber.Ctx) error {
	id, ok := pathID(c)
	if !ok {
		return fail(c, apierror.NotFound, nil)
	}
	conv, err := s.Store.Conversation(c.UserContext(), tenant(c).ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return fail(c, apierror.NotFound, nil)
	}
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"data": tenantConversation(conv)})
}

// POST /conversations/:id/close and /reopen: idempotent; a real transition appends a
// conversationUpdate activity from "system" (Store.SetConversationStatus).
func (s *server) tenantSetStatus(status string) fiber.Handler {
	return func(c *fiber.Ctx) error {
		id, ok := pathID(c)
		if !ok {
			return fail(c, apierror.NotFound, nil)
		}
		conv, _, err := s.Store.SetConversationStatus(c.UserContext(), tenant(c).ID, id, status)
		if errors.Is(err, store.ErrNotFound) {
			return fail(c, apierror.NotFound, nil)
		}
		if err != nil {
			return err
		}
		return c.JSON(fiber.Map{"data": tenantConversation(conv)})
	}
}

// POST /conversations/:id/activities: the client fields from the body (ADR-0005: every
// other key is ignored), the sender named in the body (a server-to-server API), the
// idempotency key from the header only. A repeated key answers the original, 201 too.
func (s *server) tenantCreateActivity(c *fiber.Ctx) error {
	t := tenant(c)
	id, ok := pathID(c)
	if !ok {
		return fail(c, apierror.NotFound, nil)
	}
	headerErrs := activity.FieldErrors{}
	key := idempotencyKey(c, headerErrs)
	client, sender, errs := activity.FromTenantBody(c.Body(), "user")
	if errs := mergeErrors(headerErrs, errs); errs != nil {
		return failValidation(c, errs)
	}
	sys := activity.System{TenantID: t.ID, ConversationID: id, Sender: sender, IdempotencyKey: key}
	a, created, err := s.Store.CreateActivity(c.UserContext(), client, sys)
	if err != nil {
		return activityError(c, err, apierror.NotFound)
	}
	if created {
		s.echo(c, a)
	}
	c.Status(fiber.StatusCreated)
	answer := tenantActivityData{Data: tenantActivity(a)}
	if body, ok := answer.appendJSON(make([]byte, 0, 384+len(a.Text)+len(a.Attachments)+len(a.Metadata))); ok {
		c.Response().SetBodyRaw(body)
		c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
		return nil
	}
	return c.JSON(answer)
}

// GET /conversations/:id/activities?watermark=&limit=: the activities after the
// watermark, oldest first. A malformed watermark is 400; a limit that is not a positive
// whole number is the default (listLimit); an empty page echoes the watermark sent.
func (s *server) tenantListActivities(c *fiber.Ctx) error {
	id, ok := pathID(c)
	if !ok {
		return fail(c, apierror.NotFound, nil)
	}
	sent := c.Query("watermark")
	var after int64
	if sent != "" {
		if after, ok = decodeWatermark(sent); !ok {
			return fail(c, errBadWatermark, nil)
		}
	}
	limit := listLimit(c.Query("limit"))
	list, more, err := s.Store.ListActivities(c.UserContext(), tenant(c).ID, id, after, limit)
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
	data := make([]tenantActivityJSON, 0, len(list))
	for _, a := range list {
		// Uploaded files' contentUrls are signed and expire: sign them afresh.
		a.Attachments = s.freshAttachmentURLs(a.Attachments)
		data = append(data, tenantActivity(a))
	}
	return c.JSON(fiber.Map{"data": data, "meta": fiber.Map{"watermark": watermark, "has_more": more, "limit": limit}})
}

// POST /tokens (legacy): a conversation token for the legacy WebSocket, for a
// conversation of the tenant; deprecated in favour of the client API's tokens.
func (s *server) tenantLegacyToken(c *fiber.Ctx) error {
	t := tenant(c)
	body, errs := bodyObject(c.Body())
	if errs != nil {
		return failValidation(c, errs)
	}
	errs = activity.FieldErrors{}
	convID, ok := optionalString(body["conversation_id"])
	if !ok || convID == "" {
		errs["conversation_id"] = []string{"is required and must be a string"}
	}
	userID, ok := optionalString(body["user_id"])
	if !ok || !validUserID(userID) {
		errs["user_id"] = []string{"must be a string of at most " + strconv.Itoa(maxUserID) + " bytes"}
	}
	if len(errs) > 0 {
		return failValidation(c, errs)
	}
	if !ids.IsUUID(convID) {
		return fail(c, apierror.NotFound, nil)
	}
	conv, err := s.Store.Conversation(c.UserContext(), t.ID, convID)
	if errors.Is(err, store.ErrNotFound) {
		return fail(c, apierror.NotFound, nil)
	}
	if err != nil {
		return err
	}
	tok, err := s.Signer.IssueLegacy(conv.ID, t.ID, userID, s.Now())
	if err != nil {
		return err
	}
	return c.Status(fiber.StatusCreated).JSON(fiber.Map{"token": tok, "expires_in": int(token.LegacyLifetime.Seconds())})
}
