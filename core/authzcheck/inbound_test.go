package authzcheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/converger/edge/core/inbound"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/pgserver"
)

// inboundLimitsYAML gives the inbound bucket a budget of 5 per channel id, in an
// hour-long window so that the requests of a test fall in one window (the test runs
// again once if the hour changed).
const inboundLimitsYAML = `database_wait_ms: 5000
limits:
  inbound: {limit: 5, window: 1h}
`

// webhookChannel creates a tenant with a webhook channel.
func (c *core) webhookChannel() (store.Channel, string) {
	c.t.Helper()
	ctx := context.Background()
	ten, _, err := c.store.As("test").CreateTenant(ctx, fmt.Sprintf("inbound-tenant-%d", names.Add(1)))
	if err != nil {
		c.t.Fatal(err)
	}
	ch, sec, err := c.store.As("test").CreateChannel(ctx, ten.ID, "hook", "webhook", "duplex")
	if err != nil {
		c.t.Fatal(err)
	}
	return ch, sec.Secret
}

// TestInboundBudgetIsCountedBeforeTheSignature runs the real core behind the real
// sidecar: the sidecar counts inbound requests per channel id before the core looks at
// the signature, so once a channel's budget is used up by unsigned requests (each the
// core's 401), the next one is the sidecar's 429, signed or not; another channel's
// signed delivery goes through.
func TestInboundBudgetIsCountedBeforeTheSignature(t *testing.T) {
	dbURL := pgserver.NewTestDatabase(t, migrations.Up)
	sc := startSidecar(t, dbURL, "127.0.0.1:0", inboundLimitsYAML)
	c := startCore(t, dbURL, newChecker(t, sc.GRPCAddr.String(), quietLogger()))
	body := `{"text":"hello","idempotency_key":"wamid.1"}`

	for attempt := 1; ; attempt++ {
		hour := time.Now().Truncate(time.Hour)
		ch, secret := c.webhookChannel()
		path := "/api/v1/channels/" + ch.ID + "/inbound"
		before := c.reached.Load()
		for i := 1; i <= 5; i++ {
			r := c.do("POST", path, body, nil)
			var env envelope
			if err := json.Unmarshal(r.body, &env); err != nil || r.status != 401 || env.Error.Code != "unauthorized" ||
				env.Error.Details["reason"] != "missing" {
				t.Fatalf("unsigned request %d: %d %s, want the core's 401", i, r.status, r.body)
			}
		}
		if got := c.reached.Load() - before; got != 5 {
			t.Fatalf("%d requests reached the core, want 5", got)
		}
		r := c.do("POST", path, body, map[string]string{"x-request-id": "req-inbound-6th"})
		if attempt == 1 && r.status != 429 && !time.Now().Truncate(time.Hour).Equal(hour) {
			t.Logf("the hour changed during the run: again")
			continue
		}
		assert429(t, r, "req-inbound-6th")
		// Signed or not, on /inbound or /status: the channel id's budget is used up.
		signed := map[string]string{"x-request-id": "req-inbound-signed",
			inbound.SignatureHeader: inbound.Sign(time.Now(), []byte(body), []byte(secret))}
		assert429(t, c.do("POST", path, body, signed), "req-inbound-signed")
		status := `{"provider_message_id":"wamid.1","status":"read"}`
		assert429(t, c.do("POST", "/api/v1/channels/"+ch.ID+"/status", status, map[string]string{"x-request-id": "req-status",
			inbound.SignatureHeader: inbound.Sign(time.Now(), []byte(status), []byte(secret))}), "req-status")
		if got := c.reached.Load() - before; got != 5 {
			t.Fatalf("%d requests reached the core, want 5 (the 429s are the sidecar's)", got)
		}
		if n := activities(t, c, ch.ID); n != 0 {
			t.Fatalf("%d activities stored, want none", n)
		}

		// Another channel has its own budget: a signed delivery is stored.
		other, otherSecret := c.webhookChannel()
		r = c.do("POST", "/api/v1/channels/"+other.ID+"/inbound", body, map[string]string{
			inbound.SignatureHeader: inbound.Sign(time.Now(), []byte(body), []byte(otherSecret))})
		if r.status != 201 {
			t.Fatalf("signed delivery on another channel: %d %s", r.status, r.body)
		}
		if n := activities(t, c, other.ID); n != 1 {
			t.Fatalf("%d activities stored, want 1", n)
		}
		break
	}
}

// activities counts the activities of a channel's conversations.
func activities(t *testing.T, c *core, channelID string) int {
	t.Helper()
	var n int
	if err := c.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM activities a
		JOIN conversations v ON v.id = a.conversation_id WHERE v.channel_id = $1`, channelID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
