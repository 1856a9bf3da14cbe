package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// stage is one stage of a Dockerfile.
type stage struct {
	name, from string
	user       string   // the last USER
	entrypoint []string // the last ENTRYPOINT (exec form)
	cmd        []string // the last CMD (exec form)
	env        map[string]string
}

// dockerfile is a parsed Dockerfile: its stages by name, in order.
type dockerfile struct {
	stages []*stage
}

func (d *dockerfile) stage(name string) *stage {
	for _, s := range d.stages {
		if s.name == name {
			return s
		}
	}
	return nil
}

// resolved returns a stage with what it inherits from the stages it is built FROM.
func (d *dockerfile) resolved(name string) *stage {
	s := d.stage(name)
	if s == nil {
		return nil
	}
	out := &stage{name: s.name, from: s.from, env: map[string]string{}}
	if parent := d.resolved(s.from); parent != nil && parent.name != name {
		*out = *parent
		out.name, out.from, out.env = s.name, s.from, map[string]string{}
		for k, v := range parent.env {
			out.env[k] = v
		}
	}
	if s.user != "" {
		out.user = s.user
	}
	if s.entrypoint != nil {
		out.entrypoint, out.cmd = s.entrypoint, nil // a new ENTRYPOINT resets CMD
	}
	if s.cmd != nil {
		out.cmd = s.cmd
	}
	for k, v := range s.env {
		out.env[k] = v
	}
	return out
}

var envPairRe = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S+)`)

// parseDockerfile reads the instructions the checks need: FROM ... AS, USER, ENTRYPOINT
// and CMD in exec form, ENV NAME=value. Continuation lines are joined.
func parseDockerfile(path string) (*dockerfile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	var cur strings.Builder
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") && cur.Len() == 0 || line == "" {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	d := &dockerfile{}
	var s *stage
	for _, line := range lines {
		word, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(word) {
		case "FROM":
			f := strings.Fields(rest)
			s = &stage{from: f[0], env: map[string]string{}}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			d.stages = append(d.stages, s)
		case "USER":
			s.user = rest
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				return nil, fmt.Errorf("%s: %s must be in exec form (a JSON list): %s", path, word, rest)
			}
			if strings.EqualFold(word, "ENTRYPOINT") {
				s.entrypoint = v
			} else {
				s.cmd = v
			}
		case "ENV":
			for _, m := range envPairRe.FindAllStringSubmatch(rest, -1) {
				s.env[m[1]] = strings.Trim(m[2], `"`)
			}
		}
	}
	if len(d.stages) == 0 {
		return nil, fmt.Errorf("%s: no FROM", path)
	}
	return d, nil
}

// pinnedImage reports what is wrong with an image reference, if anything: it must name a
// tag with a version (not latest, not a rolling *-latest) or a digest.
func pinnedImage(ref string) error {
	if ref == "scratch" || strings.Contains(ref, "@sha256:") {
		return nil
	}
	slash := strings.LastIndexByte(ref, '/')
	colon := strings.LastIndexByte(ref, ':')
	if colon < slash+1 {
		return fmt.Errorf("image %q has no tag: it would be whatever :latest is at the time", ref)
	}
	tag := ref[colon+1:]
	if tag == "latest" || strings.HasSuffix(tag, "-latest") || !regexp.MustCompile(`\d`).MatchString(tag) {
		return fmt.Errorf("image %q: tag %q is not a version (pin one, such as 1.2.3, or a digest)", ref, tag)
	}
	return nil
}

func TestDockerfile(t *testing.T) {
	d, err := parseDockerfile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.stages {
		if d.stage(s.from) == nil {
			if err := pinnedImage(s.from); err != nil {
				t.Errorf("stage %q: %v", s.name, err)
			}
		}
	}
	for _, target := range []string{"core", "sidecar"} {
		s := d.resolved(target)
		if s == nil {
			t.Errorf("no stage %q", target)
			continue
		}
		if s.user == "" || strings.HasPrefix(s.user, "0") || strings.HasPrefix(s.user, "root") {
			t.Errorf("stage %q runs as %q, want a non-root user", target, s.user)
		}
		if len(s.entrypoint) == 0 || !strings.HasSuffix(s.entrypoint[0], "/"+target) {
			t.Errorf("stage %q: entrypoint %v, want the %s binary", target, s.entrypoint, target)
		}
	}
	// The images listen beyond loopback inside the container.
	for target, vars := range map[string][]string{"core": {"CORE_ADDR", "CORE_OPS_ADDR"}, "sidecar": {"SIDECAR_GRPC_ADDR", "SIDECAR_HTTP_ADDR"}} {
		for _, v := range vars {
			if got := d.resolved(target).env[v]; !strings.HasPrefix(got, "0.0.0.0:") {
				t.Errorf("stage %q: %s=%q, want 0.0.0.0:<port>", target, v, got)
			}
		}
	}
	// Every ENV of an image is a variable its program reads and accepts.
	for _, target := range []string{"core", "sidecar"} {
		c := &container{where: "Dockerfile stage " + target, program: target, args: d.resolved(target).cmd, env: map[string]string{}}
		for k, v := range d.resolved(target).env {
			c.env[k] = v
		}
		if target == "core" {
			c.args = []string{"migrate"} // serving needs the keys too; the variables are the same
			c.env["DATABASE_URL"] = "postgres://converger@db.example.com/converger"
		}
		for _, err := range checkConfig(c) {
			t.Error(err)
		}
	}
	for _, bad := range []string{"golang", "golang:latest", "envoyproxy/envoy:v1.36-latest", "registry:5000/app", "postgres:alpine"} {
		if pinnedImage(bad) == nil {
			t.Errorf("pinnedImage(%q) accepted an unpinned image", bad)
		}
	}
	for _, good := range []string{"golang:1.26.8-bookworm", "registry:5000/app:1.2", "envoyproxy/envoy:v1.36.4", "x@sha256:abc"} {
		if err := pinnedImage(good); err != nil {
			t.Errorf("pinnedImage(%q): %v", good, err)
		}
	}
}

// TestDockerignore: the build context leaves out what must never be in an image.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	for _, want := range []string{".git", ".data", "bin"} {
		if !lines[want] {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}
}
