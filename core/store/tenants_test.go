package store_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/store"
)

func TestTenantByAPIKey(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	ten, key, err := e.st.As("test").CreateTenant(e.ctx, "Acme")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, credentials.APIKeyPrefix) || ten.Status != "active" || ten.APIKeyPrefix != key[:len(ten.APIKeyPrefix)] {
		t.Fatalf("tenant %+v key prefix %q", ten, key[:9])
	}
	if got, err := e.st.TenantByAPIKey(e.ctx, key); err != nil || got.ID != ten.ID {
		t.Fatalf("by key: %+v %v", got, err)
	}
	for _, k := range []string{"", "cvg_live_nope", key + "x", strings.ToUpper(key)} {
		if _, err := e.st.TenantByAPIKey(e.ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	if got, err := e.st.TenantByName(e.ctx, "ACME"); err != nil || got.ID != ten.ID {
		t.Fatalf("by name: %+v %v", got, err)
	}
	if _, _, err := e.st.As("test").CreateTenant(e.ctx, "acme"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	// The key is stored hashed only.
	var n int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM tenants t WHERE strpos(t::text, $1) > 0`, key).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the API key is stored in clear (%d rows, %v)", n, err)
	}
	// The previous key works during its grace, not after.
	newKey := credentials.NewAPIKey()
	if _, err := e.pool.Exec(e.ctx, `UPDATE tenants SET previous_api_key_hash = api_key_hash, previous_api_key_expires_at = now() + interval '1 hour',
		api_key_hash = $2 WHERE id = $1`, ten.ID, credentials.Hash(newKey)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{key, newKey} {
		if got, err := e.st.TenantByAPIKey(e.ctx, k); err != nil || got.ID != ten.ID {
			t.Fatalf("during the grace: %+v %v", got, err)
		}
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE tenants SET previous_api_key_expires_at = now() - interval '1 second' WHERE id = $1`, ten.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.TenantByAPIKey(e.ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the grace: %v", err)
	}
	// An inactive tenant's key does not work.
	if _, err := e.pool.Exec(e.ctx, `UPDATE tenants SET status = 'inactive' WHERE id = $1`, ten.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.TenantByAPIKey(e.ctx, newKey); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("inactive tenant: %v", err)
	}
}

func TestChannels(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	ten, _, err := e.st.As("test").CreateTenant(e.ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	ch, sec, err := e.st.As("test").CreateChannel(e.ctx, ten.ID, "web", "echo", "duplex")
	if err != nil {
		t.Fatal(err)
	}
	if ch.TenantID != ten.ID || ch.Type != "echo" || ch.Status != "active" || !ch.Active() || !strings.HasPrefix(sec.Publishable, credentials.PublishablePrefix) ||
		sec.Secret == "" {
		t.Fatalf("channel %+v", ch)
	}
	for name, lookup := range map[string]func() (store.Channel, error){
		"secret":      func() (store.Channel, error) { return e.st.ChannelBySecret(e.ctx, sec.Secret) },
		"publishable": func() (store.Channel, error) { return e.st.ChannelByPublishableKey(e.ctx, sec.Publishable) },
		"id":          func() (store.Channel, error) { return e.st.ChannelByID(e.ctx, ch.ID) },
	} {
		if got, err := lookup(); err != nil || got.ID != ch.ID || got.Type != "echo" {
			t.Fatalf("by %s: %+v %v", name, got, err)
		}
	}
	// A secret is no publishable key, nor the other way round.
	if _, err := e.st.ChannelBySecret(e.ctx, sec.Publishable); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("publishable key as a secret: %v", err)
	}
	if _, err := e.st.ChannelByPublishableKey(e.ctx, sec.Secret); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("secret as a publishable key: %v", err)
	}
	// The secret reads back (for inbound signatures) and is stored only hashed and sealed.
	if _, got, err := e.st.InboundChannel(e.ctx, ch.ID); err != nil || string(got) != sec.Secret {
		t.Fatalf("InboundChannel: %v", err)
	}
	var hash, sealed []byte
	if err := e.pool.QueryRow(e.ctx, `SELECT secret_hash, secret_ciphertext FROM channels WHERE id = $1`, ch.ID).Scan(&hash, &sealed); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(sec.Secret)) || !bytes.Equal(hash, credentials.Hash(sec.Secret)) {
		t.Fatal("the secret is not stored hashed and sealed")
	}
	// Names are unique per tenant.
	if _, _, err := e.st.As("test").CreateChannel(e.ctx, ten.ID, "web", "webhook", "duplex"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	other, _, _ := e.st.As("test").CreateTenant(e.ctx, "b")
	if _, _, err := e.st.As("test").CreateChannel(e.ctx, other.ID, "web", "webhook", "duplex"); err != nil {
		t.Fatalf("same name, other tenant: %v", err)
	}
	// Active needs the channel and its tenant active.
	if _, err := e.pool.Exec(e.ctx, `UPDATE tenants SET status = 'inactive' WHERE id = $1`, ten.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.st.ChannelByID(e.ctx, ch.ID); got.Active() {
		t.Fatal("a channel of an inactive tenant is active")
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE tenants SET status = 'active' WHERE id = $1;`, ten.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE channels SET status = 'inactive' WHERE id = $1`, ch.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.st.ChannelByID(e.ctx, ch.ID); got.Active() {
		t.Fatal("an inactive channel is active")
	}
	if _, err := e.st.ChannelByID(e.ctx, "00000000-0000-4000-8000-000000000000"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing channel: %v", err)
	}
	// Without ENCRYPTION_KEY no channel is created.
	bare := store.New(e.pool, nil, activity.DefaultLimits)
	if _, _, err := bare.As("test").CreateChannel(e.ctx, ten.ID, "x", "echo", "duplex"); !errors.Is(err, store.ErrNoEncryptionKey) {
		t.Fatalf("without a sealer: %v", err)
	}
}
