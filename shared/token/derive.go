package token

import (
	"crypto/hkdf"
	"crypto/sha256"
)

// DeriveKey returns a 32-byte secret for one purpose (signed attachment URLs, for
// instance), derived from the signing key with HKDF-SHA256 and the purpose as the info.
// Every instance holding the same TOKEN_SIGNING_KEY derives the same secret, so they
// accept each other's signatures; the secret reveals nothing about the signing key, and
// different purposes get unrelated secrets.
func (s *Signer) DeriveKey(purpose string) []byte {
	k, err := hkdf.Key(sha256.New, s.key.Seed(), nil, "converger/"+purpose, 32)
	if err != nil {
		// Only a length over 255 hash sizes fails.
		panic(err)
	}
	return k
}
