package store_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
)

func TestCreateConversation(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()
	if c.ID == "" || c.TenantID != tenantID || c.Status != "active" || c.LastSeq != 0 || compactJSON(c.Metadata) != "{}" ||
		c.InsertedAt.IsZero() || c.UpdatedAt.IsZero() {
		t.Fatalf("created %+v", c)
	}
	withMeta, err := e.st.CreateConversation(e.ctx, tenantID, c.ChannelID, json.RawMessage(`{"a":[1]}`))
	if err != nil || compactJSON(withMeta.Metadata) != `{"a":[1]}` || withMeta.ChannelID != c.ChannelID {
		t.Fatalf("with metadata: %+v %v", withMeta, err)
	}
	got, err := e.st.Conversation(e.ctx, tenantID, c.ID)
	if err != nil || got.ID != c.ID || got.ChannelID != c.ChannelID {
		t.Fatalf("Conversation: %+v %v", got, err)
	}
	// Another tenant's channel and conversation are missing.
	other, otherConv := e.conversation()
	if _, err := e.st.CreateConversation(e.ctx, tenantID, otherConv.ChannelID, nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("conversation on another tenant's channel: %v", err)
	}
	if _, err := e.st.Conversation(e.ctx, other, c.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's conversation: %v", err)
	}
	if _, err := e.st.Conversation(e.ctx, tenantID, "00000000-0000-4000-8000-000000000000"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing conversation: %v", err)
	}
}

func TestSetConversationStatus(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()
	if _, _, err := e.create(tenantID, c.ID, "hi", ""); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		status  string
		changed bool
		lastSeq int64
	}{
		{"closed", true, 2}, {"closed", false, 2}, {"active", true, 3}, {"active", false, 3}, {"closed", true, 4},
	}
	for _, s := range steps {
		got, changed, err := e.st.SetConversationStatus(e.ctx, tenantID, c.ID, s.status)
		if err != nil || changed != s.changed || got.Status != s.status || got.LastSeq != s.lastSeq {
			t.Fatalf("to %s: %+v changed=%v %v; want changed=%v last_seq=%d", s.status, got, changed, err, s.changed, s.lastSeq)
		}
	}
	list, _, err := e.st.ListActivities(e.ctx, tenantID, c.ID, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range list {
		got = append(got, fmt.Sprintf("%d %s %s %s", a.Seq, a.Sender, a.Type, compactJSON(a.Metadata)))
	}
	want := []string{
		"1 user message {}",
		`2 system conversationUpdate {"event":"conversation_closed","reason":"manual","status":"closed"}`,
		`3 system conversationUpdate {"event":"conversation_reopened","reason":"manual","status":"active"}`,
		`4 system conversationUpdate {"event":"conversation_closed","reason":"manual","status":"closed"}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("lifecycle:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	other, _ := e.conversation()
	if _, _, err := e.st.SetConversationStatus(e.ctx, other, c.ID, "active"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's conversation: %v", err)
	}
	if got, _ := e.st.Conversation(e.ctx, tenantID, c.ID); got.Status != "closed" {
		t.Fatalf("another tenant reopened it: %+v", got)
	}
}
