package tenants

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Status says what a lookup knows.
type Status int

// Lookup statuses.
const (
	// Found: the value is current, or stale because the database could not be asked.
	Found Status = iota
	// NotFound: the database has no such row (possibly cached).
	NotFound
	// Unavailable: nothing is cached and the database did not answer in time.
	Unavailable
)

func (s Status) String() string {
	switch s {
	case Found:
		return "found"
	case NotFound:
		return "not found"
	}
	return "unavailable"
}

// Result labels for cache metrics.
const (
	ResultHit      = "hit"
	ResultMiss     = "miss"
	ResultFallback = "fallback"
)

// cache is a read-through cache in front of the database. A lookup that misses starts
// one load per key (concurrent lookups of the key share it) and waits for it at most
// wait; when it does not finish in time, or the database is down, the lookup decides
// with what it has: the stale value if there is one, else Unavailable. A load that
// finishes late still fills the cache.
//
// A value in use is reloaded in the background before it expires (at a random point
// between 70% and 90% of its TTL, so that values loaded together are not reloaded
// together): keys that keep coming never wait on the database again, and no value is
// served older than its TTL while the database answers.
type cache[K comparable, V any] struct {
	name   string
	ttl    time.Duration // of found values
	negTTL time.Duration // of not-found answers
	max    int
	load   func(ctx context.Context, k K) (v V, found bool, err error)
	d      *Directory

	hits, misses, fallbacks Counter

	mu sync.RWMutex
	m  map[K]*item[V]
}

type item[V any] struct {
	val       V
	found     bool
	filled    bool      // a load has succeeded at least once
	expires   time.Time // when filled
	refreshAt time.Time // when a lookup reloads it in the background
	loading   chan struct{}
}

func (c *cache[K, V]) get(k K) (V, Status) {
	now := c.d.now()
	c.mu.RLock()
	it := c.m[k]
	if it != nil && it.filled && now.Before(it.expires) {
		v, found, refresh := it.val, it.found, !now.Before(it.refreshAt) && it.loading == nil
		c.mu.RUnlock()
		c.hits.Inc()
		if refresh && c.d.breaker.closed() {
			k = own(k)
			c.mu.Lock()
			c.startLocked(k, it)
			c.mu.Unlock()
		}
		return v, status(found)
	}
	c.mu.RUnlock()

	k = own(k)
	c.mu.Lock()
	if it = c.m[k]; it == nil {
		c.evictLocked(now)
		it = &item[V]{}
		c.m[k] = it
	}
	// A load that finished between the read lock and this one filled the item: no
	// second load for it.
	if c.d.breaker.closed() && (!it.filled || !now.Before(it.expires)) {
		c.startLocked(k, it)
	}
	wait := it.loading
	c.mu.Unlock()

	if wait != nil && c.d.breaker.closed() {
		t := time.NewTimer(c.d.wait)
		select {
		case <-wait:
		case <-t.C:
		}
		t.Stop()
	}

	c.mu.RLock()
	defer c.mu.RUnlock()
	switch {
	case !it.filled:
		c.fallbacks.Inc()
		var zero V
		return zero, Unavailable
	case c.d.now().Before(it.expires):
		c.misses.Inc()
	default:
		c.fallbacks.Inc()
	}
	return it.val, status(it.found)
}

// own returns k in memory of its own. The cache keeps keys (in its map, and in the
// loads it starts), and a string key may be over a caller's buffer that is reused once
// the lookup returns; only misses and refreshes copy.
func own[K comparable](k K) K {
	if s, ok := any(k).(string); ok {
		return any(strings.Clone(s)).(K)
	}
	return k
}

// startLocked starts loading k unless a load is in flight; the caller holds c.mu.
func (c *cache[K, V]) startLocked(k K, it *item[V]) {
	if it.loading == nil {
		it.loading = make(chan struct{})
		go c.fetch(k, it)
	}
}

func status(found bool) Status {
	if found {
		return Found
	}
	return NotFound
}

func (c *cache[K, V]) fetch(k K, it *item[V]) {
	ctx, cancel := context.WithTimeout(context.Background(), c.d.queryTimeout)
	v, found, err := c.load(ctx, k)
	cancel()
	c.mu.Lock()
	if err == nil {
		it.val, it.found, it.filled = v, found, true
		ttl := c.ttl
		if !found {
			ttl = c.negTTL
		}
		now := c.d.now()
		it.expires = now.Add(ttl)
		it.refreshAt = now.Add(ttl * time.Duration(70+rand.IntN(21)) / 100)
	}
	close(it.loading)
	it.loading = nil
	c.mu.Unlock()
	if err != nil {
		c.d.failed(c.name, err)
	} else {
		c.d.breaker.succeeded()
	}
}

// evictLocked makes room for one more entry: expired entries go first, then arbitrary
// ones (map order is random).
func (c *cache[K, V]) evictLocked(now time.Time) {
	if len(c.m) < c.max {
		return
	}
	for k, it := range c.m {
		if it.loading == nil && (!it.filled || !now.Before(it.expires)) {
			delete(c.m, k)
		}
	}
	for k := range c.m {
		if len(c.m) < c.max*9/10 {
			break
		}
		delete(c.m, k)
	}
}

// invalidate drops k: the next lookup asks the database. A load in flight fills the
// dropped item only, so it cannot bring back the old value.
func (c *cache[K, V]) invalidate(k K) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

func (c *cache[K, V]) invalidateAll() {
	c.mu.Lock()
	c.m = make(map[K]*item[V])
	c.mu.Unlock()
}

// invalidateWhere drops the found values that match, and every lookup in flight (it
// may have read the row before the change that led here), as invalidate does.
func (c *cache[K, V]) invalidateWhere(match func(V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, it := range c.m {
		if it.loading != nil || (it.filled && it.found && match(it.val)) {
			delete(c.m, k)
		}
	}
}

// refreshAll makes every value reload in the background at its next lookup, which is
// still answered with the cached value.
func (c *cache[K, V]) refreshAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, it := range c.m {
		it.refreshAt = time.Time{}
	}
}
