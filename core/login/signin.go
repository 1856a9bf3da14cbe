package login

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
)

// The answers of the sign-in forms. A refused password or code re-renders the form with
// 200 and the message: a 401 must carry a WWW-Authenticate challenge, which a form login
// has none of. The lockout is 429, an unavailable limiter 503.
const (
	msgInvalidLogin = "Invalid email or password."
	msgInvalidCode  = "Invalid code."
	msgUnavailable  = "Signing in is unavailable right now. Try again in a minute."
	msgBusy         = "Signing in is busy right now. Try again in a moment."
)

func lockedOutMessage(seconds int64) string {
	return fmt.Sprintf("Too many failed login attempts. Try again in %d seconds.", seconds)
}

// home is the landing page after sign-in.
func (p *Pages) home(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.signedIn(c, rl)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if s == nil {
			return redirect(c, rl.prefix+"/login")
		}
		if s.user.MustChangePassword {
			return redirect(c, rl.prefix+"/password/change")
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, s)
		v.WhoAmI, v.Tenant, v.TOTPEnabled = s.user.Email, s.user.TenantName, s.user.TOTPEnabled()
		return p.render(c, fiber.StatusOK, "home", v)
	}
}

func (p *Pages) loginPage(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.signedIn(c, rl)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if s != nil {
			return redirect(c, afterSignIn(rl, s.user))
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, nil)
		v.Notice = p.takeNotice(c)
		return p.render(c, fiber.StatusOK, "login", v)
	}
}

// accountKey is the login_account key of an account: "admin:<email>" or
// "tenant:<tenant name>:<email>", normalized.
func accountKey(rl realm, tenantName, email string) string {
	if rl.portal {
		return boundKey("tenant:" + tenantName + ":" + email)
	}
	return boundKey("admin:" + email)
}

// secondFactorKey is the login_account key of a user's TOTP codes.
func secondFactorKey(u store.LoginUser) string {
	if u.Kind == store.KindTenant {
		return "tenant-2fa:" + u.ID
	}
	return "admin-2fa:" + u.ID
}

// lockout is the outcome of taking an attempt from the lockout buckets.
type lockout struct {
	locked     bool
	retryAfter int64 // seconds, when locked
}

// attempt is a login attempt taken from the lockout buckets: the keys it was counted on.
type attempt struct {
	keys  [2]limiterKey
	taken [2]bool
}

type limiterKey struct{ bucket, key string }

// takeAttempt counts an attempt on the client's address and the account before the
// secret is checked: each Take counts only when the bucket has room, so N parallel
// guesses are never all checked. When either bucket is full the attempt is locked out
// and what was taken is given back. Without an answer from the limiter it fails, and
// what was taken is given back too.
func (p *Pages) takeAttempt(c *fiber.Ctx, ip, account string) (*attempt, lockout, error) {
	ctx, cancel := limiterContext(c)
	defer cancel()
	a := &attempt{keys: [2]limiterKey{{buckets.LoginIP, ip}, {buckets.LoginAccount, account}}}
	for i, k := range a.keys {
		r, err := p.Limiter.Take(ctx, k.bucket, k.key, 1)
		if err != nil {
			p.forgive(c, a)
			return nil, lockout{}, fmt.Errorf("limiter: take %s: %w", k.bucket, err)
		}
		if !r.Allowed {
			p.forgive(c, a)
			return nil, lockout{locked: true, retryAfter: r.RetryAfterSeconds()}, nil
		}
		a.taken[i] = true
	}
	return a, lockout{}, nil
}

// forgive gives an attempt back: it succeeded, was not a guess (a deactivated account),
// or was never checked. A refund that fails leaves the attempt counted (the safe side),
// and is logged.
func (p *Pages) forgive(c *fiber.Ctx, a *attempt) {
	// Not the request's context: a client that goes away must not keep its attempt.
	ctx, cancel := context.WithTimeout(context.Background(), limiterTimeout)
	defer cancel()
	for i, k := range a.keys {
		if !a.taken[i] {
			continue
		}
		a.taken[i] = false
		if _, err := p.Limiter.Refund(ctx, k.bucket, k.key, 1); err != nil {
			p.Logger.Warn("login: an attempt could not be given back; it stays counted", "bucket", k.bucket, "error", err,
				"request_id", requestID(c))
		}
	}
}

// answerLockout renders page with the lockout message, 429 and retry-after.
func (p *Pages) answerLockout(c *fiber.Ctx, page string, v *view, l lockout) error {
	c.Set(fiber.HeaderRetryAfter, strconv.FormatInt(l.retryAfter, 10))
	v.Error = lockedOutMessage(l.retryAfter)
	return p.render(c, fiber.StatusTooManyRequests, page, v)
}

// login checks an email (and for the portal a tenant name) and password.
func (p *Pages) login(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.session(c)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if !p.checkCSRF(c, s) {
			return p.forbidden(c, rl)
		}
		rawEmail, rawTenant, password := field(c, "email"), field(c, "tenant_name"), field(c, "password")
		email, tenant := normalize(rawEmail), normalize(rawTenant)
		v := p.newView(rl)
		v.CSRF = p.formToken(c, nil)
		v.Email, v.TenantName = rawEmail, rawTenant
		if email == "" || password == "" || (rl.portal && tenant == "") || len(email) > maxEmailLength ||
			utf8.RuneCountInString(tenant) > maxTenantNameLength || len(password) > passwords.MaxLength {
			// Nothing was checked, so nothing is counted.
			v.Error = msgInvalidLogin
			return p.render(c, fiber.StatusOK, "login", v)
		}
		ip, account := p.clientIP(c), accountKey(rl, tenant, email)
		a, l, err := p.takeAttempt(c, ip, account)
		if err != nil {
			// Failing closed: without the limiter, passwords could be guessed without bound.
			p.Logger.Error("login: the limiter did not answer; refusing logins", "error", err, "request_id", requestID(c))
			v.Error = msgUnavailable
			return p.render(c, fiber.StatusServiceUnavailable, "login", v)
		}
		if l.locked {
			return p.answerLockout(c, "login", v, l)
		}
		var u store.LoginUser
		if rl.portal {
			u, err = p.Store.TenantUserForLogin(c.UserContext(), tenant, email)
		} else {
			u, err = p.Store.AdminForLogin(c.UserContext(), email)
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			p.forgive(c, a)
			return p.internalError(c, rl, err)
		}
		found := err == nil
		hash := p.dummyHash
		if found {
			hash = u.PasswordHash
		}
		// An unknown account is checked against a stand-in hash, so that it takes as
		// long as a known one.
		ok, verr := p.Hashes.Verify(c.UserContext(), password, hash)
		switch {
		case errors.Is(verr, passwords.ErrBusy) || c.UserContext().Err() != nil:
			// Not checked: not counted.
			p.forgive(c, a)
			c.Set(fiber.HeaderRetryAfter, "1")
			v.Error = msgBusy
			return p.render(c, fiber.StatusServiceUnavailable, "login", v)
		case verr != nil:
			p.Logger.Error("login: a stored password hash is unusable", "kind", u.Kind, "user_id", u.ID, "error", verr)
		}
		switch {
		case found && !u.Active:
			// A deactivated account cannot sign in and is not counted.
			p.forgive(c, a)
			v.Error = msgInvalidLogin
			return p.render(c, fiber.StatusOK, "login", v)
		case !found || !ok:
			// The attempt stays counted.
			v.Error = msgInvalidLogin
			return p.render(c, fiber.StatusOK, "login", v)
		}
		// A success is not counted.
		p.forgive(c, a)
		if u.TOTPEnabled() {
			if err := p.startSession(c, u, store.SessionTOTP); err != nil {
				return p.internalError(c, rl, err)
			}
			return redirect(c, rl.prefix+"/login/totp")
		}
		if err := p.startSession(c, u, store.SessionSignedIn); err != nil {
			return p.internalError(c, rl, err)
		}
		return redirect(c, afterSignIn(rl, u))
	}
}

// halfSignedIn returns the request's session waiting for a TOTP code in the realm, or nil.
func (p *Pages) halfSignedIn(c *fiber.Ctx, rl realm) (*session, error) {
	s, err := p.session(c)
	if err != nil || s == nil || s.Kind != rl.kind || s.Stage != store.SessionTOTP || !s.user.TOTPEnabled() {
		return nil, err
	}
	return s, nil
}

func (p *Pages) totpPage(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.halfSignedIn(c, rl)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if s == nil {
			return redirect(c, rl.prefix+"/login")
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, s)
		return p.render(c, fiber.StatusOK, "totp", v)
	}
}

// totpLogin checks the second factor: a TOTP code or a recovery code.
func (p *Pages) totpLogin(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.halfSignedIn(c, rl)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if s == nil {
			// Not half signed in: expired, or never. The CSRF check comes after, since
			// there is no session to check against; nothing is changed either way.
			return redirect(c, rl.prefix+"/login")
		}
		if !p.checkCSRF(c, s) {
			return p.forbidden(c, rl)
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, s)
		ip, account := p.clientIP(c), secondFactorKey(s.user)
		a, l, err := p.takeAttempt(c, ip, account)
		if err != nil {
			p.Logger.Error("login: the limiter did not answer; refusing logins", "error", err, "request_id", requestID(c))
			v.Error = msgUnavailable
			return p.render(c, fiber.StatusServiceUnavailable, "totp", v)
		}
		if l.locked {
			return p.answerLockout(c, "totp", v, l)
		}
		ok, err := p.checkSecondFactor(c.UserContext(), s.user, field(c, "code"))
		if err != nil {
			p.forgive(c, a)
			return p.internalError(c, rl, err)
		}
		if !ok {
			// The attempt stays counted.
			v.Error = msgInvalidCode
			return p.render(c, fiber.StatusOK, "totp", v)
		}
		p.forgive(c, a)
		if err := p.startSession(c, s.user, store.SessionSignedIn); err != nil {
			return p.internalError(c, rl, err)
		}
		return redirect(c, afterSignIn(rl, s.user))
	}
}

// logout ends the session, whatever its realm or stage.
func (p *Pages) logout(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.session(c)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if !p.checkCSRF(c, s) {
			return p.forbidden(c, rl)
		}
		if err := p.endSession(c); err != nil {
			return p.internalError(c, rl, err)
		}
		p.setCookie(c, noticeCookie, "signed_out", 0)
		return redirect(c, rl.prefix+"/login")
	}
}
