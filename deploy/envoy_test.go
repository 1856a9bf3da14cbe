package deploy

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"

	"github.com/converger/edge/envoy"
	"github.com/converger/edge/sidecar/rls"
)

// envoyConfigArg is the bootstrap path of an Envoy's arguments (-c path).
func envoyConfigArg(args []string) (string, error) {
	i := slices.Index(args, "-c")
	if i < 0 || i+1 >= len(args) {
		return "", fmt.Errorf("no -c <bootstrap> in its arguments %v", args)
	}
	return args[i+1], nil
}

// readEnvoyBootstrap reads a bootstrap an Envoy container runs (path in the container,
// found through its mounts): it must be the file of envoy/ of that name, unchanged.
func readEnvoyBootstrap(c *container, path string) (*bootstrapv3.Bootstrap, error) {
	got, err := os.ReadFile(c.hostPath(path))
	if err != nil {
		return nil, fmt.Errorf("its bootstrap %s is not in its mounts: %w", path, err)
	}
	want, err := os.ReadFile(filepath.Join("..", "envoy", filepath.Base(path)))
	if err != nil || !bytes.Equal(got, want) {
		return nil, fmt.Errorf("its bootstrap %s is not envoy/%s of the repository", path, filepath.Base(path))
	}
	bootstraps.Lock()
	defer bootstraps.Unlock()
	if bs, ok := bootstraps.parsed[string(got)]; ok {
		return bs, nil
	}
	bs, err := envoy.ParseBootstrap(got)
	if err == nil {
		bootstraps.parsed[string(got)] = bs
	}
	return bs, err
}

// bootstraps are the bootstraps parsed so far, by content: the checks of every broken
// copy read the same ones, and only read them.
var bootstraps = struct {
	sync.Mutex
	parsed map[string]*bootstrapv3.Bootstrap
}{parsed: map[string]*bootstrapv3.Bootstrap{}}

// checkEnvoyPod checks what one bootstrap needs of the programs sharing Envoy's network
// namespace (members): every cluster it sends to is served there, but Envoy's own admin
// interface; and the domain of each global rate limit filter has rules in a sidecar of the
// namespace (RLS_CONFIG_DIR, loaded with the sidecar's own loader). It returns how many
// rate limit domains the bootstrap asks for.
func checkEnvoyPod(where, name string, bs *bootstrapv3.Bootstrap, containers map[string]*container, members []string) (int, []error) {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	sa := bs.GetAdmin().GetAddress().GetSocketAddress()
	admin := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	for _, cl := range bs.GetStaticResources().GetClusters() {
		for _, ep := range envoy.ClusterEndpoints(bs, cl.GetName()) {
			if ep != admin && !listensInPod(containers, members, ep) {
				fail("%s: %s sends cluster %q to %s, which nothing in the namespace (%s) listens on", where, name, cl.GetName(), ep, strings.Join(members, ", "))
			}
		}
	}
	domains, err := rateLimitDomains(bs)
	if err != nil {
		return 0, append(errs, fmt.Errorf("%s: %s: %w", where, name, err))
	}
	for _, domain := range domains {
		var dirs []string
		found := false
		for _, m := range members {
			c := containers[m]
			if c.program != "sidecar" || c.env["RLS_CONFIG_DIR"] == "" {
				continue
			}
			dirs = append(dirs, c.env["RLS_CONFIG_DIR"])
			if rules, err := rls.LoadDir(c.hostPath(c.env["RLS_CONFIG_DIR"])); err == nil && slices.Contains(rules.Domains(), domain) {
				found = true
			}
		}
		if !found {
			fail("%s: %s asks the rate limit service for domain %q, which no sidecar of the namespace has valid rules for (RLS_CONFIG_DIR: %v)", where, name, domain, dirs)
		}
	}
	return len(domains), errs
}

// rateLimitDomains are the domains of the global rate limit filters of a bootstrap's
// listeners.
func rateLimitDomains(bs *bootstrapv3.Bootstrap) ([]string, error) {
	var out []string
	for _, port := range envoy.ListenerPorts(bs) {
		hcm, err := envoy.ListenerHCM(bs, port)
		if err != nil {
			continue // not an HTTP listener
		}
		for _, f := range hcm.GetHttpFilters() {
			rl := &ratelimitv3.RateLimit{}
			if !f.GetTypedConfig().MessageIs(rl) {
				continue
			}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				return nil, fmt.Errorf("filter %s: %w", f.GetName(), err)
			}
			out = append(out, rl.GetDomain())
		}
	}
	return out, nil
}

// listensBeyondLoopback returns the addresses a serving program container listens on off
// loopback: the address variables it sets, else its image's defaults.
func listensBeyondLoopback(c *container) map[string]string {
	out := map[string]string{}
	if c.program == "core" && (len(c.args) == 0 || c.args[0] != "serve") || c.program == "sidecar" && len(c.args) > 0 {
		return out // a command: it listens on nothing
	}
	for _, v := range addressVars[c.program] {
		value := c.env[v]
		if value == "" {
			value = defaultAddr(c.program, v)
		}
		host, _, err := net.SplitHostPort(value)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			out[v] = value
		}
	}
	return out
}
