package api

import (
	"errors"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/token"
)

// The credential answers. Direct Line clients take 403 as "token expired", so the
// client API answers 403 for every bad token; the tenant API answers 401.
var (
	errAPIKey = apierror.Unauthorized.WithMessage("A valid API key is required in the x-api-key header.")
	errToken  = apierror.Forbidden.WithMessage("Invalid or expired token.")
)

// requireTenant authenticates the tenant API: x-api-key, current or within its
// rotation grace, of an active tenant (remembered for a while: apikeys.go).
func (s *server) requireTenant(c *fiber.Ctx) error {
	t, found, err := s.tenantByKey(c)
	if err != nil {
		return err
	}
	if !found {
		return fail(c, errAPIKey, nil)
	}
	c.Locals(localTenant, t)
	return c.Next()
}

// tenant is the tenant requireTenant authenticated.
func tenant(c *fiber.Ctx) store.Tenant {
	t, _ := c.Locals(localTenant).(store.Tenant)
	return t
}

// bearer returns the credential of an "Authorization: Bearer …" header.
func bearer(c *fiber.Ctx) string {
	h := c.Get(fiber.HeaderAuthorization)
	const scheme = "bearer "
	if len(h) > len(scheme) && strings.EqualFold(h[:len(scheme)], scheme) {
		return strings.TrimSpace(h[len(scheme):])
	}
	return ""
}

// requireToken authenticates the client API: a valid Converger token (bearer, or the
// t query parameter of the stream only) whose channel is still active, from an origin
// its tenant allows (checkTenantOrigin).
func (s *server) requireToken(c *fiber.Ctx) error {
	tok := bearer(c)
	if tok == "" && strings.HasSuffix(c.Path(), "/stream") {
		// Only the stream takes the token from its URL (streamUrl): a browser's
		// WebSocket cannot send headers. Tokens elsewhere stay out of URLs and logs.
		tok = c.Query("t")
	}
	claims, err := s.Verifier.Verify(tok)
	if err != nil {
		return fail(c, errToken, nil)
	}
	ch, err := s.Store.ChannelByID(c.UserContext(), claims.ChannelID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (!ch.Active() || ch.TenantID != claims.TenantID)) {
		return fail(c, errToken, nil)
	}
	if err != nil {
		return err
	}
	if ok, err := s.checkTenantOrigin(c, claims.TenantID); !ok {
		return err
	}
	c.Locals(localClaims, claims)
	return c.Next()
}

// claims are the token requireToken verified.
func claims(c *fiber.Ctx) *token.Claims {
	cl, _ := c.Locals(localClaims).(*token.Claims)
	return cl
}

// tokenAllows reports whether a token may touch a conversation: an unbound token any
// conversation of its channel, a bound one only its own. Callers answer 404 otherwise,
// as for a missing conversation.
func tokenAllows(cl *token.Claims, conv store.Conversation) bool {
	if conv.TenantID != cl.TenantID || conv.ChannelID != cl.ChannelID {
		return false
	}
	return cl.ConversationID == "" || cl.ConversationID == conv.ID
}
