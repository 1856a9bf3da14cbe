// Package token is the Converger token format: an Ed25519-signed JWT that the core issues
// and the sidecar verifies, and the encoding of the keys that sign and verify it.
package token

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/converger/edge/shared/ids"
)

// Type is the value of the "type" claim of a Converger token.
const Type = "converger"

// Token sources: the credential a token was first generated from.
const (
	SrcSecret      = "secret"
	SrcPublishable = "publishable"
)

// Lifetime is how long a Converger token is valid.
const Lifetime = 1800 * time.Second

// Claims are the claims of a Converger token.
type Claims struct {
	Type           string `json:"type"`
	TenantID       string `json:"tenant_id"`
	ChannelID      string `json:"channel_id"`
	ConversationID string `json:"conversation_id,omitempty"`
	UserID         string `json:"user_id,omitempty"`
	Src            string `json:"src"`
	jwt.RegisteredClaims
}

// ErrInvalid is returned for every token that does not verify; the wrapped text says why.
var ErrInvalid = errors.New("invalid token")

// Signer issues tokens with one private key.
type Signer struct {
	key ed25519.PrivateKey
	kid string
}

// NewSigner returns a signer for key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{key: key, kid: KeyID(key.Public().(ed25519.PublicKey))}
}

// GenerateKey returns a new private key, encoded as TOKEN_SIGNING_KEY takes it.
func GenerateKey() (string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(priv.Seed()), nil
}

// ParseSigningKey decodes TOKEN_SIGNING_KEY: the base64 of a 32-byte Ed25519 seed.
func ParseSigningKey(s string) (*Signer, error) {
	b, err := decodeBase64(s)
	if err != nil || len(b) != ed25519.SeedSize {
		return nil, fmt.Errorf("a signing key is the base64 of a %d-byte Ed25519 seed", ed25519.SeedSize)
	}
	return NewSigner(ed25519.NewKeyFromSeed(b)), nil
}

// PublicKey returns the signer's public key, encoded as TOKEN_VERIFY_KEYS takes it.
func (s *Signer) PublicKey() string {
	return base64.StdEncoding.EncodeToString(s.key.Public().(ed25519.PublicKey))
}

// KeyID is the key id (kid) of the signer's public key.
func (s *Signer) KeyID() string { return s.kid }

// PublicKeyID returns the key id of a public key as TOKEN_VERIFY_KEYS takes it.
func PublicKeyID(s string) (string, error) {
	b, err := decodeBase64(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return "", fmt.Errorf("a verify key is the base64 of a %d-byte Ed25519 public key", ed25519.PublicKeySize)
	}
	return KeyID(ed25519.PublicKey(b)), nil
}

// KeyID returns the key id of a public key: the first 8 bytes of its SHA-256, in hex.
// Both sides derive it, so rotating keys needs no separate kid setting.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Issue signs c after filling its type, issue time, expiry and id.
func (s *Signer) Issue(c Claims, now time.Time) (string, error) {
	c.Type = Type
	c.IssuedAt = jwt.NewNumericDate(now)
	c.ExpiresAt = jwt.NewNumericDate(now.Add(Lifetime))
	if c.ID == "" {
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return "", err
		}
		c.ID = base64.RawURLEncoding.EncodeToString(id[:])
	}
	t := jwt.NewWithClaims(jwt.SigningMethodEdDSA, &c)
	t.Header["kid"] = s.kid
	return t.SignedString(s.key)
}

// Verifier checks tokens against a set of public keys, chosen by the kid header.
type Verifier struct {
	// Now is the verifier's clock; time.Now unless a test sets it.
	Now    func() time.Time
	keys   map[string]ed25519.PublicKey
	parser *jwt.Parser
}

// NewVerifier returns a verifier that accepts tokens signed by any of keys.
func NewVerifier(keys ...ed25519.PublicKey) *Verifier {
	v := &Verifier{Now: time.Now, keys: make(map[string]ed25519.PublicKey, len(keys))}
	for _, k := range keys {
		v.keys[KeyID(k)] = k
	}
	v.parser = jwt.NewParser(
		jwt.WithTimeFunc(func() time.Time { return v.Now() }),
		jwt.WithValidMethods([]string{jwt.SigningMethodEdDSA.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(5*time.Second),
	)
	return v
}

// ParseVerifyKeys decodes TOKEN_VERIFY_KEYS: base64 Ed25519 public keys separated by
// commas (the current key and, during a rotation, the previous one).
func ParseVerifyKeys(s string) (*Verifier, error) {
	var keys []ed25519.PublicKey
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		b, err := decodeBase64(part)
		if err != nil || len(b) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("key %d: a verify key is the base64 of a %d-byte Ed25519 public key", i+1, ed25519.PublicKeySize)
		}
		keys = append(keys, ed25519.PublicKey(b))
	}
	if len(keys) == 0 {
		return nil, errors.New("no keys")
	}
	return NewVerifier(keys...), nil
}

// MaxLength bounds the size of a token the verifier looks at.
const MaxLength = 4096

// Verify checks the signature, expiry and claims of a Converger token.
func (v *Verifier) Verify(tok string) (*Claims, error) {
	if len(tok) > MaxLength {
		return nil, fmt.Errorf("%w: too long", ErrInvalid)
	}
	var c Claims
	_, err := v.parser.ParseWithClaims(tok, &c, v.key)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if c.Type != Type {
		return nil, fmt.Errorf("%w: not a Converger token", ErrInvalid)
	}
	if !ids.IsUUID(c.TenantID) || !ids.IsUUID(c.ChannelID) {
		return nil, fmt.Errorf("%w: tenant_id and channel_id must be UUIDs", ErrInvalid)
	}
	if c.Src != SrcSecret && c.Src != SrcPublishable {
		return nil, fmt.Errorf("%w: src must be %q or %q", ErrInvalid, SrcSecret, SrcPublishable)
	}
	return &c, nil
}

func decodeBase64(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not base64")
}
