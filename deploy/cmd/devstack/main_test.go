package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDemoCredentialsFile(t *testing.T) {
	d := Demo{TenantID: "t-1", APIKey: "cvg_live_abc", ChannelID: "c-1", ChannelSecret: "s3cr_et-", PublishableKey: "cvg_pk_x"}
	b := d.Marshal()
	if !strings.HasPrefix(string(b), "# ") || !strings.Contains(string(b), "\nDEMO_CHANNEL_SECRET=s3cr_et-\n") {
		t.Fatalf("file:\n%s", b)
	}
	got, err := ParseDemo(b)
	if err != nil || got != d {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if _, err := ParseDemo([]byte("DEMO_TENANT_ID=x\n")); err == nil || !strings.Contains(err.Error(), "DEMO_API_KEY is missing") {
		t.Fatalf("a partial file: %v", err)
	}
	if _, err := ParseDemo([]byte("garbage\n")); err == nil {
		t.Fatal("a line without = must be refused")
	}
}

func TestReadOrCreateKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	n := 0
	gen := func() (string, error) { n++; return "k" + strings.Repeat("x", n), nil }
	k1, err := readOrCreateKey(path, gen)
	if err != nil || k1 != "kx" {
		t.Fatalf("first: %q %v", k1, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v, want 0600", fi.Mode(), err)
	}
	k2, err := readOrCreateKey(path, gen)
	if err != nil || k2 != k1 || n != 1 {
		t.Fatalf("second start must read the same key: %q %v (generated %d times)", k2, err, n)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable": "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"postgres://app:p%40ss:w@db.example:5432/converger":           "postgres://app:***@db.example:5432/converger",
		"host=db user=app": "host=db user=app",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
