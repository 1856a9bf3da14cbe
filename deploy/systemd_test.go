package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unit is the part of a systemd unit the checks read.
type unit struct {
	execStart   []string
	envFiles    []string
	environment map[string]string
	credentials map[string]string // name -> source file
	settings    map[string][]string
}

func parseUnit(path string) (*unit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	u := &unit{environment: map[string]string{}, credentials: map[string]string{}, settings: map[string][]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: not a setting: %q", path, line)
		}
		u.settings[k] = append(u.settings[k], v)
		switch k {
		case "ExecStart":
			u.execStart = strings.Fields(v)
		case "EnvironmentFile":
			u.envFiles = append(u.envFiles, strings.TrimPrefix(v, "-"))
		case "Environment":
			name, value, _ := strings.Cut(v, "=")
			u.environment[name] = value
		case "LoadCredential":
			name, src, _ := strings.Cut(v, ":")
			u.credentials[name] = src
		}
	}
	return u, sc.Err()
}

// hardening are the settings each unit must have, with the value.
var hardening = map[string]string{
	"DynamicUser": "yes", "NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "ProtectSystem": "strict",
	"ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes", "PrivateUsers": "yes",
	"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
	"RestrictNamespaces": "yes", "MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native",
	"LockPersonality": "yes", "RestrictSUIDSGID": "yes", "UMask": "0077",
}

// checkUnit loads the unit's program configuration: its Environment=, the example env
// file shipped for its EnvironmentFile=, and its credentials made by the install steps.
func checkUnit(t *testing.T, path string, u *unit) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for k, want := range hardening {
		if v := u.settings[k]; len(v) == 0 || v[len(v)-1] != want {
			fail("%s: %s=%s is missing (have %v)", path, k, want, v)
		}
	}
	if len(u.execStart) == 0 {
		return append(errs, fmt.Errorf("%s: no ExecStart", path))
	}
	c := &container{where: path, program: filepath.Base(u.execStart[0]), args: u.execStart[1:], env: map[string]string{}, mounts: map[string]string{}}
	for _, ef := range u.envFiles {
		example := filepath.Join("systemd", strings.TrimSuffix(filepath.Base(ef), ".env")+".env.example")
		b, err := os.ReadFile(example)
		if err != nil {
			fail("%s: EnvironmentFile=%s has no example %s: %v", path, ef, example, err)
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(line, "#") {
				c.env[k] = v
			}
		}
	}
	// The credentials directory (%d) holds what the install steps create.
	creds := t.TempDir()
	keys := generatedKeys(t)
	keys["DATABASE_URL"] = "postgres://converger:password@db.example.com:5432/converger?sslmode=verify-full"
	for name, src := range u.credentials {
		v, ok := keys[filepath.Base(src)]
		if !ok {
			fail("%s: LoadCredential=%s:%s, a file the install steps do not create", path, name, src)
			continue
		}
		if err := os.WriteFile(filepath.Join(creds, name), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range u.environment {
		c.env[k] = strings.ReplaceAll(v, "%d", creds)
	}
	return append(errs, checkConfig(c)...)
}

func TestSystemdUnits(t *testing.T) {
	units, _ := filepath.Glob("systemd/*.service")
	if len(units) != 2 {
		t.Fatalf("units %v, want the core's and the sidecar's", units)
	}
	analyze, _ := exec.LookPath("systemd-analyze")
	for _, path := range units {
		u, err := parseUnit(path)
		if err != nil {
			t.Fatal(err)
		}
		if errs := checkUnit(t, path, u); len(errs) > 0 {
			t.Error(errors.Join(errs...))
		}
		if analyze == "" {
			t.Logf("systemd-analyze is not installed: not rating %s", path)
			continue
		}
		// The threshold is on a scale of 100; the rating is printed in tenths: 20 is 2.0.
		out, err := exec.Command(analyze, "security", "--offline=yes", "--threshold=20", path).CombinedOutput()
		if err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			t.Errorf("systemd-analyze security %s: %v: %s", path, err, lines[len(lines)-1])
		}
	}
}

// TestSystemdChecksFail: the checks fail on broken units.
func TestSystemdChecksFail(t *testing.T) {
	b, err := os.ReadFile("systemd/converger-core.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ old, new, want string }{
		{"ProtectSystem=strict\n", "", "ProtectSystem=strict is missing"},
		{"Environment=ENCRYPTION_KEY_FILE=%d/ENCRYPTION_KEY\n", "Environment=ENCRYPTION_KEYS_FILE=%d/ENCRYPTION_KEY\n", "ENCRYPTION_KEY is required"},
		{"LoadCredential=TOKEN_SIGNING_KEY:/etc/converger/keys/TOKEN_SIGNING_KEY", "LoadCredential=TOKEN_SIGNING_KEY:/etc/converger/keys/signing", "a file the install steps do not create"},
	} {
		if !strings.Contains(string(b), tc.old) {
			t.Fatalf("test setup: %q is not in the unit", tc.old)
		}
		path := filepath.Join(t.TempDir(), "converger-core.service")
		if err := os.WriteFile(path, []byte(strings.Replace(string(b), tc.old, tc.new, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		u, err := parseUnit(path)
		if err != nil {
			t.Fatal(err)
		}
		u.envFiles = []string{"/etc/converger/core.env"}
		if all := errors.Join(checkUnit(t, path, u)...); all == nil || !strings.Contains(all.Error(), tc.want) {
			t.Errorf("%q -> %q: want an error containing %q, got %v", tc.old, tc.new, tc.want, all)
		}
	}
}
