package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
// file shipped for its EnvironmentFile= (in examples), and its credentials made by the
// install steps; then again with the example's commented-out settings (#NAME=value) on,
// with the directories the install steps fill.
func checkUnit(t *testing.T, path, examples string, u *unit) []error {
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
	commented := map[string]string{}
	for _, ef := range u.envFiles {
		example := filepath.Join(examples, strings.TrimSuffix(filepath.Base(ef), ".env")+".env.example")
		b, err := os.ReadFile(example)
		if err != nil {
			fail("%s: EnvironmentFile=%s has no example %s: %v", path, ef, example, err)
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if m := commentedSettingRe.FindStringSubmatch(line); m != nil {
				commented[m[1]] = m[2]
			} else if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(line, "#") {
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
	errs = append(errs, checkConfig(c)...)
	if len(commented) == 0 {
		return errs
	}
	readme, err := os.ReadFile(filepath.Join(examples, "README.md"))
	if err != nil {
		return append(errs, err)
	}
	on := &container{where: path + " with the commented settings of its env file", program: c.program, args: c.args, env: maps.Clone(c.env), mounts: map[string]string{}}
	for _, m := range installDirRe.FindAllStringSubmatch(string(readme), -1) {
		on.mounts[m[2]] = filepath.Join("..", m[1])
	}
	maps.Copy(on.env, commented)
	return append(errs, checkConfig(on)...)
}

var (
	// commentedSettingRe is a setting an example env file leaves commented out.
	commentedSettingRe = regexp.MustCompile(`^#([A-Z][A-Z0-9_]*)=(.*)$`)
	// installDirRe is an install step that copies the rule files of a directory of the
	// repository into a directory of the host: install -m 0644 SRC/*.yaml DEST/
	installDirRe = regexp.MustCompile(`install -m \d+ (\S+)/\*\.yaml (/\S+?)/?(?:\s|$)`)
)

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
		if errs := checkUnit(t, path, "systemd", u); len(errs) > 0 {
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
		if all := errors.Join(checkUnit(t, path, "systemd", u)...); all == nil || !strings.Contains(all.Error(), tc.want) {
			t.Errorf("%q -> %q: want an error containing %q, got %v", tc.old, tc.new, tc.want, all)
		}
	}

	// Broken copies of the sidecar's example env file and the install steps.
	u, err := parseUnit("systemd/converger-sidecar.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, old, new, want string }{
		{"sidecar.env.example", "#RLS_CONFIG_DIR=", "#RLS_CONFIG_DIRECTORY=", "RLS_CONFIG_DIRECTORY is not a variable sidecar reads"},
		{"sidecar.env.example", "#CLUSTER_JOIN=10.0.0.1:7946,", "#CLUSTER_JOIN=10.0.0.1,", `CLUSTER_JOIN: "10.0.0.1"`},
		{"sidecar.env.example", "SIDECAR_HTTP_ADDR=127.0.0.1:8082", "SIDECAR_HTTP_ADDRESS=127.0.0.1:8082", "SIDECAR_HTTP_ADDRESS is not a variable"},
		{"README.md", "install -m 0644 envoy/ratelimit/*.yaml", "install -m 0644 envoy/limits/*.yaml", "RLS_CONFIG_DIR ../envoy/limits"},
	} {
		dir := t.TempDir()
		for _, name := range []string{"sidecar.env.example", "README.md"} {
			b, err := os.ReadFile(filepath.Join("systemd", name))
			if err != nil {
				t.Fatal(err)
			}
			if name == tc.file {
				if !strings.Contains(string(b), tc.old) {
					t.Fatalf("test setup: %q is not in %s", tc.old, name)
				}
				b = []byte(strings.Replace(string(b), tc.old, tc.new, 1))
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if all := errors.Join(checkUnit(t, "converger-sidecar.service", dir, u)...); all == nil || !strings.Contains(all.Error(), tc.want) {
			t.Errorf("%s: %q -> %q: want an error containing %q, got %v", tc.file, tc.old, tc.new, tc.want, all)
		}
	}
}
