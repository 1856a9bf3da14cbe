package api

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/converger/edge/core/store"
)

// The tenant API's keys are looked up in PostgreSQL once and then remembered, so that a
// request costs no query of its own to authenticate (the sidecar in front does the same).
// A remembered key must never outlive a change that revokes it, so the cache is used
// only while the Listener follows NOTIFY tenant_changes — which the schema's triggers send
// for every change of a tenant's status or API keys, whatever made it — and every such
// notification, like every interruption of the LISTEN connection, empties it. A key
// therefore stops working on this core as soon as the change's notification arrives,
// within milliseconds of its commit. Besides, an entry lives at most apiKeyTTL, and a key
// in its rotation grace no longer than the grace, which ends without a notification.
// Only keys that authenticate are remembered, by their SHA-256 hash, at most
// apiKeyMaxEntries of them.

const (
	apiKeyTTL        = 10 * time.Second
	apiKeyMaxEntries = 10_000
)

// apiKeyCache remembers the tenants of API keys; see above.
type apiKeyCache struct {
	now func() time.Time

	mu sync.RWMutex
	// on: the Listener follows tenant_changes, so that a change empties the cache.
	on bool
	// gen changes at every emptying: a lookup that started before one is not stored,
	// since it may have read the tenant before the change.
	gen     uint64
	entries map[[sha256.Size]byte]apiKeyEntry
}

type apiKeyEntry struct {
	tenant  store.Tenant
	expires time.Time
}

func newAPIKeyCache(now func() time.Time) *apiKeyCache {
	return &apiKeyCache{now: now, entries: map[[sha256.Size]byte]apiKeyEntry{}}
}

// get returns the tenant remembered for a key hash.
func (c *apiKeyCache) get(h [sha256.Size]byte) (store.Tenant, bool) {
	c.mu.RLock()
	e, ok := c.entries[h]
	on := c.on
	c.mu.RUnlock()
	if !ok || !on || !c.now().Before(e.expires) {
		return store.Tenant{}, false
	}
	return e.tenant, true
}

// generation is what put needs from before its lookup of the database.
func (c *apiKeyCache) generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// put remembers the tenant of a key hash, found by a lookup that started at generation
// gen, valid until until (zero: no end but the cache's own), unless the cache was emptied
// since, is off, or is full.
func (c *apiKeyCache) put(gen uint64, h [sha256.Size]byte, t store.Tenant, until time.Time) {
	expires := c.now().Add(apiKeyTTL)
	if !until.IsZero() && until.Before(expires) {
		expires = until
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on || gen != c.gen {
		return
	}
	if len(c.entries) >= apiKeyMaxEntries {
		now := c.now()
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= apiKeyMaxEntries {
			return
		}
	}
	c.entries[h] = apiKeyEntry{tenant: t, expires: expires}
}

// reset empties the cache and turns it on or off: on once the Listener follows
// tenant_changes, off when it no longer does; each notification resets it (on).
func (c *apiKeyCache) reset(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = on
	c.gen++
	clear(c.entries)
}
