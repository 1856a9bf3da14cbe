package login

import (
	"errors"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/store"
)

// session is the request's session with its user.
type session struct {
	store.Session
	raw  string // the cookie's value, the secret the CSRF token is derived from
	user store.LoginUser
}

type localKey int

const localSession localKey = iota

// session returns the request's valid session, or nil: the cookie names a stored
// session that has neither expired nor been idle too long, of an active user. Using it
// records the time.
func (p *Pages) session(c *fiber.Ctx) (*session, error) {
	if s, ok := c.Locals(localSession).(*session); ok {
		return s, nil
	}
	raw := c.Cookies(SessionCookie)
	if !validToken(raw) {
		return nil, nil
	}
	raw = strings.Clone(raw)
	st, err := p.Store.TouchSession(c.UserContext(), hashToken(raw), p.Now(), p.IdleTimeout)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	u, err := p.Store.LoginUserByID(c.UserContext(), st.Kind, st.UserID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !u.Active) {
		return nil, p.Store.DeleteSession(c.UserContext(), st.IDHash)
	}
	if err != nil {
		return nil, err
	}
	s := &session{Session: st, raw: raw, user: u}
	c.Locals(localSession, s)
	return s, nil
}

// signedIn returns the request's full session of the realm's kind, or nil.
func (p *Pages) signedIn(c *fiber.Ctx, rl realm) (*session, error) {
	s, err := p.session(c)
	if err != nil || s == nil || s.Kind != rl.kind || s.Stage != store.SessionSignedIn {
		return nil, err
	}
	return s, nil
}

// startSession replaces the request's session, if any, by a new one of u at stage: a
// new id on every change of privilege, so that an id planted before sign-in is worth
// nothing after it. A half-signed-in session (stage totp) lasts totpStageTTL at most.
func (p *Pages) startSession(c *fiber.Ctx, u store.LoginUser, stage string) error {
	if old := c.Cookies(SessionCookie); validToken(old) {
		if err := p.Store.DeleteSession(c.UserContext(), hashToken(old)); err != nil {
			return err
		}
	}
	raw := credentials.Random(32)
	now := p.Now()
	life := p.MaxAge
	if stage == store.SessionTOTP {
		life = min(life, totpStageTTL)
	}
	err := p.Store.CreateSession(c.UserContext(), store.Session{IDHash: hashToken(raw), Kind: u.Kind, UserID: u.ID,
		Stage: stage, CreatedAt: now, ExpiresAt: now.Add(life)})
	if err != nil {
		return err
	}
	c.Locals(localSession, nil)
	p.setCookie(c, SessionCookie, raw, life)
	return nil
}

// endSession deletes the request's session and its cookie.
func (p *Pages) endSession(c *fiber.Ctx) error {
	if raw := c.Cookies(SessionCookie); validToken(raw) {
		if err := p.Store.DeleteSession(c.UserContext(), hashToken(raw)); err != nil {
			return err
		}
	}
	c.Locals(localSession, nil)
	p.clearCookie(c, SessionCookie)
	return nil
}

// afterSignIn is where a full sign-in leads: the password change when one is due, else
// the landing page.
func afterSignIn(rl realm, u store.LoginUser) string {
	if u.MustChangePassword {
		return rl.prefix + "/password/change"
	}
	return rl.prefix
}

// SignedIn reports whether the request carries a valid session of either realm, at any
// stage: the core gives larger request bodies only to requests with a credential.
func (p *Pages) SignedIn(c *fiber.Ctx) (bool, error) {
	s, err := p.session(c)
	return s != nil, err
}
