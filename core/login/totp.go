package login

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"html/template"
	"image/png"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/pquerna/otp"
	"github.com/pquerna/otp/hotp"
	"github.com/pquerna/otp/totp"

	"github.com/converger/edge/core/store"
)

// TOTP as authenticator apps do it: 6 digits, 30 s steps, HMAC-SHA1, and a code of the
// step before or after the current one still accepted (skew 1).
const (
	totpIssuer = "Converger"
	totpPeriod = 30
	totpSkew   = 1
	// RecoveryCodes is how many single-use recovery codes an enrolment makes.
	RecoveryCodes = 10
	// recoveryCodeChars: 16 base32 characters, 80 random bits.
	recoveryCodeChars = 16
	qrSize            = 240
)

var hotpOpts = hotp.ValidateOpts{Digits: otp.DigitsSix, Algorithm: otp.AlgorithmSHA1}

// totpStep is the step of t.
func totpStep(t time.Time) int64 { return t.Unix() / totpPeriod }

// matchTOTP returns the step of code within the skew around now, preferring the latest;
// ok is false when no step matches.
func matchTOTP(secret, code string, now time.Time) (step int64, ok bool) {
	if len(code) != 6 || strings.Trim(code, "0123456789") != "" {
		return 0, false
	}
	current := totpStep(now)
	for s := current + totpSkew; s >= current-totpSkew; s-- {
		want, err := hotp.GenerateCodeCustom(secret, uint64(s), hotpOpts)
		if err == nil && subtle.ConstantTimeCompare([]byte(want), []byte(code)) == 1 {
			return s, true
		}
	}
	return 0, false
}

// checkSecondFactor accepts a TOTP code whose step is later than the last one accepted
// from the user, or an unused recovery code (which is then used up).
func (p *Pages) checkSecondFactor(ctx context.Context, u store.LoginUser, code string) (bool, error) {
	code = strings.TrimSpace(code)
	if len(code) == 6 {
		secret, err := p.Sealer.Open(u.TOTPSecret)
		if err != nil {
			return false, err
		}
		step, ok := matchTOTP(string(secret), code, p.Now())
		if !ok {
			return false, nil
		}
		// A code of a step not later than the last accepted one is a reused code.
		return p.Store.AcceptTOTPStep(ctx, u.Kind, u.ID, step)
	}
	norm, ok := normalizeRecoveryCode(code)
	if !ok {
		return false, nil
	}
	return p.Store.UseRecoveryCode(ctx, u.Kind, u.ID, recoveryCodeHash(u, norm), p.Now())
}

var recoveryAlphabet = base32.StdEncoding.WithPadding(base32.NoPadding)

// newRecoveryCode returns a code as shown: four groups of four lower-case base32
// characters, such as "abcd-efgh-ijkl-mnop".
func newRecoveryCode() string {
	b := make([]byte, recoveryCodeChars*5/8)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	s := strings.ToLower(recoveryAlphabet.EncodeToString(b))
	return s[0:4] + "-" + s[4:8] + "-" + s[8:12] + "-" + s[12:16]
}

// normalizeRecoveryCode drops spaces and dashes and lower-cases; ok is false for what
// cannot be a recovery code.
func normalizeRecoveryCode(s string) (string, bool) {
	s = strings.ToLower(strings.NewReplacer(" ", "", "-", "").Replace(s))
	if len(s) != recoveryCodeChars {
		return "", false
	}
	if _, err := recoveryAlphabet.DecodeString(strings.ToUpper(s)); err != nil {
		return "", false
	}
	return s, true
}

// recoveryCodeHash is how a recovery code is stored: SHA-256 of the user and the
// normalized code, so equal codes of two users differ.
func recoveryCodeHash(u store.LoginUser, normalized string) []byte {
	sum := sha256.Sum256([]byte("converger recovery\x00" + u.Kind + "\x00" + u.ID + "\x00" + normalized))
	return sum[:]
}

// pendingKey returns the session's enrolment in progress, starting one when there is
// none: the key is kept sealed in the session row, never in the page.
func (p *Pages) pendingKey(c *fiber.Ctx, s *session, create bool) (*otp.Key, error) {
	if s.TOTPPending != nil {
		if uri, err := p.Sealer.Open(s.TOTPPending); err == nil {
			if k, err := otp.NewKeyFromURL(string(uri)); err == nil {
				return k, nil
			}
		}
	}
	if !create {
		return nil, nil
	}
	account := s.user.Email
	if s.user.TenantName != "" {
		account = s.user.TenantName + ":" + s.user.Email
	}
	k, err := totp.Generate(totp.GenerateOpts{Issuer: totpIssuer, AccountName: account, Period: totpPeriod,
		Digits: otp.DigitsSix, Algorithm: otp.AlgorithmSHA1})
	if err != nil {
		return nil, err
	}
	sealed := p.Sealer.Seal([]byte(k.URL()))
	if err := p.Store.SetTOTPPending(c.UserContext(), s.IDHash, sealed); err != nil {
		return nil, err
	}
	s.TOTPPending = sealed
	return k, nil
}

// enrolView fills the enrolment page: the QR code as a PNG data URI, the secret and the
// otpauth URI.
func (p *Pages) enrolView(c *fiber.Ctx, rl realm, s *session, k *otp.Key) (*view, error) {
	img, err := k.Image(qrSize, qrSize)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return nil, err
	}
	v := p.newView(rl)
	v.CSRF = p.formToken(c, s)
	v.WhoAmI = s.user.Email
	// A data: URI the package made itself, safe as an image source.
	v.QR = template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes()))
	v.Secret, v.URI = k.Secret(), k.URL()
	return v, nil
}

func (p *Pages) enrolPage(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s, err := p.signedIn(c, rl)
		switch {
		case err != nil:
			return p.internalError(c, rl, err)
		case s == nil:
			return redirect(c, rl.prefix+"/login")
		case s.user.MustChangePassword:
			return redirect(c, rl.prefix+"/password/change")
		case s.user.TOTPEnabled():
			return redirect(c, rl.prefix)
		}
		k, err := p.pendingKey(c, s, true)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		v, err := p.enrolView(c, rl, s, k)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		return p.render(c, fiber.StatusOK, "enrol", v)
	}
}

// enrol confirms an enrolment with a code of the new key, turns TOTP on and shows the
// recovery codes once.
func (p *Pages) enrol(rl realm) fiber.Handler {
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
		if s.user.MustChangePassword {
			return redirect(c, rl.prefix+"/password/change")
		}
		if s.user.TOTPEnabled() {
			return redirect(c, rl.prefix)
		}
		k, err := p.pendingKey(c, s, false)
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if k == nil {
			return redirect(c, rl.prefix+"/totp/enrol")
		}
		step, ok := matchTOTP(k.Secret(), strings.TrimSpace(field(c, "code")), p.Now())
		if !ok {
			v, err := p.enrolView(c, rl, s, k)
			if err != nil {
				return p.internalError(c, rl, err)
			}
			v.Error = msgInvalidCode
			return p.render(c, fiber.StatusBadRequest, "enrol", v)
		}
		codes := make([]string, RecoveryCodes)
		hashes := make([][]byte, RecoveryCodes)
		for i := range codes {
			codes[i] = newRecoveryCode()
			norm, _ := normalizeRecoveryCode(codes[i])
			hashes[i] = recoveryCodeHash(s.user, norm)
		}
		err = p.Store.EnableTOTP(c.UserContext(), s.user.Kind, s.user.ID, p.Sealer.Seal([]byte(k.Secret())), step, hashes)
		if errors.Is(err, store.ErrConflict) {
			return redirect(c, rl.prefix)
		}
		if err != nil {
			return p.internalError(c, rl, err)
		}
		if err := p.Store.SetTOTPPending(c.UserContext(), s.IDHash, nil); err != nil {
			return p.internalError(c, rl, err)
		}
		v := p.newView(rl)
		v.CSRF = p.formToken(c, s)
		v.WhoAmI = s.user.Email
		v.RecoveryCodes = codes
		return p.render(c, fiber.StatusOK, "recovery", v)
	}
}
