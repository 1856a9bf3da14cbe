// Package console is the operators' console: the admin API (/admin/api/v1, JSON, the
// core's error envelope) over tenants, their channels and rate-limit overrides and the
// audit log, and the admin pages on top of it (server-rendered, no scripts), with the
// live view of what the sidecars are limiting (their Limiter service).
//
// Requests are authenticated by the admin pages' session (core/login; writes carry the
// session's CSRF token) or by an admin API token (`core admins token create`, read-only
// or read-write). Every change goes through store.Operator as "admin:<id>", with the
// session or token it came through, audited in the change's transaction; limit changes
// NOTIFY the sidecars in it too. The writes are counted per client IP in admin_write by
// the sidecar, like every other write endpoint (sidecar/routes.AdminWrites).
package console

import (
	"context"
	"errors"
	"html/template"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/limiterpb"
)

// Sidecar is what the console asks the sidecar's Limiter service;
// *limiterclient.Client implements it.
type Sidecar interface {
	Buckets(ctx context.Context) (*limiterpb.BucketsResponse, error)
	Traffic(ctx context.Context) (*limiterpb.TrafficResponse, error)
	Busiest(ctx context.Context, top uint32, bucket string) (*limiterpb.BusiestResponse, error)
	Cluster(ctx context.Context) (*limiterpb.ClusterResponse, error)
}

// Options are what the console works with.
type Options struct {
	Store *store.Store
	// Pages are the admin login pages, whose sessions and CSRF tokens the console uses.
	Pages *login.Pages
	// Sidecar is the sidecar's Limiter service (LIMITER_ADDR); nil: no live view, and
	// the installation's limits are not known.
	Sidecar Sidecar
	// DatabaseTimeout bounds the database work of one request (DefaultDatabaseTimeout
	// when zero); SidecarTimeout each call to the sidecar (DefaultSidecarTimeout).
	DatabaseTimeout, SidecarTimeout time.Duration
	// Now is the clock (time.Now when nil).
	Now    func() time.Time
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultDatabaseTimeout = 5 * time.Second
	DefaultSidecarTimeout  = 2 * time.Second
	// maxBody bounds a request body of the API.
	maxBody = 64 << 10
	// maxParam bounds a query parameter.
	maxParam = 256
)

// Console serves the admin API and pages.
type Console struct {
	Options
	views map[string]*template.Template
	csp   string
	// routes are the API's routes, for 405 answers with Allow.
	routes []route
}

// New checks the options and parses the templates.
func New(o Options) (*Console, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("console: a store is required")
	case o.Pages == nil:
		return nil, errors.New("console: the login pages are required")
	}
	if o.DatabaseTimeout <= 0 {
		o.DatabaseTimeout = DefaultDatabaseTimeout
	}
	if o.SidecarTimeout <= 0 {
		o.SidecarTimeout = DefaultSidecarTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	c := &Console{Options: o}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	return c, nil
}

// Register adds the API and the pages to r. Register them before the login pages,
// whose catch-all answers every other path below /admin.
func (c *Console) Register(r fiber.Router) {
	c.registerAPI(r)
	c.registerPages(r)
}

// route is one of the API's routes.
type route struct {
	method   string
	segments []string
}

// matches reports whether path fits the pattern's segments (":x" matches any one),
// case-insensitively, ignoring repeated and trailing slashes, as fiber routes.
func (rt route) matches(path string) bool {
	segs := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(segs) != len(rt.segments) {
		return false
	}
	for i, s := range rt.segments {
		if s[0] != ':' && !strings.EqualFold(s, segs[i]) {
			return false
		}
	}
	return true
}

// handle adds a route of the API (r is its group, path below apiPrefix).
func (c *Console) handle(r fiber.Router, method, path string, h ...fiber.Handler) {
	c.routes = append(c.routes, route{method: method, segments: strings.FieldsFunc(apiPrefix+path, func(r rune) bool { return r == '/' })})
	r.Add(method, path, h...)
}

// apiFallback answers the API's unknown paths with 404, and its known paths asked with
// another method with 405 and Allow, in the envelope.
func (c *Console) apiFallback(ctx *fiber.Ctx) error {
	if !under(ctx.Path(), apiPrefix) {
		return ctx.Next()
	}
	var allow []string
	for _, rt := range c.routes {
		if rt.matches(ctx.Path()) {
			allow = append(allow, rt.method)
			if rt.method == fiber.MethodGet {
				allow = append(allow, fiber.MethodHead)
			}
		}
	}
	if len(allow) > 0 {
		ctx.Set(fiber.HeaderAllow, strings.Join(allow, ", "))
		return fail(ctx, errMethodNotAllowed, nil)
	}
	return fail(ctx, apierror.NotFound, nil)
}

// under reports whether path is prefix or below it, case-insensitively.
func under(path, prefix string) bool {
	return len(path) >= len(prefix) && strings.EqualFold(path[:len(prefix)], prefix) &&
		(len(path) == len(prefix) || path[len(prefix)] == '/')
}

// The console's answers beyond the shared ones (apierror).
var (
	errUnauthorized = apierror.Error{Status: 401, Code: "unauthorized",
		Message: "An admin API token (Authorization: Bearer cvg_admin_…) or an admin session is required."}
	errReadOnly         = apierror.Error{Status: 403, Code: "forbidden", Message: "This token is read-only."}
	errCSRF             = apierror.Error{Status: 403, Code: "forbidden", Message: "A change made with a session needs the session's CSRF token in the x-csrf-token header."}
	errMethodNotAllowed = apierror.Error{Status: 405, Code: "method_not_allowed", Message: "Method not allowed."}
	errTooLarge         = apierror.Error{Status: 413, Code: "payload_too_large", Message: "The request body is too large."}
	errMediaType        = apierror.Error{Status: 415, Code: "unsupported_media_type", Message: "The body must be JSON (content-type: application/json), not compressed."}
	errValidation       = apierror.Error{Status: 422, Code: "validation_failed", Message: "Some fields are invalid."}
	errInternal         = apierror.Error{Status: 500, Code: "internal_error", Message: "Something went wrong."}
	errDatabase         = apierror.Error{Status: 503, Code: "unavailable", Message: "The database is not answering; try again shortly."}
	errNoSidecar        = apierror.Error{Status: 503, Code: "unavailable", Message: "No sidecar is configured (LIMITER_ADDR), so there is no live view."}
	errSidecar          = apierror.Error{Status: 503, Code: "unavailable", Message: "The sidecar did not answer; try again shortly."}
)

// requestID is the answer's x-request-id (set by the API's middleware).
func requestID(c *fiber.Ctx) string { return string(c.Response().Header.Peek("x-request-id")) }

// fail answers with an error envelope; 503s carry retry-after.
func fail(c *fiber.Ctx, e apierror.Error, details any) error {
	if e.Status == fiber.StatusServiceUnavailable {
		c.Set(fiber.HeaderRetryAfter, "1")
	}
	if e.Status == fiber.StatusUnauthorized {
		c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="converger admin"`)
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Status(e.Status).Send(e.Body(details, requestID(c)))
}

// unavailable reports whether err says the database could not be reached or did not
// answer in time, rather than that the request was wrong or the core broken.
func unavailable(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ce), pgconn.Timeout(err), errors.As(err, &ne),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &pe):
		// Connection exceptions, insufficient resources, shutdowns.
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "53") || strings.HasPrefix(pe.Code, "57P")
	}
	return false
}

// storeError answers an error of the store: 404, 422 with the message under field, 503
// when the database is down or slow, else 500 (logged).
func (c *Console) storeError(ctx *fiber.Ctx, err error, field string) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fail(ctx, apierror.NotFound, nil)
	case errors.Is(err, store.ErrInvalid):
		return fail(ctx, errValidation, map[string]any{"fields": map[string][]string{field: {err.Error()}}})
	case errors.Is(err, context.Canceled) && ctx.Context().Err() != nil:
		return nil
	case unavailable(err):
		c.Logger.Warn("console: the database did not answer", "request_id", requestID(ctx), "route", ctx.Route().Path, "error", err)
		return fail(ctx, errDatabase, nil)
	}
	c.Logger.Error("console: request failed", "request_id", requestID(ctx), "method", ctx.Method(), "route", ctx.Route().Path, "error", err)
	return fail(ctx, errInternal, nil)
}
