package login_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/credentials"
)

const resetNotice = "If the account exists, we have sent a link to reset its password."

var resetLink = regexp.MustCompile(`(http://[^/\s]+)(/(?:admin|portal)/password/reset/([A-Za-z0-9_-]{43}))\s`)

// requestReset asks for a reset of the admin email from b and checks the answer.
func requestReset(t *testing.T, b *browser, email string) page {
	t.Helper()
	p := b.submit("/admin/password/reset", "/admin/password/reset", url.Values{"email": {email}})
	if p.status != 200 || p.text("notice") != resetNotice {
		t.Fatalf("reset request for %s: %d, notice %q", email, p.status, p.text("notice"))
	}
	return p
}

// linkOf returns the reset link's path and token in an email body.
func (e *env) linkOf(body string) (path, token string) {
	e.t.Helper()
	m := resetLink.FindStringSubmatch(body)
	if m == nil || m[1] != e.base {
		e.t.Fatalf("no reset link under %s in the email:\n%s", e.base, body)
	}
	return m[2], m[3]
}

// setPassword submits the set-new-password form of a reset link.
func setPassword(b *browser, path, password, confirm string) page {
	b.t.Helper()
	return b.postOn(path, path, url.Values{"password": {password}, "password_confirm": {confirm}})
}

func TestPasswordReset(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("mallory@example.com", "old-password-123", true)
	signedIn := e.browser("192.0.2.70")
	expect(t, "a session before the reset", signedIn.login("mallory@example.com", "old-password-123"), 303, "/admin/password/change")

	// The same answer, byte for byte, for an account that exists and one that does not.
	b := e.browser("192.0.2.71")
	known := requestReset(t, b, "  Mallory@Example.com ")
	unknown := requestReset(t, b, "nobody@example.com")
	if known.body != unknown.body || known.status != unknown.status {
		t.Fatalf("the answers differ:\n%s\n---\n%s", known.body, unknown.body)
	}
	msg := e.mails.waitFor(t, "mallory@example.com", 1)
	path, token := e.linkOf(msg.Body)
	if !strings.HasPrefix(path, "/admin/password/reset/") || msg.Subject == "" {
		t.Fatalf("email %q: link %s", msg.Subject, path)
	}
	var stored int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM password_resets WHERE token_hash = $1 AND user_id = $2
		AND expires_at = $3`, credentials.Hash(token), u.ID, e.clock.now().Add(time.Hour)).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("the token is not stored hashed with a 1 h expiry: %d %v", stored, err)
	}

	r := e.browser("192.0.2.72") // the link opened elsewhere
	p := r.get(path)
	if p.status != 200 || !p.has("set") {
		t.Fatalf("the reset link's page: %d\n%s", p.status, p.body)
	}
	expectError(t, "a short password", setPassword(r, path, "short", "short"), 422, "The password must have at least 12 characters.")
	expectError(t, "different passwords", setPassword(r, path, "new-password-123", "new-password-124"), 422, "The passwords do not match.")
	expect(t, "setting the password", setPassword(r, path, "new-password-123", "new-password-123"), 303, "/admin/login")
	if p := r.get("/admin/login"); p.text("notice") == "" {
		t.Fatalf("no notice after the reset:\n%s", p.body)
	}

	// The token is used up; the account's sessions are revoked; must_change_password is
	// cleared.
	expectError(t, "the link again", r.get(path), 400, "This password reset link is invalid, has been used, or has expired. Ask for a new one.")
	used := url.Values{"_csrf": {r.get("/admin/login").csrf(t)}, "password": {"another-password-1"},
		"password_confirm": {"another-password-1"}}
	if p := r.do("POST", path, used); p.status != 400 || !p.has("error") {
		t.Fatalf("posting to a used link: %d", p.status)
	}
	expect(t, "the session from before the reset", signedIn.get("/admin"), 303, "/admin/login")
	expectError(t, "the old password", e.browser("192.0.2.73").login("mallory@example.com", "old-password-123"), 200, invalidLogin)
	expect(t, "the new password", e.browser("192.0.2.73").login("mallory@example.com", "new-password-123"), 303, "/admin")

	// A link expires after an hour.
	requestReset(t, b, "mallory@example.com")
	path, _ = e.linkOf(e.mails.waitFor(t, "mallory@example.com", 2).Body)
	e.clock.advance(time.Hour + time.Second)
	expect(t, "an expired link", r.get(path), 400, "")
	expect(t, "a malformed token", r.get("/admin/password/reset/abc"), 400, "")
}

// Over password_reset_account (3 per hour) no email is sent, and the answer is the same.
func TestPasswordResetAccountLimit(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.admin("niaj@example.com", "niaj-password-12", false)
	e.admin("olivia@example.com", "olivia-password-1", false)
	var bodies []string
	for i := 1; i <= 4; i++ {
		// From four addresses: password_reset_ip is the sidecar's route table's business.
		b := e.browser("203.0.113." + string(rune('0'+i)))
		bodies = append(bodies, requestReset(t, b, "niaj@example.com").body)
		if i <= 3 {
			e.mails.waitFor(t, "niaj@example.com", i)
		}
	}
	// Emails go out in order: once the next one is sent, the fourth was not.
	requestReset(t, e.browser("203.0.113.9"), "olivia@example.com")
	e.mails.waitFor(t, "olivia@example.com", 1)
	if n := len(e.mails.to("niaj@example.com")); n != 3 {
		t.Fatalf("%d emails to niaj, want 3", n)
	}
	// The bodies differ only in their CSRF tokens (each browser has its own).
	strip := regexp.MustCompile(`value="[^"]+"`)
	for i := range bodies {
		if strip.ReplaceAllString(bodies[i], "") != strip.ReplaceAllString(bodies[0], "") {
			t.Fatalf("answer %d differs from the first", i+1)
		}
	}
	// The limit is per hour.
	e.clock.advance(time.Hour)
	requestReset(t, e.browser("203.0.113.10"), "niaj@example.com")
	e.mails.waitFor(t, "niaj@example.com", 4)
}

// The portal's reset takes the tenant name; its links work only on the portal.
func TestPortalPasswordReset(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.tenantUser("Initech", "peggy@example.com", "peggy-password-1")
	b := e.browser("192.0.2.80")
	p := b.submit("/portal/password/reset", "/portal/password/reset",
		url.Values{"tenant_name": {" INITECH "}, "email": {"peggy@example.com"}})
	if p.status != 200 || p.text("notice") != resetNotice {
		t.Fatalf("portal reset request: %d %q", p.status, p.text("notice"))
	}
	path, token := e.linkOf(e.mails.waitFor(t, "peggy@example.com", 1).Body)
	if !strings.HasPrefix(path, "/portal/password/reset/") {
		t.Fatalf("link %s", path)
	}
	expect(t, "the portal link on the admin pages", b.get("/admin/password/reset/"+token), 400, "")
	expect(t, "setting the password", setPassword(b, path, "peggy-password-2", "peggy-password-2"), 303, "/portal/login")
	expect(t, "the new password", b.portalLogin("initech", "peggy@example.com", "peggy-password-2"), 303, "/portal")
	if p := b.get("/portal"); p.text("whoami") != "peggy@example.com" || p.text("tenant") != "Initech" {
		t.Fatalf("portal landing page:\n%s", p.body)
	}
}

// A reset request takes as long for an account that exists as for one that does not:
// over 200 alternating requests (100 existing accounts, each asked once, and 100
// unknown emails) the medians are within 25 % of each other. A loaded machine can make
// one round noisy, so up to three rounds are run; a real difference fails them all.
func TestPasswordResetTiming(t *testing.T) {
	e := newEnv(t, envOptions{})
	var last [2]time.Duration
	for round := range 3 {
		var existing []string
		for i := range 100 {
			email := fmt.Sprintf("timing-%d-%d@example.com", round, i)
			e.admin(email, "timing-password-1", false)
			existing = append(existing, email)
		}
		b := e.browser("192.0.2.90")
		csrf := b.get("/admin/password/reset").csrf(t)
		var took [2][]time.Duration
		for i := range 200 {
			kind := i % 2
			email := existing[i/2]
			if kind == 1 {
				email = fmt.Sprintf("unknown-%d-%d@example.com", round, i)
			}
			start := time.Now()
			p := b.do("POST", "/admin/password/reset", url.Values{"_csrf": {csrf}, "email": {email}})
			took[kind] = append(took[kind], time.Since(start))
			if p.status != 200 || p.text("notice") != resetNotice {
				t.Fatalf("reset request %d: %d %q", i, p.status, p.text("notice"))
			}
		}
		last = [2]time.Duration{median(took[0]), median(took[1])}
		ratio := float64(last[0]) / float64(last[1])
		t.Logf("round %d: median %v for existing accounts, %v for unknown ones (ratio %.2f)", round+1, last[0], last[1], ratio)
		if ratio >= 0.8 && ratio <= 1.25 {
			e.mails.waitFor(t, existing[99], 1)
			return
		}
	}
	t.Fatalf("medians %v (existing) and %v (unknown) differ by more than 25 %%", last[0], last[1])
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
