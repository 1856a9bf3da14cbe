package token

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const (
	tenantID  = "6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a10"
	channelID = "0b9d7d2e-13a4-4c55-8f0e-6e2f1b7a9c21"
)

func newPair(t *testing.T) (*Signer, *Verifier) {
	t.Helper()
	enc, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSigningKey(enc)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ParseVerifyKeys(s.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

func TestIssueAndVerify(t *testing.T) {
	s, v := newPair(t)
	now := time.Now()
	tok, err := s.Issue(Claims{TenantID: tenantID, ChannelID: channelID, UserID: "u1", Src: SrcPublishable}, now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.Type != Type || c.TenantID != tenantID || c.ChannelID != channelID || c.UserID != "u1" || c.Src != SrcPublishable {
		t.Fatalf("claims: %+v", c)
	}
	if c.ID == "" || c.ExpiresAt.Sub(c.IssuedAt.Time) != Lifetime {
		t.Fatalf("jti %q, lifetime %s", c.ID, c.ExpiresAt.Sub(c.IssuedAt.Time))
	}
}

func TestVerifyRejects(t *testing.T) {
	s, v := newPair(t)
	other, _ := newPair(t)
	now := time.Now()
	good := Claims{TenantID: tenantID, ChannelID: channelID, Src: SrcSecret}
	issue := func(s *Signer, c Claims, at time.Time) string {
		tok, err := s.Issue(c, at)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	valid := issue(s, good, now)
	parts := strings.Split(valid, ".")
	noneAlg := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "."
	hs, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, &good).SignedString([]byte(s.PublicKey()))
	noKid := jwt.NewWithClaims(jwt.SigningMethodEdDSA, &Claims{Type: Type, TenantID: tenantID, ChannelID: channelID, Src: SrcSecret,
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}})
	noKidTok, _ := noKid.SignedString(s.key)
	cases := map[string]string{
		"empty":              "",
		"garbage":            "not a token",
		"three dots":         "a.b.c",
		"other key":          issue(other, good, now),
		"expired":            issue(s, good, now.Add(-time.Hour)),
		"issued in future":   issue(s, good, now.Add(time.Hour)),
		"tampered payload":   parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"type":"converger","tenant_id":"`+tenantID+`"}`)) + "." + parts[2],
		"alg none":           noneAlg,
		"hs256 with pub key": hs,
		"no kid":             noKidTok,
		"bad src":            issue(s, Claims{TenantID: tenantID, ChannelID: channelID, Src: "x"}, now),
		"tenant not uuid":    issue(s, Claims{TenantID: "t1", ChannelID: channelID, Src: SrcSecret}, now),
		"too long":           valid + strings.Repeat("A", MaxLength),
	}
	for name, tok := range cases {
		if c, err := v.Verify(tok); err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Verify = %+v, %v; want ErrInvalid", name, c, err)
		}
	}
}

func TestVerifyAcceptsEveryListedKey(t *testing.T) {
	oldS, _ := newPair(t)
	newS, _ := newPair(t)
	v, err := ParseVerifyKeys(newS.PublicKey() + " , " + oldS.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Signer{oldS, newS} {
		tok, _ := s.Issue(Claims{TenantID: tenantID, ChannelID: channelID, Src: SrcSecret}, time.Now())
		if _, err := v.Verify(tok); err != nil {
			t.Fatalf("rotation: %v", err)
		}
	}
}

func TestVerifierClock(t *testing.T) {
	s, v := newPair(t)
	issued := time.Now()
	tok, _ := s.Issue(Claims{TenantID: tenantID, ChannelID: channelID, Src: SrcSecret}, issued)
	v.Now = func() time.Time { return issued.Add(Lifetime - time.Minute) }
	if _, err := v.Verify(tok); err != nil {
		t.Fatalf("a minute before expiry: %v", err)
	}
	v.Now = func() time.Time { return issued.Add(Lifetime + time.Minute) }
	if _, err := v.Verify(tok); err == nil {
		t.Fatal("a minute after expiry: verified")
	}
}

func TestKeyParsingErrors(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	for _, bad := range []string{"", "***", base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := ParseSigningKey(bad); err == nil {
			t.Errorf("ParseSigningKey(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"", " , ", "***", base64.StdEncoding.EncodeToString(pub) + ",short"} {
		if _, err := ParseVerifyKeys(bad); err == nil {
			t.Errorf("ParseVerifyKeys(%q) accepted", bad)
		}
	}
	if _, err := ParseVerifyKeys(base64.RawURLEncoding.EncodeToString(pub)); err != nil {
		t.Errorf("unpadded base64url key refused: %v", err)
	}
}

func TestLegacyTokens(t *testing.T) {
	s, v := newPair(t)
	now := time.Now()
	legacy, err := s.IssueLegacy(tenantID, channelID, "user-7", now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.VerifyLegacy(legacy)
	if err != nil || c.ConversationID != tenantID || c.TenantID != channelID || c.Subject != "user-7" ||
		c.ExpiresAt.Sub(c.IssuedAt.Time) != LegacyLifetime {
		t.Fatalf("legacy claims %+v, %v", c, err)
	}
	// Neither kind passes for the other.
	if _, err := v.Verify(legacy); err == nil {
		t.Error("a legacy token verified as a Converger token")
	}
	converger, _ := s.Issue(Claims{TenantID: tenantID, ChannelID: channelID, Src: SrcSecret}, now)
	if _, err := v.VerifyLegacy(converger); err == nil {
		t.Error("a Converger token verified as a legacy token")
	}
	expired, _ := s.IssueLegacy(tenantID, channelID, "u", now.Add(-2*time.Hour))
	if _, err := v.VerifyLegacy(expired); err == nil {
		t.Error("an expired legacy token verified")
	}
}
