// Package config reads the core's configuration from the environment and refuses
// invalid values with a message naming the variable.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	netmail "net/mail"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/shared/token"
)

// Config is the core's configuration.
type Config struct {
	Addr        string // CORE_ADDR
	DatabaseURL string // DATABASE_URL (required)
	// PublicURL is the base URL clients reach the core at (PUBLIC_URL), for streamUrl and
	// contentUrl; default http://CORE_ADDR.
	PublicURL   string
	Signer      *token.Signer       // TOKEN_SIGNING_KEY (required to serve)
	Verifier    *token.Verifier     // the signer's public key plus TOKEN_VERIFY_KEYS
	Sealer      *credentials.Sealer // ENCRYPTION_KEY
	LimiterAddr string              // LIMITER_ADDR
	AuthzAddr   string              // AUTHZ_ADDR
	// TLS and OpsTLS are the TLS of CORE_ADDR and CORE_OPS_ADDR (CORE_TLS_*,
	// CORE_OPS_TLS_*; see shared/tlsconfig); nil: plain text.
	TLS, OpsTLS *tlsconfig.ServerFiles
	// AuthzTLS and LimiterTLS are how the clients of AUTHZ_ADDR and LIMITER_ADDR speak
	// TLS (AUTHZ_TLS_*, LIMITER_TLS_*); nil: plain text.
	AuthzTLS, LimiterTLS *tlsconfig.ClientFiles
	// AuthzFailOpen lets requests through unchecked when the AUTHZ_ADDR Check fails,
	// but on the routes that protect credentials (AUTHZ_FAIL_OPEN, default true).
	AuthzFailOpen bool
	// TrustedProxies resolves and canonicalises client addresses (TRUSTED_PROXIES, CLIENT_IPV6_PREFIX), as the sidecar does.
	TrustedProxies *clientip.Resolver
	Limits         activity.Limits // ACTIVITY_MAX_*
	MaxUploadBytes int             // UPLOAD_MAX_BYTES
	LogLevel       slog.Level
	LogFormat      string
	// AdminEmail and AdminPassword create the first admin at start when there is no admin
	// (ADMIN_EMAIL, ADMIN_PASSWORD); without a password a random one is printed once.
	AdminEmail    string
	AdminPassword string
	// SMTP sends the login pages' email (SMTP_URL, with SMTP_FROM as its sender); nil:
	// email is written to the log.
	SMTP     *mail.SMTP
	SMTPFrom string // SMTP_FROM
	// SessionIdleTimeout and SessionMaxAge end login sessions unused for that long, or
	// that old (SESSION_IDLE_TIMEOUT, SESSION_MAX_AGE).
	SessionIdleTimeout time.Duration
	SessionMaxAge      time.Duration
	// PasswordHashConcurrency bounds the password hashes computed at once
	// (PASSWORD_HASH_CONCURRENCY; 0: one per CPU, passwords.DefaultConcurrency).
	PasswordHashConcurrency int
	// CORSOrigins are the origins whose web pages may call the client API, for every
	// tenant (CORS_ORIGINS): canonical origins, or "*" alone for any origin; empty: only
	// the tenants' own allowed origins.
	CORSOrigins []string
	// OpsAddr serves /healthz, /readyz and /metrics (CORE_OPS_ADDR), apart from the API.
	OpsAddr string
	// AccessLog writes one log line per request (CORE_ACCESS_LOG).
	AccessLog bool
	Bounds    Bounds
}

// Bounds are the core's limits on connections, requests and database calls.
type Bounds struct {
	// MaxConns bounds the open connections (CORE_MAX_CONNS); 0: three quarters of the
	// open-files limit, at most 10,000 (netlimit.DefaultMaxConns).
	MaxConns int
	// MaxConnsPerIP bounds the open connections of one client address, except the
	// TRUSTED_PROXIES (CORE_MAX_CONNS_PER_IP); 0: no bound.
	MaxConnsPerIP int
	// MaxInFlight bounds the requests being handled at once; beyond it a request is
	// answered 503 at once (CORE_MAX_IN_FLIGHT).
	MaxInFlight int
	// RequestTimeout bounds the handling of one request, database calls included
	// (CORE_REQUEST_TIMEOUT); Envoy's x-envoy-expected-rq-timeout-ms may shorten it.
	RequestTimeout time.Duration
	// ReadTimeout bounds reading a request's headers and body (CORE_READ_TIMEOUT);
	// uploads get UploadReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing an answer (CORE_WRITE_TIMEOUT).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle for that long (CORE_IDLE_TIMEOUT).
	IdleTimeout time.Duration
	// DatabaseTimeout bounds every PostgreSQL query and new connection
	// (DATABASE_TIMEOUT).
	DatabaseTimeout time.Duration
	// DatabaseAcquireTimeout bounds the wait for a connection of the pool
	// (DATABASE_ACQUIRE_TIMEOUT): under overload, a request that gets none in time is
	// answered 503 rather than waiting past its client's patience.
	DatabaseAcquireTimeout time.Duration
	// BodyBudgetMB bounds, in MiB, the request bodies held at once, being read or
	// handled (CORE_BODY_BUDGET_MB); BodyBudgetPerIPMB those of one client address
	// (CORE_BODY_BUDGET_PER_IP_MB). Beyond either a request is answered 503.
	BodyBudgetMB, BodyBudgetPerIPMB int
	// BodyMinRate is the least average rate, in bytes per second, of a body still
	// arriving 5 s after it began (CORE_BODY_MIN_RATE; 0: none): slower, 408.
	BodyMinRate int
	// MaxStreamsPerToken, MaxStreamsPerConversation and MaxSocketsPerIP bound the
	// long-lived connections of one core: Direct Line streams of one token
	// (CORE_MAX_STREAMS_PER_TOKEN) and of one conversation
	// (CORE_MAX_STREAMS_PER_CONVERSATION), and WebSockets (streams and legacy sockets
	// together) of one client address (CORE_MAX_SOCKETS_PER_IP). Beyond them, 429.
	MaxStreamsPerToken, MaxStreamsPerConversation, MaxSocketsPerIP int
}

// DefaultBounds are the bounds without their variables.
var DefaultBounds = Bounds{
	MaxConnsPerIP:          512,
	MaxInFlight:            512,
	RequestTimeout:         10 * time.Second,
	ReadTimeout:            10 * time.Second,
	WriteTimeout:           30 * time.Second,
	IdleTimeout:            2 * time.Minute,
	DatabaseTimeout:        3 * time.Second,
	DatabaseAcquireTimeout: 500 * time.Millisecond,
	// 64 MiB of bodies fit the core's container (512 MiB, deploy/kubernetes) with room
	// for everything else; one client address may hold a quarter of it, enough for
	// three of the largest uploads.
	BodyBudgetMB:              64,
	BodyBudgetPerIPMB:         16,
	BodyMinRate:               1024,
	MaxStreamsPerToken:        10,
	MaxStreamsPerConversation: 50,
	MaxSocketsPerIP:           256,
}

// MinAdminPasswordLength is the fewest characters ADMIN_PASSWORD may have.
const MinAdminPasswordLength = 12

// maxSessionDuration bounds SESSION_IDLE_TIMEOUT and SESSION_MAX_AGE.
const maxSessionDuration = 30 * 24 * time.Hour

// Load reads the configuration through getenv. Serving needs DATABASE_URL and
// TOKEN_SIGNING_KEY; the management commands only DATABASE_URL (and ENCRYPTION_KEY to
// create channels), so Load checks the formats and callers check what they need.
func Load(getenv func(string) string) (*Config, error) {
	c := &Config{
		Addr:           orDefault(getenv("CORE_ADDR"), "127.0.0.1:8080"),
		DatabaseURL:    strings.TrimSpace(getenv("DATABASE_URL")),
		LimiterAddr:    strings.TrimSpace(getenv("LIMITER_ADDR")),
		AuthzAddr:      strings.TrimSpace(getenv("AUTHZ_ADDR")),
		Limits:         activity.DefaultLimits,
		MaxUploadBytes: 4 << 20,
		LogFormat:      orDefault(getenv("LOG_FORMAT"), "json"),
		OpsAddr:        orDefault(getenv("CORE_OPS_ADDR"), "127.0.0.1:8083"),
		Bounds:         DefaultBounds,
	}
	for _, v := range []struct{ name, val string }{{"CORE_ADDR", c.Addr}, {"CORE_OPS_ADDR", c.OpsAddr}} {
		if err := checkAddr(v.val); err != nil {
			return nil, fmt.Errorf("%s=%q: %w", v.name, v.val, err)
		}
	}
	for _, v := range []struct{ name, val string }{{"LIMITER_ADDR", c.LimiterAddr}, {"AUTHZ_ADDR", c.AuthzAddr}} {
		if v.val != "" {
			if err := checkAddr(v.val); err != nil {
				return nil, fmt.Errorf("%s=%q: %w", v.name, v.val, err)
			}
		}
	}
	var err error
	if err := c.loadTLS(getenv); err != nil {
		return nil, err
	}
	switch v := strings.ToLower(orDefault(getenv("AUTHZ_FAIL_OPEN"), "true")); v {
	case "true", "false":
		c.AuthzFailOpen = v == "true"
	default:
		return nil, fmt.Errorf("AUTHZ_FAIL_OPEN=%q: must be true or false", v)
	}
	scheme := "http://"
	if c.TLS != nil {
		scheme = "https://"
	}
	c.PublicURL = strings.TrimRight(orDefault(getenv("PUBLIC_URL"), scheme+c.Addr), "/")
	if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("PUBLIC_URL=%q: must be an http(s) URL such as https://api.example.com", c.PublicURL)
	}
	if v := strings.TrimSpace(getenv("TOKEN_SIGNING_KEY")); v != "" {
		if c.Signer, err = token.ParseSigningKey(v); err != nil {
			return nil, fmt.Errorf("TOKEN_SIGNING_KEY: %w", err)
		}
		keys := c.Signer.PublicKey()
		if extra := strings.TrimSpace(getenv("TOKEN_VERIFY_KEYS")); extra != "" {
			keys += "," + extra
		}
		if c.Verifier, err = token.ParseVerifyKeys(keys); err != nil {
			return nil, fmt.Errorf("TOKEN_VERIFY_KEYS: %w", err)
		}
	}
	if v := strings.TrimSpace(getenv("ENCRYPTION_KEY")); v != "" {
		if c.Sealer, err = credentials.ParseEncryptionKey(v); err != nil {
			return nil, fmt.Errorf("ENCRYPTION_KEY: %w", err)
		}
	}
	if c.TrustedProxies, err = clientip.Load(getenv); err != nil {
		return nil, err
	}
	for _, n := range []struct {
		name string
		dst  *int
	}{
		{"ACTIVITY_MAX_TEXT_BYTES", &c.Limits.MaxTextBytes},
		{"ACTIVITY_MAX_ATTACHMENTS", &c.Limits.MaxAttachments},
		{"ACTIVITY_MAX_ATTACHMENT_BYTES", &c.Limits.MaxAttachmentBytes},
		{"ACTIVITY_MAX_METADATA_BYTES", &c.Limits.MaxMetadataBytes},
		{"UPLOAD_MAX_BYTES", &c.MaxUploadBytes},
	} {
		if v := strings.TrimSpace(getenv(n.name)); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i <= 0 || i > 1<<30 {
				return nil, fmt.Errorf("%s=%q: must be a positive whole number", n.name, v)
			}
			*n.dst = i
		}
	}
	if err := c.loadBounds(getenv); err != nil {
		return nil, err
	}
	switch v := strings.ToLower(orDefault(getenv("CORE_ACCESS_LOG"), "true")); v {
	case "true", "1", "yes", "on":
		c.AccessLog = true
	case "false", "0", "no", "off":
	default:
		return nil, fmt.Errorf("CORE_ACCESS_LOG=%q: must be true or false", v)
	}
	switch v := strings.ToLower(orDefault(getenv("LOG_LEVEL"), "info")); v {
	case "debug", "info", "warn", "error":
		_ = c.LogLevel.UnmarshalText([]byte(v))
	default:
		return nil, fmt.Errorf("LOG_LEVEL=%q: must be debug, info, warn or error", v)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return nil, fmt.Errorf("LOG_FORMAT=%q: must be json or text", c.LogFormat)
	}
	if err := c.loadLogins(getenv); err != nil {
		return nil, err
	}
	if c.CORSOrigins, err = parseCORSOrigins(getenv("CORS_ORIGINS")); err != nil {
		return nil, fmt.Errorf("CORS_ORIGINS: %w", err)
	}
	return c, nil
}

// loadTLS reads the TLS of the two ports and of the two clients of the sidecar.
func (c *Config) loadTLS(getenv func(string) string) error {
	var err error
	if c.TLS, err = tlsconfig.LoadServer(getenv, "CORE_TLS"); err != nil {
		return err
	}
	if c.OpsTLS, err = tlsconfig.LoadServer(getenv, "CORE_OPS_TLS"); err != nil {
		return err
	}
	if c.AuthzTLS, err = tlsconfig.LoadClient(getenv, "AUTHZ_TLS"); err != nil {
		return err
	}
	if c.LimiterTLS, err = tlsconfig.LoadClient(getenv, "LIMITER_TLS"); err != nil {
		return err
	}
	for _, v := range []struct {
		name string
		f    *tlsconfig.ClientFiles
		addr string
	}{{"AUTHZ", c.AuthzTLS, c.AuthzAddr}, {"LIMITER", c.LimiterTLS, c.LimiterAddr}} {
		if v.f != nil && v.addr == "" {
			return fmt.Errorf("%s_TLS_CA_FILE is set but %s_ADDR is not", v.name, v.name)
		}
	}
	return nil
}

// parseCORSOrigins reads CORS_ORIGINS: origins separated by commas or spaces
// (https://shop.example.com,http://localhost:3000), or "*" alone.
func parseCORSOrigins(v string) ([]string, error) {
	list := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	if slices.Contains(list, "*") {
		if len(list) > 1 {
			return nil, errors.New(`"*" allows every origin: give it alone, or list the origins`)
		}
		return list, nil
	}
	return store.CanonicalOrigins(list)
}

// loadBounds reads the bounds on connections, requests and database calls.
func (c *Config) loadBounds(getenv func(string) string) error {
	for _, n := range []struct {
		name string
		dst  *int
		min  int
	}{
		{"CORE_MAX_CONNS", &c.Bounds.MaxConns, 1},
		{"CORE_MAX_CONNS_PER_IP", &c.Bounds.MaxConnsPerIP, 0},
		{"CORE_MAX_IN_FLIGHT", &c.Bounds.MaxInFlight, 1},
		{"CORE_BODY_BUDGET_MB", &c.Bounds.BodyBudgetMB, 1},
		{"CORE_BODY_BUDGET_PER_IP_MB", &c.Bounds.BodyBudgetPerIPMB, 1},
		{"CORE_BODY_MIN_RATE", &c.Bounds.BodyMinRate, 0},
		{"CORE_MAX_STREAMS_PER_TOKEN", &c.Bounds.MaxStreamsPerToken, 1},
		{"CORE_MAX_STREAMS_PER_CONVERSATION", &c.Bounds.MaxStreamsPerConversation, 1},
		{"CORE_MAX_SOCKETS_PER_IP", &c.Bounds.MaxSocketsPerIP, 1},
	} {
		if v := strings.TrimSpace(getenv(n.name)); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i < n.min || i > 1_000_000 {
				return fmt.Errorf("%s=%q: must be a whole number from %d to 1000000", n.name, v, n.min)
			}
			*n.dst = i
		}
	}
	for _, d := range []struct {
		name     string
		dst      *time.Duration
		min, max time.Duration
	}{
		{"CORE_REQUEST_TIMEOUT", &c.Bounds.RequestTimeout, 100 * time.Millisecond, 10 * time.Minute},
		{"CORE_READ_TIMEOUT", &c.Bounds.ReadTimeout, 100 * time.Millisecond, 10 * time.Minute},
		{"CORE_WRITE_TIMEOUT", &c.Bounds.WriteTimeout, 100 * time.Millisecond, 10 * time.Minute},
		{"CORE_IDLE_TIMEOUT", &c.Bounds.IdleTimeout, time.Second, 24 * time.Hour},
		{"DATABASE_TIMEOUT", &c.Bounds.DatabaseTimeout, 100 * time.Millisecond, 10 * time.Minute},
		{"DATABASE_ACQUIRE_TIMEOUT", &c.Bounds.DatabaseAcquireTimeout, 10 * time.Millisecond, 10 * time.Minute},
	} {
		if v := strings.TrimSpace(getenv(d.name)); v != "" {
			t, err := time.ParseDuration(v)
			if err != nil || t < d.min || t > d.max {
				return fmt.Errorf("%s=%q: must be a duration from %v to %v, such as 5s", d.name, v, d.min, d.max)
			}
			*d.dst = t
		}
	}
	return nil
}

// loadLogins reads the variables of the login pages. Secrets (ADMIN_PASSWORD, the
// password in SMTP_URL) never appear in an error.
func (c *Config) loadLogins(getenv func(string) string) error {
	c.AdminEmail = strings.TrimSpace(getenv("ADMIN_EMAIL"))
	c.AdminPassword = getenv("ADMIN_PASSWORD")
	if c.AdminEmail != "" {
		if err := store.CheckEmail(c.AdminEmail); err != nil {
			return fmt.Errorf("ADMIN_EMAIL: %w", err)
		}
	}
	if c.AdminPassword != "" {
		switch {
		case c.AdminEmail == "":
			return errors.New("ADMIN_PASSWORD is set but ADMIN_EMAIL is not: set both, or neither")
		case !utf8.ValidString(c.AdminPassword) || utf8.RuneCountInString(c.AdminPassword) < MinAdminPasswordLength:
			return fmt.Errorf("ADMIN_PASSWORD: must have at least %d characters", MinAdminPasswordLength)
		case len(c.AdminPassword) > passwords.MaxLength:
			return fmt.Errorf("ADMIN_PASSWORD: must have at most %d bytes", passwords.MaxLength)
		}
	}
	if v := strings.TrimSpace(getenv("PASSWORD_HASH_CONCURRENCY")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("PASSWORD_HASH_CONCURRENCY=%q: must be a whole number from 1 to 1024", v)
		}
		c.PasswordHashConcurrency = n
	}
	c.SMTPFrom = orDefault(getenv("SMTP_FROM"), mail.DefaultFrom)
	from, err := netmail.ParseAddress(c.SMTPFrom)
	if err != nil || len(c.SMTPFrom) > 320 {
		return fmt.Errorf("SMTP_FROM=%q: must be an email address, such as converger@example.com or \"Converger\" <converger@example.com>", c.SMTPFrom)
	}
	c.SMTPFrom = from.String()
	if v := strings.TrimSpace(getenv("SMTP_URL")); v != "" {
		s, err := mail.ParseURL(v)
		if err != nil {
			return fmt.Errorf("SMTP_URL: %w", err)
		}
		s.From = c.SMTPFrom
		c.SMTP = s
	}
	for _, d := range []struct {
		name string
		def  time.Duration
		dst  *time.Duration
	}{
		{"SESSION_IDLE_TIMEOUT", 30 * time.Minute, &c.SessionIdleTimeout},
		{"SESSION_MAX_AGE", 12 * time.Hour, &c.SessionMaxAge},
	} {
		*d.dst = d.def
		if v := strings.TrimSpace(getenv(d.name)); v != "" {
			t, err := time.ParseDuration(v)
			if err != nil || t < time.Minute || t > maxSessionDuration {
				return fmt.Errorf("%s=%q: must be a duration from 1m to %s, such as 30m or 12h", d.name, v, maxSessionDuration)
			}
			*d.dst = t
		}
	}
	return nil
}

// RequireServe checks what serving needs.
func (c *Config) RequireServe() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("DATABASE_URL is required")
	case c.Signer == nil:
		return errors.New("TOKEN_SIGNING_KEY is required (the base64 of a 32-byte Ed25519 seed): `core keys generate` makes one")
	case c.Sealer == nil:
		return errors.New("ENCRYPTION_KEY is required (the base64 of 32 random bytes): `core keys generate` makes one")
	}
	return nil
}

func orDefault(v, def string) string {
	if v = strings.TrimSpace(v); v == "" {
		return def
	}
	return v
}

func checkAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return errors.New("must be host:port")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return errors.New("the port must be a number from 0 to 65535")
	}
	return nil
}
