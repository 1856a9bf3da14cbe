package login

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
)

const (
	msgResetSent    = "If the account exists, we have sent a link to reset its password."
	msgResetInvalid = "This password reset link is invalid, has been used, or has expired. Ask for a new one."
)

// checkNewPassword returns why a new password is refused, or "".
func checkNewPassword(password, confirm string) string {
	switch {
	case !utf8.ValidString(password):
		return "The password is not valid text."
	case utf8.RuneCountInString(password) < MinPasswordLength:
		return fmt.Sprintf("The password must have at least %d characters.", MinPasswordLength)
	case len(password) > passwords.MaxLength:
		return fmt.Sprintf("The password must have at most %d bytes.", passwords.MaxLength)
	case password != confirm:
		return "The passwords do not match."
	}
	return ""
}

func (p *Pages) resetRequestPage(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		v := p.newView(rl)
		v.CSRF = p.formToken(c, nil)
		return p.render(c, fiber.StatusOK, "reset_request", v)
	}
}

// resetAccountKey is the password_reset_account key of an account:
// "admin::<email>" or "tenant:<tenant name>:<email>", normalized.
func resetAccountKey(rl realm, tenantName, email string) string {
	if rl.portal {
		return boundKey("tenant:" + tenantName + ":" + email)
	}
	return boundKey("admin::" + email)
}

// resetRequest emails a reset link to an active account, at most 3 per hour per account
// (password_reset_account; the address is limited by the sidecar's route table). The
// answer is the same page whatever happened, and the work done before it is the same
// for known and unknown accounts — one limiter Check on the account key — so that
// neither the answer nor its timing tells which accounts exist: the lookup, the reset
// token's row and the email are made in the background.
func (p *Pages) resetRequest(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.session(c)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if !p.checkCSRF(c, s) {
			return p.forbidden(c, rl)
		}
		email, tenant := normalize(field(c, "email")), normalize(field(c, "tenant_name"))
		if email != "" && len(email) <= maxEmailLength && (!rl.portal || (tenant != "" &&
			utf8.RuneCountInString(tenant) <= maxTenantNameLength)) {
			p.requestReset(c, rl, tenant, email)
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, nil)
		v.Notice = msgResetSent
		return p.render(c, fiber.StatusOK, "reset_request", v)
	}
}

// requestReset counts a reset request of an account and has the rest done in the
// background (createReset).
func (p *Pages) requestReset(c *fiber.Ctx, rl realm, tenant, email string) {
	ctx, cancel := limiterContext(c)
	res, err := p.Limiter.Check(ctx, buckets.PasswordResetAccount, resetAccountKey(rl, tenant, email), 1)
	cancel()
	id := requestID(c)
	if err != nil {
		// Failing closed: no email rather than an unlimited number of them.
		p.Logger.Error("login: the limiter did not answer; no password reset email sent", "error", err, "request_id", id)
		return
	}
	if !res.Allowed {
		return
	}
	p.background("password reset", func() {
		if err := p.createReset(rl, tenant, email); err != nil {
			p.Logger.Error("login: a password reset failed", "error", err, "request_id", id)
		}
	})
}

// createReset emails a reset link to the account when it exists and is active.
func (p *Pages) createReset(rl realm, tenant, email string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var u store.LoginUser
	var err error
	if rl.portal {
		u, err = p.Store.TenantUserForLogin(ctx, tenant, email)
	} else {
		u, err = p.Store.AdminForLogin(ctx, email)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case !u.Active:
		return nil
	}
	link, err := ResetLink(ctx, p.Store, p.PublicURL, u, p.Now())
	if err != nil {
		return err
	}
	p.deliver(mail.Message{
		To:      u.Email,
		Subject: "Reset your Converger password",
		Body: "Someone, hopefully you, asked to reset the password of the Converger " + accountName(u) + ".\n\n" +
			"To choose a new password, open this link within an hour:\n\n" + link + "\n\n" +
			"The link works once. If you did not ask for it, ignore this email: your password stays as it is.\n",
	})
	return nil
}

// accountName names a user's account in an email.
func accountName(u store.LoginUser) string {
	if u.Kind == store.KindTenant {
		return "account " + u.Email + " of tenant " + u.TenantName
	}
	return "admin account " + u.Email
}

// ResetLink stores a new password reset token of u and returns the link that uses it:
// <publicURL>/admin/password/reset/<token>, or /portal/… for a tenant user. It works
// once, within ResetTTL of now.
func ResetLink(ctx context.Context, st *store.Store, publicURL string, u store.LoginUser, now time.Time) (string, error) {
	rl := adminRealm
	if u.Kind == store.KindTenant {
		rl = portalRealm
	}
	token := credentials.Random(32)
	if err := st.CreatePasswordReset(ctx, u.Kind, u.ID, hashToken(token), now.Add(ResetTTL)); err != nil {
		return "", err
	}
	return strings.TrimRight(publicURL, "/") + rl.prefix + "/password/reset/" + token, nil
}

// InvitationMessage is the email that gives a new user the link to choose a password.
func InvitationMessage(u store.LoginUser, link string) mail.Message {
	return mail.Message{
		To:      u.Email,
		Subject: "Your Converger account",
		Body: "The Converger " + accountName(u) + " was created for you.\n\n" +
			"To choose your password, open this link within an hour:\n\n" + link + "\n\n" +
			"The link works once. When it has expired, ask for a new one with \"Forgot your password?\" on the sign-in page.\n",
	}
}

// resetUser returns the user of the path's reset token when it can still be used in
// this realm.
func (p *Pages) resetUser(c *fiber.Ctx, rl realm) (token string, u store.LoginUser, ok bool, err error) {
	token = c.Params("token")
	if !validToken(token) {
		return "", store.LoginUser{}, false, nil
	}
	token = strings.Clone(token)
	u, err = p.Store.PasswordResetUser(c.UserContext(), hashToken(token), rl.kind, p.Now())
	if errors.Is(err, store.ErrNotFound) {
		return token, u, false, nil
	}
	return token, u, err == nil, err
}

func (p *Pages) resetPage(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		token, _, ok, err := p.resetUser(c, rl)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if !ok {
			return p.message(c, rl, fiber.StatusBadRequest, msgResetInvalid)
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, nil)
		v.Action = rl.prefix + "/password/reset/" + token
		return p.render(c, fiber.StatusOK, "reset_password", v)
	}
}

// reset sets a new password with a reset token: the token is used up, the account's
// sessions revoked, and must_change_password cleared.
func (p *Pages) reset(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.session(c)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if !p.checkCSRF(c, s) {
			return p.forbidden(c, rl)
		}
		token, _, ok, err := p.resetUser(c, rl)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if !ok {
			return p.message(c, rl, fiber.StatusBadRequest, msgResetInvalid)
		}
		password := field(c, "password")
		if msg := checkNewPassword(password, field(c, "password_confirm")); msg != "" {
			v := p.newView(rl)
			v.CSRF = p.formToken(c, nil)
			v.Action = rl.prefix + "/password/reset/" + token
			v.Error = msg
			return p.render(c, fiber.StatusUnprocessableEntity, "reset_password", v)
		}
		hash, err := p.Hashes.Hash(c.UserContext(), password, p.PasswordParams)
		if err != nil {
			return p.hashError(c, rl, err)
		}
		_, err = p.Store.ResetPassword(c.UserContext(), hashToken(token), rl.kind, p.Now(), hash)
		if errors.Is(err, store.ErrNotFound) {
			return p.message(c, rl, fiber.StatusBadRequest, msgResetInvalid)
		}
		if err != nil {
			return p.internalError(c, rl, err)
		}
		// The account's sessions are gone; the browser's cookie is dropped too.
		p.clearCookie(c, SessionCookie)
		p.setCookie(c, noticeCookie, "password_reset", 0)
		return redirect(c, rl.prefix+"/login")
	}
}

// changePage is the password change due after signing in with a password that must be
// changed (a generated one). Other accounts change their password through a reset.
func (p *Pages) changePage(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.signedIn(c, rl)
		switch {
		case err != nil:
			return p.internalError(c, rl, err)
		case s == nil:
			return redirect(c, rl.prefix+"/login")
		case !s.user.MustChangePassword:
			return redirect(c, rl.prefix)
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, s)
		v.WhoAmI = s.user.Email
		return p.render(c, fiber.StatusOK, "change_password", v)
	}
}

func (p *Pages) change(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.signedIn(c, rl)
		switch {
		case err != nil:
			return p.internalError(c, rl, err)
		case s == nil:
			return redirect(c, rl.prefix+"/login")
		}
		if !p.checkCSRF(c, s) {
			return p.forbidden(c, rl)
		}
		if !s.user.MustChangePassword {
			return redirect(c, rl.prefix)
		}
		password := field(c, "password")
		if msg := checkNewPassword(password, field(c, "password_confirm")); msg != "" {
			v := p.newView(rl)
			v.CSRF = p.formToken(c, s)
			v.WhoAmI = s.user.Email
			v.Error = msg
			return p.render(c, fiber.StatusUnprocessableEntity, "change_password", v)
		}
		same, err := p.Hashes.Verify(c.UserContext(), password, s.user.PasswordHash)
		if errors.Is(err, passwords.ErrBusy) || c.UserContext().Err() != nil {
			return p.hashError(c, rl, err)
		}
		if same {
			v := p.newView(rl)
			v.CSRF = p.formToken(c, s)
			v.WhoAmI = s.user.Email
			v.Error = "Choose a password other than the current one."
			return p.render(c, fiber.StatusUnprocessableEntity, "change_password", v)
		}
		hash, err := p.Hashes.Hash(c.UserContext(), password, p.PasswordParams)
		if err != nil {
			return p.hashError(c, rl, err)
		}
		if err := p.Store.ChangePassword(c.UserContext(), s.user.Kind, s.user.ID, hash, s.IDHash, p.Now()); err != nil {
			return p.internalError(c, rl, err)
		}
		return redirect(c, rl.prefix)
	}
}

// hashError answers a password hash that could not run: 503 when every slot stayed busy
// (passwords.Gate), else an internal error.
func (p *Pages) hashError(c *fiber.Ctx, rl realm, err error) error {
	if errors.Is(err, passwords.ErrBusy) {
		c.Set(fiber.HeaderRetryAfter, "1")
		return p.message(c, rl, fiber.StatusServiceUnavailable, "The server is busy right now. Try again in a moment.")
	}
	return p.internalError(c, rl, err)
}
