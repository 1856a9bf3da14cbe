package store

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/shared/ids"
)

// Bounds of a tenant's allowed origins.
const (
	MaxTenantOrigins = 100
	maxOriginBytes   = 255
)

// CanonicalOrigin returns a web origin as browsers write it in the Origin header —
// "http" or "https", "://", the host in lower case, and ":port" unless it is the
// scheme's default — or ErrInvalid saying why. A trailing "/" is accepted; a path, a
// query, a fragment, user info, wildcards and non-ASCII host names (write them in
// punycode, xn--…) are not, nor is "null", the origin of sandboxed and file: pages.
func CanonicalOrigin(origin string) (string, error) {
	bad := func(why string) error {
		return invalidf("%q is not an origin such as https://www.example.com or http://localhost:3000 (%s)", origin, why)
	}
	if len(origin) > maxOriginBytes {
		return "", invalidf("an origin is at most %d bytes", maxOriginBytes)
	}
	for i := 0; i < len(origin); i++ {
		if origin[i] <= ' ' || origin[i] >= 0x7f {
			return "", bad("spaces, control and non-ASCII characters are not allowed; write host names in punycode")
		}
	}
	u, err := url.Parse(origin)
	switch {
	case err != nil:
		return "", bad("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return "", bad("the scheme must be http or https")
	case u.Opaque != "" || u.User != nil:
		return "", bad("no user info")
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(origin, "#"):
		return "", bad("an origin has no path, query or fragment")
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if host == "" || strings.ContainsAny(host, "*%[]") {
		return "", bad("a host name or address is required, without wildcards")
	}
	if strings.HasSuffix(u.Host, ":") {
		return "", bad("an empty port")
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strings.HasPrefix(port, "0") {
			return "", bad("the port must be a number from 1 to 65535")
		}
		if (u.Scheme == "http" && n == 80) || (u.Scheme == "https" && n == 443) {
			port = ""
		}
	}
	if strings.Contains(host, ":") {
		if net.ParseIP(host) == nil {
			return "", bad("not an IPv6 address")
		}
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return u.Scheme + "://" + host, nil
}

// CanonicalOrigins canonicalises a list of origins (CanonicalOrigin), drops duplicates
// and sorts it.
func CanonicalOrigins(origins []string) ([]string, error) {
	out := make([]string, 0, len(origins))
	for _, o := range origins {
		c, err := CanonicalOrigin(o)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// TenantOrigins returns the origins a tenant's web pages may call the client API from
// (its CORS origins), sorted; a missing tenant is ErrNotFound.
func (s *Store) TenantOrigins(ctx context.Context, tenantID string) ([]string, error) {
	if !ids.IsUUID(tenantID) {
		return nil, ErrNotFound
	}
	var origins []string
	err := s.pool.QueryRow(ctx, `SELECT allowed_origins FROM tenants WHERE id = $1`, tenantID).Scan(&origins)
	return origins, notFound(err)
}

// ActiveTenantOrigins returns every origin that some active tenant allows, once each.
func (s *Store) ActiveTenantOrigins(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT unnest(allowed_origins) FROM tenants WHERE status = 'active'`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// OriginsChange is the outcome of SetTenantOrigins.
type OriginsChange struct {
	Tenant        Tenant
	Before, After []string
	Changed       bool // false: the tenant had exactly these origins, nothing was written
}

// SetTenantOrigins replaces a tenant's allowed origins (none: no page of another origin
// may call its client API unless CORS_ORIGINS allows it). The origins are checked and
// canonicalised (CanonicalOrigins), at most MaxTenantOrigins. The change, its audit row
// (tenants.origins_set, before and after) and, by trigger, NOTIFY tenant_changes commit
// together, so every core applies it at once; an unchanged list writes nothing.
func (o *Operator) SetTenantOrigins(ctx context.Context, tenantID string, origins []string) (OriginsChange, error) {
	after, err := CanonicalOrigins(origins)
	if err != nil {
		return OriginsChange{}, err
	}
	if len(after) > MaxTenantOrigins {
		return OriginsChange{}, invalidf("a tenant has at most %d origins", MaxTenantOrigins)
	}
	if !ids.IsUUID(tenantID) {
		return OriginsChange{}, ErrNotFound
	}
	ch := OriginsChange{After: after}
	err = o.s.inTx(ctx, func(tx pgx.Tx) error {
		t := &ch.Tenant
		if err := tx.QueryRow(ctx, `SELECT id::text, name, status, api_key_prefix, allowed_origins FROM tenants
			WHERE id = $1 FOR UPDATE`, tenantID).Scan(&t.ID, &t.Name, &t.Status, &t.APIKeyPrefix, &ch.Before); err != nil {
			return notFound(err)
		}
		if slices.Equal(ch.Before, after) {
			return nil
		}
		ch.Changed = true
		if _, err := tx.Exec(ctx, `UPDATE tenants SET allowed_origins = $2, updated_at = now() WHERE id = $1`, tenantID, after); err != nil {
			return err
		}
		return o.audit(ctx, tx, "tenants.origins_set", tenantResource(t.ID), map[string]any{
			"before": ch.Before, "after": after,
		})
	})
	if err != nil {
		return OriginsChange{}, err
	}
	return ch, nil
}
