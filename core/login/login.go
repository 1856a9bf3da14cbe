// Package login serves the admin and tenant portal login pages (CORE_API.md §9):
// server-rendered forms with CSRF tokens and server-side sessions, the lockout of failed
// logins through the sidecar's Limiter, TOTP two-factor authentication with recovery
// codes, and password resets by email.
//
// The pages under /admin and /portal are the same but for the account they sign in: an
// admin (admin_users, by email) or a tenant user (tenant_users, by tenant name and
// email). Every POST carries a CSRF token: one derived from the session for signed-in
// pages, or a random one kept in a cookie (double submit) before sign-in. Every attempt
// at a password or code is taken from the buckets login_ip and login_account before the
// secret is checked, in one atomic operation each (Limiter.Take), and given back when it
// succeeds (Refund); a login is answered 429 without checking the secret when either
// has no room left, so parallel guesses never check more than the limit. Password hashes
// run in a bounded number of slots (passwords.Gate).
package login

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/template/html/v2"
	"github.com/valyala/fasthttp"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/pgguard"
)

//go:embed templates/*.html
var templateFiles embed.FS

// Names and limits of the pages.
const (
	// SessionCookie holds the session id.
	SessionCookie = "converger_session"
	// csrfCookie holds the double-submit CSRF token of the pages before sign-in.
	csrfCookie = "converger_csrf"
	// noticeCookie carries a notice across a redirect (a fixed code, never text).
	noticeCookie = "converger_notice"
	// MinPasswordLength is the fewest characters a new password may have.
	MinPasswordLength = 12
	// totpStageTTL bounds a half-signed-in session waiting for its TOTP code.
	totpStageTTL = 5 * time.Minute
	// ResetTTL is how long a password reset link works.
	ResetTTL = time.Hour
	// Default session lifetimes (SESSION_IDLE_TIMEOUT, SESSION_MAX_AGE).
	DefaultIdleTimeout = 30 * time.Minute
	DefaultMaxAge      = 12 * time.Hour
	// limiterTimeout bounds one call to the Limiter.
	limiterTimeout = 2 * time.Second
	// outboxSize bounds the background jobs (password resets and their emails)
	// waiting; more are dropped and logged.
	outboxSize = 256
	// maxEmailLength and maxTenantNameLength bound the form fields (bytes, runes).
	maxEmailLength      = 254
	maxTenantNameLength = 100
)

// Options are what the pages work with.
type Options struct {
	Store *store.Store
	// Sealer seals TOTP secrets (ENCRYPTION_KEY).
	Sealer *credentials.Sealer
	// Limiter counts failed logins and password resets: the sidecar's (LIMITER_ADDR) or
	// a LocalLimiter.
	Limiter Limiter
	// Mailer sends the password reset links.
	Mailer mail.Sender
	// ClientIP resolves a request's client address from its peer and x-forwarded-for
	// (TRUSTED_PROXIES); nil trusts no proxy.
	ClientIP *clientip.Resolver
	// PublicURL is the base of the links in emails; cookies are Secure when it is https.
	PublicURL string
	// IdleTimeout and MaxAge end sessions unused for that long, or that old.
	IdleTimeout, MaxAge time.Duration
	// PasswordParams hash new passwords and the stand-in hash that unknown accounts are
	// checked against (zero: passwords.Default).
	PasswordParams passwords.Params
	// Hashes bounds the password hashes computed at once (PASSWORD_HASH_CONCURRENCY);
	// nil: a gate of passwords.DefaultConcurrency slots.
	Hashes *passwords.Gate
	// PurgeInterval is how often expired sessions and reset tokens are deleted
	// (DefaultPurgeInterval when zero).
	PurgeInterval time.Duration
	// Now is the clock (time.Now when nil).
	Now    func() time.Time
	Logger *slog.Logger
}

// DefaultPurgeInterval is how often the pages delete expired sessions and reset tokens.
const DefaultPurgeInterval = 10 * time.Minute

// Pages serves the login pages. Close stops its mail sender and its purge of expired
// sessions.
type Pages struct {
	Options
	views *html.Engine
	// dummyHash is verified for unknown accounts, so that they take as long as known ones.
	dummyHash string
	secure    bool
	csp       string

	// outbox holds the background jobs: password resets and emails, done one after
	// another by sendMail, so that no answer waits for them.
	outbox    chan func()
	closeOnce sync.Once
	done      chan struct{}
	sent      sync.WaitGroup
}

// realm is one family of pages: the admin pages or the tenant portal.
type realm struct {
	kind   string // store.KindAdmin or store.KindTenant
	prefix string // "/admin" or "/portal"
	portal bool
	title  string
}

var (
	adminRealm  = realm{kind: store.KindAdmin, prefix: "/admin", title: "Converger admin"}
	portalRealm = realm{kind: store.KindTenant, prefix: "/portal", portal: true, title: "Converger tenant portal"}
)

// New checks the options, parses the templates and starts the mail sender.
func New(o Options) (*Pages, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("login: a store is required")
	case o.Sealer == nil:
		return nil, errors.New("login: ENCRYPTION_KEY is required to seal TOTP secrets")
	case o.Limiter == nil:
		return nil, errors.New("login: a limiter is required")
	case o.Mailer == nil:
		return nil, errors.New("login: a mail sender is required")
	}
	if o.ClientIP == nil {
		o.ClientIP = &clientip.Resolver{}
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.PasswordParams == (passwords.Params{}) {
		o.PasswordParams = passwords.Default
	}
	if o.Hashes == nil {
		o.Hashes = passwords.NewGate(0, 0)
	}
	if o.PurgeInterval <= 0 {
		o.PurgeInterval = DefaultPurgeInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.PublicURL = strings.TrimRight(o.PublicURL, "/")
	dummy, err := passwords.HashWith(credentials.Random(18), o.PasswordParams)
	if err != nil {
		return nil, fmt.Errorf("login: %w", err)
	}
	sub, err := fs.Sub(templateFiles, "templates")
	if err != nil {
		return nil, err
	}
	views := html.NewFileSystem(http.FS(sub), ".html")
	if err := views.Load(); err != nil {
		return nil, fmt.Errorf("login: templates: %w", err)
	}
	layout, err := templateFiles.ReadFile("templates/layout.html")
	if err != nil {
		return nil, err
	}
	p := &Pages{
		Options:   o,
		views:     views,
		dummyHash: dummy,
		secure:    strings.HasPrefix(o.PublicURL, "https://"),
		csp:       ContentSecurityPolicy(layout),
		outbox:    make(chan func(), outboxSize),
		done:      make(chan struct{}),
	}
	p.sent.Add(2)
	go p.sendMail()
	go p.purge()
	return p, nil
}

// purge deletes expired sessions and reset tokens every PurgeInterval until Close, so
// that rows of users who never come back do not stay forever.
func (p *Pages) purge() {
	defer p.sent.Done()
	t := time.NewTicker(p.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			sessions, resets, err := p.Store.PurgeLogins(ctx, p.Now(), p.IdleTimeout)
			cancel()
			if err != nil {
				p.Logger.Warn("login: deleting expired sessions failed", "error", err)
				continue
			}
			if sessions+resets > 0 {
				p.Logger.Debug("login: deleted expired sessions and reset tokens", "sessions", sessions, "reset_tokens", resets)
			}
		}
	}
}

// Close stops the purge and the mail sender after the emails already queued, waiting
// for them at most ten seconds.
func (p *Pages) Close() {
	p.closeOnce.Do(func() {
		close(p.done)
		finished := make(chan struct{})
		go func() { p.sent.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			p.Logger.Warn("login: stopped without sending every queued email")
		}
	})
}

// Register adds the pages of both realms to r.
func (p *Pages) Register(r fiber.Router) {
	for _, rl := range []realm{adminRealm, portalRealm} {
		r.Use(rl.prefix, p.headers(rl))
		r.Get(rl.prefix, p.home(rl))
		r.Get(rl.prefix+"/login", p.loginPage(rl))
		r.Post(rl.prefix+"/login", p.login(rl))
		r.Get(rl.prefix+"/login/totp", p.totpPage(rl))
		r.Post(rl.prefix+"/login/totp", p.totpLogin(rl))
		r.Get(rl.prefix+"/totp/enrol", p.enrolPage(rl))
		r.Post(rl.prefix+"/totp/enrol", p.enrol(rl))
		r.Get(rl.prefix+"/password/reset", p.resetRequestPage(rl))
		r.Post(rl.prefix+"/password/reset", p.resetRequest(rl))
		r.Get(rl.prefix+"/password/reset/:token", p.resetPage(rl))
		r.Post(rl.prefix+"/password/reset/:token", p.reset(rl))
		r.Get(rl.prefix+"/password/change", p.changePage(rl))
		r.Post(rl.prefix+"/password/change", p.change(rl))
		r.Post(rl.prefix+"/logout", p.logout(rl))
		r.Use(rl.prefix, p.notFound(rl))
	}
}

// under reports whether path is prefix or below it (fiber's Use also matches
// "/administrator" for "/admin"). Routing ignores case, and so does this.
func under(path, prefix string) bool {
	return len(path) >= len(prefix) && strings.EqualFold(path[:len(prefix)], prefix) &&
		(len(path) == len(prefix) || path[len(prefix)] == '/')
}

// ContentSecurityPolicy is the policy of pages rendered from layout: it allows nothing
// but the layout's inline style (by its hash), data: images (the TOTP QR code) and
// forms posting to the core itself.
func ContentSecurityPolicy(layout []byte) string {
	style := ""
	if m := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindSubmatch(layout); m != nil {
		sum := sha256.Sum256(m[1])
		style = "; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	return "default-src 'none'" + style + "; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}

// SetPageHeaders sets the security headers of a server-rendered page (these and the
// console's): no caching (pages hold secrets, CSRF tokens, addresses and emails), no
// framing, no scripts (csp, from ContentSecurityPolicy).
func SetPageHeaders(h *fasthttp.ResponseHeader, csp string) {
	h.Set("Cache-Control", "no-store")
	h.Set("Pragma", "no-cache")
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// headers sets the page headers on every page of the realm.
func (p *Pages) headers(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if under(c.Path(), rl.prefix) {
			SetPageHeaders(&c.Response().Header, p.csp)
		}
		return c.Next()
	}
}

// view is what the templates render.
type view struct {
	Title  string
	Prefix string
	Portal bool
	CSRF   string
	Error  string
	Notice string
	// The login and reset forms' values, shown again after an error.
	Email, TenantName string
	// Signed-in pages.
	WhoAmI      string
	Tenant      string
	TOTPEnabled bool
	// TOTP enrolment.
	QR            template.URL
	Secret, URI   string
	RecoveryCodes []string
	// Action is the path a form posts to when it is not fixed (the reset link's).
	Action string
}

func (p *Pages) newView(rl realm) *view {
	return &view{Title: rl.title, Prefix: rl.prefix, Portal: rl.portal}
}

// render answers with a page in the layout.
func (p *Pages) render(c *fiber.Ctx, status int, name string, v *view) error {
	var b bytes.Buffer
	if err := p.views.Render(&b, name, v, "layout"); err != nil {
		p.Logger.Error("login: rendering a page", "template", name, "error", err, "request_id", requestID(c))
		c.Set(fiber.HeaderContentType, fiber.MIMETextPlainCharsetUTF8)
		return c.Status(fiber.StatusInternalServerError).SendString("Something went wrong.")
	}
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	return c.Status(status).Send(b.Bytes())
}

// message answers with the message page: an error in id="error".
func (p *Pages) message(c *fiber.Ctx, rl realm, status int, text string) error {
	v := p.newView(rl)
	v.Error = text
	return p.render(c, status, "message", v)
}

// internalError logs err and answers 500, or 503 when the database did not answer in
// time (down, hung or overloaded).
func (p *Pages) internalError(c *fiber.Ctx, rl realm, err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	if pgguard.Unavailable(err) {
		c.Set(fiber.HeaderRetryAfter, "1")
		return p.message(c, rl, fiber.StatusServiceUnavailable, "The service is busy or unavailable right now. Try again in a minute.")
	}
	// The realm, not the path: a reset link's path holds its token.
	p.Logger.Error("login: request failed", "request_id", requestID(c), "method", c.Method(), "realm", rl.prefix, "error", err)
	return p.message(c, rl, fiber.StatusInternalServerError, "Something went wrong. Try again later.")
}

// forbidden answers a POST whose CSRF token is missing or wrong.
func (p *Pages) forbidden(c *fiber.Ctx, rl realm) error {
	return p.message(c, rl, fiber.StatusForbidden, "The form has expired or did not come from this site. Go back, reload the page and try again.")
}

func (p *Pages) notFound(rl realm) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if !under(c.Path(), rl.prefix) {
			return c.Next()
		}
		return p.message(c, rl, fiber.StatusNotFound, "There is no such page.")
	}
}

// redirect answers 303 See Other.
func redirect(c *fiber.Ctx, path string) error {
	return c.Redirect(path, fiber.StatusSeeOther)
}

// requestID is the answer's x-request-id (set by the API's middleware).
func requestID(c *fiber.Ctx) string { return string(c.Response().Header.Peek("x-request-id")) }

// field returns a form value copied out of fiber's buffers.
func field(c *fiber.Ctx, name string) string { return strings.Clone(c.FormValue(name)) }

// normalize is how emails and tenant names are keyed: trimmed and lower-cased.
func normalize(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// setCookie sets one of the pages' cookies: HttpOnly, SameSite=Lax, Path=/, Secure
// behind https. maxAge 0 makes a cookie of the browser session.
func (p *Pages) setCookie(c *fiber.Ctx, name, value string, maxAge time.Duration) {
	c.Cookie(&fiber.Cookie{Name: name, Value: value, Path: "/", HTTPOnly: true, SameSite: fiber.CookieSameSiteLaxMode,
		Secure: p.secure, MaxAge: int(maxAge / time.Second), SessionOnly: maxAge == 0})
}

func (p *Pages) clearCookie(c *fiber.Ctx, name string) {
	c.Cookie(&fiber.Cookie{Name: name, Path: "/", HTTPOnly: true, SameSite: fiber.CookieSameSiteLaxMode,
		Secure: p.secure, Expires: fasthttp.CookieExpireDelete})
}

// The notices carried across a redirect.
var notices = map[string]string{
	"password_reset": "Your password has been changed. Sign in with the new one.",
	"signed_out":     "You have been signed out.",
}

// takeNotice returns and clears the notice of the previous answer.
func (p *Pages) takeNotice(c *fiber.Ctx) string {
	code := c.Cookies(noticeCookie)
	if code == "" {
		return ""
	}
	p.clearCookie(c, noticeCookie)
	return notices[code]
}

// csrfFromSession is the CSRF token of a session: a digest of its secret id, so that
// it needs no storage and no one without the cookie can compute it.
func csrfFromSession(rawID string) string {
	sum := sha256.Sum256([]byte("converger csrf\x00" + rawID))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// formToken returns the CSRF token for a page's forms: the session's when signed in (or
// half signed in), else the double-submit cookie's, which is set when missing.
func (p *Pages) formToken(c *fiber.Ctx, s *session) string {
	if s != nil {
		return csrfFromSession(s.raw)
	}
	if t := c.Cookies(csrfCookie); validToken(t) {
		return strings.Clone(t)
	}
	t := credentials.Random(32)
	p.setCookie(c, csrfCookie, t, 0)
	return t
}

// checkCSRF reports whether the form's _csrf is the session's token or the
// double-submit cookie's, compared in constant time.
func (p *Pages) checkCSRF(c *fiber.Ctx, s *session) bool {
	got := []byte(c.FormValue("_csrf"))
	if len(got) == 0 {
		return false
	}
	ok := false
	if s != nil {
		ok = subtle.ConstantTimeCompare(got, []byte(csrfFromSession(s.raw))) == 1
	}
	if t := c.Cookies(csrfCookie); validToken(t) {
		ok = subtle.ConstantTimeCompare(got, []byte(t)) == 1 || ok
	}
	return ok
}

// validToken reports whether s looks like 32 random bytes in base64url: session ids,
// CSRF tokens and reset tokens.
func validToken(s string) bool {
	if len(s) != 43 {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil
}

// hashToken is how session ids and reset tokens are stored.
func hashToken(s string) []byte { return credentials.Hash(s) }

// clientIP is the request's counted client address as the sidecar resolves and
// canonicalises it (an IPv6 client per prefix).
func (p *Pages) clientIP(c *fiber.Ctx) string {
	k, ok := p.ClientIP.ClientKey(c.Context().RemoteAddr().String(), c.Get("x-forwarded-for"))
	if !ok {
		return "unknown"
	}
	return k
}

// limiterContext bounds a call to the Limiter.
func limiterContext(c *fiber.Ctx) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.UserContext(), limiterTimeout)
}

// sendMail runs the queued background jobs (password resets, emails) one after another
// until Close.
func (p *Pages) sendMail() {
	defer p.sent.Done()
	for {
		select {
		case job := <-p.outbox:
			job()
		case <-p.done:
			for {
				select {
				case job := <-p.outbox:
					job()
				default:
					return
				}
			}
		}
	}
}

func (p *Pages) deliver(m mail.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Mailer.Send(ctx, m); err != nil {
		// The recipient is personal data, and the body holds a working link: neither is logged.
		p.Logger.Error("login: sending an email failed", "subject", m.Subject, "error", err)
	}
}

// background hands a job to the sender without waiting, so that an answer does not
// tell from its timing what was done for it. what names the job in the log when the
// queue is full and it is dropped.
func (p *Pages) background(what string, job func()) {
	select {
	case p.outbox <- job:
	default:
		p.Logger.Error("login: too many background jobs waiting; one was dropped", "job", what)
	}
}
