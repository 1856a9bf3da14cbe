// Package identity finds whom a request is counted for: the tenant of an API key or
// token, the channel of a secret, publishable key, token or path, or the client IP.
package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unsafe"

	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/ids"
	"github.com/converger/edge/sidecar/routes"
	"github.com/converger/edge/sidecar/tenants"
)

// Directory looks credentials and channels up; *tenants.Directory implements it.
type Directory interface {
	TenantByAPIKey(key string) (tenants.Tenant, tenants.Status)
	ChannelBySecret(secret string) (tenants.Channel, tenants.Status)
	ChannelByPublishableKey(key string) (tenants.Channel, tenants.Status)
	ChannelTenant(channelID string) (string, tenants.Status)
}

// The request headers identification reads.
const (
	HeaderAuthorization = "authorization"
	HeaderAPIKey        = "x-api-key"
	HeaderForwardedFor  = "x-forwarded-for"
)

// Headers are the only request headers Identify reads.
var Headers = []string{HeaderAuthorization, HeaderAPIKey, HeaderForwardedFor}

// Request is what identification reads of a request.
type Request struct {
	// Header returns a request header by lower-case name, "" when absent.
	Header func(name string) string
	// Source is the proxy's direct peer address.
	Source string
	// ChannelID is the raw :channel_id path parameter of the matched route.
	ChannelID string
	// Buf, when it has room for MaxBufferedID bytes, is where a counted id that
	// Identify makes (a client address's, an unverified credential's hash) is built
	// instead of in a new string: the Identity's ID then shares Buf's array and is valid
	// only until Buf is written again.
	Buf []byte
}

// MaxBufferedID is the room Request.Buf needs: the longest id Identify builds, an IPv6
// address with its prefix length or an unverified credential's hash.
const MaxBufferedID = 64

// Identity is who a step counts.
type Identity struct {
	// ID is the counted identity: a tenant id, channel id or IP address.
	ID string
	// TenantID is the tenant whose overrides apply, "" when unknown.
	TenantID string
	// Src is the src claim of the request's token, when a token identified it.
	Src string
}

// UnknownIP is the counted identity of requests whose client address cannot be parsed:
// they share one counter rather than escaping the limit.
const UnknownIP = "unknown"

// maxRawID bounds ids taken verbatim from a request; longer ones are counted by hash so
// that a flood of huge ids cannot grow memory.
const maxRawID = 64

// Messages of the sidecar's credential answers.
var (
	errAPIKey      = apierror.Unauthorized.WithMessage("A valid API key is required in the x-api-key header.")
	errToken       = apierror.Forbidden.WithMessage("Invalid or expired token.")
	errSecret      = apierror.Forbidden.WithMessage("Invalid channel secret.")
	errPublishable = apierror.Forbidden.WithMessage("Invalid publishable key.")
	errNotSecret   = apierror.BadRequest.WithMessage("Token generation takes a channel secret, not a token; renew a token with tokens/refresh.")
)

// Resolver identifies requests.
type Resolver struct {
	dir    Directory // nil without a database
	tokens *TokenCache
	ips    *clientip.Resolver
}

// New returns a resolver. dir may be nil (no database: credentials looked up in
// PostgreSQL are counted unverified), tokens may hold no verifier (every token invalid).
func New(dir Directory, tokens *TokenCache, ips *clientip.Resolver) *Resolver {
	if ips == nil {
		ips = &clientip.Resolver{}
	}
	return &Resolver{dir: dir, tokens: tokens, ips: ips}
}

// Identify finds the identity of one step. A non-nil error is the answer to send
// instead of counting: the credential is missing or invalid.
func (r *Resolver) Identify(s routes.Step, req *Request) (Identity, *apierror.Error) {
	switch s.From {
	case routes.FromIP:
		return Identity{ID: r.ClientIP(req)}, nil
	case routes.FromPath:
		id := canonicalID(req.ChannelID)
		var tenant string
		if r.dir != nil {
			tenant, _ = r.dir.ChannelTenant(id)
		}
		return Identity{ID: id, TenantID: tenant}, nil
	case routes.FromToken:
		c := r.tokens.Verify(bearer(req.Header(HeaderAuthorization)))
		if c == nil {
			return Identity{}, &errToken
		}
		id := c.TenantID
		if s.Per != buckets.PerTenant {
			id = c.ChannelID
		}
		return Identity{ID: id, TenantID: c.TenantID, Src: c.Src}, nil
	case routes.FromAPIKey:
		key := req.Header(HeaderAPIKey)
		if !plausible(key, "cvg_live_") {
			return Identity{}, &errAPIKey
		}
		if r.dir == nil {
			return unverified(key, req.Buf), nil
		}
		t, st := r.dir.TenantByAPIKey(key)
		switch {
		case st == tenants.Unavailable:
			return unverified(key, req.Buf), nil
		case st == tenants.NotFound || !t.Active:
			return Identity{}, &errAPIKey
		}
		return Identity{ID: t.ID, TenantID: t.ID}, nil
	case routes.FromChannelSecret:
		secret := bearer(req.Header(HeaderAuthorization))
		if looksLikeJWT(secret) {
			return Identity{}, &errNotSecret
		}
		if !plausible(secret, "") {
			return Identity{}, &errSecret
		}
		return r.channel(secret, req.Buf, r.lookupSecret, &errSecret)
	case routes.FromPublishableKey:
		key := bearer(req.Header(HeaderAuthorization))
		if !plausible(key, "cvg_pk_") {
			return Identity{}, &errPublishable
		}
		return r.channel(key, req.Buf, r.lookupPublishable, &errPublishable)
	}
	return Identity{}, &apierror.BadRequest
}

func (r *Resolver) lookupSecret(s string) (tenants.Channel, tenants.Status) {
	return r.dir.ChannelBySecret(s)
}

func (r *Resolver) lookupPublishable(s string) (tenants.Channel, tenants.Status) {
	return r.dir.ChannelByPublishableKey(s)
}

func (r *Resolver) channel(cred string, buf []byte, lookup func(string) (tenants.Channel, tenants.Status), invalid *apierror.Error) (Identity, *apierror.Error) {
	if r.dir == nil {
		return unverified(cred, buf), nil
	}
	c, st := lookup(cred)
	switch {
	case st == tenants.Unavailable:
		return unverified(cred, buf), nil
	case st == tenants.NotFound || !c.Active:
		return Identity{}, invalid
	}
	return Identity{ID: c.ID, TenantID: c.TenantID}, nil
}

// ClientIP returns the request's counted client address (clientip.Resolver.Key: IPv4
// per address, IPv6 per prefix), or UnknownIP.
func (r *Resolver) ClientIP(req *Request) string {
	a, ok := r.ips.Resolve(req.Source, req.Header(HeaderForwardedFor))
	if !ok {
		return UnknownIP
	}
	if cap(req.Buf) < MaxBufferedID {
		return r.ips.Key(a)
	}
	b := r.ips.AppendKey(req.Buf[:0], a)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// unverified is the identity of a credential that could not be looked up (no database,
// or it did not answer in time): the credential is counted by its hash, so a limit still
// holds per credential, with the installation's limits. The id is built in buf when it
// has room (Request.Buf).
func unverified(cred string, buf []byte) Identity {
	sum := sha256.Sum256([]byte(cred))
	if cap(buf) < MaxBufferedID {
		return Identity{ID: "unverified:" + hex.EncodeToString(sum[:16])}
	}
	b := hex.AppendEncode(append(buf[:0], "unverified:"...), sum[:16])
	return Identity{ID: unsafe.String(unsafe.SliceData(b), len(b))}
}

// canonicalID is the counted form of an id taken from a request's path: a UUID in
// lower case, as the core looks it up (so every spelling of one channel shares one
// counter); anything else as sent, or its hash when it is too long to keep.
func canonicalID(id string) string {
	if ids.IsUUID(id) {
		return strings.ToLower(id)
	}
	return boundID(id)
}

// boundID returns a raw id from a request, or its hash when it is too long to keep.
func boundID(id string) string {
	if len(id) <= maxRawID {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// bearer returns the credential of an "Authorization: Bearer <credential>" header.
func bearer(h string) string {
	const scheme = "bearer "
	if len(h) > len(scheme) && strings.EqualFold(h[:len(scheme)], scheme) {
		return strings.TrimSpace(h[len(scheme):])
	}
	return ""
}

// plausible rejects, without a lookup, credentials that cannot be valid: empty, too
// long, without the expected prefix, or with characters outside base64url.
func plausible(cred, prefix string) bool {
	if len(cred) < len(prefix)+16 || len(cred) > 256 || !strings.HasPrefix(cred, prefix) {
		return false
	}
	for i := len(prefix); i < len(cred); i++ {
		c := cred[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func looksLikeJWT(s string) bool {
	return strings.HasPrefix(s, "eyJ") && strings.Count(s, ".") == 2
}
