package login_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"html"
	"image/png"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"

	"github.com/converger/edge/shared/buckets"
)

// The TOTP settings of authenticator apps.
var totpOpts = totp.ValidateOpts{Period: 30, Digits: otp.DigitsSix, Algorithm: otp.AlgorithmSHA1}

func totpCode(t *testing.T, secret string, at time.Time) string {
	t.Helper()
	c, err := totp.GenerateCodeCustom(secret, at, totpOpts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wrongCode returns a 6-digit code that no step within the skew around at accepts.
func wrongCode(t *testing.T, secret string, at time.Time) string {
	t.Helper()
	valid := map[string]bool{}
	for _, d := range []time.Duration{-30 * time.Second, 0, 30 * time.Second} {
		valid[totpCode(t, secret, at.Add(d))] = true
	}
	for i := 0; ; i++ {
		c := fmt.Sprintf("%06d", 123456+i)
		if !valid[c] {
			return c
		}
	}
}

var (
	qrSource     = regexp.MustCompile(`id="totp-qr" src="data:image/png;base64,([^"]+)"`)
	recoveryItem = regexp.MustCompile(`<li>([^<]+)</li>`)
)

// enrol turns TOTP on for the signed-in browser with a code of the clock's current step,
// and returns the secret and the recovery codes.
func (e *env) enrol(b *browser) (secret string, codes []string) {
	t := e.t
	t.Helper()
	p := b.get("/admin/totp/enrol")
	expect(t, "the enrolment page", p, 200, "")
	secret = p.text("totp-secret")
	p = b.do("POST", "/admin/totp/enrol", url.Values{"_csrf": {p.csrf(t)}, "code": {totpCode(t, secret, e.clock.now())}})
	expect(t, "confirming the enrolment", p, 200, "")
	for _, m := range recoveryItem.FindAllStringSubmatch(p.body, -1) {
		codes = append(codes, m[1])
	}
	return secret, codes
}

// TOTP: enrolment confirmed by a code, the sealed secret, the second step after the
// password, reused codes refused, and single-use recovery codes.
func TestTOTP(t *testing.T) {
	e := newEnv(t, envOptions{})
	u := e.admin("kim@example.com", "kim-password-123", false)
	b := e.browser("192.0.2.50")
	expect(t, "login", b.login("kim@example.com", "kim-password-123"), 303, "/admin")
	if p := b.get("/admin"); p.status != 200 || !p.has("enrol-totp") || p.text("whoami") != "kim@example.com" {
		t.Fatalf("landing page with TOTP off: %d\n%s", p.status, p.body)
	}

	p := b.get("/admin/totp/enrol")
	expect(t, "the enrolment page", p, 200, "")
	secret := p.text("totp-secret")
	key, err := otp.NewKeyFromURL(p.text("totp-uri"))
	if err != nil {
		t.Fatal(err)
	}
	if key.Secret() != secret || key.Type() != "totp" || key.Period() != 30 || key.Digits() != otp.DigitsSix ||
		key.Algorithm() != otp.AlgorithmSHA1 || key.Issuer() != "Converger" || !strings.Contains(key.AccountName(), "kim@example.com") {
		t.Fatalf("otpauth URI %q does not match the secret %q and the settings", key.URL(), secret)
	}
	m := qrSource.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no QR code image:\n%s", p.body)
	}
	raw, err := base64.StdEncoding.DecodeString(html.UnescapeString(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(bytes.NewReader(raw)); err != nil || img.Bounds().Dx() < 100 {
		t.Fatalf("the QR code is not a PNG image: %v", err)
	}
	if again := b.get("/admin/totp/enrol"); again.text("totp-secret") != secret {
		t.Fatal("reloading the enrolment page changed the secret")
	}
	if strings.Contains(p.body, `type="hidden" name="secret"`) {
		t.Fatal("the secret travels in the form")
	}

	now := e.clock.now()
	p = b.do("POST", "/admin/totp/enrol", url.Values{"_csrf": {p.csrf(t)}, "code": {wrongCode(t, secret, now)}})
	expectError(t, "a wrong enrolment code", p, 400, invalidCode)
	p = b.do("POST", "/admin/totp/enrol", url.Values{"_csrf": {p.csrf(t)}, "code": {totpCode(t, secret, now)}})
	expect(t, "confirming the enrolment", p, 200, "")
	var codes []string
	seen := map[string]bool{}
	for _, m := range recoveryItem.FindAllStringSubmatch(p.body, -1) {
		if seen[m[1]] {
			t.Fatalf("recovery code %s repeated", m[1])
		}
		seen[m[1]] = true
		codes = append(codes, m[1])
	}
	if len(codes) != 10 || !p.has("recovery-codes") || !p.has("continue") {
		t.Fatalf("%d recovery codes, want 10\n%s", len(codes), p.body)
	}

	// Stored: the secret sealed, the confirming step, the codes hashed.
	var sealed []byte
	var lastStep int64
	if err := e.pool.QueryRow(context.Background(), `SELECT totp_secret, totp_last_step FROM admin_users WHERE id = $1`,
		u.ID).Scan(&sealed, &lastStep); err != nil {
		t.Fatal(err)
	}
	if opened, err := e.sealer.Open(sealed); err != nil || string(opened) != secret || bytes.Contains(sealed, []byte(secret)) {
		t.Fatalf("totp_secret is not the sealed secret (%v)", err)
	}
	if lastStep != now.Unix()/30 {
		t.Fatalf("totp_last_step %d, want %d", lastStep, now.Unix()/30)
	}
	// 32-byte digests (CHECK in the schema), never the codes.
	if n, err := e.st.UnusedRecoveryCodes(context.Background(), "admin", u.ID); err != nil || n != 10 {
		t.Fatalf("%d recovery codes stored, want 10 (%v)", n, err)
	}

	if p := b.get("/admin"); p.status != 200 || p.has("enrol-totp") {
		t.Fatalf("landing page with TOTP on: %d, enrolment link %v", p.status, p.has("enrol-totp"))
	}
	expect(t, "the enrolment page with TOTP on", b.get("/admin/totp/enrol"), 303, "/admin")
	expect(t, "logout", b.postOn("/admin", "/admin/logout", nil), 303, "/admin/login")

	// The second step, granting nothing before it is passed.
	expect(t, "password with TOTP on", b.login("kim@example.com", "kim-password-123"), 303, "/admin/login/totp")
	expect(t, "the landing page before the code", b.get("/admin"), 303, "/admin/login")
	expect(t, "the enrolment page before the code", b.get("/admin/totp/enrol"), 303, "/admin/login")
	expectError(t, "the enrolment's code again", b.postOn("/admin/login/totp", "/admin/login/totp",
		url.Values{"code": {totpCode(t, secret, now)}}), 200, invalidCode)
	next := totpCode(t, secret, now.Add(30*time.Second))
	expect(t, "the next step's code", b.postOn("/admin/login/totp", "/admin/login/totp", url.Values{"code": {next}}), 303, "/admin")
	if p := b.get("/admin"); p.status != 200 || p.text("whoami") != "kim@example.com" {
		t.Fatalf("signed in with TOTP: %d", p.status)
	}

	// A code is accepted once, even in another session.
	b2 := e.browser("192.0.2.51")
	expect(t, "password again", b2.login("kim@example.com", "kim-password-123"), 303, "/admin/login/totp")
	expectError(t, "a reused code", b2.postOn("/admin/login/totp", "/admin/login/totp", url.Values{"code": {next}}), 200, invalidCode)

	// A recovery code works once, however it is typed.
	typed := "  " + strings.ToUpper(strings.ReplaceAll(codes[0], "-", " ")) + " "
	expect(t, "a recovery code", b2.postOn("/admin/login/totp", "/admin/login/totp", url.Values{"code": {typed}}), 303, "/admin")
	b3 := e.browser("192.0.2.52")
	expect(t, "password again", b3.login("kim@example.com", "kim-password-123"), 303, "/admin/login/totp")
	expectError(t, "a used recovery code", b3.postOn("/admin/login/totp", "/admin/login/totp", url.Values{"code": {codes[0]}}),
		200, invalidCode)
	expect(t, "another recovery code", b3.postOn("/admin/login/totp", "/admin/login/totp", url.Values{"code": {codes[1]}}), 303, "/admin")
	if n, err := e.st.UnusedRecoveryCodes(context.Background(), "admin", u.ID); err != nil || n != 8 {
		t.Fatalf("%d unused recovery codes, want 8 (%v)", n, err)
	}

	// The half-signed-in state is short-lived.
	b4 := e.browser("192.0.2.53")
	expect(t, "password again", b4.login("kim@example.com", "kim-password-123"), 303, "/admin/login/totp")
	e.clock.advance(5*time.Minute + time.Second)
	expect(t, "the TOTP step 5 minutes later", b4.get("/admin/login/totp"), 303, "/admin/login")
}

// Wrong codes count towards login_ip and the account's 2FA key in the sidecar; when the
// key is locked, even the right code is refused with 429.
func TestTOTPLockout(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	u := e.admin("leo@example.com", "leo-password-123", false)
	b := e.browser("192.0.2.60")
	expect(t, "login", b.login("leo@example.com", "leo-password-123"), 303, "/admin")
	secret, _ := e.enrol(b)
	e.clock.advance(30 * time.Second)
	for i := 1; i <= 5; i++ {
		bi := e.browser("203.0.113." + strconv.Itoa(200+i))
		expect(t, "password", bi.login("leo@example.com", "leo-password-123"), 303, "/admin/login/totp")
		expectError(t, "wrong code "+strconv.Itoa(i), bi.postOn("/admin/login/totp", "/admin/login/totp",
			url.Values{"code": {wrongCode(t, secret, e.clock.now())}}), 200, invalidCode)
	}
	if n := e.peekCount(buckets.LoginAccount, "admin-2fa:"+u.ID); n != 5 {
		t.Fatalf("login_account admin-2fa:<id> counts %d, want 5", n)
	}
	if n := e.peekCount(buckets.LoginAccount, "admin:leo@example.com"); n != 0 {
		t.Fatalf("the password's key counts %d, want 0 (the passwords were right)", n)
	}
	b6 := e.browser("203.0.113.206")
	expect(t, "password", b6.login("leo@example.com", "leo-password-123"), 303, "/admin/login/totp")
	good := url.Values{"code": {totpCode(t, secret, e.clock.now())}}
	expectLocked(t, "the right code while locked", b6.postOn("/admin/login/totp", "/admin/login/totp", good))
	e.clock.advance(time.Minute)
	good = url.Values{"code": {totpCode(t, secret, e.clock.now())}}
	expect(t, "the right code after the window", b6.postOn("/admin/login/totp", "/admin/login/totp", good), 303, "/admin")
}
