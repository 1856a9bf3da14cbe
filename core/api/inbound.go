package api

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/inbound"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/ids"
)

// inboundRoutes registers the inbound provider webhooks (CORE_API.md §6) under
// /api/v1/channels. The sidecar has counted the request in bucket inbound on the raw
// :channel_id before it gets here. Each request is checked in this order: the channel
// (404 for an id that is no UUID or no channel's), the body's size (413) and encoding
// (400), the signature over the raw body (401), the channel's and its tenant's status
// (400); only then is the body parsed (400 when it is not a JSON object, 422 for its
// fields).
func (s *server) inboundRoutes(r fiber.Router) {
	r.Post("/:channel_id/inbound", s.verifyInbound, s.inboundMessage)
	r.Post("/:channel_id/status", s.verifyInbound, s.inboundStatus)
}

// inboundLocal is the key under which verifyInbound leaves the channel.
type inboundLocal int

const localInboundChannel inboundLocal = 0

var (
	errNoChannel           = apierror.NotFound.WithMessage("No such channel.")
	errNoConversation      = apierror.NotFound.WithMessage("No such conversation.")
	errInboundTooLarge     = errPayloadTooLarge.WithMessage(fmt.Sprintf("The request body is larger than %d bytes.", inbound.MaxBodyBytes))
	errInboundEncoding     = apierror.BadRequest.WithMessage("Compressed request bodies are not accepted: the signature covers the body as sent.")
	errInboundNotObject    = apierror.BadRequest.WithMessage("The body must be a JSON object.")
	errChannelInactive     = apierror.BadRequest.WithMessage("The channel is inactive and accepts no inbound requests.")
	errTenantInactive      = apierror.BadRequest.WithMessage("The channel's tenant is inactive; its channels accept no inbound requests.")
	errChannelOutboundOnly = apierror.BadRequest.WithMessage("The channel's mode is outbound: it accepts no inbound messages.")
)

// signatureReasons name the verification failures in the 401's details.
var signatureReasons = map[error]string{
	inbound.ErrMissing:   "missing",
	inbound.ErrMalformed: "malformed",
	inbound.ErrStale:     "stale",
	inbound.ErrMismatch:  "mismatch",
	inbound.ErrReplayed:  "replayed",
}

// localInboundSigned is the key under which verifyInbound leaves the request's
// signature for replay protection (nil for an unsigned request).
const localInboundSigned inboundLocal = 1

// verifyInbound finds the channel of the path and verifies the request's signature
// over the raw body (read once, bounded by inbound.MaxBodyBytes) with the channel's
// secret, before anything parses the body. A channel whose require_signature is off
// still accepts unsigned requests (deprecated, logged), never a bad signature.
func (s *server) verifyInbound(c *fiber.Ctx) error {
	id := c.Params("channel_id")
	if !ids.IsUUID(id) {
		return fail(c, errNoChannel, nil)
	}
	ch, secret, err := s.Store.InboundChannel(c.UserContext(), strings.ToLower(id))
	if errors.Is(err, store.ErrNotFound) {
		return fail(c, errNoChannel, nil)
	}
	if err != nil {
		return err
	}
	defer clear(secret)
	// The raw body: fiber's Body would decode a Content-Encoding first, and the
	// signature is over the bytes as sent.
	body := c.Request().Body()
	if len(body) > inbound.MaxBodyBytes {
		return fail(c, errInboundTooLarge, nil)
	}
	if enc := strings.TrimSpace(c.Get(fiber.HeaderContentEncoding)); enc != "" && !strings.EqualFold(enc, "identity") {
		return fail(c, errInboundEncoding, nil)
	}
	header := c.Get(inbound.SignatureHeader)
	err = inbound.Verify(header, secret, body, s.Now())
	switch {
	case err == nil:
		digest, expires, _ := inbound.ReplayKey(header, body)
		c.Locals(localInboundSigned, &store.Signed{Digest: digest, ExpiresAt: expires})
	case errors.Is(err, inbound.ErrMissing) && !ch.RequireSignature:
		s.Logger.Warn("inbound request accepted without a signature (deprecated: the channel does not require one)", "channel_id", ch.ID)
	default:
		return fail(c, apierror.Unauthorized.WithMessage(signatureMessage(err)), map[string]string{"reason": signatureReasons[err]})
	}
	switch {
	case !ch.TenantActive:
		return fail(c, errTenantInactive, nil)
	case ch.Status != "active":
		return fail(c, errChannelInactive, nil)
	}
	c.Locals(localInboundChannel, ch)
	return c.Next()
}

// signatureMessage is the 401's message for a verification error.
func signatureMessage(err error) string {
	msg := err.Error()
	return strings.ToUpper(msg[:1]) + msg[1:] + "."
}

// inboundSigned is the signature verifyInbound verified, nil for an unsigned request.
func inboundSigned(c *fiber.Ctx) *store.Signed {
	sig, _ := c.Locals(localInboundSigned).(*store.Signed)
	return sig
}

// replayed answers a signed request that was received already.
func replayed(c *fiber.Ctx) error {
	return fail(c, apierror.Unauthorized.WithMessage(signatureMessage(inbound.ErrReplayed)), map[string]string{"reason": signatureReasons[inbound.ErrReplayed]})
}

// inboundChannel is the channel verifyInbound verified.
func inboundChannel(c *fiber.Ctx) store.Channel {
	ch, _ := c.Locals(localInboundChannel).(store.Channel)
	return ch
}

// POST /api/v1/channels/:channel_id/inbound: a provider's message becomes an activity
// through the trusted create, with the sender and provider message id (idempotency_key)
// the body names as the activity's server fields, in the conversation_id given (of the
// channel's tenant, open) or a new conversation of the channel. 201 with the activity,
// also for a repeated provider message id (the original). A signed request is single
// use: sent again within the tolerance it answers the original activity when it has a
// provider message id, else 401 with reason "replayed".
func (s *server) inboundMessage(c *fiber.Ctx) error {
	ch := inboundChannel(c)
	if ch.Mode == "outbound" {
		return fail(c, errChannelOutboundOnly, nil)
	}
	m, err := inbound.DecodeMessage(c.Request().Body())
	if err != nil {
		return inboundBodyError(c, err)
	}
	if errs := m.Check(s.Limits); errs != nil {
		return failValidation(c, errs)
	}
	convID := m.ConversationID
	if convID != "" {
		if !ids.IsUUID(convID) {
			return fail(c, errNoConversation, nil)
		}
		convID = strings.ToLower(convID)
	}
	a, created, err := s.Store.CreateInboundActivity(c.UserContext(), ch, store.InboundMessage{
		Client: m.Client, Sender: m.Sender, ProviderMessageID: m.ProviderMessageID, ConversationID: convID,
		Signed: inboundSigned(c),
	})
	if errors.Is(err, store.ErrReplayed) {
		return replayed(c)
	}
	if err != nil {
		return activityError(c, err, errNoConversation)
	}
	if created {
		s.echo(c, a)
	}
	return c.Status(fiber.StatusCreated).JSON(fiber.Map{"data": tenantActivity(a)})
}

// POST /api/v1/channels/:channel_id/status: a provider's delivery status of a message
// of the channel, named by provider_message_id or delivery_id. Statuses only move
// forward (inbound.Status.Advances); 200 with the current status and whether this
// update was applied. Every channel mode takes status updates.
func (s *server) inboundStatus(c *fiber.Ctx) error {
	u, err := inbound.DecodeStatus(c.Request().Body())
	if err != nil {
		return inboundBodyError(c, err)
	}
	d, err := s.Store.UpdateDeliveryStatus(c.UserContext(), inboundChannel(c).ID, u, inboundSigned(c))
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"data": fiber.Map{
		u.IDField: u.ID, "status": d.Status, "applied": d.Applied, "updated_at": jsonTime(d.UpdatedAt),
	}})
}

// inboundBodyError answers a body decoding error: 400 when the body is not a JSON
// object, 422 with the fields otherwise.
func inboundBodyError(c *fiber.Ctx, err error) error {
	var fe activity.FieldErrors
	if errors.As(err, &fe) {
		return failValidation(c, fe)
	}
	return fail(c, errInboundNotObject, nil)
}
