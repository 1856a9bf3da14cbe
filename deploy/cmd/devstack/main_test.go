package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converger/edge/shared/cmdline/cmdlinetest"
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

func TestEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "env")
	vars := []envVar{{"DATABASE_URL", "postgres://postgres@127.0.0.1:5999/postgres?sslmode=disable"}, {"ODD", "it's $HOME `x`"}}
	if err := writeEnv(path, vars); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v, want 0600", fi.Mode(), err)
	}
	got := previousEnv(path)
	for _, v := range vars {
		if got[v.name] != v.value {
			t.Errorf("%s = %q, want %q", v.name, got[v.name], v.value)
		}
	}
	// A POSIX shell reads the same values.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	out, err := exec.Command(sh, "-c", `. "$0" && printf '%s\n' "$DATABASE_URL" "$ODD"`, path).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := vars[0].value + "\n" + vars[1].value + "\n"; string(out) != want {
		t.Fatalf("sourced:\n%s\nwant:\n%s", out, want)
	}
}

func TestKeptPort(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "postgres.port")
	if p := keptPort(path); p != 0 {
		t.Fatalf("no file: port %d, want 0 (a free one)", p)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := keepPort(path, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)); err != nil {
		t.Fatal(err)
	}
	if p := keptPort(path); p != 0 {
		t.Fatalf("the kept port %d is taken: got %d, want 0", port, p)
	}
	l.Close()
	if p := keptPort(path); p != port {
		t.Fatalf("the kept port is free again: got %d, want %d", p, port)
	}
}

// TestCommandLine: help and --version start nothing (no PostgreSQL, no ./.data).
func TestCommandLine(t *testing.T) {
	binary := filepath.Join(t.TempDir(), "devstack")
	build := exec.Command("go", append(append([]string{"build"}, cmdlinetest.BuildFlags...), "-o", binary, ".")...)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	cmdlinetest.Check(t, binary, nil, "usage: devstack")
}
