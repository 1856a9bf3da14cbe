package envoy

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/rls"

	// Every type that appears in a typed_config of a config under envoy/ must be registered,
	// or protojson cannot resolve the Any. Add the package here when a config uses a new one.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// The contract between the bootstrap configs and the rest of the system (DESIGN.md §1, §7).
const (
	sidecarCluster  = "sidecar_authz"
	coreCluster     = "core"
	extAuthzFilter  = "envoy.filters.http.ext_authz"
	rateLimitFilter = "envoy.filters.http.ratelimit"
	rlsCluster      = "sidecar_rls"
	// rulesDir holds the rate limit service's rules of the bootstraps with the global rate
	// limit filter: rule files, not bootstraps.
	rulesDir           = "ratelimit"
	routerFilter       = "envoy.filters.http.router"
	upstreamHTTPOptKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// Request headers the sidecar reads; if a config restricts the headers ext_authz sends, these
// must all get through.
var sidecarHeaders = []string{"x-api-key", "authorization", "x-request-id", "x-forwarded-for", "content-type"}

// Route prefixes that must reach the core.
var coreRoutePrefixes = []string{"/api/", "/admin/", "/portal/", "/socket/"}

// Paths that must reach the core exactly as written (core_links_test.go checks every link
// and redirect the core emits).
var corePaths = []string{"/admin", "/portal", "/admin/login", "/api/v1/conversations", "/socket/websocket"}

// TestBootstrapFiles validates every *.yaml under envoy/ (recursively), so that new bootstrap
// variants are covered as soon as they are added.
func TestBootstrapFiles(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path == rulesDir {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no *.yaml bootstrap found under envoy/")
	}
	rules, err := rls.LoadDir(rulesDir)
	if err != nil {
		t.Fatalf("the rules of %s/ are not valid:\n%v", rulesDir, err)
	}
	withRLS := 0
	for _, path := range files {
		t.Run(path, func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			bs, err := loadBootstrap(raw)
			if err != nil {
				t.Fatalf("%s is not a valid Envoy bootstrap:\n%v", path, err)
			}
			if err := checkSidecarContract(bs); err != nil {
				t.Fatalf("%s breaks the edge contract:\n%v", path, err)
			}
			n, err := checkRateLimitContract(bs, rules)
			if err != nil {
				t.Fatalf("%s breaks the rate limit service's contract:\n%v", path, err)
			}
			withRLS += n
		})
	}
	if withRLS == 0 {
		t.Errorf("no bootstrap under envoy/ has the %s filter", rateLimitFilter)
	}
}

// validateBootstrap reports whether yamlBytes is a bootstrap Envoy would accept, as far as its
// protos and their validation rules can tell.
func validateBootstrap(yamlBytes []byte) error {
	_, err := loadBootstrap(yamlBytes)
	return err
}

// loadBootstrap parses a YAML bootstrap and checks it:
//  1. YAML to JSON, then protojson into bootstrapv3.Bootstrap with unknown fields rejected (also
//     inside every typed_config, whose type must be registered);
//  2. ValidateAll (the protoc-gen-validate rules) on the bootstrap and on every message held in
//     a google.protobuf.Any anywhere in the tree, since the generated validation stops at Any;
//  3. every cluster a route or an Envoy gRPC service names exists in static_resources.clusters,
//     and cluster and listener names are unique.
func loadBootstrap(yamlBytes []byte) (*bootstrapv3.Bootstrap, error) {
	bs, err := ParseBootstrap(yamlBytes)
	if err != nil {
		return nil, err
	}

	var errs []error
	if err := bs.ValidateAll(); err != nil {
		errs = append(errs, fmt.Errorf("bootstrap: %w", err))
	}

	var refs []clusterRef
	walkErr := walkMessages(bs.ProtoReflect(), "", func(path string, m proto.Message, unpacked bool) {
		if unpacked {
			if v, ok := m.(interface{ ValidateAll() error }); ok {
				if err := v.ValidateAll(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", path, err))
				}
			}
		}
		refs = append(refs, clusterRefs(path, m)...)
	})
	if walkErr != nil {
		errs = append(errs, walkErr)
	}

	clusters := map[string]bool{}
	for i, c := range bs.GetStaticResources().GetClusters() {
		if clusters[c.GetName()] {
			errs = append(errs, fmt.Errorf("static_resources.clusters[%d]: duplicate cluster name %q", i, c.GetName()))
		}
		clusters[c.GetName()] = true
	}
	listeners := map[string]bool{}
	for i, l := range bs.GetStaticResources().GetListeners() {
		if l.GetName() == "" {
			continue // Envoy names unnamed listeners itself
		}
		if listeners[l.GetName()] {
			errs = append(errs, fmt.Errorf("static_resources.listeners[%d]: duplicate listener name %q", i, l.GetName()))
		}
		listeners[l.GetName()] = true
	}
	for _, r := range refs {
		if !clusters[r.name] {
			errs = append(errs, fmt.Errorf("%s: cluster %q is not defined in static_resources.clusters", r.path, r.name))
		}
	}

	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return bs, nil
}

// walkMessages calls visit for m and for every message below it, in fields, lists and map
// values. A google.protobuf.Any is unpacked with the global type registry; its content is
// visited with unpacked=true and walked in turn, so Any inside Any is reached too. Paths use the
// proto field names, with the Any's type in parentheses.
func walkMessages(m protoreflect.Message, path string, visit func(path string, m proto.Message, unpacked bool)) error {
	var errs []error
	var walk func(m protoreflect.Message, path string, unpacked bool)
	walk = func(m protoreflect.Message, path string, unpacked bool) {
		if a, ok := m.Interface().(*anypb.Any); ok {
			inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: cannot unpack %s: %w", path, a.GetTypeUrl(), err))
				return
			}
			path = fmt.Sprintf("%s(%s)", path, inner.ProtoReflect().Descriptor().FullName())
			m, unpacked = inner.ProtoReflect(), true
		}
		visit(path, m.Interface(), unpacked)
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			p := join(path, string(fd.Name()))
			switch {
			case fd.IsList() && fd.Message() != nil:
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					walk(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i), false)
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message(), fmt.Sprintf("%s[%s]", p, k.String()), false)
					return true
				})
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message(), p, false)
			}
			return true
		})
	}
	walk(m, path, false)
	return errors.Join(errs...)
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

type clusterRef struct{ path, name string }

// clusterRefs returns the clusters that m names by reference. Extend it when a config starts
// using another kind of reference (tcp_proxy, thrift routes, ...). Empty names are left to the
// validation rules of each message.
func clusterRefs(path string, m proto.Message) []clusterRef {
	var refs []clusterRef
	add := func(field, name string) {
		if name != "" {
			refs = append(refs, clusterRef{join(path, field), name})
		}
	}
	switch m := m.(type) {
	case *routev3.RouteAction:
		add("cluster", m.GetCluster())
		for i, w := range m.GetWeightedClusters().GetClusters() {
			add(fmt.Sprintf("weighted_clusters.clusters[%d].name", i), w.GetName())
		}
		for i, mp := range m.GetRequestMirrorPolicies() {
			add(fmt.Sprintf("request_mirror_policies[%d].cluster", i), mp.GetCluster())
		}
	case *corev3.GrpcService_EnvoyGrpc:
		add("cluster_name", m.GetClusterName())
	case *corev3.HttpUri:
		add("cluster", m.GetCluster())
	}
	return refs
}

// checkSidecarContract asserts what the rest of the system relies on: every HTTP connection
// manager asks the sidecar (ext_authz, transport V3, over the HTTP/2 cluster sidecar_authz)
// before the router, the router is the last filter, the sidecar gets the headers it reads, and
// the API prefixes reach the core.
func checkSidecarContract(bs *bootstrapv3.Bootstrap) error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	hcms, err := connectionManagers(bs)
	if err != nil {
		return err
	}
	// Listeners that never reach the core (the probe listener) need no Check.
	for where, hcm := range hcms {
		if !routesTo(hcm.GetRouteConfig(), coreCluster) {
			delete(hcms, where)
		}
	}
	if len(hcms) == 0 {
		return errors.New("no listener has an http_connection_manager that routes to the core")
	}
	for where, hcm := range hcms {
		filters := hcm.GetHttpFilters()
		authzAt, routerAt := -1, -1
		for i, f := range filters {
			switch f.GetName() {
			case extAuthzFilter:
				if authzAt >= 0 {
					fail("%s: %s appears twice", where, extAuthzFilter)
				}
				authzAt = i
			case routerFilter:
				routerAt = i
			}
		}
		switch {
		case routerAt < 0:
			fail("%s: no %s filter", where, routerFilter)
		case routerAt != len(filters)-1:
			fail("%s: %s is filter %d of %d, it must be last", where, routerFilter, routerAt+1, len(filters))
		}
		if authzAt < 0 {
			fail("%s: no %s filter", where, extAuthzFilter)
			continue
		}
		if routerAt >= 0 && authzAt > routerAt {
			fail("%s: %s runs after the router", where, extAuthzFilter)
		}
		authz := &extauthzv3.ExtAuthz{}
		if err := filters[authzAt].GetTypedConfig().UnmarshalTo(authz); err != nil {
			fail("%s: %s typed_config is not an ExtAuthz: %v", where, extAuthzFilter, err)
			continue
		}
		if v := authz.GetTransportApiVersion(); v != corev3.ApiVersion_V3 {
			fail("%s: ext_authz transport_api_version is %v, want V3", where, v)
		}
		if c := authz.GetGrpcService().GetEnvoyGrpc().GetClusterName(); c != sidecarCluster {
			fail("%s: ext_authz grpc_service.envoy_grpc.cluster_name is %q, want %q", where, c, sidecarCluster)
		}
		for _, h := range sidecarHeaders {
			if !headerSent(authz, h) {
				fail("%s: ext_authz does not send the %q header the sidecar reads", where, h)
			}
		}
		for _, prefix := range coreRoutePrefixes {
			if !routesPrefixTo(hcm.GetRouteConfig(), prefix, coreCluster) {
				fail("%s: no route sends prefix %q to cluster %q", where, prefix, coreCluster)
			}
		}
		for _, path := range corePaths {
			if m, ok, err := routeOf(hcm, "GET", path); err != nil || !ok || m.Cluster != coreCluster {
				fail("%s: GET %s goes to %+v (matched %v, %v), not to cluster %q", where, path, m, ok, err, coreCluster)
			}
		}
	}

	if err := checkHTTP2Cluster(bs, sidecarCluster); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkRateLimitContract asserts, for every http_connection_manager with Envoy's global rate
// limit filter, what the sidecar's rate limit service relies on: the filter asks
// ShouldRateLimit over transport V3 on the HTTP/2 cluster sidecar_rls before the router, in
// a domain of the rules in envoy/ratelimit/; and every descriptor a route's rate_limits
// build is limited by one of those rules (or explicitly unlimited), as the sidecar decides
// it. It returns how many connection managers have the filter.
func checkRateLimitContract(bs *bootstrapv3.Bootstrap, rules *rls.Rules) (int, error) {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	hcms, err := connectionManagers(bs)
	if err != nil {
		return 0, err
	}
	n := 0
	for where, hcm := range hcms {
		filters := hcm.GetHttpFilters()
		at := -1
		for i, f := range filters {
			if f.GetName() == rateLimitFilter {
				at = i
			}
		}
		if at < 0 {
			continue
		}
		n++
		if at != len(filters)-2 || filters[len(filters)-1].GetName() != routerFilter {
			fail("%s: %s must be the filter just before the router", where, rateLimitFilter)
		}
		rl := &ratelimitv3.RateLimit{}
		if err := filters[at].GetTypedConfig().UnmarshalTo(rl); err != nil {
			fail("%s: %s typed_config is not a RateLimit: %v", where, rateLimitFilter, err)
			continue
		}
		svc := rl.GetRateLimitService()
		if v := svc.GetTransportApiVersion(); v != corev3.ApiVersion_V3 {
			fail("%s: rate_limit_service transport_api_version is %v, want V3", where, v)
		}
		if c := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName(); c != rlsCluster {
			fail("%s: rate_limit_service grpc_service.envoy_grpc.cluster_name is %q, want %q", where, c, rlsCluster)
		}
		if !slices.Contains(rules.Domains(), rl.GetDomain()) {
			fail("%s: domain %q has no rules in envoy/%s/ (domains: %v)", where, rl.GetDomain(), rulesDir, rules.Domains())
			continue
		}
		decider := rls.New(limiter.New(limiter.Options{}), rules, rls.Options{})
		limited := 0
		for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
			for ri, r := range vh.GetRoutes() {
				for li, l := range append(slices.Clone(vh.GetRateLimits()), r.GetRoute().GetRateLimits()...) {
					at := fmt.Sprintf("%s: virtual host %q route %d rate_limits[%d]", where, vh.GetName(), ri, li)
					if l.GetStage().GetValue() != rl.GetStage() {
						continue
					}
					d, err := descriptorOf(l)
					if err != nil {
						fail("%s: %v", at, err)
						continue
					}
					var resp rls.Response
					req := rls.Request{Domain: rl.GetDomain(), Descriptors: []rls.Descriptor{d}}
					if err := decider.Decide(&req, &resp); err != nil {
						fail("%s: %v", at, err)
						continue
					}
					if st := resp.Statuses[0]; !st.HasLimit && st.Remaining != math.MaxUint32 {
						fail("%s: the descriptor %v matches no rule with a limit in domain %q", at, d.Entries, rl.GetDomain())
					}
					limited++
				}
			}
		}
		if limited == 0 {
			fail("%s: no route has rate_limits: the filter would never ask the sidecar", where)
		}
	}
	if err := checkHTTP2Cluster(bs, rlsCluster); n > 0 && err != nil {
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// descriptorOf is the descriptor Envoy builds from a route's rate limit actions, with a
// sample value where the request supplies it.
func descriptorOf(l *routev3.RateLimit) (rls.Descriptor, error) {
	var d rls.Descriptor
	for _, a := range l.GetActions() {
		switch {
		case a.GetRemoteAddress() != nil:
			d.Entries = append(d.Entries, rls.Entry{Key: "remote_address", Value: "192.0.2.10"})
		case a.GetGenericKey() != nil:
			g := a.GetGenericKey()
			key := g.GetDescriptorKey()
			if key == "" {
				key = "generic_key"
			}
			d.Entries = append(d.Entries, rls.Entry{Key: key, Value: g.GetDescriptorValue()})
		case a.GetRequestHeaders() != nil:
			d.Entries = append(d.Entries, rls.Entry{Key: a.GetRequestHeaders().GetDescriptorKey(), Value: "https://shop.example"})
		case a.GetHeaderValueMatch() != nil:
			d.Entries = append(d.Entries, rls.Entry{Key: "header_match", Value: a.GetHeaderValueMatch().GetDescriptorValue()})
		default:
			return d, fmt.Errorf("action %v: this test does not know what descriptor Envoy builds for it; teach descriptorOf", a)
		}
	}
	return d, nil
}

// connectionManagers unpacks every http_connection_manager of the static listeners, keyed by
// where it sits.
func connectionManagers(bs *bootstrapv3.Bootstrap) (map[string]*hcmv3.HttpConnectionManager, error) {
	out := map[string]*hcmv3.HttpConnectionManager{}
	for li, l := range bs.GetStaticResources().GetListeners() {
		chains := l.GetFilterChains()
		if l.GetDefaultFilterChain() != nil {
			chains = append(append([]*listenerv3.FilterChain{}, chains...), l.GetDefaultFilterChain())
		}
		for ci, fc := range chains {
			for fi, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if !f.GetTypedConfig().MessageIs(hcm) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					return nil, err
				}
				out[fmt.Sprintf("listener %q (#%d) chain %d filter %d", l.GetName(), li, ci, fi)] = hcm
			}
		}
	}
	return out, nil
}

func checkHTTP2Cluster(bs *bootstrapv3.Bootstrap, name string) error {
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != name {
			continue
		}
		opts := &upstreamhttpv3.HttpProtocolOptions{}
		a, ok := c.GetTypedExtensionProtocolOptions()[upstreamHTTPOptKey]
		if !ok {
			return fmt.Errorf("cluster %q: no %s, so Envoy would speak HTTP/1.1 to a gRPC server", name, upstreamHTTPOptKey)
		}
		if err := a.UnmarshalTo(opts); err != nil {
			return fmt.Errorf("cluster %q: %w", name, err)
		}
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			return fmt.Errorf("cluster %q: explicit_http_config is not http2_protocol_options; gRPC needs HTTP/2", name)
		}
		return nil
	}
	return fmt.Errorf("cluster %q is not defined", name)
}

// headerSent reports whether ext_authz forwards request header h to a gRPC authorization
// service: all headers when allowed_headers is unset, else those it matches, minus those
// disallowed_headers matches.
func headerSent(authz *extauthzv3.ExtAuthz, h string) bool {
	if authz.GetDisallowedHeaders() != nil && listMatches(authz.GetDisallowedHeaders(), h) {
		return false
	}
	if authz.GetAllowedHeaders() == nil {
		return true
	}
	return listMatches(authz.GetAllowedHeaders(), h)
}

func listMatches(l *matcherv3.ListStringMatcher, s string) bool {
	for _, p := range l.GetPatterns() {
		if stringMatches(p, s) {
			return true
		}
	}
	return false
}

func stringMatches(m *matcherv3.StringMatcher, s string) bool {
	fold := func(x string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(x)
		}
		return x
	}
	v := fold(s)
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return v == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(v, fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(v, fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(v, fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile("^(?:" + p.SafeRegex.GetRegex() + ")$")
		return err == nil && re.MatchString(s)
	}
	return false
}

// routeOf matches a request against one connection manager's routes.
func routeOf(hcm *hcmv3.HttpConnectionManager, method, path string) (Match, bool, error) {
	a, err := anypb.New(hcm)
	if err != nil {
		return Match{}, false, err
	}
	bs := &bootstrapv3.Bootstrap{StaticResources: &bootstrapv3.Bootstrap_StaticResources{Listeners: []*listenerv3.Listener{{
		Address:      &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 1}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}}}},
	}}}}
	return RouteRequest(bs, 1, method, "edge.test", path)
}

func routesTo(rc *routev3.RouteConfiguration, cluster string) bool {
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if r.GetRoute().GetCluster() == cluster {
				return true
			}
		}
	}
	return false
}

func routesPrefixTo(rc *routev3.RouteConfiguration, prefix, cluster string) bool {
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if r.GetMatch().GetPrefix() == prefix && r.GetRoute().GetCluster() == cluster {
				return true
			}
		}
	}
	return false
}

// --- negative tests: the validator must be able to fail ---

// minimalBootstrap passes validateBootstrap and checkSidecarContract; each negative case breaks
// exactly one thing in it.
const minimalBootstrap = `
static_resources:
  listeners:
    - name: edge
      address: { socket_address: { address: 127.0.0.1, port_value: 10000 } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: edge
                use_remote_address: true
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - { match: { prefix: /api/ }, route: { cluster: core } }
                        - { match: { path: /admin }, route: { cluster: core } }
                        - { match: { prefix: /admin/ }, route: { cluster: core } }
                        - { match: { path: /portal }, route: { cluster: core } }
                        - { match: { prefix: /portal/ }, route: { cluster: core } }
                        - { match: { prefix: /socket/ }, route: { cluster: core } }
                http_filters:
                  - name: envoy.filters.http.ext_authz
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
                      transport_api_version: V3
                      grpc_service: { envoy_grpc: { cluster_name: sidecar_authz }, timeout: 0.25s }
                      status_on_error: { code: ServiceUnavailable }
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: core
      connect_timeout: 1s
      load_assignment:
        cluster_name: core
        endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 8080 } } } }] }]
    - name: sidecar_authz
      connect_timeout: 0.25s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: { http2_protocol_options: {} }
      load_assignment:
        cluster_name: sidecar_authz
        endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 8081 } } } }] }]
`

// mutate replaces old with new in minimalBootstrap, failing if old is not there exactly once.
func mutate(t *testing.T, old, new string) []byte {
	t.Helper()
	if n := strings.Count(minimalBootstrap, old); n != 1 {
		t.Fatalf("test setup: %q occurs %d times in minimalBootstrap, want 1", old, n)
	}
	return []byte(strings.Replace(minimalBootstrap, old, new, 1))
}

func TestMinimalBootstrapIsValid(t *testing.T) {
	bs, err := loadBootstrap([]byte(minimalBootstrap))
	if err != nil {
		t.Fatalf("the base of the negative tests must be valid: %v", err)
	}
	if err := checkSidecarContract(bs); err != nil {
		t.Fatalf("the base of the negative tests must meet the contract: %v", err)
	}
}

func TestValidateBootstrapRejects(t *testing.T) {
	cases := []struct {
		name     string
		old, new string
		want     string // a substring of the error
	}{
		// (a) unknown fields, at the top level and inside typed_config.
		{"unknown field in a cluster", "connect_timeout: 1s", "connect_timout: 1s", `unknown field "connect_timout"`},
		{"unknown field in the bootstrap", "static_resources:", "admin_typo: {}\nstatic_resources:", `unknown field "admin_typo"`},
		{"unknown field inside the HCM typed_config", "use_remote_address: true", "use_remote_adress: true", `unknown field "use_remote_adress"`},
		{"unknown typed_config type", "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
			"type.googleapis.com/envoy.extensions.filters.http.router.v3.Ruoter", "Ruoter"},

		// (b) values only the validation rules of a message inside an Any reject.
		{"invalid enum inside ext_authz (Any in Any)", "code: ServiceUnavailable", "code: 999", "HttpStatus.Code"},
		{"empty cluster name inside the HCM", "{ prefix: /admin/ }, route: { cluster: core }",
			`{ prefix: /admin/ }, route: { cluster: "" }`, "RouteAction.Cluster"},
		{"empty stat_prefix inside the HCM", "stat_prefix: edge", `stat_prefix: ""`, "HttpConnectionManager.StatPrefix"},

		// (c) references to clusters that do not exist, and duplicate names.
		{"route to a missing cluster", "{ prefix: /portal/ }, route: { cluster: core }",
			"{ prefix: /portal/ }, route: { cluster: nowhere }", `cluster "nowhere" is not defined`},
		{"ext_authz to a missing cluster", "envoy_grpc: { cluster_name: sidecar_authz }", "envoy_grpc: { cluster_name: no_sidecar }", `cluster "no_sidecar" is not defined`},
		{"duplicate cluster name", "- name: sidecar_authz\n", "- name: core\n", `duplicate cluster name "core"`},
		{"duplicate listener name", "  listeners:\n", "  listeners:\n    - name: edge\n      address: { socket_address: { address: 127.0.0.1, port_value: 10001 } }\n", `duplicate listener name "edge"`},

		// Not YAML, not one document.
		{"invalid YAML", "static_resources:", "static_resources: [", "yaml"},
		{"two documents", "static_resources:", "{}\n---\nstatic_resources:", "exactly one document"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := validateBootstrap(mutate(t, tc.old, tc.new))
			if err == nil {
				t.Fatal("validateBootstrap accepted a broken bootstrap")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not mention %q:\n%v", tc.want, err)
			}
		})
	}
}

func TestSidecarContractRejects(t *testing.T) {
	cases := []struct {
		name     string
		old, new string
		want     string
	}{
		{"no router", `                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, "", "no " + routerFilter},
		{"transport V2", "transport_api_version: V3", "transport_api_version: V2", "want V3"},
		{"sidecar over HTTP/1.1", "explicit_http_config: { http2_protocol_options: {} }",
			"explicit_http_config: { http_protocol_options: {} }", "gRPC needs HTTP/2"},
		{"allowed_headers without x-api-key", "status_on_error: { code: ServiceUnavailable }",
			"status_on_error: { code: ServiceUnavailable }\n                      allowed_headers: { patterns: [{ exact: authorization }, { exact: x-request-id }, { exact: x-forwarded-for }, { exact: content-type }] }",
			`"x-api-key"`},
		{"disallowed authorization", "status_on_error: { code: ServiceUnavailable }",
			"status_on_error: { code: ServiceUnavailable }\n                      disallowed_headers: { patterns: [{ prefix: auth }] }",
			`"authorization"`},
		{"/socket/ not routed to core", "{ prefix: /socket/ }, route: { cluster: core }",
			"{ prefix: /socket/ }, route: { cluster: sidecar_authz }", `"/socket/"`},
		{"/admin only with a trailing slash", "                        - { match: { path: /admin }, route: { cluster: core } }\n", "", "GET /admin goes to"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bs, err := loadBootstrap(mutate(t, tc.old, tc.new))
			if err != nil {
				t.Fatalf("test setup: the mutated bootstrap must still be valid: %v", err)
			}
			err = checkSidecarContract(bs)
			if err == nil {
				t.Fatal("checkSidecarContract accepted a bootstrap that breaks the contract")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not mention %q:\n%v", tc.want, err)
			}
		})
	}
	// Router moved in front of ext_authz (both present).
	t.Run("ext_authz after the router", func(t *testing.T) {
		bs, err := loadBootstrap([]byte(minimalBootstrap))
		if err != nil {
			t.Fatal(err)
		}
		hcms, err := connectionManagers(bs)
		if err != nil {
			t.Fatal(err)
		}
		for _, hcm := range hcms {
			f := hcm.HttpFilters
			f[0], f[1] = f[1], f[0]
			repackHCM(t, bs, hcm)
		}
		err = checkSidecarContract(bs)
		if err == nil || !strings.Contains(err.Error(), "runs after the router") || !strings.Contains(err.Error(), "must be last") {
			t.Fatalf("want 'runs after the router' and 'must be last', got %v", err)
		}
	})
}

// repackHCM writes hcm back into the (only) listener filter of the minimal bootstrap.
func repackHCM(t *testing.T, bs *bootstrapv3.Bootstrap, hcm *hcmv3.HttpConnectionManager) {
	t.Helper()
	a, err := anypb.New(hcm)
	if err != nil {
		t.Fatal(err)
	}
	f := bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0]
	f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
}

// minimalRLSBootstrap is minimalBootstrap with the global rate limit filter and a route
// that sends one descriptor.
var minimalRLSBootstrap = strings.NewReplacer(
	"        - { match: { prefix: /api/ }, route: { cluster: core } }",
	"        - { match: { prefix: /api/ }, route: { cluster: core, rate_limits: [{ actions: [{ remote_address: {} }] }] } }",
	`                  - name: envoy.filters.http.router
`, `                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: { envoy_grpc: { cluster_name: sidecar_rls } }
                  - name: envoy.filters.http.router
`,
	"  clusters:\n", `  clusters:
    - name: sidecar_rls
      connect_timeout: 0.25s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: { http2_protocol_options: {} }
      load_assignment:
        cluster_name: sidecar_rls
        endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 8081 } } } }] }]
`).Replace(minimalBootstrap)

func TestRateLimitContractRejects(t *testing.T) {
	rules, err := rls.LoadDir(rulesDir)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := loadBootstrap([]byte(minimalRLSBootstrap))
	if err != nil {
		t.Fatalf("the base of the negative tests must be valid: %v", err)
	}
	if n, err := checkRateLimitContract(bs, rules); n != 1 || err != nil {
		t.Fatalf("the base of the negative tests must meet the contract: %d, %v", n, err)
	}
	for _, tc := range []struct{ name, old, new, want string }{
		{"a domain without rules", "domain: edge", "domain: shop", `domain "shop" has no rules`},
		{"transport V2", "transport_api_version: V3\n                        grpc_service", "transport_api_version: V2\n                        grpc_service", "want V3"},
		{"another cluster", "envoy_grpc: { cluster_name: sidecar_rls }", "envoy_grpc: { cluster_name: sidecar_authz }", `want "sidecar_rls"`},
		{"a descriptor no rule limits", "actions: [{ remote_address: {} }]", "actions: [{ generic_key: { descriptor_value: nothing } }]", "matches no rule"},
		{"an action the test does not know", "actions: [{ remote_address: {} }]", "actions: [{ destination_cluster: {} }]", "teach descriptorOf"},
		{"no rate_limits", "route: { cluster: core, rate_limits: [{ actions: [{ remote_address: {} }] }] }", "route: { cluster: core }", "no route has rate_limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Count(minimalRLSBootstrap, tc.old) != 1 {
				t.Fatalf("test setup: %q is not in the base once", tc.old)
			}
			bs, err := loadBootstrap([]byte(strings.Replace(minimalRLSBootstrap, tc.old, tc.new, 1)))
			if err != nil {
				t.Fatalf("test setup: the mutated bootstrap must still be valid: %v", err)
			}
			_, err = checkRateLimitContract(bs, rules)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error about %q, got %v", tc.want, err)
			}
		})
	}
}
