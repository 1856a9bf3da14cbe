package service_test

import (
	"context"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
)

// eventually polls cond for up to 5 s — far inside the 30 s credential cache TTL, and
// on the stack's clock no time passes at all, so only the NOTIFY can explain a change.
func (s *stack) eventually(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("not within 5 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The core's deactivation of a tenant (or a channel) reaches the sidecar at once: its
// cached credentials are refused at the next check, not when the cache expires; and the
// activation again likewise.
func TestDeactivationRefusedAtOnce(t *testing.T) {
	s := newStack(t, stackOptions{})
	s.waitListening()
	ten := s.tenant()
	ch := s.channel(ten.id)
	sibling := s.channel(ten.id)
	other := s.tenant()
	op := store.New(s.db, nil, activity.DefaultLimits).As("test:operator")
	ctx := context.Background()

	apiKey := func(key string) *authv3.CheckRequest {
		return request("POST", "/api/v1/conversations/c/activities", "192.0.2.1", map[string]string{"x-api-key": key})
	}
	secret := func(c channel) *authv3.CheckRequest {
		return request("POST", "/api/v1/converger/tokens/generate", "192.0.2.1", map[string]string{"authorization": "Bearer " + c.secret})
	}
	publishable := func(c channel) *authv3.CheckRequest {
		return request("POST", "/api/v1/converger/tokens/publishable", "192.0.2.1", map[string]string{"authorization": "Bearer " + c.publishable})
	}
	allowed := func(r *authv3.CheckRequest) bool { return isAllowed(s.check(r)) }
	// status is 200 for an allowed check, else the denial's status. A refused credential
	// is answered before anything is counted, whatever the counters say.
	status := func(r *authv3.CheckRequest) int {
		resp := s.check(r)
		if isAllowed(resp) {
			return 200
		}
		return int(resp.GetDeniedResponse().GetStatus().GetCode())
	}
	rejected := func(r *authv3.CheckRequest, status int, code string) {
		t.Helper()
		assertRejected(t, s.check(r), r, status, code)
	}
	// Cached as found and active.
	for _, r := range []*authv3.CheckRequest{apiKey(ten.apiKey), secret(ch), publishable(ch), secret(sibling), apiKey(other.apiKey)} {
		if !allowed(r) {
			t.Fatalf("before: %v", s.check(r))
		}
	}

	if _, _, err := op.DeactivateTenant(ctx, ten.id); err != nil {
		t.Fatal(err)
	}
	s.eventually("the deactivated tenant's API key refused", func() bool { return status(apiKey(ten.apiKey)) == 401 })
	rejected(apiKey(ten.apiKey), 401, "unauthorized")
	rejected(secret(ch), 403, "forbidden")
	rejected(publishable(sibling), 403, "forbidden")
	if !allowed(apiKey(other.apiKey)) {
		t.Fatal("another tenant was refused")
	}

	if _, _, err := op.ActivateTenant(ctx, ten.id); err != nil {
		t.Fatal(err)
	}
	s.eventually("the tenant's API key accepted again", func() bool { return allowed(apiKey(ten.apiKey)) })
	if !allowed(secret(ch)) || !allowed(secret(sibling)) {
		t.Fatal("the channels of the tenant active again are refused")
	}

	// One channel: its credentials only.
	if _, _, err := op.SetChannelStatus(ctx, ch.id, store.StatusInactive); err != nil {
		t.Fatal(err)
	}
	s.eventually("the deactivated channel's secret refused", func() bool { return status(secret(ch)) == 403 })
	rejected(publishable(ch), 403, "forbidden")
	if !allowed(secret(sibling)) || !allowed(apiKey(ten.apiKey)) {
		t.Fatal("the tenant's other credentials are refused")
	}
}
