// Package credentials makes the core's secrets: tenant API keys, channel secrets,
// publishable keys and admin API tokens (stored as SHA-256, shown once), and the
// AES-256-GCM sealing of the secrets the core must read back (channel secrets for
// inbound signatures, TOTP seeds).
package credentials

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
)

// Prefixes of the credentials' plaintext forms.
const (
	APIKeyPrefix      = "cvg_live_"
	PublishablePrefix = "cvg_pk_"
	AdminTokenPrefix  = "cvg_admin_"
	// DisplayPrefixLength is how much of an API key is kept for display.
	DisplayPrefixLength = 13
)

// Hash is how credentials are looked up: their SHA-256.
func Hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// NewAPIKey returns a tenant API key: "cvg_live_" and 32 random bytes in base64url.
func NewAPIKey() string { return APIKeyPrefix + random(32) }

// DisplayPrefix is the part of an API key kept for display.
func DisplayPrefix(key string) string { return key[:min(len(key), DisplayPrefixLength)] }

// NewAdminToken returns an admin API token: "cvg_admin_" and 32 random bytes in
// base64url.
func NewAdminToken() string { return AdminTokenPrefix + random(32) }

// NewChannelSecret returns a channel secret: 32 random bytes in base64url.
func NewChannelSecret() string { return random(32) }

// NewPublishableKey returns a publishable key: "cvg_pk_" and 24 random bytes in base64url.
func NewPublishableKey() string { return PublishablePrefix + random(24) }

// Random returns n random bytes in base64url without padding (session ids, tokens).
func Random(n int) string { return random(n) }

func random(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // the system is unusable
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// Sealer encrypts and authenticates small secrets with AES-256-GCM.
type Sealer struct{ aead cipher.AEAD }

// ParseEncryptionKey reads ENCRYPTION_KEY: the base64 of 32 bytes.
func ParseEncryptionKey(s string) (*Sealer, error) {
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		key, err = base64.RawURLEncoding.DecodeString(s)
	}
	if err != nil || len(key) != 32 {
		return nil, errors.New("an encryption key is the base64 of 32 random bytes (head -c 32 /dev/urandom | base64)")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// GenerateEncryptionKey returns a new ENCRYPTION_KEY.
func GenerateEncryptionKey() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return base64.StdEncoding.EncodeToString(b)
}

// Seal encrypts plaintext; the nonce goes first.
func (s *Sealer) Seal(plaintext []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plaintext)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return s.aead.Seal(nonce, nonce, plaintext, nil)
}

// ErrOpen is returned for a sealed value that does not decrypt: another key, or
// tampering.
var ErrOpen = errors.New("sealed value does not open with this key")

// Open decrypts what Seal sealed.
func (s *Sealer) Open(sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return nil, ErrOpen
	}
	out, err := s.aead.Open(nil, sealed[:n], sealed[n:], nil)
	if err != nil {
		return nil, ErrOpen
	}
	return out, nil
}
