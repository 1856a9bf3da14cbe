package config

import (
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/core/activity"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestDefaults(t *testing.T) {
	c, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case c.Addr != "127.0.0.1:8080":
		t.Errorf("CORE_ADDR default %q: the core binds to loopback by default", c.Addr)
	case c.PublicURL != "http://127.0.0.1:8080":
		t.Errorf("PUBLIC_URL default %q", c.PublicURL)
	case c.Limits != activity.DefaultLimits:
		t.Errorf("limits %+v", c.Limits)
	case c.SessionIdleTimeout != 30*time.Minute || c.SessionMaxAge != 12*time.Hour:
		t.Errorf("sessions %v %v", c.SessionIdleTimeout, c.SessionMaxAge)
	case c.SMTP != nil || c.Signer != nil || c.Sealer != nil:
		t.Error("optional parts set without their variables")
	case c.OpsAddr != "127.0.0.1:8083" || !c.AccessLog || c.Bounds != DefaultBounds:
		t.Errorf("operations: %q, access log %v, bounds %+v", c.OpsAddr, c.AccessLog, c.Bounds)
	}
	c, err = Load(env(map[string]string{"CORE_MAX_CONNS": "100", "CORE_MAX_CONNS_PER_IP": "0", "CORE_MAX_IN_FLIGHT": "8",
		"CORE_REQUEST_TIMEOUT": "2s", "DATABASE_TIMEOUT": "500ms", "CORE_ACCESS_LOG": "off"}))
	if err != nil {
		t.Fatal(err)
	}
	if b := c.Bounds; b.MaxConns != 100 || b.MaxConnsPerIP != 0 || b.MaxInFlight != 8 || b.RequestTimeout != 2*time.Second ||
		b.DatabaseTimeout != 500*time.Millisecond || c.AccessLog {
		t.Errorf("bounds from the environment: %+v, access log %v", b, c.AccessLog)
	}
	if err := c.RequireServe(); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("RequireServe without DATABASE_URL: %v", err)
	}
}

// Every invalid value stops the start with a message that names the variable, and never
// repeats a secret.
func TestInvalidValuesNameTheVariable(t *testing.T) {
	const secret = "s3cret-Passw0rd-value"
	cases := []struct {
		vars map[string]string
		name string
	}{
		{map[string]string{"CORE_ADDR": "8080"}, "CORE_ADDR"},
		{map[string]string{"LIMITER_ADDR": "host:99999"}, "LIMITER_ADDR"},
		{map[string]string{"AUTHZ_ADDR": "nohost"}, "AUTHZ_ADDR"},
		{map[string]string{"AUTHZ_FAIL_OPEN": "maybe"}, "AUTHZ_FAIL_OPEN"},
		{map[string]string{"PASSWORD_HASH_CONCURRENCY": "0"}, "PASSWORD_HASH_CONCURRENCY"},
		{map[string]string{"CLIENT_IPV6_PREFIX": "200"}, "CLIENT_IPV6_PREFIX"},
		{map[string]string{"PUBLIC_URL": "ftp://x"}, "PUBLIC_URL"},
		{map[string]string{"TOKEN_SIGNING_KEY": secret}, "TOKEN_SIGNING_KEY"},
		{map[string]string{"ENCRYPTION_KEY": secret}, "ENCRYPTION_KEY"},
		{map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
		{map[string]string{"ADMIN_EMAIL": "not an email"}, "ADMIN_EMAIL"},
		{map[string]string{"ADMIN_PASSWORD": secret}, "ADMIN_EMAIL"},
		{map[string]string{"ADMIN_EMAIL": "a@example.com", "ADMIN_PASSWORD": "short"}, "ADMIN_PASSWORD"},
		{map[string]string{"SMTP_FROM": "nobody"}, "SMTP_FROM"},
		{map[string]string{"SMTP_URL": "http://user:" + secret + "@mail"}, "SMTP_URL"},
		{map[string]string{"SESSION_IDLE_TIMEOUT": "5s"}, "SESSION_IDLE_TIMEOUT"},
		{map[string]string{"SESSION_MAX_AGE": "forever"}, "SESSION_MAX_AGE"},
		{map[string]string{"CORS_ORIGINS": "shop.example.com"}, "CORS_ORIGINS"},
		{map[string]string{"CORS_ORIGINS": "https://shop.example.com/path"}, "CORS_ORIGINS"},
		{map[string]string{"CORS_ORIGINS": "*,https://shop.example.com"}, "CORS_ORIGINS"},
		{map[string]string{"CORS_ORIGINS": "null"}, "CORS_ORIGINS"},
		{map[string]string{"CORS_ORIGINS": "https://*.example.com"}, "CORS_ORIGINS"},
		{map[string]string{"CORE_OPS_ADDR": "localhost"}, "CORE_OPS_ADDR"},
		{map[string]string{"CORE_MAX_CONNS": "0"}, "CORE_MAX_CONNS"},
		{map[string]string{"CORE_MAX_CONNS_PER_IP": "-1"}, "CORE_MAX_CONNS_PER_IP"},
		{map[string]string{"CORE_MAX_IN_FLIGHT": "many"}, "CORE_MAX_IN_FLIGHT"},
		{map[string]string{"CORE_REQUEST_TIMEOUT": "1ms"}, "CORE_REQUEST_TIMEOUT"},
		{map[string]string{"CORE_READ_TIMEOUT": "10"}, "CORE_READ_TIMEOUT"},
		{map[string]string{"CORE_WRITE_TIMEOUT": "1h"}, "CORE_WRITE_TIMEOUT"},
		{map[string]string{"CORE_IDLE_TIMEOUT": "0s"}, "CORE_IDLE_TIMEOUT"},
		{map[string]string{"DATABASE_TIMEOUT": "forever"}, "DATABASE_TIMEOUT"},
		{map[string]string{"DATABASE_ACQUIRE_TIMEOUT": "1ms"}, "DATABASE_ACQUIRE_TIMEOUT"},
		{map[string]string{"CORE_ACCESS_LOG": "maybe"}, "CORE_ACCESS_LOG"},
	}
	for _, tc := range cases {
		_, err := Load(env(tc.vars))
		if err == nil {
			t.Errorf("%v: accepted", tc.vars)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%v: %q does not name %s", tc.vars, err, tc.name)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%v: the message repeats the secret: %q", tc.vars, err)
		}
	}
}

func TestLogins(t *testing.T) {
	c, err := Load(env(map[string]string{
		"ADMIN_EMAIL": " admin@example.com ", "ADMIN_PASSWORD": "a-long-enough-password",
		"SMTP_URL": "smtp://user:pw@127.0.0.1:2525", "SMTP_FROM": "Converger <c@example.com>",
		"SESSION_IDLE_TIMEOUT": "10m", "SESSION_MAX_AGE": "2h",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.AdminEmail != "admin@example.com" || c.SMTP == nil || c.SMTP.From != `"Converger" <c@example.com>` ||
		c.SessionIdleTimeout != 10*time.Minute || c.SessionMaxAge != 2*time.Hour {
		t.Fatalf("%+v", c)
	}
}

func TestCORSOrigins(t *testing.T) {
	for v, want := range map[string]string{
		"":    "",
		"*":   "*",
		" * ": "*",
		"https://Shop.example.com/, http://localhost:3000 https://shop.example.com:443": "http://localhost:3000 https://shop.example.com",
	} {
		c, err := Load(env(map[string]string{"CORS_ORIGINS": v}))
		if err != nil {
			t.Errorf("CORS_ORIGINS=%q: %v", v, err)
		} else if strings.Join(c.CORSOrigins, " ") != want {
			t.Errorf("CORS_ORIGINS=%q: %q %v, want %q", v, c.CORSOrigins, err, want)
		}
	}
}
