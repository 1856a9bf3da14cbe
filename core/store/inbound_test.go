package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/inbound"
	"github.com/converger/edge/core/store"
)

// inboundChannel creates a tenant with a webhook channel and returns the channel with
// its secret.
func (e *dataEnv) inboundChannel() (store.Channel, string) {
	e.t.Helper()
	e.n++
	ten, _, err := e.st.As("test").CreateTenant(e.ctx, fmt.Sprintf("inbound-%d", e.n))
	if err != nil {
		e.t.Fatal(err)
	}
	ch, sec, err := e.st.As("test").CreateChannel(e.ctx, ten.ID, "hook", "webhook", "duplex")
	if err != nil {
		e.t.Fatal(err)
	}
	return ch, sec.Secret
}

func (e *dataEnv) countRows(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func TestInboundChannelUnsealsTheSecret(t *testing.T) {
	e := newDataEnv(t, activity.DefaultLimits)
	ch, secret := e.inboundChannel()
	got, key, err := e.st.InboundChannel(e.ctx, ch.ID)
	if err != nil || got != ch || string(key) != secret || !got.RequireSignature {
		t.Fatalf("%+v %v", got, err)
	}
	if _, _, err := e.st.InboundChannel(e.ctx, "00000000-0000-4000-8000-000000000000"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing channel: %v", err)
	}
}

func TestCreateInboundActivity(t *testing.T) {
	e := newDataEnv(t, activity.DefaultLimits)
	ch, _ := e.inboundChannel()
	msg := store.InboundMessage{Client: activity.Client{Text: "hello"}, Sender: "+15550001", ProviderMessageID: "wamid.1"}
	a, created, err := e.st.CreateInboundActivity(e.ctx, ch, msg)
	if err != nil || !created {
		t.Fatal(created, err)
	}
	if a.Sender != "+15550001" || a.Text != "hello" || a.Type != "message" || a.Seq != 1 || a.IdempotencyKey != "wamid.1" ||
		a.TenantID != ch.TenantID || a.ChannelID != ch.ID {
		t.Fatalf("%+v", a)
	}
	conv, err := e.st.Conversation(e.ctx, ch.TenantID, a.ConversationID)
	if err != nil || conv.ChannelID != ch.ID || conv.Status != "active" {
		t.Fatalf("new conversation %+v %v", conv, err)
	}

	// A repeat returns the original, whatever it says, and opens no conversation.
	again := store.InboundMessage{Client: activity.Client{Text: "different"}, Sender: "x", ProviderMessageID: "wamid.1"}
	b, created, err := e.st.CreateInboundActivity(e.ctx, ch, again)
	if err != nil || created || b.ID != a.ID || b.Text != "hello" {
		t.Fatalf("repeat: %+v %v %v", b, created, err)
	}
	if n := e.countRows(`SELECT count(*) FROM conversations WHERE channel_id = $1`, ch.ID); n != 1 {
		t.Fatalf("%d conversations, want 1", n)
	}

	// Into an explicit conversation; without a provider id nothing is recorded.
	c, created, err := e.st.CreateInboundActivity(e.ctx, ch, store.InboundMessage{
		Client: activity.Client{Text: "second"}, Sender: "external", ConversationID: a.ConversationID})
	if err != nil || !created || c.ConversationID != a.ConversationID || c.Seq != 2 || c.IdempotencyKey != "" {
		t.Fatalf("%+v %v %v", c, created, err)
	}
	if n := e.countRows(`SELECT count(*) FROM inbound_messages WHERE channel_id = $1`, ch.ID); n != 1 {
		t.Fatalf("%d inbound messages recorded, want 1", n)
	}

	// The same provider id on another channel is another message.
	other, _ := e.inboundChannel()
	d, created, err := e.st.CreateInboundActivity(e.ctx, other, msg)
	if err != nil || !created || d.ID == a.ID || d.TenantID != other.TenantID {
		t.Fatalf("other channel: %+v %v %v", d, created, err)
	}
}

func TestCreateInboundActivityRefusals(t *testing.T) {
	e := newDataEnv(t, activity.DefaultLimits)
	ch, _ := e.inboundChannel()
	_, otherConv := e.conversation()

	_, _, err := e.st.CreateInboundActivity(e.ctx, ch, store.InboundMessage{Client: activity.Client{Type: "bogus"}, Sender: "external"})
	var fe activity.FieldErrors
	if !errors.As(err, &fe) || fe["type"] == nil {
		t.Fatalf("bad type: %v", err)
	}
	for _, id := range []string{otherConv.ID, "00000000-0000-4000-8000-000000000000", "not-a-uuid"} {
		_, _, err := e.st.CreateInboundActivity(e.ctx, ch, store.InboundMessage{Sender: "external", ProviderMessageID: "p-" + id, ConversationID: id})
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("conversation %s: %v, want ErrNotFound", id, err)
		}
	}
	a, _, err := e.st.CreateInboundActivity(e.ctx, ch, store.InboundMessage{Sender: "external"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.st.SetConversationStatus(e.ctx, ch.TenantID, a.ConversationID, "closed"); err != nil {
		t.Fatal(err)
	}
	closed := store.InboundMessage{Sender: "external", ProviderMessageID: "late", ConversationID: a.ConversationID}
	if _, _, err := e.st.CreateInboundActivity(e.ctx, ch, closed); !errors.Is(err, store.ErrConversationClosed) {
		t.Fatalf("closed: %v", err)
	}
	// A refused message leaves no trace of its provider id: once the conversation is
	// reopened, the same delivery goes through.
	if n := e.countRows(`SELECT count(*) FROM inbound_messages WHERE channel_id = $1`, ch.ID); n != 0 {
		t.Fatalf("%d provider ids recorded for refused messages", n)
	}
	if _, _, err := e.st.SetConversationStatus(e.ctx, ch.TenantID, a.ConversationID, "active"); err != nil {
		t.Fatal(err)
	}
	if _, created, err := e.st.CreateInboundActivity(e.ctx, ch, closed); err != nil || !created {
		t.Fatalf("after reopening: %v %v", created, err)
	}
}

// Concurrent deliveries of one provider id, without a conversation: one activity in one
// new conversation, and every delivery answers it.
func TestCreateInboundActivityConcurrentRepeats(t *testing.T) {
	e := newDataEnv(t, activity.DefaultLimits)
	ch, _ := e.inboundChannel()
	const n = 20
	ids := make([]string, n)
	errs := make([]error, n)
	createdCount := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a, created, err := e.st.CreateInboundActivity(e.ctx, ch, store.InboundMessage{
				Client: activity.Client{Text: fmt.Sprintf("try %d", i)}, Sender: "external", ProviderMessageID: "same"})
			ids[i], errs[i] = a.ID, err
			if created {
				mu.Lock()
				createdCount++
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("delivery %d: %s %v, want %s", i, ids[i], errs[i], ids[0])
		}
	}
	if createdCount != 1 {
		t.Fatalf("%d deliveries created, want 1", createdCount)
	}
	if a := e.countRows(`SELECT count(*) FROM activities a JOIN conversations c ON c.id = a.conversation_id WHERE c.channel_id = $1`, ch.ID); a != 1 {
		t.Fatalf("%d activities, want 1", a)
	}
	if c := e.countRows(`SELECT count(*) FROM conversations WHERE channel_id = $1`, ch.ID); c != 1 {
		t.Fatalf("%d conversations, want 1", c)
	}
}

func TestUpdateDeliveryStatus(t *testing.T) {
	e := newDataEnv(t, activity.DefaultLimits)
	ch, _ := e.inboundChannel()
	update := func(field, id string, s inbound.Status) store.DeliveryStatus {
		t.Helper()
		d, err := e.st.UpdateDeliveryStatus(e.ctx, ch.ID, inbound.StatusUpdate{IDField: field, ID: id, Status: s}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	p := inbound.ProviderMessageIDField
	steps := []struct {
		status      inbound.Status
		wantStatus  inbound.Status
		wantApplied bool
	}{
		{inbound.Sent, inbound.Sent, true},
		{inbound.Queued, inbound.Sent, false}, // backwards: ignored
		{inbound.Sent, inbound.Sent, false},   // a repeat
		{inbound.Read, inbound.Read, true},    // skipping delivered is forward
		{inbound.Delivered, inbound.Read, false},
		{inbound.Failed, inbound.Read, false},
	}
	for i, s := range steps {
		d := update(p, "m1", s.status)
		if d.Status != s.wantStatus || d.Applied != s.wantApplied || d.UpdatedAt.IsZero() {
			t.Fatalf("step %d (%s): %+v, want %s applied=%v", i, s.status, d, s.wantStatus, s.wantApplied)
		}
	}
	// failed only from queued or sent, and final.
	if d := update(p, "m2", inbound.Queued); !d.Applied {
		t.Fatal(d)
	}
	if d := update(p, "m2", inbound.Failed); !d.Applied || d.Status != inbound.Failed {
		t.Fatal(d)
	}
	if d := update(p, "m2", inbound.Delivered); d.Applied || d.Status != inbound.Failed {
		t.Fatal(d)
	}
	// A delivery id is another name space than provider ids.
	if d := update(inbound.DeliveryIDField, "m1", inbound.Queued); !d.Applied || d.Status != inbound.Queued {
		t.Fatal(d)
	}
}

// Concurrent status updates of one message end at the furthest status, whatever their
// order.
func TestUpdateDeliveryStatusConcurrent(t *testing.T) {
	e := newDataEnv(t, activity.DefaultLimits)
	ch, _ := e.inboundChannel()
	order := []inbound.Status{inbound.Queued, inbound.Sent, inbound.Delivered, inbound.Read}
	var wg sync.WaitGroup
	errs := make([]error, 4*len(order))
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.st.UpdateDeliveryStatus(e.ctx, ch.ID, inbound.StatusUpdate{
				IDField: inbound.ProviderMessageIDField, ID: "m", Status: order[i%len(order)]}, nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	d, err := e.st.UpdateDeliveryStatus(e.ctx, ch.ID, inbound.StatusUpdate{IDField: inbound.ProviderMessageIDField, ID: "m", Status: inbound.Queued}, nil)
	if err != nil || d.Status != inbound.Read || d.Applied {
		t.Fatalf("%+v %v", d, err)
	}
}
