package login

import (
	"crypto/subtle"

	"github.com/gofiber/fiber/v2"
)

// Admin is the signed-in admin of a request, for the console (core/console), which
// builds on these pages' sessions.
type Admin struct {
	ID, Email string
	// CSRF is the session's CSRF token: the console's forms carry it in _csrf, and the
	// admin API's writes with the session in the x-csrf-token header.
	CSRF string
}

// SignedInAdmin returns the admin of the request's session, or nil: no full session of
// an active admin, or one who must change their password first.
func (p *Pages) SignedInAdmin(c *fiber.Ctx) (*Admin, error) {
	s, err := p.signedIn(c, adminRealm)
	if err != nil || s == nil || s.user.MustChangePassword {
		return nil, err
	}
	return &Admin{ID: s.user.ID, Email: s.user.Email, CSRF: csrfFromSession(s.raw)}, nil
}

// ValidCSRF reports whether token is a's CSRF token, compared in constant time.
func ValidCSRF(a *Admin, token string) bool {
	return a != nil && token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(a.CSRF)) == 1
}
