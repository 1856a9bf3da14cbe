package login_test

import (
	"strings"
	"testing"
)

// A refused password re-renders the form with 200, not 401: a 401 must carry a
// WWW-Authenticate challenge, which a form login has none of (the system the core
// replaces answers 200 too). The lockout stays 429; TOTP codes are answered alike.
func TestFailedSignInIsTheFormAgain(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.admin("olivia@example.com", "olivia-password-1", false)
	e.tenantUser("Initech", "peter@example.com", "peter-password-1")
	for name, p := range map[string]page{
		"admin":                e.browser("192.0.2.201").login("olivia@example.com", "wrong-password"),
		"admin, unknown email": e.browser("192.0.2.202").login("nobody@example.com", "wrong-password"),
		"portal":               e.browser("192.0.2.203").portalLogin("Initech", "peter@example.com", "wrong-password"),
	} {
		expectError(t, name, p, 200, invalidLogin)
		if ct := p.header.Get("content-type"); ct != "text/html; charset=utf-8" {
			t.Errorf("%s: content-type %q", name, ct)
		}
		if v := p.header.Values("www-authenticate"); len(v) != 0 {
			t.Errorf("%s: WWW-Authenticate %q", name, v)
		}
		// The form again, with the email as typed and no password.
		if !strings.Contains(p.body, `name="password"`) || !strings.Contains(p.body, `@example.com"`) ||
			strings.Contains(p.body, "wrong-password") {
			t.Errorf("%s: not the form again:\n%s", name, p.body)
		}
	}
	b := e.browser("192.0.2.204")
	for range 4 {
		expectError(t, "a wrong password", b.login("olivia@example.com", "wrong-password"), 200, invalidLogin)
	}
	expectLocked(t, "the account's sixth attempt", b.login("olivia@example.com", "olivia-password-1"))
}
