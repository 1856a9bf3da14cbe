// Package config reads the sidecar's configuration from the environment and the
// RATE_LIMIT_CONFIG file, and refuses invalid values with a message naming them.
package config

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/routes"
)

// Config is the sidecar's configuration.
type Config struct {
	GRPCAddr string // SIDECAR_GRPC_ADDR
	HTTPAddr string // SIDECAR_HTTP_ADDR
	// GRPCTLS and HTTPTLS are the ports' TLS (SIDECAR_GRPC_TLS_*, SIDECAR_HTTP_TLS_*, see
	// shared/tlsconfig); nil: plain text.
	GRPCTLS, HTTPTLS *tlsconfig.ServerFiles
	DatabaseURL      string // DATABASE_URL; "" runs without a database
	Backend          string // RATE_LIMIT_BACKEND: "local" or "cluster"
	SyncInterval     time.Duration
	// ShareMode (RATE_LIMIT_SHARE_MODE) divides each counter's limit among the nodes
	// of a cluster that count it.
	ShareMode bool
	// GrantWait (RATE_LIMIT_GRANT_WAIT_MS) is how long a check refused by its share-mode
	// bound below the limit waits for the key's owner to grant room (100 ms by default);
	// 0 never asks, and the node does not take part in the owner's grants.
	GrantWait time.Duration
	// GrantMaxLimit (RATE_LIMIT_GRANT_MAX_LIMIT) is the largest limit, in hits per
	// window, whose counters the owner's grants divide (100 by default); share mode
	// alone divides larger ones.
	GrantMaxLimit uint32
	Cluster       Cluster
	// ClockOffset shifts the sidecar's wall clock (SIDECAR_TEST_CLOCK_OFFSET_MS): a test
	// hook for a node whose clock is off.
	ClockOffset time.Duration
	// TrustedProxies resolves and canonicalises client addresses (TRUSTED_PROXIES, CLIENT_IPV6_PREFIX).
	TrustedProxies *clientip.Resolver
	// Verifier checks Converger tokens (TOKEN_VERIFY_KEYS); nil rejects every token.
	Verifier  *token.Verifier
	LogLevel  slog.Level
	LogFormat string // "json" or "text"
	// MaxChecksInFlight bounds the Checks being decided at once
	// (SIDECAR_MAX_CHECKS_IN_FLIGHT); beyond it a Check waits for its turn within its
	// deadline, then gets the fast 503 decision.
	MaxChecksInFlight int
	// HTTPMaxConns and HTTPMaxConnsPerIP bound the HTTP port's connections in total
	// (SIDECAR_HTTP_MAX_CONNS; 0: from the open-files limit) and per client address but
	// the TRUSTED_PROXIES (SIDECAR_HTTP_MAX_CONNS_PER_IP; 0: none).
	HTTPMaxConns, HTTPMaxConnsPerIP int
	// GCHeadroomMB is the garbage, in MiB, the collector lets the sidecar allocate
	// between two collections at least (SIDECAR_GC_HEADROOM_MB; 0: Go's own pacing;
	// GOGC in the environment overrides it), see shared/gctune.
	GCHeadroomMB int

	// From RATE_LIMIT_CONFIG.
	Limits        map[string]buckets.Limit // installation-wide limits by bucket
	OverrideTTL   time.Duration
	CleanPeriod   time.Duration
	CredentialTTL time.Duration
	DBWait        time.Duration
	// Routes are the configured routes followed by the built-in ones.
	Routes []routes.Route

	// The rate limit service (RLS_*).
	RLSDir             string     // RLS_CONFIG_DIR; "" serves no rules
	RLSRules           *rls.Rules // read from RLSDir; nil without it
	RLSShadowMode      bool       // RLS_SHADOW_MODE (the reference's SHADOW_MODE)
	RLSResponseHeaders bool       // RLS_RESPONSE_HEADERS (LIMIT_RESPONSE_HEADERS_ENABLED)
	// RLSMergeDomains (RLS_MERGE_DOMAIN_CONFIG, MERGE_DOMAIN_CONFIG) merges the files of
	// one domain.
	RLSMergeDomains bool
	// RLSQuotaMode (RLS_QUOTA_MODE, QUOTA_MODE) puts every descriptor in quota mode.
	RLSQuotaMode bool
	// RLSHeaderNames name the response headers (RLS_LIMIT_HEADER, RLS_REMAINING_HEADER,
	// RLS_RESET_HEADER; the reference's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
	// LIMIT_RESET_HEADER).
	RLSHeaderNames rls.HeaderNames
	// RLSDynamicMetadata (RLS_RESPONSE_DYNAMIC_METADATA, RESPONSE_DYNAMIC_METADATA)
	// returns the reference's dynamic metadata with every answer.
	RLSDynamicMetadata bool
	// RLSConfigType (RLS_CONFIG_TYPE, CONFIG_TYPE) is where the rules come from: FILE
	// (RLS_CONFIG_DIR) or GRPC_XDS_SOTW (an xDS server, RLSXDS).
	RLSConfigType string
	RLSXDS        XDS

	// GRPCMaxConnectionAge and its grace (SIDECAR_GRPC_MAX_CONNECTION_AGE,
	// SIDECAR_GRPC_MAX_CONNECTION_AGE_GRACE; the reference's GRPC_MAX_CONNECTION_AGE and
	// GRPC_MAX_CONNECTION_AGE_GRACE): a gRPC connection is asked to go away (GOAWAY) after
	// the age, give or take 10 %, and closed after the grace, so that the clients of a
	// shared deployment spread over new replicas.
	GRPCMaxConnectionAge, GRPCMaxConnectionAgeGrace time.Duration
}

// XDS is the rate limit service's xDS client (RLS_XDS_*, the reference's
// CONFIG_GRPC_XDS_*), used with RLS_CONFIG_TYPE=GRPC_XDS_SOTW.
type XDS struct {
	ServerURL string            // RLS_XDS_SERVER_URL (CONFIG_GRPC_XDS_SERVER_URL): host:port
	NodeID    string            // RLS_XDS_NODE_ID (CONFIG_GRPC_XDS_NODE_ID), "default"
	Metadata  map[string]string // RLS_XDS_NODE_METADATA (CONFIG_GRPC_XDS_NODE_METADATA): k=v,k=v
	Headers   map[string]string // RLS_XDS_CLIENT_ADDITIONAL_HEADERS (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS): k:v,k:v
	// BackoffInitial and BackoffMax bound the wait before connecting again
	// (RLS_XDS_BACKOFF_INITIAL_INTERVAL, XDS_CLIENT_BACKOFF_INITIAL_INTERVAL; 1 s;
	// RLS_XDS_BACKOFF_MAX_INTERVAL, XDS_CLIENT_BACKOFF_MAX_INTERVAL; 60 s): it doubles
	// from the first to the second, each wait drawn between half and all of it.
	BackoffInitial, BackoffMax time.Duration
	// TLS is how the connection to the server speaks TLS (RLS_XDS_TLS_CA_FILE, _CERT_FILE,
	// _KEY_FILE, _SERVER_NAME; the reference's CONFIG_GRPC_XDS_SERVER_USE_TLS=true with
	// CONFIG_GRPC_XDS_SERVER_TLS_CACERT, CONFIG_GRPC_XDS_CLIENT_TLS_CERT and _KEY,
	// CONFIG_GRPC_XDS_SERVER_TLS_SAN); nil: plain text.
	TLS *tlsconfig.ClientFiles
}

// Cluster is the membership configuration (CLUSTER_*), used by the cluster backend.
type Cluster struct {
	Strategy      string   // CLUSTER_STRATEGY: none, static or dns
	Join          []string // CLUSTER_JOIN
	DNSName       string   // CLUSTER_DNS_NAME
	BindAddr      string   // CLUSTER_BIND_ADDR
	AdvertiseAddr string   // CLUSTER_ADVERTISE_ADDR
	NodeName      string   // CLUSTER_NODE_NAME
	SecretKey     []byte   // CLUSTER_SECRET_KEY (decoded)
	Insecure      bool     // CLUSTER_INSECURE
	// Replication (CLUSTER_REPLICATION) is "owner" (the default: each key's values go
	// to its owner, which sends every member its summary) or "broadcast" (every value
	// to every member, as releases before owner replication did).
	Replication string
}

// Defaults.
const (
	DefaultMaxChecksInFlight = 256 // as authz.DefaultMaxInFlight
	DefaultGCHeadroomMB      = 128

	DefaultGRPCAddr = "127.0.0.1:8081"
	DefaultHTTPAddr = "127.0.0.1:8082"
	DefaultBindAddr = "127.0.0.1:7946"
)

// Load reads the configuration through getenv (os.Getenv in main).
func Load(getenv func(string) string) (*Config, error) {
	c := &Config{
		GRPCAddr:      orDefault(getenv("SIDECAR_GRPC_ADDR"), DefaultGRPCAddr),
		HTTPAddr:      orDefault(getenv("SIDECAR_HTTP_ADDR"), DefaultHTTPAddr),
		DatabaseURL:   strings.TrimSpace(getenv("DATABASE_URL")),
		SyncInterval:  100 * time.Millisecond,
		GrantWait:     100 * time.Millisecond,
		GrantMaxLimit: 100,
		Limits:        map[string]buckets.Limit{},
		OverrideTTL:   30 * time.Second,
		CleanPeriod:   60 * time.Second,
		CredentialTTL: 30 * time.Second,
		DBWait:        50 * time.Millisecond,
		LogFormat:     "json",

		MaxChecksInFlight: DefaultMaxChecksInFlight,
		HTTPMaxConnsPerIP: 512,
		GCHeadroomMB:      DefaultGCHeadroomMB,
	}
	for _, v := range []struct{ name, val string }{{"SIDECAR_GRPC_ADDR", c.GRPCAddr}, {"SIDECAR_HTTP_ADDR", c.HTTPAddr}} {
		if err := checkAddr(v.val); err != nil {
			return nil, fmt.Errorf("%s=%q: %w", v.name, v.val, err)
		}
	}
	var err error
	if c.GRPCTLS, err = tlsconfig.LoadServer(referenceTLS(getenv), "SIDECAR_GRPC_TLS"); err != nil {
		return nil, err
	}
	if c.HTTPTLS, err = tlsconfig.LoadServer(getenv, "SIDECAR_HTTP_TLS"); err != nil {
		return nil, err
	}
	if c.DatabaseURL != "" {
		// The parser's own message may quote the URL, password included, so it is not
		// repeated here.
		if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
			return nil, errors.New("DATABASE_URL: not a valid PostgreSQL connection string " +
				"(postgres://user:password@host:5432/database?sslmode=...)")
		}
	}

	if err := c.loadCluster(getenv); err != nil {
		return nil, err
	}
	if v := getenv("RATE_LIMIT_SYNC_INTERVAL_MS"); v != "" {
		ms, err := positiveMS(v, math.MaxInt32)
		if err != nil {
			return nil, fmt.Errorf("RATE_LIMIT_SYNC_INTERVAL_MS=%q: %w", v, err)
		}
		c.SyncInterval = ms
	}
	if v := strings.TrimSpace(getenv("RATE_LIMIT_GRANT_WAIT_MS")); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 || ms > 1000 {
			return nil, fmt.Errorf("RATE_LIMIT_GRANT_WAIT_MS=%q: must be whole milliseconds from 0 (never ask) to 1000", v)
		}
		c.GrantWait = time.Duration(ms) * time.Millisecond
	}
	if v := strings.TrimSpace(getenv("RATE_LIMIT_GRANT_MAX_LIMIT")); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("RATE_LIMIT_GRANT_MAX_LIMIT=%q: must be a whole number of hits per window from 1 to %d", v, uint32(math.MaxUint32))
		}
		c.GrantMaxLimit = uint32(n)
	}

	if c.TrustedProxies, err = clientip.Load(getenv); err != nil {
		return nil, err
	}
	if v := getenv("TOKEN_VERIFY_KEYS"); strings.TrimSpace(v) != "" {
		if c.Verifier, err = token.ParseVerifyKeys(v); err != nil {
			return nil, fmt.Errorf("TOKEN_VERIFY_KEYS: %w", err)
		}
	}
	for _, n := range []struct {
		name string
		dst  *int
		min  int
	}{
		{"SIDECAR_MAX_CHECKS_IN_FLIGHT", &c.MaxChecksInFlight, 1},
		{"SIDECAR_HTTP_MAX_CONNS", &c.HTTPMaxConns, 1},
		{"SIDECAR_HTTP_MAX_CONNS_PER_IP", &c.HTTPMaxConnsPerIP, 0},
		{"SIDECAR_GC_HEADROOM_MB", &c.GCHeadroomMB, 0},
	} {
		if v := strings.TrimSpace(getenv(n.name)); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i < n.min || i > 1_000_000 {
				return nil, fmt.Errorf("%s=%q: must be a whole number from %d to 1000000", n.name, v, n.min)
			}
			*n.dst = i
		}
	}
	switch v := strings.ToLower(orDefault(getenv("LOG_LEVEL"), "info")); v {
	case "debug", "info", "warn", "error":
		_ = c.LogLevel.UnmarshalText([]byte(v))
	default:
		return nil, fmt.Errorf("LOG_LEVEL=%q: must be debug, info, warn or error", v)
	}
	switch v := orDefault(getenv("LOG_FORMAT"), "json"); v {
	case "json", "text":
		c.LogFormat = v
	default:
		return nil, fmt.Errorf("LOG_FORMAT=%q: must be json or text", v)
	}

	if err := c.loadRLSOptions(getenv); err != nil {
		return nil, err
	}
	if err := c.loadRoutes(getenv("RATE_LIMIT_CONFIG")); err != nil {
		return nil, err
	}
	if c.RLSConfigType == ConfigTypeFile {
		if err := c.loadRLS(getenv("RLS_CONFIG_DIR")); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// The sources of the rate limit service's rules (RLS_CONFIG_TYPE).
const (
	ConfigTypeFile = "FILE"
	ConfigTypeXDS  = "GRPC_XDS_SOTW"
)

// aliased reads a variable by this project's name or by the reference's, its alias; both
// set to different values is an error. name is the one that was set, for messages.
func aliased(getenv func(string) string, ours, theirs string) (value, name string, err error) {
	a, b := strings.TrimSpace(getenv(ours)), strings.TrimSpace(getenv(theirs))
	switch {
	case a != "" && b != "" && a != b:
		return "", ours, fmt.Errorf("%s=%q and %s=%q (its name in envoyproxy/ratelimit) disagree: set one", ours, a, theirs, b)
	case a == "" && b != "":
		return b, theirs, nil
	}
	return a, ours, nil
}

func aliasedBool(getenv func(string) string, ours, theirs string, def bool) (bool, error) {
	v, name, err := aliased(getenv, ours, theirs)
	if err != nil {
		return false, err
	}
	return boolVar(func(string) string { return v }, name, def)
}

func aliasedDuration(getenv func(string) string, ours, theirs string, def, lo, hi time.Duration) (time.Duration, error) {
	v, name, err := aliased(getenv, ours, theirs)
	if err != nil || v == "" {
		return def, err
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || d > hi {
		return 0, fmt.Errorf("%s=%q: must be a duration such as 30s, 10m or 24h, from %v to %v", name, v, lo, hi)
	}
	return d, nil
}

// loadRLSOptions reads the rate limit service's settings but its rule directory.
func (c *Config) loadRLSOptions(getenv func(string) string) error {
	var err error
	for _, b := range []struct {
		dst          *bool
		ours, theirs string
	}{
		{&c.RLSShadowMode, "RLS_SHADOW_MODE", "SHADOW_MODE"},
		{&c.RLSResponseHeaders, "RLS_RESPONSE_HEADERS", "LIMIT_RESPONSE_HEADERS_ENABLED"},
		{&c.RLSMergeDomains, "RLS_MERGE_DOMAIN_CONFIG", "MERGE_DOMAIN_CONFIG"},
		{&c.RLSQuotaMode, "RLS_QUOTA_MODE", "QUOTA_MODE"},
		{&c.RLSDynamicMetadata, "RLS_RESPONSE_DYNAMIC_METADATA", "RESPONSE_DYNAMIC_METADATA"},
	} {
		if *b.dst, err = aliasedBool(getenv, b.ours, b.theirs, false); err != nil {
			return err
		}
	}
	for i, h := range []struct{ ours, theirs string }{
		{"RLS_LIMIT_HEADER", "LIMIT_LIMIT_HEADER"}, {"RLS_REMAINING_HEADER", "LIMIT_REMAINING_HEADER"}, {"RLS_RESET_HEADER", "LIMIT_RESET_HEADER"},
	} {
		v, name, err := aliased(getenv, h.ours, h.theirs)
		if err != nil {
			return err
		}
		if v == "" {
			v = rls.DefaultHeaderNames[i]
		}
		if !headerName(v) {
			return fmt.Errorf("%s=%q: must be an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~, at most 128), not a pseudo-header", name, v)
		}
		c.RLSHeaderNames[i] = v
	}
	if c.GRPCMaxConnectionAge, err = aliasedDuration(getenv, "SIDECAR_GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE", 24*time.Hour, time.Second, 10*365*24*time.Hour); err != nil {
		return err
	}
	if c.GRPCMaxConnectionAgeGrace, err = aliasedDuration(getenv, "SIDECAR_GRPC_MAX_CONNECTION_AGE_GRACE", "GRPC_MAX_CONNECTION_AGE_GRACE", time.Hour, 0, 10*365*24*time.Hour); err != nil {
		return err
	}

	v, name, err := aliased(getenv, "RLS_CONFIG_TYPE", "CONFIG_TYPE")
	if err != nil {
		return err
	}
	switch c.RLSConfigType = strings.ToUpper(orDefault(v, ConfigTypeFile)); c.RLSConfigType {
	case ConfigTypeFile:
		if strings.TrimSpace(getenv("RLS_XDS_TLS_CA_FILE")) != "" {
			return errors.New("RLS_XDS_TLS_CA_FILE is set but RLS_CONFIG_TYPE is not GRPC_XDS_SOTW: there is no xDS server to connect to")
		}
		return nil
	case ConfigTypeXDS:
	default:
		return fmt.Errorf("%s=%q: must be FILE (RLS_CONFIG_DIR) or GRPC_XDS_SOTW (an xDS server)", name, v)
	}
	if strings.TrimSpace(getenv("RLS_CONFIG_DIR")) != "" {
		return errors.New("RLS_CONFIG_DIR and RLS_CONFIG_TYPE=GRPC_XDS_SOTW: the rules come from one or the other, unset one")
	}
	x := &c.RLSXDS
	if x.ServerURL, name, err = aliased(getenv, "RLS_XDS_SERVER_URL", "CONFIG_GRPC_XDS_SERVER_URL"); err != nil {
		return err
	}
	if x.ServerURL == "" {
		x.ServerURL, name = "localhost:18000", "RLS_XDS_SERVER_URL" // the reference's default
	}
	if err := checkAddr(x.ServerURL); err != nil {
		return fmt.Errorf("%s=%q: %w", name, x.ServerURL, err)
	}
	if x.NodeID, _, err = aliased(getenv, "RLS_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_ID"); err != nil {
		return err
	}
	x.NodeID = orDefault(x.NodeID, "default")
	for _, p := range []struct {
		dst          *map[string]string
		ours, theirs string
		sep          string
	}{
		{&x.Metadata, "RLS_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_NODE_METADATA", "="},
		{&x.Headers, "RLS_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ":"},
	} {
		v, name, err := aliased(getenv, p.ours, p.theirs)
		if err != nil {
			return err
		}
		if *p.dst, err = pairs(v, p.sep); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	for k := range x.Headers {
		if !headerName(k) || k != strings.ToLower(k) {
			return fmt.Errorf("RLS_XDS_CLIENT_ADDITIONAL_HEADERS: %q must be a lower-case header name", k)
		}
	}
	if x.BackoffInitial, err = aliasedDuration(getenv, "RLS_XDS_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", time.Second, time.Millisecond, time.Hour); err != nil {
		return err
	}
	if x.BackoffMax, err = aliasedDuration(getenv, "RLS_XDS_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", time.Minute, time.Millisecond, time.Hour); err != nil {
		return err
	}
	x.BackoffMax = max(x.BackoffMax, x.BackoffInitial)
	xdsEnv, aliases, err := referenceXDSTLS(getenv)
	if err != nil {
		return err
	}
	if x.TLS, err = tlsconfig.LoadClient(xdsEnv, "RLS_XDS_TLS"); err != nil && len(*aliases) > 0 {
		return fmt.Errorf("%w (given as %s)", err, strings.Join(*aliases, ", "))
	}
	return err
}

// pairs reads "k<sep>v,k<sep>v"; "" is none.
func pairs(v, sep string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(p), sep)
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%q: write key%svalue pairs separated by commas", p, sep)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(val)
	}
	return out, nil
}

// headerName reports an HTTP header name (an RFC 9110 token) of at most 128 bytes.
func headerName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// referenceTLS reads the gRPC port's TLS variables with envoyproxy/ratelimit's names as
// aliases: with GRPC_SERVER_USE_TLS=true, GRPC_SERVER_TLS_CERT and _KEY are the
// certificate and key, GRPC_CLIENT_TLS_CACERT the CA that client certificates must be
// signed by (then required), GRPC_CLIENT_TLS_SAN the client identity allowed. Our own
// names win when both are set.
func referenceTLS(getenv func(string) string) func(string) string {
	alias := map[string]string{
		"SIDECAR_GRPC_TLS_CERT_FILE":       "GRPC_SERVER_TLS_CERT",
		"SIDECAR_GRPC_TLS_KEY_FILE":        "GRPC_SERVER_TLS_KEY",
		"SIDECAR_GRPC_TLS_CLIENT_CA_FILE":  "GRPC_CLIENT_TLS_CACERT",
		"SIDECAR_GRPC_TLS_ALLOWED_CLIENTS": "GRPC_CLIENT_TLS_SAN",
	}
	return func(name string) string {
		if v := getenv(name); strings.TrimSpace(v) != "" {
			return v
		}
		if ref, ok := alias[name]; ok && strings.EqualFold(strings.TrimSpace(getenv("GRPC_SERVER_USE_TLS")), "true") {
			return getenv(ref)
		}
		return ""
	}
}

// referenceXDSTLS reads the xDS client's TLS variables with envoyproxy/ratelimit's names
// as aliases: with CONFIG_GRPC_XDS_SERVER_USE_TLS=true, CONFIG_GRPC_XDS_SERVER_TLS_CACERT
// is the CA that signs the server's certificate, CONFIG_GRPC_XDS_CLIENT_TLS_CERT and _KEY
// the client certificate, CONFIG_GRPC_XDS_SERVER_TLS_SAN the name the server's
// certificate is verified for. Our own names win when both are set. The reference trusts
// the system's CAs when it is given none; here TLS needs a CA file, so USE_TLS=true
// without one is refused rather than read as plain text.
//
// aliases collects the reference's names that were read, for messages.
func referenceXDSTLS(getenv func(string) string) (env func(string) string, aliases *[]string, err error) {
	alias := map[string]string{
		"RLS_XDS_TLS_CA_FILE":     "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
		"RLS_XDS_TLS_CERT_FILE":   "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
		"RLS_XDS_TLS_KEY_FILE":    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
		"RLS_XDS_TLS_SERVER_NAME": "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	}
	use, err := boolVar(getenv, "CONFIG_GRPC_XDS_SERVER_USE_TLS", false)
	if err != nil {
		return nil, nil, err
	}
	aliases = new([]string)
	env = func(name string) string {
		if v := getenv(name); strings.TrimSpace(v) != "" {
			return v
		}
		ref, ok := alias[name]
		if !ok || !use {
			return ""
		}
		v := getenv(ref)
		if strings.TrimSpace(v) != "" && !slices.Contains(*aliases, ref) {
			*aliases = append(*aliases, ref)
		}
		return v
	}
	if use && strings.TrimSpace(env("RLS_XDS_TLS_CA_FILE")) == "" {
		return nil, nil, errors.New("CONFIG_GRPC_XDS_SERVER_USE_TLS=true needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT (or RLS_XDS_TLS_CA_FILE): " +
			"the CAs that sign the xDS server's certificate; the system's CAs are not used")
	}
	return env, aliases, nil
}

// loadRoutes reads RATE_LIMIT_CONFIG (path, "" for none) and sets the routes.
func (c *Config) loadRoutes(path string) error {
	var extra []routes.Route
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("RATE_LIMIT_CONFIG: %w", err)
		}
		defer f.Close()
		if extra, err = c.readFile(f); err != nil {
			return fmt.Errorf("RATE_LIMIT_CONFIG %s: %w", path, err)
		}
	}
	c.Routes = append(extra, routes.BuiltIn()...)
	if _, err := routes.New(c.Routes); err != nil {
		return fmt.Errorf("RATE_LIMIT_CONFIG: %w", err)
	}
	return nil
}

// loadRLS reads the rule files of RLS_CONFIG_DIR (dir, "" for none).
func (c *Config) loadRLS(dir string) error {
	if c.RLSDir = strings.TrimSpace(dir); c.RLSDir == "" {
		return nil
	}
	var err error
	if c.RLSRules, err = rls.Load(c.RLSDir, rls.LoadOptions{MergeDomains: c.RLSMergeDomains}); err != nil {
		// One problem a line, each naming its file, line and key.
		return fmt.Errorf("RLS_CONFIG_DIR %s:\n  %s", c.RLSDir, strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	return nil
}

// CheckFiles validates RATE_LIMIT_CONFIG and RLS_CONFIG_DIR, each on its own, without
// starting anything: the summary says what they hold, the error is every problem found.
func CheckFiles(getenv func(string) string) (summary []string, err error) {
	c := &Config{Limits: map[string]buckets.Limit{}}
	var errs []error
	if path := getenv("RATE_LIMIT_CONFIG"); path != "" {
		if err := c.loadRoutes(path); err != nil {
			errs = append(errs, err)
		} else {
			summary = append(summary, fmt.Sprintf("RATE_LIMIT_CONFIG %s: valid, %d limits and %d routes of its own", path, len(c.Limits), len(c.Routes)-len(routes.BuiltIn())))
		}
	} else {
		summary = append(summary, "RATE_LIMIT_CONFIG: unset (the built-in limits and routes)")
	}
	if dir := getenv("RLS_CONFIG_DIR"); strings.TrimSpace(dir) != "" {
		if c.RLSMergeDomains, err = aliasedBool(getenv, "RLS_MERGE_DOMAIN_CONFIG", "MERGE_DOMAIN_CONFIG", false); err != nil {
			errs = append(errs, err)
		}
		if err := c.loadRLS(dir); err != nil {
			errs = append(errs, err)
		} else {
			descs, limits := c.RLSRules.Size()
			summary = append(summary, fmt.Sprintf("RLS_CONFIG_DIR %s: valid, %d files, domains %s, %d descriptors, %d limits",
				c.RLSDir, len(c.RLSRules.Files()), strings.Join(c.RLSRules.Domains(), ", "), descs, limits))
		}
	} else if v, _, _ := aliased(getenv, "RLS_CONFIG_TYPE", "CONFIG_TYPE"); strings.EqualFold(v, ConfigTypeXDS) {
		summary = append(summary, "RLS_CONFIG_TYPE=GRPC_XDS_SOTW: the rate limit service's rules come from an xDS server, checked as they arrive")
	} else {
		summary = append(summary, "RLS_CONFIG_DIR: unset (no rate limit service rules: every ShouldRateLimit is OK)")
	}
	return summary, errors.Join(errs...)
}

func (c *Config) loadCluster(getenv func(string) string) error {
	cl := &c.Cluster
	cl.Strategy = orDefault(getenv("CLUSTER_STRATEGY"), "none")
	switch cl.Strategy {
	case "none":
	case "static":
		for _, p := range strings.FieldsFunc(getenv("CLUSTER_JOIN"), func(r rune) bool { return r == ',' || r == ' ' }) {
			if err := checkAddr(p); err != nil {
				return fmt.Errorf("CLUSTER_JOIN: %q %w", p, err)
			}
			cl.Join = append(cl.Join, p)
		}
		if len(cl.Join) == 0 {
			return errors.New("CLUSTER_STRATEGY=static needs CLUSTER_JOIN=host:port,... (the list may name this node too)")
		}
	case "dns":
		if cl.DNSName = strings.TrimSpace(getenv("CLUSTER_DNS_NAME")); cl.DNSName == "" {
			return errors.New("CLUSTER_STRATEGY=dns needs CLUSTER_DNS_NAME (e.g. a Kubernetes headless service)")
		}
	default:
		return fmt.Errorf("CLUSTER_STRATEGY=%q: must be none, static or dns", cl.Strategy)
	}
	cl.BindAddr = orDefault(getenv("CLUSTER_BIND_ADDR"), DefaultBindAddr)
	if err := checkAddr(cl.BindAddr); err != nil {
		return fmt.Errorf("CLUSTER_BIND_ADDR=%q: %w", cl.BindAddr, err)
	}
	if cl.AdvertiseAddr = strings.TrimSpace(getenv("CLUSTER_ADVERTISE_ADDR")); cl.AdvertiseAddr != "" {
		if err := checkAddr(cl.AdvertiseAddr); err != nil {
			return fmt.Errorf("CLUSTER_ADVERTISE_ADDR=%q: %w", cl.AdvertiseAddr, err)
		}
	}
	cl.NodeName = strings.TrimSpace(getenv("CLUSTER_NODE_NAME"))
	if len(cl.NodeName) > 128 || strings.ContainsAny(cl.NodeName, "# \t\n") {
		return fmt.Errorf("CLUSTER_NODE_NAME=%q: at most 128 characters, no spaces or #", cl.NodeName)
	}
	if v := strings.TrimSpace(getenv("CLUSTER_SECRET_KEY")); v != "" {
		key, err := base64.StdEncoding.DecodeString(v)
		if err != nil || (len(key) != 16 && len(key) != 24 && len(key) != 32) {
			return errors.New("CLUSTER_SECRET_KEY: must be the base64 of a 16, 24 or 32-byte key (`core keys generate` prints one, as does head -c 32 /dev/urandom | base64)")
		}
		cl.SecretKey = key
	}
	var err error
	if cl.Insecure, err = boolVar(getenv, "CLUSTER_INSECURE", false); err != nil {
		return err
	}
	switch cl.Replication = orDefault(strings.TrimSpace(getenv("CLUSTER_REPLICATION")), "owner"); cl.Replication {
	case "owner", "broadcast":
	default:
		return fmt.Errorf("CLUSTER_REPLICATION=%q: must be owner or broadcast", cl.Replication)
	}

	def := "local"
	if cl.Strategy != "none" {
		def = "cluster"
	}
	switch c.Backend = orDefault(getenv("RATE_LIMIT_BACKEND"), def); c.Backend {
	case "local":
	case "cluster":
		if cl.Strategy == "none" {
			return errors.New("RATE_LIMIT_BACKEND=cluster needs CLUSTER_STRATEGY=static or dns")
		}
		if cl.SecretKey == nil && !cl.Insecure {
			return errors.New("CLUSTER_SECRET_KEY is required to run a cluster: `core keys generate` prints one (or set CLUSTER_INSECURE=true to send cluster traffic in clear)")
		}
	default:
		return fmt.Errorf("RATE_LIMIT_BACKEND=%q: must be local or cluster", c.Backend)
	}
	if c.ShareMode, err = boolVar(getenv, "RATE_LIMIT_SHARE_MODE", true); err != nil {
		return err
	}
	if v := strings.TrimSpace(getenv("SIDECAR_TEST_CLOCK_OFFSET_MS")); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < -86_400_000 || ms > 86_400_000 {
			return fmt.Errorf("SIDECAR_TEST_CLOCK_OFFSET_MS=%q: must be whole milliseconds within a day", v)
		}
		c.ClockOffset = time.Duration(ms) * time.Millisecond
	}
	return nil
}

func boolVar(getenv func(string) string, name string, def bool) (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(getenv(name))); v {
	case "":
		return def, nil
	case "true", "1", "yes", "on":
		return true, nil
	case "false", "0", "no", "off":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: must be true or false", name, v)
	}
}

// BaseLimit resolves a bucket's limit without tenant overrides: the installation config,
// then the route's ad-hoc limit, then the built-in default. ok is false when none has one.
func (c *Config) BaseLimit(bucket string, route buckets.Limit) (l buckets.Limit, ok bool) {
	if l, ok := c.Limits[bucket]; ok {
		return l, true
	}
	if route.Count > 0 {
		return route, true
	}
	if b, ok := buckets.Lookup(bucket); ok {
		return b.Default, true
	}
	return buckets.Limit{}, false
}

// file is the RATE_LIMIT_CONFIG document.
type file struct {
	Limits               map[string]limitSpec `yaml:"limits"`
	OverrideCacheTTLMS   *wholeNumber         `yaml:"override_cache_ttl_ms"`
	CleanPeriodMS        *wholeNumber         `yaml:"clean_period_ms"`
	CredentialCacheTTLMS *wholeNumber         `yaml:"credential_cache_ttl_ms"`
	DatabaseWaitMS       *wholeNumber         `yaml:"database_wait_ms"`
	Routes               []routeSpec          `yaml:"routes"`
}

type limitSpec struct {
	Limit  wholeNumber `yaml:"limit"`
	Window string      `yaml:"window"`
}

type routeSpec struct {
	Method string      `yaml:"method"`
	Path   string      `yaml:"path"`
	Bucket string      `yaml:"bucket"`
	Per    string      `yaml:"per"`
	From   string      `yaml:"from"`
	Limit  wholeNumber `yaml:"limit"`
	Window string      `yaml:"window"`
}

// wholeNumber is an integer in the file. yaml would silently truncate 1.5 into an
// int64 field; this type refuses anything but an integer.
type wholeNumber int64

func (n *wholeNumber) UnmarshalYAML(v *yaml.Node) error {
	var i int64
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(&i) != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %q is not a whole number", v.Line, v.Value)}}
	}
	*n = wholeNumber(i)
	return nil
}

// maxFileSize bounds RATE_LIMIT_CONFIG.
const maxFileSize = 1 << 20

func (c *Config) readFile(r io.Reader) ([]routes.Route, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("larger than %d bytes", maxFileSize)
	}
	// The document as a tree first: for its shape, and for the keys that yaml's
	// decoding errors (which only say the line) are about.
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if err := dec.Decode(new(yaml.Node)); !errors.Is(err, io.EOF) {
		return nil, errors.New("holds more than one YAML document; write a single one")
	}
	if len(root.Content) == 1 && root.Content[0].Kind != yaml.MappingNode && root.Content[0].ShortTag() != "!!null" {
		return nil, fmt.Errorf("line %d: the document must be a mapping of settings (limits, routes, override_cache_ttl_ms, ...)", root.Content[0].Line)
	}
	var f file
	dec = yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, namedKeys(&root, err)
	}
	for _, d := range []struct {
		key string
		v   *wholeNumber
		dst *time.Duration
	}{
		{"override_cache_ttl_ms", f.OverrideCacheTTLMS, &c.OverrideTTL},
		{"clean_period_ms", f.CleanPeriodMS, &c.CleanPeriod},
		{"credential_cache_ttl_ms", f.CredentialCacheTTLMS, &c.CredentialTTL},
		{"database_wait_ms", f.DatabaseWaitMS, &c.DBWait},
	} {
		if d.v == nil {
			continue
		}
		if *d.v <= 0 || *d.v > 24*3600*1000 {
			return nil, fmt.Errorf("%s: must be a positive number of milliseconds, at most a day", d.key)
		}
		*d.dst = time.Duration(*d.v) * time.Millisecond
	}

	var out []routes.Route
	known := map[string]bool{}
	for _, b := range buckets.BuiltIn {
		known[b.Name] = true
	}
	for i, rs := range f.Routes {
		key := fmt.Sprintf("routes[%d]", i)
		r, err := rs.route()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if _, builtin := buckets.Lookup(rs.Bucket); !builtin && r.Steps[0].Limit.Count == 0 {
			return nil, fmt.Errorf("%s: bucket %s is not built in, so the route needs limit and window", key, rs.Bucket)
		}
		known[rs.Bucket] = true
		out = append(out, r)
	}
	for name, spec := range f.Limits {
		if !known[name] {
			return nil, fmt.Errorf("limits.%s: unknown bucket (not built in nor named by a route)", name)
		}
		l, err := spec.limit()
		if err != nil {
			return nil, fmt.Errorf("limits.%s: %w", name, err)
		}
		c.Limits[name] = l
	}
	return out, nil
}

func (s limitSpec) limit() (buckets.Limit, error) {
	if s.Limit <= 0 || s.Limit > math.MaxUint32 {
		return buckets.Limit{}, fmt.Errorf("limit must be a positive integer (at most %d)", uint32(math.MaxUint32))
	}
	w, err := time.ParseDuration(s.Window)
	if err != nil || w < time.Millisecond || w > 24*time.Hour || w%time.Millisecond != 0 {
		return buckets.Limit{}, fmt.Errorf("window %q must be a duration such as 1s, 60s or 1h, in whole milliseconds, at most 24h", s.Window)
	}
	return buckets.Limit{Count: uint32(s.Limit), Window: w}, nil
}

func (s routeSpec) route() (routes.Route, error) {
	per := buckets.Per(s.Per)
	from := routes.Source(s.From)
	switch {
	case per == buckets.PerIP && from == "":
		from = routes.FromIP
	case per != buckets.PerTenant && per != buckets.PerChannel && per != buckets.PerIP:
		return routes.Route{}, fmt.Errorf("per %q: must be tenant, channel or ip", s.Per)
	case from == "":
		return routes.Route{}, fmt.Errorf("from: say where the %s comes from (api_key, token, channel_secret, publishable_key or path)", per)
	}
	step := routes.Step{Bucket: s.Bucket, Per: per, From: from}
	if s.Limit != 0 || s.Window != "" {
		l, err := limitSpec{s.Limit, s.Window}.limit()
		if err != nil {
			return routes.Route{}, err
		}
		step.Limit = l
	}
	r := routes.Route{Method: s.Method, Pattern: s.Path, Steps: []routes.Step{step}}
	_, err := routes.New([]routes.Route{r})
	return r, err
}

// namedKeys rewrites yaml's decoding errors, "line 3: cannot unmarshal ...", to name the
// key written on that line: "limits.upload.limit: cannot unmarshal ... (line 3)".
func namedKeys(root *yaml.Node, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	keys := map[int]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				p := k.Value
				if path != "" {
					p = path + "." + k.Value
				}
				// Keys that share a line ({limit: x, window: 1s}) share their parent.
				if prev, ok := keys[k.Line]; ok {
					p = commonPath(prev, p)
				}
				keys[k.Line] = p
				walk(n.Content[i+1], p)
			}
		}
	}
	walk(root, "")
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = m
		var line int
		head, rest, ok := strings.Cut(m, ": ")
		if _, err := fmt.Sscanf(head, "line %d", &line); !ok || err != nil || keys[line] == "" {
			continue
		}
		if strings.HasPrefix(rest, "field ") && strings.Contains(rest, " not found in type ") {
			rest = "unknown key"
		}
		msgs[i] = fmt.Sprintf("%s: %s (line %d)", keys[line], rest, line)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// commonPath is the longest common prefix of two dotted key paths.
func commonPath(a, b string) string {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	n := 0
	for n < len(as) && n < len(bs) && as[n] == bs[n] {
		n++
	}
	return strings.Join(as[:n], ".")
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

func positiveMS(v string, max int64) (time.Duration, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 || n > max {
		return 0, fmt.Errorf("must be a positive whole number of milliseconds")
	}
	return time.Duration(n) * time.Millisecond, nil
}
