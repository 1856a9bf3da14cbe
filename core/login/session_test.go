package login_test

import (
	"bytes"
	"context"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/passwords"
)

// A POST without the form's CSRF token, or with another one, is refused with 403 and
// changes nothing.
func TestCSRF(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.admin("quinn@example.com", "quinn-password-1", false)
	b := e.browser("192.0.2.90")
	b.get("/admin/login") // the double-submit cookie
	creds := url.Values{"email": {"quinn@example.com"}, "password": {"quinn-password-1"}}
	expect(t, "login without a token", b.do("POST", "/admin/login", creds), 403, "")
	creds.Set("_csrf", credentials.Random(32))
	p := b.do("POST", "/admin/login", creds)
	if p.status != 403 || !p.has("error") || b.cookie(login.SessionCookie) != "" {
		t.Fatalf("login with a wrong token: %d, session cookie %q", p.status, b.cookie(login.SessionCookie))
	}
	// Another browser's token is worth nothing here.
	other := e.browser("192.0.2.91").get("/admin/login").csrf(t)
	creds.Set("_csrf", other)
	expect(t, "login with another browser's token", b.do("POST", "/admin/login", creds), 403, "")
	for _, path := range []string{"/admin/password/reset", "/portal/password/reset", "/portal/login", "/admin/login/totp"} {
		if p := b.do("POST", path, url.Values{"email": {"quinn@example.com"}}); p.status != 403 && p.status != 303 {
			t.Fatalf("POST %s without a token: %d", path, p.status)
		}
	}

	expect(t, "login", b.login("quinn@example.com", "quinn-password-1"), 303, "/admin")
	expect(t, "logout without a token", b.do("POST", "/admin/logout", url.Values{}), 403, "")
	expect(t, "still signed in", b.get("/admin"), 200, "")
	if e.mails.to("quinn@example.com") != nil {
		t.Fatal("a reset email was sent without a token")
	}
}

// Sessions end after SESSION_IDLE_TIMEOUT without use and after SESSION_MAX_AGE in any
// case; logout deletes them.
func TestSessionExpiry(t *testing.T) {
	e := newEnv(t, envOptions{idle: 30 * time.Minute, maxAge: 2 * time.Hour})
	e.admin("rupert@example.com", "rupert-password", false)

	b := e.browser("192.0.2.100")
	expect(t, "login", b.login("rupert@example.com", "rupert-password"), 303, "/admin")
	e.clock.advance(29 * time.Minute)
	expect(t, "29 minutes idle", b.get("/admin"), 200, "")
	e.clock.advance(29 * time.Minute)
	expect(t, "29 more minutes (used in between)", b.get("/admin"), 200, "")
	e.clock.advance(30 * time.Minute)
	expect(t, "30 minutes idle", b.get("/admin"), 303, "/admin/login")

	b = e.browser("192.0.2.101")
	expect(t, "login", b.login("rupert@example.com", "rupert-password"), 303, "/admin")
	for range 4 {
		e.clock.advance(29 * time.Minute)
		expect(t, "in use", b.get("/admin"), 200, "")
	}
	e.clock.advance(5 * time.Minute) // 2 h 1 min after sign-in
	expect(t, "past the maximum age", b.get("/admin"), 303, "/admin/login")
	var rows int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sessions`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d session rows left after both expired (%v)", rows, err)
	}
}

// Sessions of users who never come back are deleted by the purge, not only when used.
func TestExpiredSessionsArePurged(t *testing.T) {
	e := newEnv(t, envOptions{idle: 30 * time.Minute, maxAge: 2 * time.Hour, purge: 20 * time.Millisecond})
	e.admin("gone@example.com", "gone-password-1", false)
	expect(t, "login", e.browser("192.0.2.110").login("gone@example.com", "gone-password-1"), 303, "/admin")
	count := func() int {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sessions`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(100 * time.Millisecond) // several purges
	if n := count(); n != 1 {
		t.Fatalf("%d sessions before any expired, want the live one kept", n)
	}
	e.clock.advance(31 * time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for count() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle session was not purged within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLogout(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.admin("sybil@example.com", "sybil-password1", false)
	b := e.browser("192.0.2.110")
	expect(t, "login", b.login("sybil@example.com", "sybil-password1"), 303, "/admin")
	id := b.cookie(login.SessionCookie)
	expect(t, "logout", b.postOn("/admin", "/admin/logout", nil), 303, "/admin/login")
	if p := b.get("/admin/login"); p.text("notice") != "You have been signed out." {
		t.Fatalf("no notice after logout: %q", p.text("notice"))
	}
	var rows int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sessions`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d session rows after logout (%v)", rows, err)
	}
	// The old cookie, replayed, is worth nothing.
	replay := e.browser("192.0.2.110")
	replay.setCookie(login.SessionCookie, id)
	expect(t, "the session cookie after logout", replay.get("/admin"), 303, "/admin/login")
}

// The session cookie's attributes, the stored hash of its id, a new id at sign-in, and
// the security headers of the pages.
func TestCookieAndHeaders(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.admin("trent@example.com", "trent-password1", false)
	b := e.browser("192.0.2.120")
	// A session id planted before sign-in is replaced.
	planted := credentials.Random(32)
	b.setCookie(login.SessionCookie, planted)
	p := b.login("trent@example.com", "trent-password1")
	expect(t, "login", p, 303, "/admin")
	var set string
	for _, c := range p.header.Values("Set-Cookie") {
		if strings.HasPrefix(c, login.SessionCookie+"=") {
			set = c
		}
	}
	for _, attr := range []string{"HttpOnly", "SameSite=Lax", "path=/", "max-age=43200"} {
		if !strings.Contains(strings.ToLower(set), strings.ToLower(attr)) {
			t.Fatalf("session cookie %q lacks %s", redactCookie(set), attr)
		}
	}
	if strings.Contains(strings.ToLower(set), "secure") {
		t.Fatalf("session cookie %q is Secure behind http", redactCookie(set))
	}
	id := b.cookie(login.SessionCookie)
	if id == planted || len(id) != 43 {
		t.Fatalf("session id %d characters, planted one kept: %v", len(id), id == planted)
	}
	var stored []byte
	if err := e.pool.QueryRow(context.Background(), `SELECT id_hash FROM sessions`).Scan(&stored); err != nil ||
		!bytes.Equal(stored, credentials.Hash(id)) {
		t.Fatalf("the session row does not hold the id's SHA-256 (%v)", err)
	}

	anonymous := e.browser("192.0.2.122")
	for _, path := range []string{"/admin/login", "/admin", "/portal/login", "/admin/nope", "/portal/password/reset"} {
		h := anonymous.get(path).header
		if path == "/admin" {
			h = b.get(path).header
		}
		csp := h.Get("Content-Security-Policy")
		if h.Get("Cache-Control") != "no-store" || h.Get("X-Frame-Options") != "DENY" ||
			!strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "default-src 'none'") ||
			strings.Contains(csp, "script-src") || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("Referrer-Policy") != "no-referrer" || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
			t.Fatalf("GET %s: headers %v", path, h)
		}
	}

	// Behind https the cookies are Secure.
	s := newEnv(t, envOptions{publicURL: "https://core.example.com"})
	p = s.browser("192.0.2.121").get("/admin/login")
	if c := p.header.Get("Set-Cookie"); !strings.Contains(c, "secure") && !strings.Contains(c, "Secure") {
		t.Fatalf("the CSRF cookie is not Secure behind https: %q", redactCookie(c))
	}
}

func redactCookie(c string) string {
	return regexp.MustCompile(`=[A-Za-z0-9_-]{20,}`).ReplaceAllString(c, "=…")
}

// Unknown pages below /admin and /portal are HTML 404s; the JSON API keeps its own.
func TestNotFound(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.browser("")
	if p := b.get("/admin/nope"); p.status != 404 || !p.has("error") || !strings.HasPrefix(p.header.Get("Content-Type"), "text/html") {
		t.Fatalf("/admin/nope: %d %s", p.status, p.header.Get("Content-Type"))
	}
	for _, path := range []string{"/administrator", "/api/v1/nope", "/portals"} {
		if p := b.get(path); p.status != 404 || !strings.Contains(p.body, `"code":"not_found"`) {
			t.Fatalf("%s: %d %s", path, p.status, p.body)
		}
	}
}

// The first admin: with ADMIN_PASSWORD, or with a generated password printed once that
// must be changed at the first login.
func TestBootstrapAdmin(t *testing.T) {
	ctx := context.Background()
	t.Run("generated password", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		var out bytes.Buffer
		u, created, err := login.BootstrapAdmin(ctx, e.st, "root@example.com", "", cheap, &out)
		if err != nil || !created || !u.MustChangePassword {
			t.Fatalf("created %v, must change %v, %v", created, u.MustChangePassword, err)
		}
		m := regexp.MustCompile(`\n    (\S{24})\n`).FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("no password in the output:\n%s", out.String())
		}
		password := m[1]
		out.Reset()
		if _, created, err := login.BootstrapAdmin(ctx, e.st, "other@example.com", "", cheap, &out); err != nil || created || out.Len() != 0 {
			t.Fatalf("a second bootstrap: created %v, printed %q, %v", created, out.String(), err)
		}

		b := e.browser("192.0.2.130")
		expect(t, "first login", b.login("root@example.com", password), 303, "/admin/password/change")
		expect(t, "the landing page before the change", b.get("/admin"), 303, "/admin/password/change")
		expect(t, "the enrolment page before the change", b.get("/admin/totp/enrol"), 303, "/admin/password/change")
		expectError(t, "a short password", b.postOn("/admin/password/change", "/admin/password/change",
			url.Values{"password": {"short"}, "password_confirm": {"short"}}), 422, "The password must have at least 12 characters.")
		expectError(t, "the same password", b.postOn("/admin/password/change", "/admin/password/change",
			url.Values{"password": {password}, "password_confirm": {password}}), 422, "Choose a password other than the current one.")
		expect(t, "changing the password", b.postOn("/admin/password/change", "/admin/password/change",
			url.Values{"password": {"root-password-123"}, "password_confirm": {"root-password-123"}}), 303, "/admin")
		expect(t, "the landing page", b.get("/admin"), 200, "")
		expect(t, "the change page once changed", b.get("/admin/password/change"), 303, "/admin")
		expect(t, "the new password", e.browser("192.0.2.131").login("root@example.com", "root-password-123"), 303, "/admin")
		expectError(t, "the generated password", e.browser("192.0.2.131").login("root@example.com", password), 200, invalidLogin)
	})
	t.Run("given password", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		var out bytes.Buffer
		if _, _, err := login.BootstrapAdmin(ctx, e.st, "root@example.com", "short", cheap, &out); err == nil {
			t.Fatal("a short ADMIN_PASSWORD was accepted")
		}
		u, created, err := login.BootstrapAdmin(ctx, e.st, "root@example.com", "given-password-1", passwords.Params{}, &out)
		if err != nil || !created || u.MustChangePassword || out.Len() != 0 {
			t.Fatalf("created %v, must change %v, printed %q, %v", created, u.MustChangePassword, out.String(), err)
		}
		expect(t, "login", e.browser("192.0.2.132").login("root@example.com", "given-password-1"), 303, "/admin")
	})
}

// Portal sessions are not admin sessions, and the other way round.
func TestRealmsAreSeparate(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.tenantUser("Umbrella", "victor@example.com", "victor-password")
	e.admin("victor@example.com", "admin-password-1", false)
	b := e.browser("192.0.2.140")
	expectError(t, "an admin password at the portal", b.portalLogin("Umbrella", "victor@example.com", "admin-password-1"), 200, invalidLogin)
	expectError(t, "an unknown tenant", b.portalLogin("Nope", "victor@example.com", "victor-password"), 200, invalidLogin)
	expect(t, "portal login", b.portalLogin("umbrella", "victor@example.com", "victor-password"), 303, "/portal")
	expect(t, "the admin pages with a portal session", b.get("/admin"), 303, "/admin/login")
	expect(t, "the portal", b.get("/portal"), 200, "")
	// A deactivated tenant's users cannot sign in, and their sessions end.
	e.exec(`UPDATE tenants SET status = 'inactive' WHERE lower(name) = 'umbrella'`)
	expect(t, "the portal of a deactivated tenant", b.get("/portal"), 303, "/portal/login")
	expectError(t, "login at a deactivated tenant", b.portalLogin("umbrella", "victor@example.com", "victor-password"), 200, invalidLogin)
}
