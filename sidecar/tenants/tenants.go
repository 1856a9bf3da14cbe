// Package tenants is the sidecar's read-only view of tenants and channels in PostgreSQL:
// credentials looked up by hash, channel → tenant, and per-tenant limit overrides, all
// cached, invalidated by LISTEN rate_limit_overrides and tenant_changes, and never
// waited on beyond a bound.
package tenants

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/ids"
)

// NotifyChannel is the PostgreSQL channel on which every change of tenants.limits is
// announced, with the tenant id as payload.
const NotifyChannel = "rate_limit_overrides"

// NotifyTenantChanges is the PostgreSQL channel on which the core's schema announces,
// with the tenant id as payload, every change of a tenant's status or API keys and of
// its channels' status, credentials or tenant (a trigger of the core's migrations).
const NotifyTenantChanges = "tenant_changes"

// Tenant is what the sidecar knows of a tenant API key's owner.
type Tenant struct {
	ID     string
	Active bool
}

// Channel is what the sidecar knows of a channel credential's channel.
type Channel struct {
	ID       string
	TenantID string
	// Active is false when the channel or its tenant is inactive.
	Active bool
}

// Metrics receives the directory's events.
type Metrics interface {
	// CacheCounter returns the counter of a cache's lookups with a result (hit, miss,
	// fallback); it is asked once per cache and result.
	CacheCounter(cache, result string) Counter
	DBError(op string)
}

// Counter is a monotonic counter, such as a prometheus.Counter.
type Counter interface{ Inc() }

// Options tune a Directory. Zero values take the defaults.
type Options struct {
	OverrideTTL   time.Duration // 30 s
	CredentialTTL time.Duration // 30 s: credentials found
	NegativeTTL   time.Duration // 10 s: credentials and channels not found
	// Wait bounds how long a lookup waits on the database (50 ms).
	Wait time.Duration
	// QueryTimeout bounds one query, which goes on in the background after Wait (2 s).
	QueryTimeout time.Duration
	// MaxEntries bounds each cache (100,000).
	MaxEntries int
	Metrics    Metrics
	Logger     *slog.Logger
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Directory answers the sidecar's questions about tenants and channels.
type Directory struct {
	pool         *pgxpool.Pool
	wait         time.Duration
	queryTimeout time.Duration
	now          func() time.Time
	metrics      Metrics
	log          *slog.Logger
	breaker      breaker

	apiKeys        *cache[[32]byte, Tenant]
	secrets        *cache[[32]byte, Channel]
	publishable    *cache[[32]byte, Channel]
	channelTenants *cache[string, string]
	overrides      *cache[string, buckets.Overrides]

	listening atomic.Bool
	badLimits sync.Map // tenant id → logged once
}

// New returns a directory over pool. Call Listen to follow override changes.
func New(pool *pgxpool.Pool, o Options) *Directory {
	o.OverrideTTL = orDefault(o.OverrideTTL, 30*time.Second)
	o.CredentialTTL = orDefault(o.CredentialTTL, 30*time.Second)
	o.NegativeTTL = orDefault(o.NegativeTTL, 10*time.Second)
	o.Wait = orDefault(o.Wait, 50*time.Millisecond)
	o.QueryTimeout = orDefault(o.QueryTimeout, 2*time.Second)
	if o.MaxEntries <= 0 {
		o.MaxEntries = 100_000
	}
	if o.Metrics == nil {
		o.Metrics = nopMetrics{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	d := &Directory{pool: pool, wait: o.Wait, queryTimeout: o.QueryTimeout, now: o.Now, metrics: o.Metrics, log: o.Logger}
	d.breaker.d = d
	d.apiKeys = newCache(d, "api_keys", o.CredentialTTL, o.NegativeTTL, o.MaxEntries, d.loadTenantByKey)
	d.secrets = newCache(d, "channel_secrets", o.CredentialTTL, o.NegativeTTL, o.MaxEntries, d.loadChannel(`c.secret_hash`))
	d.publishable = newCache(d, "publishable_keys", o.CredentialTTL, o.NegativeTTL, o.MaxEntries, d.loadChannel(`c.publishable_key_hash`))
	d.channelTenants = newCache(d, "channel_tenants", o.CredentialTTL, o.NegativeTTL, o.MaxEntries, d.loadChannelTenant)
	d.overrides = newCache(d, "overrides", o.OverrideTTL, o.OverrideTTL, o.MaxEntries, d.loadOverrides)
	return d
}

func newCache[K comparable, V any](d *Directory, name string, ttl, negTTL time.Duration, max int,
	load func(context.Context, K) (V, bool, error)) *cache[K, V] {
	return &cache[K, V]{name: name, ttl: ttl, negTTL: negTTL, max: max, load: load, d: d, m: make(map[K]*item[V]),
		hits:      d.metrics.CacheCounter(name, ResultHit),
		misses:    d.metrics.CacheCounter(name, ResultMiss),
		fallbacks: d.metrics.CacheCounter(name, ResultFallback),
	}
}

func orDefault(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

type nopMetrics struct{}

func (nopMetrics) CacheCounter(string, string) Counter { return nopCounter{} }
func (nopMetrics) DBError(string)                      {}

type nopCounter struct{}

func (nopCounter) Inc() {}

// TenantByAPIKey returns the tenant of a tenant API key (the current key, or the
// previous one during its rotation grace).
func (d *Directory) TenantByAPIKey(key string) (Tenant, Status) {
	return d.apiKeys.get(sha256.Sum256([]byte(key)))
}

// ChannelBySecret returns the channel of a channel secret.
func (d *Directory) ChannelBySecret(secret string) (Channel, Status) {
	return d.secrets.get(sha256.Sum256([]byte(secret)))
}

// ChannelByPublishableKey returns the channel of a publishable key.
func (d *Directory) ChannelByPublishableKey(key string) (Channel, Status) {
	return d.publishable.get(sha256.Sum256([]byte(key)))
}

// ChannelTenant returns the tenant of a channel id. Ids that are not UUIDs are not
// looked up.
func (d *Directory) ChannelTenant(channelID string) (string, Status) {
	if !ids.IsUUID(channelID) {
		return "", NotFound
	}
	return d.channelTenants.get(canonicalUUID(channelID))
}

// Overrides returns a tenant's limit overrides (empty when it has none).
func (d *Directory) Overrides(tenantID string) (buckets.Overrides, Status) {
	if !ids.IsUUID(tenantID) {
		return nil, NotFound
	}
	return d.overrides.get(canonicalUUID(tenantID))
}

// InvalidateOverrides drops a tenant's cached overrides.
func (d *Directory) InvalidateOverrides(tenantID string) {
	d.overrides.invalidate(canonicalUUID(strings.TrimSpace(tenantID)))
}

// InvalidateTenant drops what is cached of a tenant's credentials: its API keys, its
// channels' secrets and publishable keys, and its channels' tenant, so that the next
// lookup asks the database (a deactivation is refused at once). Lookups in flight are
// dropped too: they may have read the row before the change.
func (d *Directory) InvalidateTenant(tenantID string) {
	id := canonicalUUID(strings.TrimSpace(tenantID))
	d.apiKeys.invalidateWhere(func(t Tenant) bool { return t.ID == id })
	ofTenant := func(c Channel) bool { return c.TenantID == id }
	d.secrets.invalidateWhere(ofTenant)
	d.publishable.invalidateWhere(ofTenant)
	d.channelTenants.invalidateWhere(func(t string) bool { return t == id })
}

// canonicalUUID is the cache key of a UUID: PostgreSQL's lower-case form, the one that
// NOTIFY payloads carry, so that an id written in upper case shares its entry and its
// invalidation. It does not allocate for ids that are already lower case.
func canonicalUUID(id string) string { return strings.ToLower(id) }

// HeartbeatInterval is how often Watch pings a database believed up.
const HeartbeatInterval = time.Second

// Watch pings the database every HeartbeatInterval while it is believed up, until ctx
// ends, so that an outage is noticed (Healthy, /readyz) within a second or two even
// when every lookup is answered from the caches; a failed ping stops lookups as a
// failed query does, and the probe resumes them.
func (d *Directory) Watch(ctx context.Context) {
	t := time.NewTicker(HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !d.breaker.closed() {
			continue // the breaker's probe is on it
		}
		pctx, cancel := context.WithTimeout(ctx, HeartbeatInterval)
		err := d.pool.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			d.failed("ping", err)
		}
	}
}

// Healthy reports whether the last database call succeeded.
func (d *Directory) Healthy() bool { return d.breaker.closed() }

// Listening reports whether the LISTEN connection is up.
func (d *Directory) Listening() bool { return d.listening.Load() }

func (d *Directory) loadTenantByKey(ctx context.Context, h [32]byte) (Tenant, bool, error) {
	var t Tenant
	err := d.pool.QueryRow(ctx, `
		SELECT id::text, status = 'active' FROM tenants
		WHERE api_key_hash = $1
		   OR (previous_api_key_hash = $1 AND previous_api_key_expires_at > now())
		LIMIT 1`, h[:]).Scan(&t.ID, &t.Active)
	return t, err == nil, noRows(err)
}

func (d *Directory) loadChannel(column string) func(context.Context, [32]byte) (Channel, bool, error) {
	query := `
		SELECT c.id::text, c.tenant_id::text, c.status = 'active' AND t.status = 'active'
		FROM channels c JOIN tenants t ON t.id = c.tenant_id
		WHERE ` + column + ` = $1`
	return func(ctx context.Context, h [32]byte) (Channel, bool, error) {
		var c Channel
		err := d.pool.QueryRow(ctx, query, h[:]).Scan(&c.ID, &c.TenantID, &c.Active)
		return c, err == nil, noRows(err)
	}
}

func (d *Directory) loadChannelTenant(ctx context.Context, id string) (string, bool, error) {
	var tenant string
	err := d.pool.QueryRow(ctx, `SELECT tenant_id::text FROM channels WHERE id = $1::uuid`, id).Scan(&tenant)
	return tenant, err == nil, noRows(err)
}

func (d *Directory) loadOverrides(ctx context.Context, tenantID string) (buckets.Overrides, bool, error) {
	var doc []byte
	err := d.pool.QueryRow(ctx, `SELECT limits FROM tenants WHERE id = $1::uuid`, tenantID).Scan(&doc)
	if err != nil {
		return nil, false, noRows(err)
	}
	o, perr := buckets.ParseOverrides(doc)
	if perr != nil {
		// The core validates overrides before it stores them; a row edited by hand may
		// still be wrong. Its overrides are ignored until it is fixed.
		if _, seen := d.badLimits.LoadOrStore(tenantID, true); !seen {
			d.log.Warn("ignoring invalid tenants.limits", "tenant_id", tenantID, "error", perr)
		}
		return nil, true, nil
	}
	d.badLimits.Delete(tenantID)
	return o, true, nil
}

// noRows turns "no rows" into a not-found answer rather than an error.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

func (d *Directory) failed(op string, err error) {
	d.metrics.DBError(op)
	d.breaker.failed(err)
}

// Listen follows NOTIFY rate_limit_overrides and tenant_changes until ctx ends: each
// notification drops that tenant's cached overrides, or its cached credentials
// (InvalidateTenant), at once. When the connection breaks it reconnects with backoff and
// then drops every cached override and reloads every cached credential at its next
// lookup, since notifications may have been missed.
func (d *Directory) Listen(ctx context.Context) {
	const firstBackoff = 100 * time.Millisecond
	backoff := firstBackoff
	reported := false // the current interruption has been logged
	for ctx.Err() == nil {
		err := d.listenOnce(ctx)
		if d.listening.Swap(false) {
			// The connection was up: this is a new interruption, not one more failed
			// attempt, so it starts again from the shortest delay and is logged.
			backoff, reported = firstBackoff, false
		}
		if ctx.Err() != nil {
			return
		}
		d.metrics.DBError("listen")
		// Warned once per interruption; the retries of a long outage go to debug.
		level := slog.LevelWarn
		if reported {
			level = slog.LevelDebug
		}
		d.log.Log(ctx, level, "override notifications interrupted; retrying", "error", err, "retry_in", backoff)
		reported = true
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (d *Directory) listenOnce(ctx context.Context) error {
	pooled, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection stays in LISTEN state: it is taken out of the pool and closed after.
	conn := pooled.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel+"; LISTEN "+NotifyTenantChanges); err != nil {
		return err
	}
	d.overrides.invalidateAll()
	// Reloaded in the background at their next lookup rather than dropped, so that a
	// reconnection does not make every check wait on the database.
	d.apiKeys.refreshAll()
	d.secrets.refreshAll()
	d.publishable.refreshAll()
	d.channelTenants.refreshAll()
	d.listening.Store(true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("waiting for notifications: %w", err)
		}
		if n.Channel == NotifyTenantChanges {
			d.InvalidateTenant(n.Payload)
			continue
		}
		d.InvalidateOverrides(n.Payload)
	}
}

// breaker stops database lookups after a failure until a probe succeeds, so that while
// PostgreSQL is down checks decide at once instead of waiting on it.
type breaker struct {
	d       *Directory
	open    atomic.Bool
	probing atomic.Bool
}

func (b *breaker) closed() bool { return !b.open.Load() }

func (b *breaker) succeeded() {
	if b.open.CompareAndSwap(true, false) {
		b.d.log.Info("database reachable again; lookups resumed")
	}
}

func (b *breaker) failed(err error) {
	if b.open.CompareAndSwap(false, true) {
		b.d.log.Warn("database unavailable; deciding with cached values and defaults until it answers", "error", err)
	}
	if b.probing.CompareAndSwap(false, true) {
		go b.probe()
	}
}

// probe pings the database with backoff until it answers. A failure that opens the
// breaker again while the probe is on its way out (after its Ping succeeded, before it
// cleared probing) could not start a probe of its own; the probe therefore checks the
// breaker once more after clearing probing and carries on if it is open again, so the
// breaker can never stay open with nothing probing.
func (b *breaker) probe() {
	delay := 100 * time.Millisecond
	for {
		for b.open.Load() {
			time.Sleep(delay)
			ctx, cancel := context.WithTimeout(context.Background(), b.d.queryTimeout)
			err := b.d.pool.Ping(ctx)
			cancel()
			if err == nil {
				b.succeeded()
				break
			}
			b.d.metrics.DBError("ping")
			delay = min(delay*2, 2*time.Second)
		}
		b.probing.Store(false)
		if !b.open.Load() || !b.probing.CompareAndSwap(false, true) {
			return
		}
	}
}
