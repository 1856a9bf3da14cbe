// Package api is the core's HTTP API on fiber: the tenant API (x-api-key), the Direct
// Line compatible client API, the stream, uploads and attachments, with one JSON error
// envelope and a request id on every response.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/metrics"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/bodybudget"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/limiterclient"
	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/shared/pgguard"
	"github.com/converger/edge/shared/token"
)

// Deps are what the API works with.
type Deps struct {
	Store    *store.Store
	Signer   *token.Signer
	Verifier *token.Verifier
	// PublicURL is the base URL clients reach the core at, for streamUrl and contentUrl.
	PublicURL      string
	Limits         activity.Limits
	MaxUploadBytes int
	Logger         *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Middleware run before the routes, after the core's own (request id, access log,
	// recovery, request checks, the database and in-flight bounds): the ext_authz check
	// of AUTHZ_ADDR.
	Middleware []fiber.Handler
	// Pages registers the HTML login pages (core/login), which answer their own errors
	// and unknown paths below /admin and /portal with HTML; nil: none.
	Pages func(fiber.Router)
	// Console registers the operators' console (core/console: the admin API and the
	// admin pages), before Pages; nil: none.
	Console func(fiber.Router)
	// Limiter counts the activities of transports the sidecar cannot see (the legacy
	// WebSocket) in activity_create per tenant: the sidecar's Limiter service
	// (LIMITER_ADDR), so that they share the tenant API's budget, or one in this
	// process; nil: not counted.
	Limiter Limiter
	// CORSOrigins are the origins whose pages may call the client API besides the
	// tenants' own (CORS_ORIGINS): canonical origins (store.CanonicalOrigin), or
	// CORSAnyOrigin alone for every origin. See cors.go.
	CORSOrigins []string

	// Metrics receives the requests' counts and latencies (a registry of its own when
	// nil).
	Metrics *metrics.Metrics
	// Database says whether PostgreSQL answers; while it does not, requests are answered
	// 503 at once. Nil: always.
	Database *pgguard.Monitor
	// AccessLog writes one line per request (CORE_ACCESS_LOG).
	AccessLog bool
	// The bounds of config.Bounds; zero values take config.DefaultBounds'.
	MaxInFlight                                            int
	RequestTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// The body budget (bodies.go): MiB in total and per client address, and the least
	// rate in bytes per second (0: none); zero budgets take config.DefaultBounds'.
	BodyBudgetMB, BodyBudgetPerIPMB, BodyMinRate int
	// The long-lived connections' bounds (sockets.go); zero values take
	// config.DefaultBounds'.
	MaxStreamsPerToken, MaxStreamsPerConversation, MaxSocketsPerIP int
	// ClientIP resolves the client address behind TRUSTED_PROXIES for the per-address
	// bounds; nil: the connection's address.
	ClientIP *clientip.Resolver
	// Credentialed reports whether a request of the login pages or the console carries
	// a credential that holds (a session, an admin token), for the body budget:
	// without one a body gets at most a few KiB. Nil: none does.
	Credentialed func(*fiber.Ctx) (bool, error)
}

// Limiter is the part of the sidecar's Limiter service the API uses;
// *limiterclient.Client and *login.LocalLimiter implement it.
type Limiter interface {
	Check(ctx context.Context, bucket, key string, hits uint32) (limiterclient.Result, error)
}

// Default bounds, as config.DefaultBounds.
const (
	defaultMaxInFlight    = 512
	defaultRequestTimeout = 10 * time.Second
	defaultReadTimeout    = 10 * time.Second
	defaultWriteTimeout   = 30 * time.Second
	defaultIdleTimeout    = 2 * time.Minute
	defaultBodyBudgetMB   = 64
	defaultBodyPerIPMB    = 16
)

// server holds the dependencies the handlers share.
type server struct {
	Deps
	hub *hub
	// sockets bounds the legacy WebSockets per token and per conversation.
	sockets *socketCounts
	// limiterFailing is set while the Limiter does not answer (logged once).
	limiterFailing atomic.Bool
	cors           *corsPolicy
	inFlight       *admission
	apiKeys        *apiKeyCache
	bodies         *bodybudget.Budget
}

// New returns the fiber app. Start its background work (the stream's fan-out, the
// watch over requests in flight) with the Listener's Run.
func New(d Deps) (*fiber.App, *Listener) {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Metrics == nil {
		d.Metrics = metrics.New()
	}
	for _, v := range []struct {
		dst *time.Duration
		def time.Duration
	}{
		{&d.RequestTimeout, defaultRequestTimeout}, {&d.ReadTimeout, defaultReadTimeout},
		{&d.WriteTimeout, defaultWriteTimeout}, {&d.IdleTimeout, defaultIdleTimeout},
	} {
		if *v.dst <= 0 {
			*v.dst = v.def
		}
	}
	if d.MaxInFlight <= 0 {
		d.MaxInFlight = defaultMaxInFlight
	}
	for _, v := range []struct {
		dst *int
		def int
	}{
		{&d.MaxStreamsPerToken, defaultMaxStreamsPerToken}, {&d.MaxStreamsPerConversation, defaultMaxStreamsPerConversation},
		{&d.MaxSocketsPerIP, defaultMaxSocketsPerIP},
	} {
		if *v.dst <= 0 {
			*v.dst = v.def
		}
	}
	if d.BodyBudgetMB <= 0 {
		d.BodyBudgetMB = defaultBodyBudgetMB
	}
	if d.BodyBudgetPerIPMB <= 0 {
		d.BodyBudgetPerIPMB = defaultBodyPerIPMB
	}
	s := &server{Deps: d, hub: newHub(), sockets: newSocketCounts(), cors: newCORSPolicy(d.CORSOrigins, d.PublicURL),
		inFlight: newAdmission(d.MaxInFlight), apiKeys: newAPIKeyCache(d.Now),
		bodies: bodybudget.New(int64(d.BodyBudgetMB)<<20, int64(d.BodyBudgetPerIPMB)<<20)}
	s.registerBodyMetrics()
	s.registerSocketMetrics()
	app := fiber.New(fiber.Config{
		AppName:               "converger-core",
		DisableStartupMessage: true,
		// The largest body of any route; each route's own limit applies once its
		// headers are read (requestConfig).
		BodyLimit:      max(d.MaxUploadBytes+uploadOverhead, s.maxJSONBody()),
		ReadTimeout:    d.ReadTimeout,
		WriteTimeout:   d.WriteTimeout,
		IdleTimeout:    d.IdleTimeout,
		ReadBufferSize: maxHeaderBytes,
		// Multipart bodies are parsed by the upload route only, with its errors.
		DisablePreParseMultipartForm: true,
		// Bodies are read by readBody, within the body budget (bodies.go).
		StreamRequestBody: true,
		ErrorHandler:      s.errorHandler,
		JSONEncoder:       marshalJSON,
	})
	app.Server().HeaderReceived = s.requestConfig
	// In this order: every answer carries a request id and is observed; a panic is a
	// 500; then the cheap refusals (headers, bodies); CORS (a preflight is answered from
	// memory, and a page can read the refusals after it); the database and in-flight
	// bounds; and only then what costs a call (the ext_authz check) and the routes.
	app.Use(s.requestID, s.observe, s.recover, s.readBody, s.checkRequest)
	app.Use(corsPath, s.corsHandler)
	app.Use(s.requireDatabase, s.admit)
	for _, m := range d.Middleware {
		app.Use(m)
	}
	s.tenantAPI(app.Group("/api/v1"))
	s.clientAPI(app.Group("/api/v1/converger"))
	s.inboundRoutes(app.Group("/api/v1/channels"))
	s.legacyRoutes(app)
	if d.Console != nil {
		d.Console(app)
	}
	if d.Pages != nil {
		d.Pages(app)
	}
	// Past every route: fiber answers ErrMethodNotAllowed, with Allow listing the
	// methods, when another method has a route for the path, else ErrNotFound; the error
	// handler turns either into the envelope.
	app.Use(func(c *fiber.Ctx) error { return c.Next() })
	return app, &Listener{s: s}
}

// requestID takes Envoy's x-request-id when it is a sensible one, else makes one, and
// echoes it on the response.
func (s *server) requestID(c *fiber.Ctx) error {
	id := apierror.RequestID(c.Get("x-request-id"))
	c.Locals(localRequestID, id)
	c.Set("x-request-id", id)
	return c.Next()
}

// recover answers a panic with a 500 envelope and logs it with the request id (never
// with the request's headers, which hold credentials).
//
// Logs name the matched route's pattern, never the path: paths can carry secrets (a
// password reset link's token).
func (s *server) recover(c *fiber.Ctx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.Logger.Error("panic while handling a request", "request_id", requestID(c), "method", c.Method(),
				"route", routePattern(c), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fail(c, errInternal, nil)
		}
	}()
	return c.Next()
}

// errorHandler turns every error into the envelope, with the request id and a message
// for people, never a parser's or driver's text: the errors handlers return, and those
// of fasthttp itself (a body over its limit, headers too large, a read timeout, a
// malformed request), which reach here without the middleware having run, and are
// observed here.
func (s *server) errorHandler(c *fiber.Ctx, err error) error {
	answer := s.answerError(c, err)
	if c.Locals(localObserved) == nil {
		s.record(c, time.Now())
	}
	return answer
}

func (s *server) answerError(c *fiber.Ctx, err error) error {
	var fe *fiber.Error
	switch {
	case errors.As(err, &fe):
		switch fe.Code {
		case fiber.StatusNotFound:
			return fail(c, apierror.NotFound, nil)
		case fiber.StatusRequestEntityTooLarge:
			// fasthttp answers before it reads the body: drop the rest of it before
			// closing, so that the client reads the 413 rather than a reset.
			netlimit.LingerOnClose(c.Context().Conn())
			return fail(c, errPayloadTooLarge, nil)
		case fiber.StatusMethodNotAllowed:
			return fail(c, errMethod, nil)
		case fiber.StatusRequestTimeout:
			if limit, ok := declaredTooLarge.LoadAndDelete(&c.Context().Request.Header); ok {
				s.bodies.Refuse(bodybudget.ErrTooLarge)
				netlimit.LingerOnClose(c.Context().Conn())
				return fail(c, errPayloadTooLarge, map[string]any{"max_bytes": limit})
			}
			return fail(c, errRequestTimeout, nil)
		case fiber.StatusRequestHeaderFieldsTooLarge:
			return fail(c, errHeadersTooLarge, nil)
		case fiber.StatusBadGateway:
			// fiber's answer to a network error while reading the request: the client
			// is most likely gone.
			return fail(c, apierror.BadRequest, nil)
		}
		if fe.Code < 500 {
			return fail(c, apierror.BadRequest, nil)
		}
	case errors.Is(err, context.Canceled):
		return nil // the client went away; nobody reads an answer
	case pgguard.Unavailable(err):
		// The database is down, hung or slower than DATABASE_TIMEOUT (the monitor has
		// been told and logs the outage), the pool had no free connection in time
		// (overload), or the request's deadline passed: one line per request would
		// flood the log exactly when it matters, so debug only.
		s.Logger.Debug("request failed: the database did not answer in time", "request_id", requestID(c),
			"method", c.Method(), "route", routePattern(c), "error", err)
		return failUnavailable(c, errDatabaseDown)
	}
	s.Logger.Error("request failed", "request_id", requestID(c), "method", c.Method(), "route", routePattern(c), "error", err)
	return fail(c, errInternal, nil)
}

// The error answers of the core beyond the shared ones.
var (
	errPayloadTooLarge    = apierror.PayloadTooLarge
	errValidation         = apierror.Error{Status: 422, Code: "validation_failed", Message: "Some fields are invalid."}
	errConversationClosed = apierror.Error{Status: 409, Code: "conversation_closed", Message: "The conversation is closed."}
)

type localKey int

const (
	localRequestID localKey = iota
	localTenant
	localClaims
)

func requestID(c *fiber.Ctx) string {
	id, _ := c.Locals(localRequestID).(string)
	return id
}

// fail answers with an error envelope. An answer before the request-id middleware ran
// (fasthttp's own errors) gets its id here.
func fail(c *fiber.Ctx, e apierror.Error, details any) error {
	id := requestID(c)
	if id == "" {
		id = apierror.RequestID(c.Get("x-request-id"))
		c.Locals(localRequestID, id)
		c.Set("x-request-id", id)
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(e.Status).Send(e.Body(details, id))
}

// failValidation answers 422 with the field errors.
func failValidation(c *fiber.Ctx, fields activity.FieldErrors) error {
	return fail(c, errValidation, map[string]any{"fields": fields})
}
