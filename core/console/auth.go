package console

import (
	"context"
	"errors"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/store"
)

// actor is who makes a request of the console.
type actor struct {
	adminID, email string
	// via is how: "session", or "token:<token id>".
	via   string
	scope string
	// session is the admin's session; nil for a token.
	session *login.Admin
}

// operator is the store's audited operations as the actor.
func (a *actor) operator(st *store.Store) *store.Operator {
	return st.As("admin:" + a.adminID).Via(a.via)
}

type localKey int

const localActor localKey = iota

func actorOf(c *fiber.Ctx) *actor {
	a, _ := c.Locals(localActor).(*actor)
	return a
}

// isWrite reports whether a method changes something.
func isWrite(method string) bool {
	switch method {
	case fiber.MethodGet, fiber.MethodHead, fiber.MethodOptions:
		return false
	}
	return true
}

// withDeadline bounds the database work of the rest of the request.
func (c *Console) withDeadline(ctx *fiber.Ctx) error {
	d, cancel := context.WithTimeout(ctx.UserContext(), c.DatabaseTimeout)
	defer cancel()
	ctx.SetUserContext(d)
	return ctx.Next()
}

// authAPI authenticates an API request: a bearer admin token, else the admin session.
// A request with an Authorization header is judged by it alone. Writes need a
// read-write token, or the session's CSRF token in x-csrf-token.
func (c *Console) authAPI(ctx *fiber.Ctx) error {
	var a *actor
	if h := ctx.Get(fiber.HeaderAuthorization); h != "" {
		tok, ok := bearer(h)
		if !ok || !plausibleToken(tok) {
			return fail(ctx, errUnauthorized, nil)
		}
		ta, err := c.Store.AdminByToken(ctx.UserContext(), tok)
		if errors.Is(err, store.ErrNotFound) {
			return fail(ctx, errUnauthorized, nil)
		}
		if err != nil {
			return c.storeError(ctx, err, "")
		}
		a = &actor{adminID: ta.AdminID, email: ta.Email, via: "token:" + ta.TokenID, scope: ta.Scope}
	} else {
		adm, err := c.Pages.SignedInAdmin(ctx)
		if err != nil {
			return c.storeError(ctx, err, "")
		}
		if adm == nil {
			return fail(ctx, errUnauthorized, nil)
		}
		a = &actor{adminID: adm.ID, email: adm.Email, via: "session", scope: store.ScopeWrite, session: adm}
	}
	if isWrite(ctx.Method()) {
		if a.scope != store.ScopeWrite {
			return fail(ctx, errReadOnly, nil)
		}
		if a.session != nil && !login.ValidCSRF(a.session, ctx.Get("x-csrf-token")) {
			return fail(ctx, errCSRF, nil)
		}
	}
	ctx.Locals(localActor, a)
	return ctx.Next()
}

// bearer returns the credential of "Authorization: Bearer <credential>".
func bearer(h string) (string, bool) {
	const scheme = "bearer "
	if len(h) > len(scheme) && strings.EqualFold(h[:len(scheme)], scheme) {
		return strings.TrimSpace(h[len(scheme):]), true
	}
	return "", false
}

// plausibleToken rejects, without a lookup, what cannot be an admin token: the prefix
// and 43 characters of base64url.
func plausibleToken(t string) bool {
	rest, ok := strings.CutPrefix(t, credentials.AdminTokenPrefix)
	if !ok || len(rest) != 43 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		ch := rest[i]
		if !('a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '-' || ch == '_') {
			return false
		}
	}
	return true
}

// Credentialed reports whether a request carries a credential of the console or the
// login pages that holds (an admin token in Authorization, else a session), without
// judging what it may do: the core gives larger request bodies only to such requests.
func (c *Console) Credentialed(ctx *fiber.Ctx) (bool, error) {
	if h := ctx.Get(fiber.HeaderAuthorization); h != "" {
		tok, ok := bearer(h)
		if !ok || !plausibleToken(tok) {
			return false, nil
		}
		_, err := c.Store.AdminByToken(ctx.UserContext(), tok)
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	}
	return c.Pages.SignedIn(ctx)
}
