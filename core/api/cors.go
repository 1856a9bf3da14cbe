package api

// CORS on the client API (/api/v1/converger: tokens, conversations, activities,
// uploads, attachments and the stream), so that Web Chat embedded on a customer's own
// site can call the core. The tenant API, the inbound webhooks and the login pages send
// no CORS headers.
//
// An origin may call the client API when CORS_ORIGINS lists it (or is "*"), or when
// the tenant whose credential the request carries lists it in its allowed origins
// (`core tenants origins set`). Pages of the core's own origin need no CORS and are
// never refused.
//
//   - A preflight (OPTIONS with Access-Control-Request-Method) carries no credential,
//     so its tenant is unknown: it is answered 204 with the CORS headers when
//     CORS_ORIGINS allows the origin or some active tenant lists it (a snapshot kept in
//     memory, reloaded when NOTIFY tenant_changes announces a change and every minute),
//     else 403 without them. No preflight reads the database.
//   - Any other request from another origin gets the CORS headers at once when
//     CORS_ORIGINS allows the origin, tentatively when some tenant lists it. Once the
//     request's tenant is known (its token, channel credential or attachment), the
//     tenant's own list, read fresh from the database, decides: the headers stay, or
//     the request is refused with 403 and no CORS headers before it does anything. A
//     change of a tenant's origins therefore applies to the next request on every core.
//   - Access-Control-Allow-Origin is the origin, or "*" with CORS_ORIGINS=*; credentials
//     (cookies) are never allowed: the client API takes bearer tokens only.
//   - Every answer of the client API varies by Origin.
//
// A WebSocket handshake (the stream) is not preflighted; its Origin is checked the same
// way when its token is.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
)

const (
	// corsPath is what CORS applies to.
	corsPath = "/api/v1/converger"
	// corsMaxAge is how long a browser may cache a preflight's answer, in seconds. A
	// tenant's list is checked on every request anyway.
	corsMaxAge = 600
	// corsAllowMethods and corsAllowHeaders are what a preflight allows: the client
	// API's methods, and the request headers that Direct Line clients and Web Chat send
	// beyond the CORS-safelisted ones (the Direct Line client's XMLHttpRequests add x-requested-with).
	corsAllowMethods = "GET, POST"
	corsAllowHeaders = "Authorization, Content-Type, x-idempotency-key, x-request-id, x-ms-bot-agent, x-requested-with"
	// corsExposeHeaders are the response headers scripts may read.
	corsExposeHeaders = "retry-after, x-request-id"
	// originsRefresh is how often the snapshot of the tenants' origins is reloaded
	// without a notification.
	originsRefresh = time.Minute
	// localOrigin holds a request's origin until its tenant's list has decided.
	localOrigin = "converger.cors_origin"
)

var errOrigin = apierror.Forbidden.WithMessage("Requests from this origin are not allowed.")

// CORSAnyOrigin is the CORS_ORIGINS value that allows every origin.
const CORSAnyOrigin = "*"

// corsPolicy is the origins the client API answers.
type corsPolicy struct {
	// anyOrigin: CORS_ORIGINS=*.
	anyOrigin bool
	// origins are CORS_ORIGINS (canonical).
	origins map[string]bool
	// self is PUBLIC_URL's origin.
	self string
	// tenants is every origin some active tenant lists; nil until loaded.
	tenants atomic.Pointer[map[string]bool]
	// changed holds one pending reload of tenants; more coalesce.
	changed chan struct{}
}

// newCORSPolicy takes CORS_ORIGINS (canonical origins, or CORSAnyOrigin alone) and
// PUBLIC_URL.
func newCORSPolicy(origins []string, publicURL string) *corsPolicy {
	p := &corsPolicy{origins: map[string]bool{}, changed: make(chan struct{}, 1)}
	for _, o := range origins {
		if o == CORSAnyOrigin {
			p.anyOrigin = true
		} else if c, err := store.CanonicalOrigin(o); err == nil {
			p.origins[c] = true
		}
	}
	if u := strings.TrimRight(publicURL, "/"); u != "" {
		scheme, rest, _ := strings.Cut(u, "://")
		host, _, _ := strings.Cut(rest, "/")
		p.self, _ = store.CanonicalOrigin(scheme + "://" + host)
	}
	return p
}

// listed reports whether CORS_ORIGINS allows an origin.
func (p *corsPolicy) listed(origin string) bool { return p.anyOrigin || p.origins[origin] }

// listedByATenant reports whether some active tenant allows an origin (as of the last
// reload).
func (p *corsPolicy) listedByATenant(origin string) bool {
	m := p.tenants.Load()
	return m != nil && (*m)[origin]
}

// reload asks for the tenants' origins to be read again.
func (p *corsPolicy) reload() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// run keeps the snapshot of the tenants' origins current until ctx ends: at once,
// after each reload request and every originsRefresh; a failed load is retried with
// backoff, the last snapshot staying in use meanwhile.
func (p *corsPolicy) run(ctx context.Context, st *store.Store, log *slog.Logger) {
	backoff := 100 * time.Millisecond
	failing := false
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		list, err := st.ActiveTenantOrigins(lctx)
		cancel()
		wait := originsRefresh
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				log.Warn("cors: the tenants' allowed origins could not be loaded; using the last ones", "error", err)
			}
			failing, wait, backoff = true, backoff, min(backoff*2, 10*time.Second)
		default:
			m := make(map[string]bool, len(list))
			for _, o := range list {
				m[o] = true
			}
			p.tenants.Store(&m)
			if failing {
				log.Info("cors: the tenants' allowed origins are loaded again", "origins", len(m))
			}
			failing, backoff = false, 100*time.Millisecond
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// sameOrigin reports whether a canonical origin is the core's own: PUBLIC_URL's, or
// that of the Host the request was sent to (the Host header itself: fiber's Hostname
// would take X-Forwarded-Host from anyone).
func (p *corsPolicy) sameOrigin(c *fiber.Ctx, origin string) bool {
	if origin == p.self {
		return true
	}
	scheme, _, _ := strings.Cut(origin, "://")
	host, err := store.CanonicalOrigin(scheme + "://" + string(c.Request().Host()))
	return err == nil && host == origin
}

// corsHandler runs before the client API's routes (and before AUTHZ_ADDR's check, so
// that its denials carry the headers too).
func (s *server) corsHandler(c *fiber.Ctx) error {
	c.Vary(fiber.HeaderOrigin)
	raw := c.Get(fiber.HeaderOrigin)
	if raw == "" {
		return c.Next()
	}
	origin, err := store.CanonicalOrigin(raw)
	valid := err == nil // "null" and malformed origins are never allowed
	if valid && s.cors.sameOrigin(c, origin) {
		return c.Next()
	}
	listed := valid && s.cors.listed(origin)
	known := listed || (valid && s.cors.listedByATenant(origin))
	if c.Method() == fiber.MethodOptions && c.Get(fiber.HeaderAccessControlRequestMethod) != "" {
		c.Vary(fiber.HeaderAccessControlRequestMethod, fiber.HeaderAccessControlRequestHeaders)
		if !known {
			return fail(c, errOrigin, nil)
		}
		s.setCORSHeaders(c, origin)
		c.Set(fiber.HeaderAccessControlAllowMethods, corsAllowMethods)
		c.Set(fiber.HeaderAccessControlAllowHeaders, corsAllowHeaders)
		c.Set(fiber.HeaderAccessControlMaxAge, strconv.Itoa(corsMaxAge))
		return c.SendStatus(fiber.StatusNoContent)
	}
	if known {
		s.setCORSHeaders(c, origin)
	}
	if !listed {
		// The tenant's own list decides when the tenant is known (checkTenantOrigin).
		c.Locals(localOrigin, raw)
	}
	return c.Next()
}

func (s *server) setCORSHeaders(c *fiber.Ctx, origin string) {
	if s.cors.anyOrigin {
		origin = CORSAnyOrigin
	}
	c.Set(fiber.HeaderAccessControlAllowOrigin, origin)
	c.Set(fiber.HeaderAccessControlExposeHeaders, corsExposeHeaders)
}

// checkTenantOrigin decides a cross-origin request that CORS_ORIGINS does not allow by
// the origins of its tenant, once the handler knows it: ok, with the CORS headers, when
// the tenant lists the origin; otherwise the request is answered 403 without them and
// ok is false (err is the answer's error). Requests without such an origin are ok.
func (s *server) checkTenantOrigin(c *fiber.Ctx, tenantID string) (ok bool, err error) {
	raw, pending := c.Locals(localOrigin).(string)
	if !pending {
		return true, nil
	}
	c.Locals(localOrigin, nil) // decided here, once
	list, err := s.Store.TenantOrigins(c.UserContext(), tenantID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	if origin, err := store.CanonicalOrigin(raw); err == nil && slices.Contains(list, origin) {
		s.setCORSHeaders(c, origin)
		return true, nil
	}
	h := &c.Response().Header
	h.Del(fiber.HeaderAccessControlAllowOrigin)
	h.Del(fiber.HeaderAccessControlExposeHeaders)
	return false, fail(c, errOrigin, nil)
}
