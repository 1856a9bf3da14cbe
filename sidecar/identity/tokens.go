package identity

import (
	"strings"
	"sync"
	"time"

	"github.com/converger/edge/shared/token"
)

// TokenCache verifies Converger tokens and remembers the outcome, since a client sends
// the same token with every request for up to 30 minutes and an Ed25519 verification
// costs tens of microseconds. Invalid tokens are remembered too, for a minute, so that a
// flood of one bad token costs one verification. Only the outcome is kept per token,
// never more than max tokens.
type TokenCache struct {
	v   *token.Verifier // nil: no keys, every token is invalid
	max int
	now func() time.Time

	mu sync.RWMutex
	m  map[string]cachedToken
}

type cachedToken struct {
	claims  *token.Claims // nil: invalid
	expires time.Time
}

// invalidFor is how long an invalid token is remembered.
const invalidFor = time.Minute

// NewTokenCache returns a cache over v (which may be nil) holding at most max tokens.
func NewTokenCache(v *token.Verifier, max int) *TokenCache {
	if max <= 0 {
		max = 100_000
	}
	c := &TokenCache{v: v, max: max, now: time.Now, m: make(map[string]cachedToken)}
	if v != nil {
		c.now = func() time.Time { return v.Now() }
	}
	return c
}

// Verify returns the claims of a valid token, or nil.
func (c *TokenCache) Verify(tok string) *token.Claims {
	if c == nil || c.v == nil || tok == "" || len(tok) > token.MaxLength {
		return nil
	}
	now := c.now()
	c.mu.RLock()
	e, ok := c.m[tok]
	c.mu.RUnlock()
	if ok && now.Before(e.expires) {
		return e.claims
	}
	claims, err := c.v.Verify(tok)
	e = cachedToken{expires: now.Add(invalidFor)}
	if err == nil {
		e = cachedToken{claims: claims, expires: claims.ExpiresAt.Time}
	}
	c.mu.Lock()
	if len(c.m) >= c.max {
		c.evictLocked(now)
	}
	c.m[strings.Clone(tok)] = e // tok may be a caller's buffer, reused after the call
	c.mu.Unlock()
	return e.claims
}

// evictLocked drops expired tokens, then arbitrary ones, down to 90% of max.
func (c *TokenCache) evictLocked(now time.Time) {
	for k, e := range c.m {
		if !now.Before(e.expires) {
			delete(c.m, k)
		}
	}
	for k := range c.m {
		if len(c.m) < c.max*9/10 {
			return
		}
		delete(c.m, k)
	}
}
