package api

// The body budget: fiber streams every request body (StreamRequestBody), and readBody,
// before anything else looks at the body, reads it into a buffer that grows with what
// has arrived, within the bytes the core may hold for bodies in total
// (CORE_BODY_BUDGET_MB) and for one client address (CORE_BODY_BUDGET_PER_IP_MB), at a
// least rate (CORE_BODY_MIN_RATE) and within the route's own limit (bodyRule). A
// request whose credential does not hold gets at most preAuthBody bytes of buffer.
// Every refusal is answered at once and closes the connection.

import (
	"crypto/sha256"
	"errors"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/inbound"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/bodybudget"
	"github.com/converger/edge/shared/netlimit"
)

const (
	// preAuthBody is the most body a request gets without a credential that holds:
	// bodies up to it are read before anything is checked, larger ones only once the
	// credential is known good.
	preAuthBody = 8 << 10
	// prefetchBody is the most body fasthttp reads before the handler runs (its
	// MaxRequestBodySize; it reads one byte more, or what one read returns).
	prefetchBody = 1
	// bodyGrace is how long a body may arrive at any rate before CORE_BODY_MIN_RATE
	// applies.
	bodyGrace = 5 * time.Second
)

var (
	errBodyBudget = apierror.Unavailable.WithMessage("The service is receiving too many request bodies at once. Please try again shortly.")
	errBodyUnread = apierror.BadRequest.WithMessage("The request body could not be read.")
	errPreAuth    = apierror.PayloadTooLarge.WithMessage("The request body is too large for a request without a valid credential.")
)

// readBody reads the request's body within the budget, or refuses the request.
func (s *server) readBody(c *fiber.Ctx) error {
	req := c.Request()
	declaredTooLarge.Delete(&req.Header)
	if req.Header.ContentLength() == 0 || req.BodyStream() == nil {
		return c.Next()
	}
	rule := s.bodyRule(c.Method(), c.Path())
	limit, refusal := rule.max, errPayloadTooLarge
	if req.Header.ContentLength() < 0 || req.Header.ContentLength() > preAuthBody {
		ok, e, err := s.bodyCredential(c)
		if err != nil {
			s.refuseBody(c)
			return err
		}
		if !ok {
			limit, refusal = min(limit, preAuthBody), e
		}
	}
	timeout := rule.readTimeout
	if timeout == 0 {
		timeout = s.ReadTimeout
	}
	held, err := s.bodies.Read(c.Context(), s.clientKey(c), bodybudget.Rules{Max: limit, Timeout: timeout, MinRate: s.BodyMinRate, Grace: bodyGrace})
	if err != nil {
		s.refuseBody(c)
		switch err {
		case bodybudget.ErrTooLarge:
			if refusal.Status != errPayloadTooLarge.Status || refusal.Message != errPayloadTooLarge.Message {
				return fail(c, refusal, nil)
			}
			return fail(c, errPayloadTooLarge, map[string]any{"max_bytes": limit})
		case bodybudget.ErrBudget:
			return failUnavailable(c, errBodyBudget)
		case bodybudget.ErrTooSlow:
			return fail(c, errRequestTimeout, nil)
		default:
			return fail(c, errBodyUnread, nil)
		}
	}
	defer held.Release()
	return c.Next()
}

// refuseBody closes the connection after the answer, dropping what the client still
// sends for a moment so that it reads the answer rather than a reset.
func (s *server) refuseBody(c *fiber.Ctx) {
	c.Context().SetConnectionClose()
	netlimit.LingerOnClose(c.Context().Conn())
}

// bodyCredential reports whether the request carries a credential that holds, checked
// as cheaply as its route allows, before its body is read: a Converger token on the
// client API, an API key on the tenant API, a well-formed and fresh signature on the
// inbound webhooks, a session on the login pages and the console. When it does not, it
// returns the answer for a body over preAuthBody: what the route answers a bad
// credential, or 413.
func (s *server) bodyCredential(c *fiber.Ctx) (bool, apierror.Error, error) {
	p := strings.ToLower(c.Path())
	switch {
	case strings.HasPrefix(p, "/api/v1/converger/"):
		_, err := s.Verifier.Verify(bearer(c))
		return err == nil, errToken, nil
	case strings.HasPrefix(p, "/api/v1/channels/"):
		sig, err := inbound.ParseSignature(c.Get(inbound.SignatureHeader))
		if err != nil {
			return false, errPreAuth, nil
		}
		skew := s.Now().Unix() - sig.Timestamp
		return skew <= int64(inbound.Tolerance/time.Second) && skew >= -int64(inbound.Tolerance/time.Second), errPreAuth, nil
	case strings.HasPrefix(p, "/api/v1/"):
		_, found, err := s.tenantByKey(c)
		return found, errAPIKey, err
	}
	if s.Credentialed != nil {
		ok, err := s.Credentialed(c)
		return ok, errPreAuth, err
	}
	return false, errPreAuth, nil
}

// tenantByKey looks up the tenant of the request's x-api-key, current or within its
// rotation grace, of an active tenant (remembered for a while: apikeys.go).
func (s *server) tenantByKey(c *fiber.Ctx) (store.Tenant, bool, error) {
	key := c.Get("x-api-key")
	if key == "" || len(key) > 256 {
		return store.Tenant{}, false, nil
	}
	h := sha256.Sum256([]byte(key))
	if t, ok := s.apiKeys.get(h); ok {
		return t, true, nil
	}
	gen := s.apiKeys.generation()
	t, until, err := s.Store.TenantByAPIKeyUntil(c.UserContext(), key)
	if errors.Is(err, store.ErrNotFound) {
		return store.Tenant{}, false, nil
	}
	if err != nil {
		return store.Tenant{}, false, err
	}
	s.apiKeys.put(gen, h, t, until)
	return t, true, nil
}

// clientKey is the client address a budget is counted for: the one TRUSTED_PROXIES
// resolve (Envoy's x-forwarded-for), canonicalised as the limits count it.
func (s *server) clientKey(c *fiber.Ctx) string {
	if s.ClientIP != nil {
		if k, ok := s.ClientIP.ClientKey(c.Context().RemoteAddr().String(), c.Get(fiber.HeaderXForwardedFor)); ok {
			return k
		}
	}
	return c.IP()
}

// registerBodyMetrics exposes the budget.
func (s *server) registerBodyMetrics() {
	s.Metrics.GaugeFunc("converger_core_body_bytes", "Bytes held for request bodies being read or handled (bounded by CORE_BODY_BUDGET_MB).",
		func() float64 { return float64(s.bodies.Used()) })
	for i, reason := range bodybudget.Reasons {
		s.Metrics.CounterFunc("converger_core_bodies_refused_"+reason+"_total", "Request bodies refused: "+strings.ReplaceAll(reason, "_", " ")+".",
			func() float64 { return float64(s.bodies.Refused(i)) })
	}
}
