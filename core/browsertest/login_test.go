package browsertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"
)

// What the HTML contract of the login pages says about sessions and failed logins.
const (
	failuresBeforeLockout = 5
	sessionCookie         = "converger_session"
	wrongCredentials      = "Invalid email or password."
)

// lockoutMessage is the text of #error on the lockout page; N is the retry-after value.
var lockoutMessage = regexp.MustCompile(`^Too many failed login attempts\. Try again in ([0-9]+) seconds\.$`)

// totpOpts are the TOTP settings of the contract: what authenticator apps use.
var totpOpts = totp.ValidateOpts{Period: 30, Digits: otp.DigitsSix, Algorithm: otp.AlgorithmSHA1}

// TestAdminLogin signs the first admin in through the login form of a real core in
// headless Chromium, enrols TOTP from the enrolment page (QR image, secret, otpauth URI,
// ten recovery codes), signs out and in again through the TOTP step, signs in with
// JavaScript turned off, and ends with the lockout after five wrong passwords, which holds
// even for the right one. It saves screenshots of the login and lockout pages.
func TestAdminLogin(t *testing.T) {
	begin := time.Now()
	execPath := chromium(t)
	a := newAdmin(t)
	c := startCore(t, a)
	tab := startBrowser(t, execPath)
	artifacts := artifactsDir(t)
	p := &page{t: t, ctx: tab, base: c.base}

	p.open("/admin/login", 200)
	checkLoginForm(p)
	p.screenshot(artifacts, "admin-login.png")

	signInWithoutJavaScript(t, tab, c.base, a)

	// TOTP is off: the password leads straight to the landing page.
	p.expectResponse("signing in", signIn(p, a.email, a.password), 200, "/admin")
	checkLanding(p, a.email, true)
	checkSessionCookie(p)

	secret, enrolledAt := enrolTOTP(p)
	checkLanding(p, a.email, false)

	p.expectResponse("signing out", p.click("logout"), 200, "/admin/login")

	// TOTP is on: the password leads to the TOTP step, where the code of the next
	// period is accepted (skew 1) and is later than the one that confirmed enrolment.
	p.expectResponse("signing in with TOTP on", signIn(p, a.email, a.password), 200, "/admin/login/totp")
	checkForm(p, "verify", "/admin/login/totp")
	if got := p.prop("#code", "name"); got != "code" {
		t.Errorf("TOTP step: #code has name %q, want code", got)
	}
	at := time.Now().Add(30 * time.Second)
	if step(at) <= step(enrolledAt) {
		t.Fatalf("the next code's step %d is not after the enrolment's %d", step(at), step(enrolledAt))
	}
	p.fill("code", code(t, secret, at))
	p.expectResponse("verifying the TOTP code", p.click("verify"), 200, "/admin")
	checkLanding(p, a.email, false)

	p.expectResponse("signing out", p.click("logout"), 200, "/admin/login")
	checkLockout(p, a, artifacts)

	t.Logf("the whole test took %v", time.Since(begin).Round(time.Millisecond))
}

// checkLoginForm checks the login page's form against the contract.
func checkLoginForm(p *page) {
	p.t.Helper()
	checkForm(p, "login", "/admin/login")
	for _, c := range []struct{ selector, prop, want string }{
		{"#email", "name", "email"},
		{"#password", "name", "password"},
		{"#password", "type", "password"},
	} {
		if got := p.prop(c.selector, c.prop); got != c.want {
			p.t.Errorf("login page: %s has %s %q, want %q", c.selector, c.prop, got, c.want)
		}
	}
	p.expectPath("login page: #forgot", p.prop("#forgot", "href"), "/admin/password/reset")
}

// checkForm checks that the form of the submit button with the id posts to path and
// carries a CSRF token in a hidden _csrf input.
func checkForm(p *page, button, path string) {
	p.t.Helper()
	form := "form:has(#" + button + ")"
	if got := p.prop(form, "method"); got != "post" {
		p.t.Errorf("%s: method %q, want post", form, got)
	}
	p.expectPath(form+": action", p.prop(form, "action"), path)
	csrf := form + " input[name=_csrf]"
	if got := p.prop(csrf, "type"); got != "hidden" {
		p.t.Errorf("%s: type %q, want hidden", csrf, got)
	}
	if p.prop(csrf, "value") == "" {
		p.t.Errorf("%s: empty", csrf)
	}
}

// signIn fills the login form and submits it.
func signIn(p *page, email, password string) *network.Response {
	p.t.Helper()
	p.fill("email", email)
	p.fill("password", password)
	return p.click("login")
}

// checkLanding checks the landing page: who is signed in, the TOTP enrolment link only
// while TOTP is off, and the sign-out button.
func checkLanding(p *page, email string, totpOff bool) {
	p.t.Helper()
	if got := p.text("#whoami"); !strings.Contains(got, email) {
		p.t.Errorf("landing page: #whoami is %q, want it to contain %s", got, email)
	}
	if got := p.has("#enrol-totp"); got != totpOff {
		p.t.Errorf("landing page: #enrol-totp present = %v, want %v (TOTP off = %v)", got, totpOff, totpOff)
	}
	checkForm(p, "logout", "/admin/logout")
}

// checkSessionCookie checks that the browser holds the session cookie and logs its
// attributes (not its value).
func checkSessionCookie(p *page) {
	p.t.Helper()
	cookies := run(p, "reading cookies", func(ctx context.Context, t *chromedp.Target) ([]*network.Cookie, error) {
		r, err := cdp.Call(ctx, t, network.GetCookies, network.GetCookiesParams{URLs: []string{p.base + "/admin"}})
		return r.Cookies, err
	})
	var names []string
	for _, c := range cookies {
		if c.Name == sessionCookie {
			p.t.Logf("session cookie %s: path %s, HttpOnly %v, Secure %v, SameSite %q, session-only %v",
				c.Name, c.Path, c.HTTPOnly, c.Secure, c.SameSite, c.Session)
			return
		}
		names = append(names, c.Name)
	}
	p.t.Errorf("signed in, but the browser has no %s cookie (it has %v)", sessionCookie, names)
}

// enrolTOTP follows the enrolment link from the landing page, checks the enrolment page,
// confirms with the current code and checks the recovery codes. It returns the secret
// and the time of the code that confirmed, and ends on the landing page.
func enrolTOTP(p *page) (secret string, at time.Time) {
	p.t.Helper()
	p.expectPath("landing page: #enrol-totp", p.prop("#enrol-totp", "href"), "/admin/totp/enrol")
	p.expectResponse("following #enrol-totp", p.click("enrol-totp"), 200, "/admin/totp/enrol")

	type image struct {
		Tag, Src      string
		Complete      bool
		NaturalWidth  int
		NaturalHeight int
	}
	img := eval[*image](p, "reading #totp-qr", `(i => i === null ? null : {
		Tag: i.tagName, Src: (i.getAttribute("src") || "").slice(0, 32), Complete: i.complete,
		NaturalWidth: i.naturalWidth, NaturalHeight: i.naturalHeight})(document.getElementById("totp-qr"))`)
	switch {
	case img == nil:
		p.t.Fatal("enrolment page: no #totp-qr")
	case img.Tag != "IMG" || !strings.HasPrefix(img.Src, "data:image/png;base64,"):
		p.t.Errorf("enrolment page: #totp-qr is a %s with src %q..., want an IMG with a data:image/png;base64 src", img.Tag, img.Src)
	case !img.Complete || img.NaturalWidth == 0 || img.NaturalHeight == 0:
		p.t.Errorf("enrolment page: #totp-qr did not load as an image (complete %v, %dx%d)", img.Complete, img.NaturalWidth, img.NaturalHeight)
	}

	secret = strings.ToUpper(strings.Join(strings.Fields(p.text("#totp-secret")), ""))
	if secret == "" {
		p.t.Fatal("enrolment page: #totp-secret is empty")
	}
	key, err := otp.NewKeyFromURL(p.text("#totp-uri"))
	if err != nil {
		p.t.Fatalf("enrolment page: #totp-uri is not an otpauth URI: %v", err)
	}
	if key.Type() != "totp" || strings.ToUpper(key.Secret()) != secret || key.Period() != 30 ||
		key.Digits() != otp.DigitsSix || key.Algorithm() != otp.AlgorithmSHA1 {
		p.t.Errorf("enrolment page: #totp-uri has type %s, period %d, %s digits, %s, and its secret matches #totp-secret: %v; "+
			"want totp, 30, 6, SHA1 and the same secret", key.Type(), key.Period(), key.Digits(), key.Algorithm(),
			strings.ToUpper(key.Secret()) == secret)
	}

	checkForm(p, "confirm", "/admin/totp/enrol")
	if got := p.prop("#code", "name"); got != "code" {
		p.t.Errorf("enrolment page: #code has name %q, want code", got)
	}
	at = time.Now()
	p.fill("code", code(p.t, secret, at))
	resp := p.click("confirm")
	if resp == nil || resp.Status != 200 {
		p.t.Fatalf("confirming TOTP enrolment: got %v, want 200 (error on the page: %q)", statusOf(resp), p.errorText())
	}
	codes := eval[[]string](p, "reading the recovery codes",
		`[...document.querySelectorAll("#recovery-codes li")].map(li => li.textContent.trim())`)
	seen := map[string]bool{}
	for _, c := range codes {
		if c == "" || seen[c] {
			p.t.Errorf("recovery codes: an empty or repeated code among %d", len(codes))
			break
		}
		seen[c] = true
	}
	if len(codes) != 10 {
		p.t.Errorf("recovery codes: %d items in #recovery-codes, want 10", len(codes))
	}
	p.expectPath("recovery codes page: #continue", p.prop("#continue", "href"), "/admin")
	p.expectResponse("following #continue", p.click("continue"), 200, "/admin")
	return secret, at
}

// checkLockout submits wrong passwords until the lockout, saves a screenshot of the
// lockout page, then submits the right password, which the lockout refuses as well.
func checkLockout(p *page, a admin, artifacts string) {
	p.t.Helper()
	wrong := a.password + "-wrong"
	// The failures are counted in a window of 60 s aligned to the wall clock: start them
	// where the whole run fits into one window.
	if left := time.Minute - time.Since(time.Now().Truncate(time.Minute)); left < 20*time.Second {
		time.Sleep(left + 500*time.Millisecond)
	}
	for i := 1; i <= failuresBeforeLockout; i++ {
		p.expectResponse(fmt.Sprintf("wrong password %d", i), signIn(p, a.email, wrong), 200, "/admin/login")
		if got := p.text("#error"); got != wrongCredentials {
			p.t.Errorf("wrong password %d: #error is %q, want %q", i, got, wrongCredentials)
		}
	}
	checkLocked(p, "wrong password after the lockout", signIn(p, a.email, wrong))
	p.screenshot(artifacts, "admin-lockout.png")
	checkLocked(p, "right password during the lockout", signIn(p, a.email, a.password))
}

// checkLocked checks a lockout answer: 429, a retry-after header and the same number of
// seconds in #error.
func checkLocked(p *page, what string, resp *network.Response) {
	p.t.Helper()
	p.expectResponse(what, resp, 429, "/admin/login")
	retryAfter, ok := header(resp, "Retry-After")
	if !ok {
		p.t.Errorf("%s: no retry-after header", what)
	}
	msg := p.text("#error")
	m := lockoutMessage.FindStringSubmatch(msg)
	if m == nil {
		p.t.Fatalf("%s: #error is %q, want it to match %q", what, msg, lockoutMessage)
	}
	if n, _ := strconv.Atoi(m[1]); n <= 0 || m[1] != retryAfter {
		p.t.Errorf("%s: the page says %s seconds, retry-after is %q; want the same positive number", what, m[1], retryAfter)
	}
}

// signInWithoutJavaScript signs in through the login form in a browser context of its
// own (no shared cookies) with the page's scripts turned off.
func signInWithoutJavaScript(t *testing.T, tab context.Context, base string, a admin) {
	t.Helper()
	ctx, cancel := chromedp.NewContext(tab, chromedp.WithNewBrowserContext())
	defer cancel()
	if err := chromedp.Do(ctx); err != nil { // opens the tab; bounded by browserTimeout
		t.Fatalf("opening a tab in a new browser context: %v", err)
	}
	q := &page{t: t, ctx: ctx, base: base}
	run(q, "turning JavaScript off", func(ctx context.Context, t *chromedp.Target) (cdp.Empty, error) {
		return cdp.Call(ctx, t, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
	})
	// Proof that it is off: a page whose script would change its title.
	run(q, "opening a page with a script", chromedp.Navigate(
		`data:text/html,<title>scripts off</title><script>document.title="scripts on"</script>`))
	if title := run(q, "reading the title", chromedp.Title()); title != "scripts off" {
		t.Fatalf("JavaScript is still on: the page's title is %q", title)
	}

	q.open("/admin/login", 200)
	q.expectResponse("signing in without JavaScript", signIn(q, a.email, a.password), 200, "/admin")
	if got := q.text("#whoami"); !strings.Contains(got, a.email) {
		t.Errorf("without JavaScript: #whoami is %q, want it to contain %s", got, a.email)
	}
	q.expectResponse("signing out without JavaScript", q.click("logout"), 200, "/admin/login")
}

func statusOf(resp *network.Response) string {
	if resp == nil {
		return "no response"
	}
	return fmt.Sprintf("%d at %s", resp.Status, resp.URL)
}

// step is the TOTP time step of t.
func step(t time.Time) int64 { return t.Unix() / 30 }

// code is the TOTP code of secret at t.
func code(t *testing.T, secret string, at time.Time) string {
	t.Helper()
	c, err := totp.GenerateCodeCustom(secret, at, totpOpts)
	if err != nil {
		t.Fatalf("computing a TOTP code: %v", err)
	}
	return c
}

// artifactsDir is test-artifacts/browser at the repository root, created if needed.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(moduleRoot(t), "test-artifacts", "browser")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
