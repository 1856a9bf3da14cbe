package tenants

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/converger/edge/shared/buckets"
)

func TestTenantByAPIKey(t *testing.T) {
	e := newEnv(t, "", Options{})
	current, previous, expired := newKey("ck_"), newKey("ck_"), newKey("ck_")
	id := e.addTenant(current)
	e.exec(`UPDATE tenants SET previous_api_key_hash = $2, previous_api_key_expires_at = now() + interval '1 hour' WHERE id = $1`, id, hash(previous))
	oldKey, oldExpired := newKey("ck_"), newKey("ck_")
	other := e.addTenant(oldKey)
	e.exec(`UPDATE tenants SET previous_api_key_hash = $2, previous_api_key_expires_at = now() - interval '1 second' WHERE id = $1`, other, hash(oldExpired))
	inactiveKey := newKey("ck_")
	inactive := e.addTenant(inactiveKey)
	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, inactive)

	for _, tc := range []struct {
		name, key string
		want      Tenant
		status    Status
	}{
		{"current key", current, Tenant{ID: id, Active: true}, Found},
		{"previous key within its grace", previous, Tenant{ID: id, Active: true}, Found},
		{"previous key after its grace", oldExpired, Tenant{}, NotFound},
		{"the rotated tenant's current key", oldKey, Tenant{ID: other, Active: true}, Found},
		{"inactive tenant", inactiveKey, Tenant{ID: inactive, Active: false}, Found},
		{"unknown key", expired, Tenant{}, NotFound},
		{"empty key", "", Tenant{}, NotFound},
	} {
		got, st := e.d.TenantByAPIKey(tc.key)
		if st != tc.status || got != tc.want {
			t.Errorf("%s: TenantByAPIKey = %+v, %v; want %+v, %v", tc.name, got, st, tc.want, tc.status)
		}
	}
	if n := e.rec.dbErrors(); n != 0 || !e.d.Healthy() {
		t.Errorf("database errors = %d, Healthy = %v; want 0, true", n, e.d.Healthy())
	}
	// Credentials are looked up by hash and never logged.
	for _, k := range []string{current, previous, oldExpired, inactiveKey} {
		if strings.Contains(e.logs.String(), k) {
			t.Errorf("the log holds an API key: %s", e.logs.String())
		}
	}
}

func TestChannelBySecretAndPublishableKey(t *testing.T) {
	e := newEnv(t, "", Options{})
	tenant := e.addTenant(newKey("ck_"))
	secret, pub := newKey("cs_"), newKey("pk_")
	ch := e.addChannel(tenant, secret, pub)
	offSecret, offPub := newKey("cs_"), newKey("pk_")
	off := e.addChannel(tenant, offSecret, offPub)
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, off)
	inactiveTenant := e.addTenant(newKey("ck_"))
	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, inactiveTenant)
	orphanSecret, orphanPub := newKey("cs_"), newKey("pk_")
	orphan := e.addChannel(inactiveTenant, orphanSecret, orphanPub)
	noPubSecret := newKey("cs_")
	noPub := e.addChannel(tenant, noPubSecret, "")

	for _, tc := range []struct {
		name        string
		secret, pub string
		want        Channel
	}{
		{"active channel", secret, pub, Channel{ID: ch, TenantID: tenant, Active: true}},
		{"inactive channel", offSecret, offPub, Channel{ID: off, TenantID: tenant, Active: false}},
		{"active channel of an inactive tenant", orphanSecret, orphanPub, Channel{ID: orphan, TenantID: inactiveTenant, Active: false}},
	} {
		if got, st := e.d.ChannelBySecret(tc.secret); st != Found || got != tc.want {
			t.Errorf("%s: ChannelBySecret = %+v, %v; want %+v, found", tc.name, got, st, tc.want)
		}
		if got, st := e.d.ChannelByPublishableKey(tc.pub); st != Found || got != tc.want {
			t.Errorf("%s: ChannelByPublishableKey = %+v, %v; want %+v, found", tc.name, got, st, tc.want)
		}
	}
	if got, st := e.d.ChannelBySecret(noPubSecret); st != Found || got.ID != noPub {
		t.Errorf("channel without a publishable key: ChannelBySecret = %+v, %v", got, st)
	}
	// A secret is not a publishable key and the other way round.
	for _, k := range []string{newKey("cs_"), pub, ""} {
		if got, st := e.d.ChannelBySecret(k); st != NotFound {
			t.Errorf("ChannelBySecret(unknown) = %+v, %v; want not found", got, st)
		}
	}
	for _, k := range []string{newKey("pk_"), secret, ""} {
		if got, st := e.d.ChannelByPublishableKey(k); st != NotFound {
			t.Errorf("ChannelByPublishableKey(unknown) = %+v, %v; want not found", got, st)
		}
	}
	for _, k := range []string{secret, pub, offSecret, orphanSecret} {
		if strings.Contains(e.logs.String(), k) {
			t.Errorf("the log holds a channel credential: %s", e.logs.String())
		}
	}
}

func TestChannelTenant(t *testing.T) {
	e := newEnv(t, "", Options{})
	tenant := e.addTenant(newKey("ck_"))
	ch := e.addChannel(tenant, newKey("cs_"), "")

	if got, st := e.d.ChannelTenant(ch); st != Found || got != tenant {
		t.Errorf("ChannelTenant(%s) = %q, %v; want %q, found", ch, got, st, tenant)
	}
	// The upper-case spelling of the id is the same channel, and the same cache entry.
	hits := e.rec.count("channel_tenants", ResultHit)
	if got, st := e.d.ChannelTenant(strings.ToUpper(ch)); st != Found || got != tenant {
		t.Errorf("ChannelTenant(upper case) = %q, %v; want %q, found", got, st, tenant)
	}
	if e.rec.count("channel_tenants", ResultHit) != hits+1 {
		t.Errorf("an upper-case id was not answered from the cache entry of its lower-case form")
	}
	if got, st := e.d.ChannelTenant("00000000-0000-4000-8000-000000000000"); st != NotFound || got != "" {
		t.Errorf("ChannelTenant(unknown) = %q, %v; want not found", got, st)
	}

	// Ids that are not UUIDs never reach the cache, let alone the database.
	before := e.rec.events("channel_tenants")
	for _, id := range []string{"", "x", "not-a-uuid", ch + "0", ch[:35], "'; DROP TABLE channels; --", strings.Replace(ch, "-", "_", 1)} {
		if got, st := e.d.ChannelTenant(id); st != NotFound || got != "" {
			t.Errorf("ChannelTenant(%q) = %q, %v; want not found", id, got, st)
		}
	}
	if after := e.rec.events("channel_tenants"); after != before {
		t.Errorf("non-UUID ids made %d cache lookups; want none", after-before)
	}
	if n := e.rec.dbErrors(); n != 0 {
		t.Errorf("%d database errors", n)
	}
}

func TestOverrides(t *testing.T) {
	e := newEnv(t, "", Options{})
	with := e.addTenant(newKey("ck_"))
	e.exec(`UPDATE tenants SET limits = '{"upload":{"limit":5,"scale_ms":1000},"token_generate":{"limit":20,"scale_ms":60000}}' WHERE id = $1`, with)
	empty := e.addTenant(newKey("ck_"))
	bad := e.addTenant(newKey("ck_"))
	e.exec(`UPDATE tenants SET limits = '{"upload":{"limit":0,"scale_ms":1000}}' WHERE id = $1`, bad)

	o, st := e.d.Overrides(with)
	want := buckets.Overrides{"upload": {Count: 5, Window: time.Second}, "token_generate": {Count: 20, Window: time.Minute}}
	if st != Found || fmt.Sprint(o) != fmt.Sprint(want) {
		t.Errorf("Overrides = %v, %v; want %v, found", o, st, want)
	}
	if o, st := e.d.Overrides(empty); st != Found || len(o) != 0 {
		t.Errorf("Overrides({}) = %v, %v; want empty, found", o, st)
	}
	if o, st := e.d.Overrides("00000000-0000-4000-8000-000000000000"); st != NotFound || len(o) != 0 {
		t.Errorf("Overrides(unknown tenant) = %v, %v; want not found", o, st)
	}
	before := e.rec.events("overrides")
	if o, st := e.d.Overrides("tenant-1"); st != NotFound || len(o) != 0 {
		t.Errorf("Overrides(non-UUID) = %v, %v; want not found", o, st)
	}
	if e.rec.events("overrides") != before {
		t.Errorf("a non-UUID tenant id was looked up")
	}

	// An invalid document is ignored (no overrides) and warned about once, not on every
	// reload.
	const warning = "ignoring invalid tenants.limits"
	for i := range 3 {
		if o, st := e.d.Overrides(bad); st != Found || len(o) != 0 {
			t.Errorf("Overrides(invalid document) = %v, %v; want empty, found", o, st)
		}
		e.clock.Advance(31 * time.Second) // past the default override TTL: the next call reloads
		if n := e.logs.count(warning); n != 1 {
			t.Fatalf("after %d loads of an invalid document: %d warnings, want 1:\n%s", i+1, n, e.logs)
		}
	}
	if !strings.Contains(e.logs.String(), bad) || !strings.Contains(e.logs.String(), "limits.upload") {
		t.Errorf("the warning names neither the tenant nor the offending key:\n%s", e.logs)
	}
	// Once fixed, the overrides apply; broken again, it is warned about again.
	e.exec(`UPDATE tenants SET limits = '{"upload":{"limit":3,"scale_ms":2000}}' WHERE id = $1`, bad)
	if o, _ := e.d.Overrides(bad); o["upload"] != (buckets.Limit{Count: 3, Window: 2 * time.Second}) {
		t.Errorf("fixed document: Overrides = %v", o)
	}
	e.exec(`UPDATE tenants SET limits = '{"login_ip":{"limit":3,"scale_ms":2000}}' WHERE id = $1`, bad)
	e.clock.Advance(31 * time.Second)
	if o, st := e.d.Overrides(bad); st != Found || len(o) != 0 {
		t.Errorf("non-overridable bucket: Overrides = %v, %v; want empty, found", o, st)
	}
	if n := e.logs.count(warning); n != 2 {
		t.Errorf("%d warnings after the document broke a second time, want 2", n)
	}
}

func TestCachedUntilTTL(t *testing.T) {
	const ttl = 30 * time.Second
	e := newEnv(t, "", Options{CredentialTTL: ttl})
	key := newKey("ck_")
	id := e.addTenant(key)
	secret := newKey("cs_")
	ch := e.addChannel(id, secret, "")

	if got, st := e.d.TenantByAPIKey(key); st != Found || !got.Active {
		t.Fatalf("first lookup = %+v, %v", got, st)
	}
	if e.rec.count("api_keys", ResultMiss) != 1 || e.rec.count("api_keys", ResultHit) != 0 {
		t.Errorf("first lookup: metrics %v, want one miss", e.rec.cache)
	}
	if _, st := e.d.ChannelBySecret(secret); st != Found {
		t.Fatal("channel not found")
	}

	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, id)
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, ch)
	// Halfway through the TTL (before the background reload starts, at 70% to 90%).
	e.clock.Advance(ttl / 2)
	if got, st := e.d.TenantByAPIKey(key); st != Found || !got.Active {
		t.Errorf("within the TTL: %+v, %v; want the cached active tenant", got, st)
	}
	if got, st := e.d.ChannelBySecret(secret); st != Found || !got.Active {
		t.Errorf("within the TTL: %+v, %v; want the cached active channel", got, st)
	}
	if e.rec.count("api_keys", ResultHit) != 1 || e.rec.count("channel_secrets", ResultHit) != 1 {
		t.Errorf("second lookups: metrics %v, want a hit each", e.rec.cache)
	}

	e.clock.Advance(ttl / 2)
	if got, st := e.d.TenantByAPIKey(key); st != Found || got.Active {
		t.Errorf("after the TTL: %+v, %v; want the inactive tenant", got, st)
	}
	if got, st := e.d.ChannelBySecret(secret); st != Found || got.Active {
		t.Errorf("after the TTL: %+v, %v; want the inactive channel", got, st)
	}
	if e.rec.count("api_keys", ResultMiss) != 2 || e.rec.count("api_keys", ResultFallback) != 0 {
		t.Errorf("after the TTL: metrics %v, want a second miss and no fallback", e.rec.cache)
	}
}

func TestNegativeAnswersCachedForNegativeTTL(t *testing.T) {
	const negTTL = 10 * time.Second
	e := newEnv(t, "", Options{CredentialTTL: time.Minute, NegativeTTL: negTTL})
	key, secret, pub := newKey("ck_"), newKey("cs_"), newKey("pk_")

	if _, st := e.d.TenantByAPIKey(key); st != NotFound {
		t.Fatalf("unknown key: %v", st)
	}
	if _, st := e.d.ChannelBySecret(secret); st != NotFound {
		t.Fatalf("unknown secret: %v", st)
	}
	if _, st := e.d.ChannelByPublishableKey(pub); st != NotFound {
		t.Fatalf("unknown publishable key: %v", st)
	}
	id := e.addTenant(key)
	e.addChannel(id, secret, pub)

	e.clock.Advance(negTTL - time.Millisecond)
	if _, st := e.d.TenantByAPIKey(key); st != NotFound {
		t.Errorf("within the negative TTL: %v, want the cached not found", st)
	}
	if _, st := e.d.ChannelBySecret(secret); st != NotFound {
		t.Errorf("within the negative TTL: %v, want the cached not found", st)
	}
	if _, st := e.d.ChannelByPublishableKey(pub); st != NotFound {
		t.Errorf("within the negative TTL: %v, want the cached not found", st)
	}
	if e.rec.count("api_keys", ResultHit) != 1 {
		t.Errorf("metrics %v: the second lookup was not a hit", e.rec.cache)
	}
	e.clock.Advance(time.Millisecond)
	if got, st := e.d.TenantByAPIKey(key); st != Found || got.ID != id {
		t.Errorf("after the negative TTL: %+v, %v; want found", got, st)
	}
	if _, st := e.d.ChannelBySecret(secret); st != Found {
		t.Errorf("after the negative TTL: %v; want found", st)
	}
	if _, st := e.d.ChannelByPublishableKey(pub); st != Found {
		t.Errorf("after the negative TTL: %v; want found", st)
	}
}

func TestCacheStaysBounded(t *testing.T) {
	const max = 10
	e := newEnv(t, "", Options{MaxEntries: max, NegativeTTL: 10 * time.Second})
	size := func() int {
		e.d.apiKeys.mu.Lock()
		defer e.d.apiKeys.mu.Unlock()
		return len(e.d.apiKeys.m)
	}
	for range max - 1 {
		e.d.TenantByAPIKey(newKey("ck_"))
	}
	e.clock.Advance(11 * time.Second) // those answers expire
	fresh := newKey("ck_")
	e.d.TenantByAPIKey(fresh)
	if n := size(); n != max {
		t.Fatalf("%d entries, want %d", n, max)
	}
	// The next entry makes room by evicting the expired entries, not the fresh one.
	e.d.TenantByAPIKey(newKey("ck_"))
	hits := e.rec.count("api_keys", ResultHit)
	if _, st := e.d.TenantByAPIKey(fresh); st != NotFound || e.rec.count("api_keys", ResultHit) != hits+1 {
		t.Errorf("the fresh entry was evicted before expired ones (size %d)", size())
	}

	key := newKey("ck_")
	id := e.addTenant(key)
	for i := range 200 {
		e.d.TenantByAPIKey(newKey("ck_"))
		if n := size(); n > max {
			t.Fatalf("after %d more lookups the cache holds %d entries, more than %d", i+1, n, max)
		}
	}
	// A bounded cache still answers correctly.
	if got, st := e.d.TenantByAPIKey(key); st != Found || got.ID != id {
		t.Errorf("lookup after eviction: %+v, %v", got, st)
	}
}

func TestConcurrentLookupsShareOneLoad(t *testing.T) {
	e := newEnv(t, "", Options{})
	key := newKey("ck_")
	id := e.addTenant(key)
	secret := newKey("cs_")
	ch := e.addChannel(id, secret, "")

	var loads atomic.Int32
	load := e.d.apiKeys.load
	e.d.apiKeys.load = func(ctx context.Context, h [32]byte) (Tenant, bool, error) {
		loads.Add(1)
		return load(ctx, h)
	}

	const n = 100
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan string, 3*n)
	for range n {
		wg.Go(func() {
			<-start
			if got, st := e.d.TenantByAPIKey(key); st != Found || got != (Tenant{ID: id, Active: true}) {
				errs <- fmt.Sprintf("TenantByAPIKey = %+v, %v", got, st)
			}
		})
		wg.Go(func() {
			<-start
			if got, st := e.d.ChannelBySecret(secret); st != Found || got.ID != ch || got.TenantID != id {
				errs <- fmt.Sprintf("ChannelBySecret = %+v, %v", got, st)
			}
		})
		wg.Go(func() {
			<-start
			if got, st := e.d.Overrides(id); st != Found || len(got) != 0 {
				errs <- fmt.Sprintf("Overrides = %v, %v", got, st)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := loads.Load(); got != 1 {
		t.Errorf("%d concurrent lookups of one key ran %d loads, want 1", n, got)
	}
	if hits, misses := e.rec.count("api_keys", ResultHit), e.rec.count("api_keys", ResultMiss); hits+misses != n {
		t.Errorf("metrics: %d hits + %d misses, want %d lookups in all", hits, misses, n)
	}
}

// A value in use is reloaded in the background before it expires: lookups keep hitting
// the cache and still see a change within the TTL.
func TestValuesInUseAreReloadedBeforeTheyExpire(t *testing.T) {
	const ttl = 30 * time.Second
	e := newEnv(t, "", Options{CredentialTTL: ttl})
	key := newKey("ck_")
	id := e.addTenant(key)
	if _, st := e.d.TenantByAPIKey(key); st != Found {
		t.Fatal(st)
	}
	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, id)
	e.clock.Advance(ttl * 9 / 10) // past the reload point, before the expiry
	if got, _ := e.d.TenantByAPIKey(key); !got.Active {
		t.Fatal("the first lookup past the reload point waited for the reload")
	}
	waitFor(t, 10*time.Second, "the background reload", func() bool {
		got, st := e.d.TenantByAPIKey(key)
		return st == Found && !got.Active
	})
	if n := e.rec.count("api_keys", ResultMiss); n != 1 {
		t.Errorf("%d misses, want only the first lookup's", n)
	}
	// The reloaded value lives a full TTL from its reload.
	e.clock.Advance(ttl / 2)
	hits := e.rec.count("api_keys", ResultHit)
	if got, _ := e.d.TenantByAPIKey(key); got.Active || e.rec.count("api_keys", ResultHit) != hits+1 {
		t.Errorf("after the reload: %+v, want a hit on the inactive tenant", got)
	}
}

// A caller may look up with a string over its own buffer and reuse the buffer once the
// lookup returns (the sidecar's gRPC codec does): the cache keeps a copy of the key, for
// its map and for the load it starts.
func TestLookupKeepsNoCallerBuffer(t *testing.T) {
	e := newEnv(t, "", Options{})
	tenant := e.addTenant(newKey("ck_"))
	ch := e.addChannel(tenant, newKey("cs_"), "")
	buf := []byte(ch)
	if got, st := e.d.ChannelTenant(unsafe.String(&buf[0], len(buf))); st != Found || got != tenant {
		t.Fatalf("ChannelTenant = %q, %v", got, st)
	}
	copy(buf, strings.Repeat("f", len(buf))) // the caller reuses its buffer
	hits := e.rec.count("channel_tenants", ResultHit)
	if got, st := e.d.ChannelTenant(ch); st != Found || got != tenant || e.rec.count("channel_tenants", ResultHit) != hits+1 {
		t.Fatalf("after the caller's buffer changed: %q, %v, %d hits (want %d)", got, st, e.rec.count("channel_tenants", ResultHit), hits+1)
	}
	e.d.channelTenants.mu.RLock()
	defer e.d.channelTenants.mu.RUnlock()
	for k := range e.d.channelTenants.m {
		if k != ch {
			t.Errorf("the cache holds key %q", k)
		}
	}
}
