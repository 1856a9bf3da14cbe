// Package routes is the sidecar's route table: which requests are rate limited, in which
// bucket, and from which credential or address the counted identity comes.
package routes

import (
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/converger/edge/shared/buckets"
)

// Source is where a step finds the identity it counts.
type Source string

// The identity sources.
const (
	// FromAPIKey: the tenant of the x-api-key header (tenant API; 401 when invalid).
	FromAPIKey Source = "api_key"
	// FromToken: the tenant_id or channel_id claim of the Converger bearer token
	// (client API; 403 when invalid).
	FromToken Source = "token"
	// FromChannelSecret: the channel of the bearer channel secret (403 when invalid).
	FromChannelSecret Source = "channel_secret"
	// FromPublishableKey: the channel of the bearer publishable key (403 when invalid).
	FromPublishableKey Source = "publishable_key"
	// FromPath: the raw :channel_id path parameter, counted before anything is looked up.
	FromPath Source = "path"
	// FromIP: the client address, resolved with TRUSTED_PROXIES.
	FromIP Source = "ip"
)

// Step counts one bucket. A route's steps run in order; the first denial answers.
type Step struct {
	Bucket string
	Per    buckets.Per
	From   Source
	// PublishableBucket, when set, is counted instead of Bucket for tokens whose src
	// is "publishable" (token refresh).
	PublishableBucket string
	// Limit is the route's ad-hoc limit (zero: none), used when neither a tenant
	// override nor the installation config has one.
	Limit buckets.Limit
}

// Route is a method and a path pattern whose literal segments match case-insensitively
// and whose ":name" segments match any one segment.
type Route struct {
	Method  string
	Pattern string
	Steps   []Step
	// Core marks rows that the core counts itself through the Limiter service (logins);
	// the sidecar lets them through.
	Core bool
	// Index is the route's position in its table, set by New.
	Index int

	segments []string
}

func tenantStep(b string, from Source) Step {
	return Step{Bucket: b, Per: buckets.PerTenant, From: from}
}
func channelStep(b string, from Source) Step {
	return Step{Bucket: b, Per: buckets.PerChannel, From: from}
}
func ipStep(b string) Step { return Step{Bucket: b, Per: buckets.PerIP, From: FromIP} }

// BuiltIn returns the limited endpoints of the rate-limiting reference, then the
// console's writes (AdminWrites), in table order.
func BuiltIn() []Route {
	return append([]Route{
		{Method: "POST", Pattern: "/api/v1/conversations/:id/activities", Steps: []Step{tenantStep(buckets.ActivityCreate, FromAPIKey)}},
		{Method: "POST", Pattern: "/api/v1/converger/conversations/:id/activities", Steps: []Step{tenantStep(buckets.ActivityCreate, FromToken)}},
		{Method: "POST", Pattern: "/api/v1/converger/conversations/:id/upload", Steps: []Step{tenantStep(buckets.Upload, FromToken)}},
		{Method: "POST", Pattern: "/api/v1/channels/:channel_id/inbound", Steps: []Step{channelStep(buckets.Inbound, FromPath)}},
		{Method: "POST", Pattern: "/api/v1/channels/:channel_id/status", Steps: []Step{channelStep(buckets.Inbound, FromPath)}},
		{Method: "POST", Pattern: "/api/v1/converger/tokens/generate", Steps: []Step{channelStep(buckets.TokenGenerate, FromChannelSecret)}},
		{Method: "POST", Pattern: "/api/v1/converger/tokens/refresh", Steps: []Step{{
			Bucket: buckets.TokenGenerate, Per: buckets.PerChannel, From: FromToken, PublishableBucket: buckets.PublishableToken}}},
		{Method: "POST", Pattern: "/api/v1/converger/tokens/publishable", Steps: []Step{
			ipStep(buckets.PublishableTokenIP), channelStep(buckets.PublishableToken, FromPublishableKey)}},
		{Method: "POST", Pattern: "/api/v1/tokens", Steps: []Step{ipStep(buckets.TokenCreate)}},
		{Method: "POST", Pattern: "/admin/login", Core: true},
		{Method: "POST", Pattern: "/portal/login", Core: true},
		{Method: "POST", Pattern: "/admin/login/totp", Core: true},
		{Method: "POST", Pattern: "/portal/login/totp", Core: true},
		{Method: "POST", Pattern: "/admin/password/reset", Steps: []Step{ipStep(buckets.PasswordResetIP)}},
		{Method: "POST", Pattern: "/portal/password/reset", Steps: []Step{ipStep(buckets.PasswordResetIP)}},
	}, AdminWrites()...)
}

// AdminWrites are the console's writes (core/console): the admin API's and the admin
// pages' forms, counted per client IP in admin_write before the admin is known. The
// console's test checks that every write route it serves is one of these.
func AdminWrites() []Route {
	var out []Route
	for _, w := range [][2]string{
		{"POST", "/admin/api/v1/tenants/:id/activate"},
		{"POST", "/admin/api/v1/tenants/:id/deactivate"},
		{"PATCH", "/admin/api/v1/tenants/:id/limits"},
		{"DELETE", "/admin/api/v1/tenants/:id/limits"},
		{"DELETE", "/admin/api/v1/tenants/:id/limits/:bucket"},
		{"POST", "/admin/tenants/:id/limits"},
		{"POST", "/admin/tenants/:id/status"},
	} {
		out = append(out, Route{Method: w[0], Pattern: w[1], Steps: []Step{ipStep(buckets.AdminWrite)}})
	}
	return out
}

// Table matches requests against routes. Earlier routes win.
type Table struct {
	routes []Route
}

// New checks the routes and returns a table.
func New(rs []Route) (*Table, error) {
	t := &Table{}
	for i, r := range rs {
		if err := r.compile(); err != nil {
			return nil, fmt.Errorf("route %d (%s %s): %w", i+1, r.Method, r.Pattern, err)
		}
		r.Index = i
		t.routes = append(t.routes, r)
	}
	return t, nil
}

// Routes returns the table's routes in match order.
func (t *Table) Routes() []Route { return t.routes }

func (r *Route) compile() error {
	r.Method = strings.ToUpper(strings.TrimSpace(r.Method))
	if r.Method == "" || strings.Trim(r.Method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		return fmt.Errorf("method must be an HTTP method")
	}
	if !strings.HasPrefix(r.Pattern, "/") || strings.ContainsAny(r.Pattern, "?#%* ") {
		return fmt.Errorf("path must start with / and hold only literal and :param segments")
	}
	r.segments = nil
	params := map[string]bool{}
	for _, s := range strings.Split(r.Pattern, "/") {
		if s == "" {
			continue
		}
		if s[0] == ':' {
			if len(s) == 1 || params[s] {
				return fmt.Errorf("parameter %q is empty or repeated", s)
			}
			params[s] = true
		}
		r.segments = append(r.segments, s)
	}
	if len(r.Steps) == 0 && !r.Core {
		return fmt.Errorf("a limited route needs a bucket")
	}
	for _, st := range r.Steps {
		if !buckets.ValidName(st.Bucket) {
			return fmt.Errorf("bucket %q: use 1 to 64 of a-z, 0-9 and _", st.Bucket)
		}
		if st.From == FromPath && !params[":channel_id"] {
			return fmt.Errorf("a path identity needs a :channel_id segment")
		}
		switch {
		case st.Per == buckets.PerTenant && (st.From == FromAPIKey || st.From == FromToken),
			st.Per == buckets.PerChannel && (st.From == FromToken || st.From == FromChannelSecret || st.From == FromPublishableKey || st.From == FromPath),
			st.Per == buckets.PerIP && st.From == FromIP:
		default:
			return fmt.Errorf("bucket %s cannot be counted per %q from %q", st.Bucket, st.Per, st.From)
		}
	}
	return nil
}

// Match finds the route of a request. rawPath may carry a query string. It returns the
// :channel_id parameter when the route has one.
func (t *Table) Match(method, rawPath string) (r *Route, channelID string, ok bool) {
	p := rawPath
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	if needsCleaning(p) {
		p = clean(p)
	}
	for i := range t.routes {
		r := &t.routes[i]
		if r.Method != method && !strings.EqualFold(r.Method, method) {
			continue
		}
		if id, ok := r.match(p); ok {
			return r, id, true
		}
	}
	return nil, "", false
}

// match walks p's segments against the pattern without allocating.
func (r *Route) match(p string) (channelID string, ok bool) {
	i := 0
	for _, seg := range r.segments {
		for i < len(p) && p[i] == '/' {
			i++
		}
		if i == len(p) {
			return "", false
		}
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			j = len(p)
		} else {
			j += i
		}
		got := p[i:j]
		i = j
		if seg[0] == ':' {
			if seg == ":channel_id" {
				channelID = got
			}
			continue
		}
		if !strings.EqualFold(seg, got) {
			return "", false
		}
	}
	for i < len(p) && p[i] == '/' {
		i++
	}
	return channelID, i == len(p)
}

// needsCleaning reports whether p has percent-escapes or dot segments, which the core's
// HTTP server resolves before routing, so the table must too.
func needsCleaning(p string) bool {
	return strings.Contains(p, "%") || strings.Contains(p, "/.") || strings.Contains(p, "\\")
}

// clean decodes percent-escapes and resolves dot segments.
func clean(p string) string {
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	p = strings.ReplaceAll(p, "\\", "/")
	return path.Clean("/" + p)
}
