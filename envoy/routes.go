package envoy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	// The types the configs under envoy/ hold in typed_config, so that protojson can
	// resolve them. Add the package here when a config uses a new one.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// ReadBootstrap reads a bootstrap config file; see ParseBootstrap.
func ReadBootstrap(path string) (*bootstrapv3.Bootstrap, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	bs, err := ParseBootstrap(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return bs, nil
}

// ParseBootstrap decodes a bootstrap config, one YAML document, into Envoy's proto,
// refusing unknown fields, also inside every typed_config. (The test of this package runs
// Envoy's validation rules on top.)
func ParseBootstrap(yamlBytes []byte) (*bootstrapv3.Bootstrap, error) {
	jsonBytes, err := yamlToJSON(yamlBytes)
	if err != nil {
		return nil, err
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(jsonBytes, bs); err != nil {
		return nil, fmt.Errorf("decode bootstrap: %w", err)
	}
	return bs, nil
}

// Match is where a listener's routes send one request.
type Match struct {
	VirtualHost, Route string // their names ("#<index>" for an unnamed route)
	// Cluster is the route's upstream cluster; "" for a direct response or a redirect.
	Cluster string
	// Status is a direct response's status.
	Status uint32
	// WebSocket: upgrades to WebSocket are enabled for the route.
	WebSocket bool
	// PerFilter is the route's typed_per_filter_config, by filter name.
	PerFilter map[string]*anypb.Any
}

// RouteRequest finds where the static listener on port sends a request, as Envoy
// matches: the first virtual host whose domains match host, then its first route whose
// match holds for method and path (without the query). It knows the matches the configs
// here use (prefix, path, safe_regex, path_separated_prefix, case_sensitive, exact
// headers); a route with any other kind is an error rather than a guess. ok is false
// when no route matches (Envoy answers 404).
func RouteRequest(bs *bootstrapv3.Bootstrap, port uint32, method, host, path string) (m Match, ok bool, err error) {
	hcm, err := ListenerHCM(bs, port)
	if err != nil {
		return Match{}, false, err
	}
	hcmWebSocket := upgradeEnabled(hcm.GetUpgradeConfigs(), false)
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		if !domainMatches(vh.GetDomains(), host) {
			continue
		}
		for i, r := range vh.GetRoutes() {
			hit, err := routeMatches(r.GetMatch(), method, path)
			if err != nil {
				return Match{}, false, fmt.Errorf("virtual host %q route %d: %w", vh.GetName(), i, err)
			}
			if !hit {
				continue
			}
			m := Match{VirtualHost: vh.GetName(), Route: r.GetName(), PerFilter: r.GetTypedPerFilterConfig()}
			if m.Route == "" {
				m.Route = fmt.Sprintf("#%d", i)
			}
			switch a := r.GetAction().(type) {
			case *routev3.Route_Route:
				m.Cluster = a.Route.GetCluster()
				m.WebSocket = upgradeEnabled(routeUpgrades(a.Route), hcmWebSocket)
			case *routev3.Route_DirectResponse:
				m.Status = a.DirectResponse.GetStatus()
			}
			return m, true, nil
		}
		return Match{}, false, nil // Envoy does not try the next virtual host
	}
	return Match{}, false, nil
}

// ListenerHCM returns the http_connection_manager of the static listener on port (of its
// first filter chain that has one).
func ListenerHCM(bs *bootstrapv3.Bootstrap, port uint32) (*hcmv3.HttpConnectionManager, error) {
	for _, l := range bs.GetStaticResources().GetListeners() {
		if l.GetAddress().GetSocketAddress().GetPortValue() != port {
			continue
		}
		chains := append([]*listenerv3.FilterChain{}, l.GetFilterChains()...)
		if l.GetDefaultFilterChain() != nil {
			chains = append(chains, l.GetDefaultFilterChain())
		}
		for _, fc := range chains {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().MessageIs(hcm) {
					if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						return nil, err
					}
					return hcm, nil
				}
			}
		}
		return nil, fmt.Errorf("listener %q on port %d has no http_connection_manager", l.GetName(), port)
	}
	return nil, fmt.Errorf("no static listener on port %d", port)
}

// ListenerPorts returns the port of each static listener, by name.
func ListenerPorts(bs *bootstrapv3.Bootstrap) map[string]uint32 {
	out := map[string]uint32{}
	for _, l := range bs.GetStaticResources().GetListeners() {
		out[l.GetName()] = l.GetAddress().GetSocketAddress().GetPortValue()
	}
	return out
}

// ClusterEndpoints returns the host:port of every endpoint of a static cluster.
func ClusterEndpoints(bs *bootstrapv3.Bootstrap, cluster string) []string {
	var out []string
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != cluster {
			continue
		}
		for _, le := range c.GetLoadAssignment().GetEndpoints() {
			for _, e := range le.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				out = append(out, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
			}
		}
	}
	return out
}

func routeUpgrades(a *routev3.RouteAction) []*hcmv3.HttpConnectionManager_UpgradeConfig {
	var out []*hcmv3.HttpConnectionManager_UpgradeConfig
	for _, u := range a.GetUpgradeConfigs() {
		out = append(out, &hcmv3.HttpConnectionManager_UpgradeConfig{UpgradeType: u.GetUpgradeType(), Enabled: u.GetEnabled()})
	}
	return out
}

// upgradeEnabled reports whether a list of upgrade configs enables WebSocket; def when it
// does not mention it.
func upgradeEnabled(ucs []*hcmv3.HttpConnectionManager_UpgradeConfig, def bool) bool {
	for _, u := range ucs {
		if strings.EqualFold(u.GetUpgradeType(), "websocket") {
			return u.GetEnabled() == nil || u.GetEnabled().GetValue()
		}
	}
	return def
}

func domainMatches(domains []string, host string) bool {
	host = strings.ToLower(host)
	for _, d := range domains {
		d = strings.ToLower(d)
		switch {
		case d == "*" || d == host:
			return true
		case strings.HasPrefix(d, "*") && strings.HasSuffix(host, d[1:]) && len(host) > len(d)-1:
			return true
		case strings.HasSuffix(d, "*") && strings.HasPrefix(host, d[:len(d)-1]) && len(host) > len(d)-1:
			return true
		}
	}
	return false
}

func routeMatches(rm *routev3.RouteMatch, method, path string) (bool, error) {
	if rm.GetQueryParameters() != nil || rm.GetGrpc() != nil || rm.GetTlsContext() != nil ||
		len(rm.GetDynamicMetadata()) > 0 || rm.GetRuntimeFraction() != nil || rm.GetFilterState() != nil {
		return false, errors.New("a route match this reader does not know (query, gRPC, TLS, metadata, runtime or filter state)")
	}
	fold := func(s string) string { return s }
	if rm.GetCaseSensitive() != nil && !rm.GetCaseSensitive().GetValue() {
		fold = strings.ToLower
	}
	var hit bool
	switch p := rm.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		hit = strings.HasPrefix(fold(path), fold(p.Prefix))
	case *routev3.RouteMatch_Path:
		hit = fold(path) == fold(p.Path)
	case *routev3.RouteMatch_PathSeparatedPrefix:
		pre := fold(p.PathSeparatedPrefix)
		hit = fold(path) == pre || strings.HasPrefix(fold(path), pre+"/")
	case *routev3.RouteMatch_SafeRegex:
		re, err := regexp.Compile("^(?:" + p.SafeRegex.GetRegex() + ")$")
		if err != nil {
			return false, err
		}
		hit = re.MatchString(path)
	default:
		return false, fmt.Errorf("a path match this reader does not know: %T", p)
	}
	for _, h := range rm.GetHeaders() {
		if h.GetName() != ":method" || h.GetStringMatch().GetExact() == "" || h.GetInvertMatch() || h.GetStringMatch().GetIgnoreCase() {
			return false, fmt.Errorf("a header match this reader does not know: %v", h)
		}
		hit = hit && method == h.GetStringMatch().GetExact()
	}
	return hit, nil
}

// yamlToJSON converts one YAML document to JSON, turning every mapping key into a string.
func yamlToJSON(yamlBytes []byte) ([]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(yamlBytes))
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("yaml: empty document")
		}
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("yaml: a bootstrap file must hold exactly one document")
	}
	out, err := jsonable(doc)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

func jsonable(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			ks := fmt.Sprint(k)
			if _, dup := out[ks]; dup {
				return nil, fmt.Errorf("yaml: mapping key %q appears twice once turned into a string", ks)
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	default:
		return v, nil
	}
}
