package token

import (
	"bytes"
	"testing"
)

func TestDeriveKey(t *testing.T) {
	k1, _ := GenerateKey()
	k2, _ := GenerateKey()
	a, _ := ParseSigningKey(k1)
	again, _ := ParseSigningKey(k1)
	b, _ := ParseSigningKey(k2)
	x := a.DeriveKey("attachment-url")
	if len(x) != 32 || !bytes.Equal(x, again.DeriveKey("attachment-url")) {
		t.Fatal("the same signing key must derive the same secret")
	}
	if bytes.Equal(x, a.DeriveKey("other")) || bytes.Equal(x, b.DeriveKey("attachment-url")) {
		t.Fatal("another purpose or another key must derive another secret")
	}
}
