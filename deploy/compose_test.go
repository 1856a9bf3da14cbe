package deploy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/converger/edge/envoy"
)

const composeFile = "../docker-compose.yml"

// loadCompose parses a compose file (content; the file's name for messages) in the
// repository root, under the compose specification's schema, with environ as the
// interpolation environment (not changed).
func loadCompose(content []byte, environ map[string]string) (*types.Project, error) {
	environ = maps.Clone(environ)
	root, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, "docker-compose.yml"), Content: content}},
		Environment: environ,
	}, func(o *loader.Options) { o.SetProjectName("converger", true) })
}

// checkCompose checks a compose project against the Dockerfile, the binaries' config code
// and the Envoy bootstraps the services run, and returns every problem found, and how many
// Envoys run the global rate limit filter. volumes maps named volumes to directories
// standing in for them; services that write into one (the keys) are run.
func checkCompose(p *types.Project, volumes map[string]string) (rlsEnvoys int, errs []error) {
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	df, err := parseDockerfile("Dockerfile")
	if err != nil {
		return 0, []error{err}
	}

	// Images, builds and mounts.
	containers := map[string]*container{}
	names := p.ServiceNames() // sorted
	for _, name := range names {
		s := p.Services[name]
		where := "service " + name
		if err := pinnedImage(s.Image); err != nil {
			fail("%s: %v", where, err)
		}
		target := ""
		if s.Build != nil {
			target = s.Build.Target
			dfPath, _ := filepath.Rel(p.WorkingDir, filepath.Join(s.Build.Context, s.Build.Dockerfile))
			if filepath.Clean(dfPath) != filepath.Join("deploy", "Dockerfile") {
				fail("%s: builds %s; the images are built from deploy/Dockerfile", where, dfPath)
			} else if df.stage(target) == nil {
				fail("%s: build target %q is not a stage of deploy/Dockerfile", where, target)
			}
		}
		c := &container{where: where, program: programOf(s.Image, target), args: s.Command, env: map[string]string{}, mounts: map[string]string{}}
		for k, v := range s.Environment {
			if v != nil {
				c.env[k] = *v
			}
		}
		for _, v := range s.Volumes {
			switch v.Type {
			case types.VolumeTypeBind:
				if _, err := os.Stat(v.Source); err != nil {
					fail("%s: bind mount %s: %v", where, v.Source, err)
				}
				c.mounts[v.Target] = v.Source
			case types.VolumeTypeVolume:
				dir, ok := volumes[v.Source]
				if !ok {
					fail("%s: volume %q has no stand-in in this test", where, v.Source)
					continue
				}
				c.mounts[v.Target] = dir
			}
		}
		if c.program != "" {
			if len(s.Entrypoint) > 0 {
				fail("%s: overrides the entrypoint %v of the %s image", where, s.Entrypoint, c.program)
			}
			if len(c.args) == 0 && df.resolved(c.program) != nil {
				c.args = df.resolved(c.program).cmd
			}
		}
		containers[name] = c
	}

	// Run the services that write into volumes, in dependency order, before checking the
	// others: the keys must exist for the services that read them.
	var order []string
	_ = p.ForEachService(names, func(name string, _ *types.ServiceConfig) error {
		order = append(order, name)
		return nil
	})
	for _, name := range order {
		c := containers[name]
		if c.program == "" {
			continue
		}
		errs = append(errs, checkConfig(c)...)
	}

	// The pods: every service sharing a network namespace, with the namespace's owner.
	pods := map[string][]string{}
	for _, name := range names {
		owner := name
		if mode := p.Services[name].NetworkMode; strings.HasPrefix(mode, types.ServicePrefix) {
			owner = strings.TrimPrefix(mode, types.ServicePrefix)
			if p.Services[owner].NetworkMode != "" {
				fail("service %s: its namespace's owner %s has a network_mode itself", name, owner)
			}
			if len(p.Services[name].Ports) > 0 {
				fail("service %s: publishes ports in %s's namespace; publish them on %s", name, owner, owner)
			}
		}
		pods[owner] = append(pods[owner], name)
	}
	cores, sidecars := 0, 0
	for owner, members := range pods {
		// Envoy's bootstrap is one of envoy/, its upstreams are served in its namespace,
		// its rate limit domains have rules in the sidecar there.
		listeners := map[string]uint32{}
		for _, m := range members {
			if !strings.HasPrefix(p.Services[m].Image, "envoyproxy/envoy:") {
				continue
			}
			path, err := envoyConfigArg(containers[m].args)
			var bs *bootstrapv3.Bootstrap
			if err == nil {
				bs, err = readEnvoyBootstrap(containers[m], path)
			}
			if err != nil {
				fail("service %s: %v", m, err)
				continue
			}
			for name, port := range envoy.ListenerPorts(bs) {
				listeners[m+" "+name] = port
			}
			n, perrs := checkEnvoyPod("pod of "+owner, path, bs, containers, members)
			errs = append(errs, perrs...)
			if n > 0 {
				rlsEnvoys++
			}
		}
		if len(listeners) == 0 {
			continue
		}
		// Published ports: Envoy's public listener, never its admin interface.
		for _, port := range p.Services[owner].Ports {
			if !listenerOn(listeners, port.Target) && !listensInPod(containers, members, fmt.Sprintf("0.0.0.0:%d", port.Target)) {
				fail("service %s: publishes container port %d, which no listener of envoy.yaml or process of the namespace has", owner, port.Target)
			}
			if port.Target == 9901 {
				fail("service %s: publishes Envoy's admin interface (9901)", owner)
			}
			if port.HostIP != "127.0.0.1" {
				fail("service %s: publishes %d on %q; publish on 127.0.0.1 (put a proxy in front for more)", owner, port.Target, port.HostIP)
			}
		}
		for _, m := range members {
			c := containers[m]
			switch {
			case c.program == "core" && len(c.args) > 0 && c.args[0] == "serve":
				cores++
			case c.program == "sidecar":
				sidecars++
			}
		}
	}
	if cores == 0 || sidecars == 0 {
		fail("no pod with Envoy holds a core serving (%d) and a sidecar (%d)", cores, sidecars)
	}

	// The cluster: every name in CLUSTER_JOIN is a namespace with a sidecar bound there.
	for _, name := range names {
		c := containers[name]
		if c.program != "sidecar" || c.env["CLUSTER_JOIN"] == "" {
			continue
		}
		for _, peer := range strings.Split(c.env["CLUSTER_JOIN"], ",") {
			host, port, err := net.SplitHostPort(strings.TrimSpace(peer))
			if err != nil {
				fail("service %s: CLUSTER_JOIN entry %q: %v", name, peer, err)
				continue
			}
			if !slices.ContainsFunc(pods[host], func(m string) bool {
				mc := containers[m]
				_, bport, _ := net.SplitHostPort(mc.env["CLUSTER_BIND_ADDR"])
				return mc.program == "sidecar" && bport == port
			}) {
				fail("service %s: CLUSTER_JOIN names %s, but no sidecar is bound to port %s in the namespace of %q", name, peer, port, host)
			}
		}
	}
	return rlsEnvoys, errs
}

func listenerOn(listeners map[string]uint32, port uint32) bool {
	for _, p := range listeners {
		if p == port {
			return true
		}
	}
	return false
}

// listensInPod reports whether a program of the namespace listens on addr (host:port;
// 0.0.0.0 serves every address of the namespace, 127.0.0.1 only loopback).
func listensInPod(containers map[string]*container, members []string, addr string) bool {
	host, port, _ := net.SplitHostPort(addr)
	for _, m := range members {
		c := containers[m]
		for _, v := range addressVars[c.program] {
			value := c.env[v]
			if value == "" {
				value = defaultAddr(c.program, v)
			}
			h, p, err := net.SplitHostPort(value)
			if err == nil && p == port && (h == host || h == "0.0.0.0" || h == "" || h == "::") {
				return true
			}
		}
	}
	return false
}

// addressVars are the variables that say where a program listens.
var addressVars = map[string][]string{
	"core":    {"CORE_ADDR", "CORE_OPS_ADDR"},
	"sidecar": {"SIDECAR_GRPC_ADDR", "SIDECAR_HTTP_ADDR", "CLUSTER_BIND_ADDR"},
}

// defaultAddr is the address an image listens on when the variable is unset: the
// Dockerfile's ENV.
func defaultAddr(program, name string) string {
	df, err := parseDockerfile("Dockerfile")
	if err != nil {
		return ""
	}
	if s := df.resolved(program); s != nil {
		return s.env[name]
	}
	return ""
}

// volumeStandIns gives each named volume of p an empty directory.
func volumeStandIns(t *testing.T, p *types.Project) map[string]string {
	out := map[string]string{}
	for name := range p.Volumes {
		out[name] = t.TempDir()
	}
	return out
}

// composeRLS is the documented switch to Envoy's global rate limits (docker-compose.yml).
var composeRLS = map[string]string{"ENVOY_BOOTSTRAP": "envoy-ratelimit.yaml"}

func TestComposeFile(t *testing.T) {
	content, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	// As shipped (ext_authz), and with the switch to the rate limit service's bootstrap.
	for _, environ := range []map[string]string{{}, composeRLS} {
		want := 3 * len(environ) // every Envoy with the switch, none without
		p, err := loadCompose(content, environ)
		if err != nil {
			t.Fatalf("docker-compose.yml (%v) does not load under the compose specification: %v", environ, err)
		}
		rlsEnvoys, errs := checkCompose(p, volumeStandIns(t, p))
		if len(errs) > 0 {
			t.Fatalf("docker-compose.yml (%v):\n%v", environ, errors.Join(errs...))
		}
		if rlsEnvoys != want {
			t.Errorf("docker-compose.yml (%v): %d Envoys run the global rate limit filter, want %d", environ, rlsEnvoys, want)
		}
	}
	// The defaults are the only credential, and they say so.
	if !strings.Contains(string(content), "${POSTGRES_PASSWORD:-development-only-password}") {
		t.Error("PostgreSQL's password is not the marked development default taken from POSTGRES_PASSWORD")
	}
}

// TestComposeChecksFail: each check can fail, on a broken copy of the file.
func TestComposeChecksFail(t *testing.T) {
	content, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	// A copy of the rules with a mistake, for the sidecars' rule directory.
	badRules := t.TempDir()
	if err := os.WriteFile(filepath.Join(badRules, "edge.yaml"), []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		old, new string
		environ  map[string]string
		want     string
	}{
		{"a missing core service", "  core-1:\n    <<: *core\n    network_mode: service:envoy-1\n", "  core-1:\n    <<: *core\n    network_mode: service:envoy-1\n    profiles: [never]\n", nil,
			`sends cluster "core" to 127.0.0.1:8080, which nothing in the namespace`},
		{"an unknown variable", "      CLUSTER_NODE_NAME: sidecar-2\n", "      CLUSTER_NODE_NAME: sidecar-2\n      CLUSTER_NODE_NAMES: x\n", nil,
			"CLUSTER_NODE_NAMES is not a variable sidecar reads"},
		{"a variable the configuration ignores", "  CLUSTER_STRATEGY: static\n", "  CLUSTER_STRATEGY: static\n  CLUSTER_DNS_NAME: peers\n", nil,
			"CLUSTER_DNS_NAME is not a variable sidecar reads"},
		{"an untagged image", "image: postgres:15.18", "image: postgres", nil, `image "postgres" has no tag`},
		{"a rolling tag", "image: envoyproxy/envoy:v1.36.4", "image: envoyproxy/envoy:v1.36-latest", nil, "is not a version"},
		{"a build target the Dockerfile lacks", "target: sidecar,", "target: sidecars,", nil, `build target "sidecars" is not a stage`},
		{"a key file nothing writes", "TOKEN_SIGNING_KEY_FILE: /keys/TOKEN_SIGNING_KEY", "TOKEN_SIGNING_KEY_FILE: /keys/token-signing-key", nil,
			"TOKEN_SIGNING_KEY_FILE: open"},
		{"a value the binary refuses", "LIMITER_ADDR: 127.0.0.1:8081 ", "LIMITER_ADDR: sidecar ", nil, `LIMITER_ADDR="sidecar": must be host:port`},
		{"Envoy's admin published", `"127.0.0.1:10001:10000"`, `"127.0.0.1:10001:10000", "127.0.0.1:9901:9901"`, nil, "publishes Envoy's admin interface"},
		{"a port open to the network", `"127.0.0.1:10002:10000"`, `"10002:10000"`, nil, "publish on 127.0.0.1"},
		{"the core's ops port published but not served", "  CORE_OPS_ADDR: 0.0.0.0:8083", "  CORE_OPS_ADDR: 127.0.0.1:8083", nil,
			"publishes container port 8083, which no listener"},
		{"a sidecar outside Envoy's namespace", "    network_mode: service:envoy-3\n    environment:\n      <<: *sidecar-environment",
			"    environment:\n      <<: *sidecar-environment", nil, `sends cluster "sidecar_authz" to 127.0.0.1:8081`},
		{"a peer that is not there", "CLUSTER_JOIN: envoy-1:7946,", "CLUSTER_JOIN: envoy-9:7946,", nil, "CLUSTER_JOIN names envoy-9:7946"},
		{"a bootstrap that is not mounted", "/etc/envoy/envoy-ratelimit.yaml:ro", "/etc/envoy/envoy-rls.yaml:ro", composeRLS,
			"its bootstrap /etc/envoy/envoy-ratelimit.yaml is not in its mounts"},
		{"a bootstrap that is not the repository's", "./envoy/envoy-ratelimit.yaml:/etc/envoy/envoy-ratelimit.yaml", "./envoy/envoy.yaml:/etc/envoy/envoy-ratelimit.yaml", composeRLS,
			"is not envoy/envoy-ratelimit.yaml of the repository"},
		{"the rate limit service without rules", "  RLS_CONFIG_DIR: /etc/converger/ratelimit\n", "", composeRLS,
			`asks the rate limit service for domain "edge", which no sidecar of the namespace has valid rules for`},
		{"a rule file with a mistake", "./envoy/ratelimit:/etc/converger/ratelimit", badRules + ":/etc/converger/ratelimit", nil,
			`edge.yaml: line 4: descriptors[0].rate_limit: invalid rate limit unit 'fortnight'`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if n := strings.Count(string(content), tc.old); n < 1 {
				t.Fatalf("test setup: %q is not in docker-compose.yml", tc.old)
			}
			broken := strings.Replace(string(content), tc.old, tc.new, 1)
			p, err := loadCompose([]byte(broken), tc.environ)
			var errs []error
			if err != nil {
				errs = []error{err}
			} else {
				_, errs = checkCompose(p, volumeStandIns(t, p))
			}
			all := errors.Join(errs...)
			if all == nil || !strings.Contains(all.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got:\n%v", tc.want, all)
			}
		})
	}
}
