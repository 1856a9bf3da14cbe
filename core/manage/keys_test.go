package manage_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/manage"
	"github.com/converger/edge/shared/token"
)

// keysCLI runs the keys commands, which need no database.
func keysCLI(t *testing.T, env map[string]string) *cli {
	return &cli{t: t, ctx: context.Background(), env: env}
}

// parseEnvLines reads NAME=value lines, skipping comments.
func parseEnvLines(t *testing.T, out string) map[string]string {
	t.Helper()
	vars := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("not a NAME=value line: %q", line)
		}
		vars[k] = v
	}
	return vars
}

func TestKeysGenerate(t *testing.T) {
	t.Parallel()
	c := keysCLI(t, map[string]string{})
	r := c.ok("keys", "generate")
	vars := parseEnvLines(t, r.stdout)
	if len(vars) != len(manage.KeyNames) {
		t.Fatalf("variables %v, want %v", vars, manage.KeyNames)
	}
	signer, err := token.ParseSigningKey(vars["TOKEN_SIGNING_KEY"])
	if err != nil {
		t.Fatal(err)
	}
	if vars["TOKEN_VERIFY_KEYS"] != signer.PublicKey() || !strings.Contains(r.stdout, "kid is "+signer.KeyID()) {
		t.Fatalf("TOKEN_VERIFY_KEYS %q is not the public key of the signing key (%s), or its kid is not named:\n%s", vars["TOKEN_VERIFY_KEYS"], signer.PublicKey(), r.stdout)
	}
	if _, err := credentials.ParseEncryptionKey(vars["ENCRYPTION_KEY"]); err != nil {
		t.Fatalf("ENCRYPTION_KEY: %v", err)
	}
	if again := parseEnvLines(t, c.ok("keys", "generate").stdout); again["TOKEN_SIGNING_KEY"] == vars["TOKEN_SIGNING_KEY"] ||
		again["ENCRYPTION_KEY"] == vars["ENCRYPTION_KEY"] || again["CLUSTER_SECRET_KEY"] == vars["CLUSTER_SECRET_KEY"] {
		t.Fatal("a second run must print fresh keys")
	}
	c.fails(2, []string{"unexpected argument"}, "keys", "generate", "now")
}

func TestKeysGenerateDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	c := keysCLI(t, map[string]string{})
	r := c.ok("keys", "generate", "--dir", dir)
	read := func() map[string]string {
		out := map[string]string{}
		for _, name := range manage.KeyNames {
			path := filepath.Join(dir, name)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want 0600", path, fi.Mode())
			}
			out[name] = strings.TrimSpace(string(b))
		}
		return out
	}
	first := read()
	if strings.Count(r.stdout, "created ") != len(manage.KeyNames) || strings.Contains(r.stdout, first["TOKEN_SIGNING_KEY"]) {
		t.Fatalf("output (must list the files, never the keys):\n%s", r.stdout)
	}
	// A second start keeps every key.
	r = c.ok("keys", "generate", "--dir", dir)
	if strings.Count(r.stdout, "kept ") != len(manage.KeyNames) || read()["TOKEN_SIGNING_KEY"] != first["TOKEN_SIGNING_KEY"] {
		t.Fatalf("second run:\n%s", r.stdout)
	}
	// A lost verify key is derived again from the kept signing key.
	os.Remove(filepath.Join(dir, "TOKEN_VERIFY_KEYS"))
	c.ok("keys", "generate", "--dir", dir)
	if got := read(); got["TOKEN_VERIFY_KEYS"] != first["TOKEN_VERIFY_KEYS"] {
		t.Fatalf("re-derived verify key %q, want %q", got["TOKEN_VERIFY_KEYS"], first["TOKEN_VERIFY_KEYS"])
	}
	// A verify key that does not match the signing key is an error, not silence.
	other, _ := token.GenerateKey()
	otherSigner, _ := token.ParseSigningKey(other)
	if err := os.WriteFile(filepath.Join(dir, "TOKEN_VERIFY_KEYS"), []byte(otherSigner.PublicKey()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.fails(1, []string{"does not hold the public key", "core keys public"}, "keys", "generate", "--dir", dir)
}

func TestKeysPublic(t *testing.T) {
	t.Parallel()
	current, _ := token.GenerateKey()
	previous, _ := token.GenerateKey()
	cur, _ := token.ParseSigningKey(current)
	prev, _ := token.ParseSigningKey(previous)

	r := keysCLI(t, map[string]string{"TOKEN_SIGNING_KEY": current}).ok("keys", "public")
	if strings.TrimSpace(r.stdout) != cur.PublicKey() || !strings.Contains(r.stderr, "kid "+cur.KeyID()) {
		t.Fatalf("stdout %q stderr %q, want the public key %s and its kid %s", r.stdout, r.stderr, cur.PublicKey(), cur.KeyID())
	}
	// Rotation: the new key first, then the ones still accepted, without repeats.
	r = keysCLI(t, map[string]string{"TOKEN_SIGNING_KEY": current, "TOKEN_VERIFY_KEYS": prev.PublicKey() + "," + cur.PublicKey()}).ok("keys", "public")
	if want := cur.PublicKey() + "," + prev.PublicKey(); strings.TrimSpace(r.stdout) != want {
		t.Fatalf("rotation: %q, want %q", r.stdout, want)
	}
	c := keysCLI(t, map[string]string{})
	r = c.runStdin("# the new key first\n"+current+"\n\n"+previous+"\n", "keys", "public", "--stdin")
	if want := cur.PublicKey() + "," + prev.PublicKey(); r.code != 0 || strings.TrimSpace(r.stdout) != want ||
		!strings.Contains(r.stderr, "kid "+prev.KeyID()) {
		t.Fatalf("--stdin: exit %d %q %q, want %q", r.code, r.stdout, r.stderr, want)
	}
	// Each half of a rotation verifies its tokens with the printed keys.
	v, err := token.ParseVerifyKeys(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*token.Signer{cur, prev} {
		tok, err := s.Issue(token.Claims{TenantID: "00000000-0000-4000-8000-000000000001", ChannelID: "00000000-0000-4000-8000-000000000002", Src: token.SrcSecret}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(tok); err != nil {
			t.Fatalf("a token of kid %s: %v", s.KeyID(), err)
		}
	}

	c.fails(1, []string{"TOKEN_SIGNING_KEY is not set", "core keys generate"}, "keys", "public")
	keysCLI(t, map[string]string{"TOKEN_SIGNING_KEY": "bm90IGEga2V5"}).fails(1, []string{"TOKEN_SIGNING_KEY: a signing key is the base64"}, "keys", "public")
	keysCLI(t, map[string]string{"TOKEN_SIGNING_KEY": current, "TOKEN_VERIFY_KEYS": "short"}).fails(1, []string{"TOKEN_VERIFY_KEYS, key 1"}, "keys", "public")
	if r := c.runStdin("\n", "keys", "public", "--stdin"); r.code != 1 || !strings.Contains(r.stderr, "no signing key on standard input") {
		t.Fatalf("empty stdin: %d %q", r.code, r.stderr)
	}
}
