package envoy

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	localratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/sidecar/routes"
)

// shippedBootstraps are the configs the limited routes must be checked in.
var shippedBootstraps = []string{"envoy.yaml", "envoy-ratelimit.yaml"}

// Every limited route of the sidecar's table is checked by exactly one ext_authz filter
// in each shipped config, in the spellings the sidecar matches it in: the fail-closed
// filter (failure_mode_allow: false, 503) when its limits protect credentials, else the
// fail-open one; with the local_ratelimit ceiling in front. Requests on routes no bucket
// counts cost no Check.
func TestLimitedRoutesAreChecked(t *testing.T) {
	for _, path := range shippedBootstraps {
		t.Run(path, func(t *testing.T) {
			bs, err := ReadBootstrap(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkLimitedRoutes(bs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A config that leaves a limited route of the table unchecked, or checks it with the
// wrong filter, is caught.
func TestLimitedRoutesCheckRejects(t *testing.T) {
	raw, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ old, new, want string }{
		"token route dropped":  {`"(?i)^/api/v1/tokens/?$"`, `"(?i)^/api/v1/tokenz/?$"`, "POST /api/v1/tokens"},
		"case-sensitive route": {`"(?i)^/api/v1/channels/[^/]+/(inbound|status)/?$"`, `"^/api/v1/channels/[^/]+/(inbound|status)/?$"`, "/API/V1/CHANNELS"},
		"credential route open": {`(?i)^/(admin|portal)/password/reset/?$" }
                            headers: [{ name: ":method", string_match: { exact: POST } }]
                          route: { cluster: core, timeout: 30s }
                          typed_per_filter_config: *checked_fail_closed`, `(?i)^/(admin|portal)/password/reset/?$" }
                            headers: [{ name: ":method", string_match: { exact: POST } }]
                          route: { cluster: core, timeout: 30s }
                          typed_per_filter_config: *checked_fail_open`, "/admin/password/reset protects credentials"},
		"unlimited route checked": {`                        - match: { prefix: /admin/ }
                          route: { cluster: core, timeout: 30s }
                          typed_per_filter_config: *unchecked`, `                        - match: { prefix: /admin/ }
                          route: { cluster: core, timeout: 30s }`, "GET /admin/tenants"},
	} {
		t.Run(name, func(t *testing.T) {
			mutated := strings.Replace(string(raw), c.old, c.new, 1)
			if mutated == string(raw) {
				t.Fatalf("%q is not in envoy.yaml", c.old)
			}
			bs, err := ParseBootstrap([]byte(mutated))
			if err != nil {
				t.Fatal(err)
			}
			err = checkLimitedRoutes(bs)
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(c.want)) {
				t.Fatalf("got %v, want an error naming %s", err, c.want)
			}
		})
	}
}

// spellings are the ways of writing a table pattern's path that the sidecar matches and
// that reach Envoy's route table after its path normalisation: as written, literal
// segments in upper case, a trailing slash.
func spellings(pattern string) []string {
	var segs []string
	for _, s := range strings.Split(strings.TrimPrefix(pattern, "/"), "/") {
		if strings.HasPrefix(s, ":") {
			s = "0b7e3f3a-5c1d-4d3e-9f6a-2b8c9d0e1f2a"
		}
		segs = append(segs, s)
	}
	p := "/" + strings.Join(segs, "/")
	upper := regexp.MustCompile(`[a-z]+`).ReplaceAllStringFunc(p, func(s string) string {
		if len(s) > 8 && strings.Count(s, "-") > 0 {
			return s
		}
		return strings.ToUpper(s)
	})
	// The placeholder id stays as it is in upper case too (it is a parameter).
	upper = strings.ReplaceAll(upper, strings.ToUpper("0b7e3f3a-5c1d-4d3e-9f6a-2b8c9d0e1f2a"), "0b7e3f3a-5c1d-4d3e-9f6a-2b8c9d0e1f2a")
	// A letter of the first segment percent-escaped, as a client may write it: the sidecar
	// decodes it, Envoy's normalisation may not.
	escaped := "/%" + fmt.Sprintf("%02X", p[1]) + p[2:]
	return []string{p, upper, p + "/", escaped}
}

// unlimitedRequests are requests on routes of the core that no bucket counts.
var unlimitedRequests = [][2]string{
	{"GET", "/api/v1/conversations/0b7e3f3a-5c1d-4d3e-9f6a-2b8c9d0e1f2a/activities"},
	{"GET", "/api/v1/converger/conversations/0b7e3f3a-5c1d-4d3e-9f6a-2b8c9d0e1f2a/activities"},
	{"GET", "/api/v1/converger/conversations/0b7e3f3a-5c1d-4d3e-9f6a-2b8c9d0e1f2a/stream"},
	{"POST", "/api/v1/conversations"},
	{"GET", "/admin"},
	{"GET", "/admin/tenants"},
	{"GET", "/portal/login"},
	{"GET", "/socket/websocket"},
}

// checkLimitedRoutes is TestLimitedRoutesAreChecked's assertion on one bootstrap.
func checkLimitedRoutes(bs *bootstrapv3.Bootstrap) error {
	table, err := routes.New(routes.BuiltIn())
	if err != nil {
		return err
	}
	port, err := corePort(bs)
	if err != nil {
		return err
	}
	hcm, err := ListenerHCM(bs, port)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range routes.BuiltIn() {
		if r.Core || len(r.Steps) == 0 {
			continue // counted by the core itself (logins): the sidecar allows them
		}
		credentials := false
		for _, st := range r.Steps {
			credentials = credentials || buckets.ProtectsCredentials(st.Bucket) || buckets.ProtectsCredentials(st.PublishableBucket)
		}
		for _, p := range spellings(r.Pattern) {
			if got, _, ok := table.Match(r.Method, p); !ok || got.Pattern != r.Pattern {
				return fmt.Errorf("the sidecar's table does not match %s %s to %s: fix the test's spellings", r.Method, p, r.Pattern)
			}
			m, ok, err := RouteRequest(bs, port, r.Method, "api.example", p)
			if err != nil || !ok || m.Cluster != coreCluster {
				errs = append(errs, fmt.Errorf("%s %s (route %s): goes to %+v (matched %v, %v), not to the core", r.Method, p, r.Pattern, m, ok, err))
				continue
			}
			checks, err := checkFilters(hcm.GetHttpFilters(), m.PerFilter)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", r.Method, p, err))
				continue
			}
			if len(checks) != 1 {
				errs = append(errs, fmt.Errorf("%s %s (route %s of the sidecar's table, Envoy route %s) is checked by %d ext_authz filters, want 1", r.Method, p, r.Pattern, m.Route, len(checks)))
				continue
			}
			az := checks[0]
			// Envoy cannot tell which route an escaped path is: it fails closed.
			failClosed := credentials || strings.Contains(p, "%")
			if failClosed && (az.GetFailureModeAllow() || az.GetStatusOnError().GetCode() != typev3.StatusCode_ServiceUnavailable) {
				errs = append(errs, fmt.Errorf("%s %s protects credentials: its ext_authz must fail closed with 503 (failure_mode_allow: false)", r.Method, p))
			}
			if !failClosed && !az.GetFailureModeAllow() {
				errs = append(errs, fmt.Errorf("%s %s is an availability route: its ext_authz should fail open", r.Method, p))
			}
			if !hasCeiling(m.PerFilter) {
				errs = append(errs, fmt.Errorf("%s %s has no local_ratelimit token bucket in front of the sidecar", r.Method, p))
			}
		}
	}
	for _, req := range unlimitedRequests {
		if _, _, ok := table.Match(req[0], req[1]); ok {
			return fmt.Errorf("%s %s is in the sidecar's table: fix the test's unlimited requests", req[0], req[1])
		}
		m, ok, err := RouteRequest(bs, port, req[0], "api.example", req[1])
		if err != nil || !ok {
			errs = append(errs, fmt.Errorf("%s %s: matched %v, %v", req[0], req[1], ok, err))
			continue
		}
		checks, err := checkFilters(hcm.GetHttpFilters(), m.PerFilter)
		if err != nil || len(checks) != 0 {
			errs = append(errs, fmt.Errorf("%s %s: no bucket counts it, yet %d ext_authz filters check it (%v)", req[0], req[1], len(checks), err))
		}
	}
	return errors.Join(errs...)
}

// corePort is the port of the listener whose routes reach the core.
func corePort(bs *bootstrapv3.Bootstrap) (uint32, error) {
	for _, port := range ListenerPorts(bs) {
		if hcm, err := ListenerHCM(bs, port); err == nil && routesTo(hcm.GetRouteConfig(), coreCluster) {
			return port, nil
		}
	}
	return 0, errors.New("no listener routes to the core")
}

// checkFilters returns the ext_authz filters of the chain that run on a route with the
// per-filter configs perFilter, as Envoy decides it: a filter runs unless it is disabled
// (in the chain, or for the route by ExtAuthzPerRoute.disabled or FilterConfig.disabled);
// one disabled in the chain runs where a route enables it.
func checkFilters(chain []*hcmv3.HttpFilter, perFilter map[string]*anypb.Any) ([]*extauthzv3.ExtAuthz, error) {
	var out []*extauthzv3.ExtAuthz
	for _, f := range chain {
		az := &extauthzv3.ExtAuthz{}
		if f.GetTypedConfig().MessageIs(az) {
			if err := f.GetTypedConfig().UnmarshalTo(az); err != nil {
				return nil, err
			}
		} else {
			continue
		}
		on := !f.GetDisabled()
		if per, ok := perFilter[f.GetName()]; ok {
			inner := per
			fc := &routev3.FilterConfig{}
			if per.MessageIs(fc) {
				if err := per.UnmarshalTo(fc); err != nil {
					return nil, err
				}
				on, inner = !fc.GetDisabled(), fc.GetConfig()
			}
			pr := &extauthzv3.ExtAuthzPerRoute{}
			if inner != nil {
				if !inner.MessageIs(pr) {
					return nil, fmt.Errorf("filter %s: per-route config %s is not an ExtAuthzPerRoute", f.GetName(), inner.GetTypeUrl())
				}
				if err := inner.UnmarshalTo(pr); err != nil {
					return nil, err
				}
				if pr.GetDisabled() {
					on = false
				} else if pr.GetCheckSettings() != nil {
					on = true
				}
			}
		}
		if on {
			out = append(out, az)
		}
	}
	return out, nil
}

// hasCeiling reports a route with a local_ratelimit token bucket.
func hasCeiling(perFilter map[string]*anypb.Any) bool {
	l := &localratelimitv3.LocalRateLimit{}
	per, ok := perFilter["envoy.filters.http.local_ratelimit"]
	return ok && per.UnmarshalTo(l) == nil && l.GetTokenBucket().GetMaxTokens() > 0 &&
		l.GetFilterEnforced().GetDefaultValue().GetNumerator() > 0
}
