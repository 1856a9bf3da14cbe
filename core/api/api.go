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
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/limiterclient"
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
	// Middleware run before the routes (the ext_authz check of AUTHZ_ADDR).
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
}

// Limiter is the part of the sidecar's Limiter service the API uses;
// *limiterclient.Client and *login.LocalLimiter implement it.
type Limiter interface {
	Check(ctx context.Context, bucket, key string, hits uint32) (limiterclient.Result, error)
}

// server holds the dependencies the handlers share.
type server struct {
	Deps
	hub *hub
	// sockets bounds the legacy WebSockets per token and per conversation.
	sockets *socketCounts
	// limiterFailing is set while the Limiter does not answer (logged once).
	limiterFailing atomic.Bool
	cors           *corsPolicy
}

// New returns the fiber app. Start the stream's fan-out with Listen.
func New(d Deps) (*fiber.App, *Listener) {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	s := &server{Deps: d, hub: newHub(), sockets: newSocketCounts(), cors: newCORSPolicy(d.CORSOrigins, d.PublicURL)}
	app := fiber.New(fiber.Config{
		AppName:               "converger-core",
		DisableStartupMessage: true,
		BodyLimit:             d.MaxUploadBytes + 1<<20,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		ErrorHandler:          s.errorHandler,
		JSONEncoder:           marshalJSON,
	})
	app.Use(s.requestID, s.recover)
	app.Use(corsPath, s.corsHandler)
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
				"route", c.Route().Path, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fail(c, apierror.Error{Status: 500, Code: "internal_error", Message: "Something went wrong."}, nil)
		}
	}()
	return c.Next()
}

// errorHandler turns errors that reach fiber into the envelope: fiber's own (404, 405,
// 413 body too large) and unexpected ones (500, logged).
func (s *server) errorHandler(c *fiber.Ctx, err error) error {
	var fe *fiber.Error
	if errors.As(err, &fe) {
		switch fe.Code {
		case fiber.StatusNotFound:
			return fail(c, apierror.NotFound, nil)
		case fiber.StatusRequestEntityTooLarge:
			return fail(c, errPayloadTooLarge, nil)
		case fiber.StatusMethodNotAllowed:
			return fail(c, apierror.Error{Status: 405, Code: "method_not_allowed", Message: "Method not allowed."}, nil)
		}
		if fe.Code < 500 {
			return fail(c, apierror.BadRequest.WithMessage(fe.Message), nil)
		}
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	s.Logger.Error("request failed", "request_id", requestID(c), "method", c.Method(), "route", c.Route().Path, "error", err)
	return fail(c, apierror.Error{Status: 500, Code: "internal_error", Message: "Something went wrong."}, nil)
}

// The error answers of the core beyond the shared ones.
var (
	errPayloadTooLarge    = apierror.Error{Status: 413, Code: "payload_too_large", Message: "The request body is too large."}
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

// fail answers with an error envelope.
func fail(c *fiber.Ctx, e apierror.Error, details any) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(e.Status).Send(e.Body(details, requestID(c)))
}

// failValidation answers 422 with the field errors.
func failValidation(c *fiber.Ctx, fields activity.FieldErrors) error {
	return fail(c, errValidation, map[string]any{"fields": fields})
}
