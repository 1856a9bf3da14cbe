package credentials

import (
	"bytes"
	"strings"
	"testing"
)

func TestCredentialsFormat(t *testing.T) {
	k := NewAPIKey()
	if !strings.HasPrefix(k, "cvg_live_") || len(k) != 9+43 || DisplayPrefix(k) != k[:13] {
		t.Fatalf("API key %q", k)
	}
	if NewAPIKey() == k {
		t.Fatal("two equal API keys")
	}
	if s := NewChannelSecret(); len(s) != 43 || strings.ContainsAny(s, "+/=") {
		t.Fatalf("channel secret %q", s)
	}
	if p := NewPublishableKey(); !strings.HasPrefix(p, "cvg_pk_") || len(p) != 7+32 {
		t.Fatalf("publishable key %q", p)
	}
	if len(Hash("x")) != 32 || bytes.Equal(Hash("x"), Hash("y")) {
		t.Fatal("hash")
	}
}

func TestSealer(t *testing.T) {
	s, err := ParseEncryptionKey(GenerateEncryptionKey())
	if err != nil {
		t.Fatal(err)
	}
	sealed := s.Seal([]byte("channel secret"))
	if bytes.Contains(sealed, []byte("channel secret")) {
		t.Fatal("plaintext visible in the sealed value")
	}
	if got, err := s.Open(sealed); err != nil || string(got) != "channel secret" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if bytes.Equal(sealed, s.Seal([]byte("channel secret"))) {
		t.Fatal("two seals of one value are equal (nonce reuse)")
	}
	other, _ := ParseEncryptionKey(GenerateEncryptionKey())
	if _, err := other.Open(sealed); err != ErrOpen {
		t.Fatalf("another key opened it: %v", err)
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := s.Open(sealed); err != ErrOpen {
		t.Fatal("a tampered value opened")
	}
	if _, err := s.Open([]byte("short")); err != ErrOpen {
		t.Fatal("a short value opened")
	}
	for _, bad := range []string{"", "abc", "c2hvcnQ="} {
		if _, err := ParseEncryptionKey(bad); err == nil {
			t.Errorf("ParseEncryptionKey(%q) accepted", bad)
		}
	}
}
