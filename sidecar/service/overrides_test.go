package service_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

// allowedInWindow moves to a fresh second and counts how many of n requests pass.
func (s *stack) allowedInWindow(n int, mk func() *authv3.CheckRequest) int {
	s.t.Helper()
	s.clock.set(s.clock.now().Truncate(time.Second).Add(time.Second))
	allowed := 0
	for range n {
		if isAllowed(s.check(mk())) {
			allowed++
		}
	}
	return allowed
}

func (s *stack) waitListening() {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.get("/readyz", 200), `"override_notifications":true`) {
		if time.Now().After(deadline) {
			s.t.Fatal("the sidecar never listened for override notifications")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOverrideAppliesAtOnceAfterNotify(t *testing.T) {
	s := newStack(t, stackOptions{})
	s.waitListening()
	ten := s.tenant()
	ch := s.channel(ten.id)
	act := func() *authv3.CheckRequest {
		return request("POST", "/api/v1/conversations/c/activities", "192.0.2.1", map[string]string{"x-api-key": ten.apiKey})
	}
	inbound := func() *authv3.CheckRequest {
		return request("POST", "/api/v1/channels/"+ch.id+"/inbound", "192.0.2.1", nil)
	}
	tokenGen := func() *authv3.CheckRequest {
		return request("POST", "/api/v1/converger/tokens/generate", "192.0.2.1", map[string]string{"authorization": "Bearer " + ch.secret})
	}
	if got := s.allowedInWindow(120, act); got != 100 {
		t.Fatalf("default activity_create: %d allowed, want 100", got)
	}
	s.allowedInWindow(1, inbound) // caches the channel's tenant and its (empty) overrides

	ctx := context.Background()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `UPDATE tenants SET limits = '{"activity_create":{"limit":7,"scale_ms":1000},"inbound":{"limit":4,"scale_ms":1000},"token_generate":{"limit":2,"scale_ms":60000}}' WHERE id = $1`, ten.id)
	if err == nil {
		_, err = tx.Exec(ctx, `SELECT pg_notify('rate_limit_overrides', $1)`, ten.id)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Notifications arrive asynchronously, in milliseconds; each try is a fresh window
	// one second later, far inside the 30 s TTL, so only the NOTIFY can explain it.
	deadline := time.Now().Add(5 * time.Second)
	tries := 0
	for s.allowedInWindow(10, act) != 7 {
		tries++
		if time.Now().After(deadline) || tries > 20 {
			t.Fatalf("override not applied after %d tries", tries)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := s.allowedInWindow(10, inbound); got != 4 {
		t.Errorf("inbound override (channel → tenant): %d allowed, want 4", got)
	}
	if got := s.allowedInWindow(10, tokenGen); got != 2 {
		t.Errorf("token_generate override: %d allowed, want 2", got)
	}
	// An override of another tenant's bucket does not leak.
	other := s.tenant()
	if got := s.allowedInWindow(10, func() *authv3.CheckRequest {
		return request("POST", "/api/v1/conversations/c/activities", "192.0.2.1", map[string]string{"x-api-key": other.apiKey})
	}); got != 10 {
		t.Errorf("another tenant: %d of 10 allowed", got)
	}
	// Clearing the override restores the defaults, also at once.
	if _, err := s.db.Exec(ctx, `UPDATE tenants SET limits = '{}' WHERE id = $1; `, ten.id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(ctx, `SELECT pg_notify('rate_limit_overrides', $1)`, ten.id); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for s.allowedInWindow(10, act) != 10 {
		if time.Now().After(deadline) {
			t.Fatal("cleared override not applied")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOverrideAppliesAfterTheTTLWithoutNotify(t *testing.T) {
	s := newStack(t, stackOptions{yaml: "override_cache_ttl_ms: 5000\n"})
	// (Re)connecting LISTEN drops every cached override, so let it connect first.
	s.waitListening()
	ten := s.tenant()
	ch := s.channel(ten.id)
	upload := func() *authv3.CheckRequest {
		return request("POST", "/api/v1/converger/conversations/c/upload", "192.0.2.1",
			map[string]string{"authorization": "Bearer " + s.token(ch, token.SrcSecret)})
	}
	if got := s.allowedInWindow(15, upload); got != 10 {
		t.Fatalf("default upload: %d, want 10", got)
	}
	if _, err := s.db.Exec(context.Background(), `UPDATE tenants SET limits = '{"upload":{"limit":3,"scale_ms":1000}}' WHERE id = $1`, ten.id); err != nil {
		t.Fatal(err)
	}
	// Within the TTL the cached (empty) overrides still apply...
	if got := s.allowedInWindow(15, upload); got != 10 {
		t.Fatalf("within the TTL: %d, want the cached 10", got)
	}
	// ...and once it has passed, the row is read again.
	s.clock.advance(5 * time.Second)
	if got := s.allowedInWindow(15, upload); got != 3 {
		t.Fatalf("after the TTL: %d, want 3", got)
	}
}

// With PostgreSQL stopped in the middle, checks keep being answered quickly: cached
// tenants keep their identity and overrides, new credentials are counted unverified,
// and the sidecar recovers by itself once the database is back.
func TestPostgresStoppedMidTest(t *testing.T) {
	pg := pgserver.StartForTest(t)
	ctx := context.Background()
	if err := migrations.Up(ctx, pg.URL()); err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOptions{databaseURL: pg.URL(), yaml: "database_wait_ms: 50\n"})
	s.waitListening()
	known := s.tenant()
	if _, err := s.db.Exec(ctx, `UPDATE tenants SET limits = '{"activity_create":{"limit":5,"scale_ms":1000}}' WHERE id = $1`, known.id); err != nil {
		t.Fatal(err)
	}
	unseen := s.tenant()
	act := func(key string) func() *authv3.CheckRequest {
		return func() *authv3.CheckRequest {
			return request("POST", "/api/v1/conversations/c/activities", "192.0.2.1", map[string]string{"x-api-key": key})
		}
	}
	// Warm the caches: with a 50 ms bound, a loaded machine may answer the first checks
	// before the database does.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.allowedInWindow(1, act(known.apiKey))
		m := s.metrics()
		if strings.Contains(m, `cache="api_keys",result="hit"`) && strings.Contains(m, `cache="overrides",result="hit"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the caches never filled")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.allowedInWindow(10, act(known.apiKey)); got != 5 {
		t.Fatalf("before the outage: %d, want the override's 5", got)
	}

	s.db.Close()
	if err := pg.Shutdown(); err != nil {
		t.Fatal(err)
	}
	// Even past every TTL, the stale cache keeps the known tenant's override.
	s.clock.advance(time.Minute)
	var slowest time.Duration
	measure := func(n int, mk func() *authv3.CheckRequest) int {
		s.clock.set(s.clock.now().Truncate(time.Second).Add(time.Second))
		allowed := 0
		for range n {
			start := time.Now()
			r := s.check(mk())
			if d := time.Since(start); d > slowest {
				slowest = d
			}
			if isAllowed(r) {
				allowed++
			}
		}
		return allowed
	}
	if got := measure(10, act(known.apiKey)); got != 5 {
		t.Errorf("known tenant during the outage: %d, want 5", got)
	}
	// A key never seen cannot be verified: it is counted by its hash with the
	// installation's limits (100/s), so a flood of it is still limited.
	if got := measure(120, act(unseen.apiKey)); got != 100 {
		t.Errorf("unverifiable key during the outage: %d allowed, want 100", got)
	}
	for i := range 50 {
		measure(1, act(fmt.Sprintf("cvg_live_%032d", i)))
		measure(1, func() *authv3.CheckRequest {
			return request("POST", fmt.Sprintf("/api/v1/channels/6f1c2a52-4f7e-4b8e-9a51-%012d/inbound", i), "192.0.2.1", nil)
		})
	}
	if slowest > 300*time.Millisecond {
		t.Errorf("slowest check during the outage took %s", slowest)
	}
	ready := s.get("/readyz", 200)
	if !strings.Contains(ready, `"database":"down"`) {
		t.Errorf("/readyz during the outage: %s", ready)
	}
	m := s.metrics()
	if !strings.Contains(m, `converger_sidecar_cache_lookups_total{cache="api_keys",result="fallback"}`) ||
		!strings.Contains(m, `converger_sidecar_db_errors_total`) {
		t.Errorf("fallbacks and database errors are not in the metrics")
	}

	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(15 * time.Second)
	for !strings.Contains(s.get("/readyz", 200), `"database":"up"`) {
		if time.Now().After(deadline) {
			t.Fatal("the sidecar did not notice that the database is back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The unseen tenant is now verified (its own counter, not the unverified one).
	s.clock.advance(time.Minute)
	deadline = time.Now().Add(5 * time.Second)
	for measure(1, act(unseen.apiKey)) != 1 || !strings.Contains(s.metrics(), `cache="api_keys",result="miss"`) {
		if time.Now().After(deadline) {
			t.Fatal("lookups did not resume")
		}
	}
	s.waitListening()
}

func TestHealthAndReflection(t *testing.T) {
	s := newStack(t, stackOptions{noDatabase: true})
	conn, err := grpc.NewClient(s.sc.GRPCAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, svc := range []string{"", "envoy.service.auth.v3.Authorization", "converger.limiter.v1.Limiter"} {
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v %v", svc, r, err)
		}
	}
	stream, err := reflectpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, sv := range resp.GetListServicesResponse().GetService() {
		listed = append(listed, sv.GetName())
	}
	all := strings.Join(listed, " ")
	for _, want := range []string{"envoy.service.auth.v3.Authorization", "converger.limiter.v1.Limiter", "grpc.health.v1.Health"} {
		if !strings.Contains(all, want) {
			t.Errorf("reflection lists %v, missing %s", listed, want)
		}
	}
	s.get("/healthz", 200)
	if r := s.get("/readyz", 200); !strings.Contains(r, `"database":"none"`) {
		t.Errorf("/readyz: %s", r)
	}
}
