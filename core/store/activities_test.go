package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/pgserver"
)

// dataEnv is a store on a fresh database, for the tests of tenants, channels,
// conversations and activities.
type dataEnv struct {
	t    *testing.T
	ctx  context.Context
	url  string
	pool *pgxpool.Pool
	st   *store.Store
	n    int
}

func newDataEnv(t *testing.T, limits activity.Limits) *dataEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	url := pgserver.NewTestDatabase(t, migrations.Up)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, err := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	if err != nil {
		t.Fatal(err)
	}
	return &dataEnv{t: t, ctx: ctx, url: url, pool: pool, st: store.New(pool, sealer, limits)}
}

// conversation creates a tenant, a channel and a conversation; it returns the
// tenant's id and the conversation.
func (e *dataEnv) conversation() (string, store.Conversation) {
	e.t.Helper()
	e.n++
	ten, _, err := e.st.As("test").CreateTenant(e.ctx, fmt.Sprintf("t%d", e.n))
	if err != nil {
		e.t.Fatal(err)
	}
	ch, _, err := e.st.As("test").CreateChannel(e.ctx, ten.ID, "web", "webhook", "duplex")
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := e.st.CreateConversation(e.ctx, ten.ID, ch.ID, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return ten.ID, c
}

func (e *dataEnv) create(tenantID, convID, text, key string) (activity.Activity, bool, error) {
	return e.st.CreateActivity(e.ctx, activity.Client{Text: text},
		activity.System{TenantID: tenantID, ConversationID: convID, Sender: "user", IdempotencyKey: key})
}

// compactJSON is raw without insignificant space (jsonb answers with spaces).
func compactJSON(raw []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "invalid JSON: " + string(raw)
	}
	return b.String()
}

func (e *dataEnv) lastSeq(convID string) int64 {
	e.t.Helper()
	var n int64
	if err := e.pool.QueryRow(e.ctx, `SELECT last_seq FROM conversations WHERE id = $1`, convID).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func TestCreateActivity(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()

	a, created, err := e.st.CreateActivity(e.ctx, activity.Client{Text: "hi"},
		activity.System{TenantID: tenantID, ConversationID: c.ID, Sender: "alice"})
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if a.ID == "" || a.Seq != 1 || a.Type != "message" || a.Sender != "alice" || a.Text != "hi" || a.TenantID != tenantID ||
		a.ConversationID != c.ID || string(a.Attachments) != "[]" || string(a.Metadata) != "{}" || a.IdempotencyKey != "" ||
		time.Since(a.InsertedAt) > time.Minute {
		t.Fatalf("created %+v", a)
	}
	b, _, err := e.st.CreateActivity(e.ctx, activity.Client{Type: "event", Attachments: []json.RawMessage{json.RawMessage(`{"contentType":"a"}`)},
		Metadata: json.RawMessage(`{"k": "v"}`)}, activity.System{TenantID: tenantID, ConversationID: c.ID, Sender: "bot"})
	if err != nil || b.Seq != 2 || b.Type != "event" || compactJSON(b.Attachments) != `[{"contentType":"a"}]` || compactJSON(b.Metadata) != `{"k":"v"}` || b.Text != "" {
		t.Fatalf("second %+v %v", b, err)
	}
	if got, err := e.st.Activity(e.ctx, c.ID, 2); err != nil || got.ID != b.ID {
		t.Fatalf("Activity: %+v %v", got, err)
	}
	if _, err := e.st.Activity(e.ctx, c.ID, 3); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Activity of a missing seq: %v", err)
	}

	// Validation comes first, whatever the conversation.
	_, _, err = e.st.CreateActivity(e.ctx, activity.Client{Type: "bogus"},
		activity.System{TenantID: tenantID, ConversationID: "00000000-0000-4000-8000-000000000000", Sender: "user"})
	var fe activity.FieldErrors
	if !errors.As(err, &fe) || fe["type"] == nil {
		t.Fatalf("invalid type: %v", err)
	}
	// Another tenant's conversation is missing.
	otherTenant, _ := e.conversation()
	if _, _, err := e.create(otherTenant, c.ID, "x", ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's conversation: %v", err)
	}
	if e.lastSeq(c.ID) != 2 {
		t.Fatal("a refused write moved last_seq")
	}
}

func TestCreateActivityIdempotency(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()
	a, created, err := e.create(tenantID, c.ID, "once", "k")
	if err != nil || !created || a.IdempotencyKey != "k" {
		t.Fatalf("first: %+v %v %v", a, created, err)
	}
	b, created, err := e.create(tenantID, c.ID, "twice", "k")
	if err != nil || created || b.ID != a.ID || b.Text != "once" {
		t.Fatalf("repeat: %+v %v %v", b, created, err)
	}
	// Another key, and the same key in another conversation, are new activities.
	if x, created, err := e.create(tenantID, c.ID, "other", "k2"); err != nil || !created || x.Seq != 2 {
		t.Fatalf("other key: %+v %v %v", x, created, err)
	}
	t2, c2 := e.conversation()
	if x, created, err := e.create(t2, c2.ID, "elsewhere", "k"); err != nil || !created || x.ID == a.ID {
		t.Fatalf("same key elsewhere: %+v %v %v", x, created, err)
	}

	// Concurrent duplicates resolve to one row.
	const n = 20
	ids := make([]string, n)
	createdN := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, created, err := e.create(tenantID, c.ID, fmt.Sprint(i), "race")
			ids[i], createdN[i], errs[i] = a.ID, created, err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("concurrent duplicate %d: %s %v (first %s)", i, ids[i], errs[i], ids[0])
		}
	}
	if k := slices.Index(createdN, true); k < 0 || slices.Index(createdN[k+1:], true) >= 0 {
		t.Fatalf("created flags %v: want exactly one", createdN)
	}
	if e.lastSeq(c.ID) != 3 {
		t.Fatalf("last_seq %d, want 3", e.lastSeq(c.ID))
	}
}

func TestCreateActivitySeqIsGapFree(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()
	const n = 60
	seqs := make([]int64, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every third writer sends an invalid activity, which must not take a seq.
			if i%3 == 0 {
				if _, _, err := e.st.CreateActivity(e.ctx, activity.Client{Type: "bogus"},
					activity.System{TenantID: tenantID, ConversationID: c.ID, Sender: "user"}); err == nil {
					mu.Lock()
					failures = append(failures, errors.New("invalid activity accepted"))
					mu.Unlock()
				}
				return
			}
			a, _, err := e.create(tenantID, c.ID, "m", "")
			if err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
				return
			}
			seqs[i] = a.Seq
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatal(failures)
	}
	var got []int64
	for _, s := range seqs {
		if s != 0 {
			got = append(got, s)
		}
	}
	slices.Sort(got)
	for i, s := range got {
		if s != int64(i+1) {
			t.Fatalf("seqs %v have a gap or a duplicate", got)
		}
	}
	if e.lastSeq(c.ID) != int64(len(got)) {
		t.Fatalf("last_seq %d, want %d", e.lastSeq(c.ID), len(got))
	}
}

func TestCreateActivityOnAClosedConversation(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()
	before, _, err := e.create(tenantID, c.ID, "before", "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.st.SetConversationStatus(e.ctx, tenantID, c.ID, "closed"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.create(tenantID, c.ID, "x", ""); !errors.Is(err, store.ErrConversationClosed) {
		t.Fatalf("write on a closed conversation: %v", err)
	}
	// Validation still comes first.
	var fe activity.FieldErrors
	if _, _, err := e.st.CreateActivity(e.ctx, activity.Client{Type: "bogus"},
		activity.System{TenantID: tenantID, ConversationID: c.ID, Sender: "user"}); !errors.As(err, &fe) {
		t.Fatalf("invalid write on a closed conversation: %v", err)
	}
	// A repeat of an activity stored before the close answers it.
	if a, created, err := e.create(tenantID, c.ID, "before", "k"); err != nil || created || a.ID != before.ID {
		t.Fatalf("repeat on a closed conversation: %+v %v %v", a, created, err)
	}
	if e.lastSeq(c.ID) != 2 {
		t.Fatalf("last_seq %d, want 2 (the message and the close)", e.lastSeq(c.ID))
	}
}

func TestCreateActivityLimits(t *testing.T) {
	t.Parallel()
	l := activity.Limits{MaxTextBytes: 4, MaxAttachments: 1, MaxAttachmentBytes: 20, MaxMetadataBytes: 20}
	e := newDataEnv(t, l)
	tenantID, c := e.conversation()
	sys := activity.System{TenantID: tenantID, ConversationID: c.ID, Sender: "user"}
	for _, tc := range []struct {
		c     activity.Client
		field string
	}{
		{activity.Client{Text: "12345"}, "text"},
		{activity.Client{Attachments: []json.RawMessage{json.RawMessage(`{}`), json.RawMessage(`{}`)}}, "attachments"},
		{activity.Client{Attachments: []json.RawMessage{json.RawMessage(`{"contentType":"` + strings.Repeat("x", 20) + `"}`)}}, "attachments"},
		{activity.Client{Metadata: json.RawMessage(`{"k":"` + strings.Repeat("x", 20) + `"}`)}, "metadata"},
	} {
		_, _, err := e.st.CreateActivity(e.ctx, tc.c, sys)
		var fe activity.FieldErrors
		if !errors.As(err, &fe) || fe[tc.field] == nil || len(fe) != 1 {
			t.Fatalf("%+v: %v, want an error on %s", tc.c, err, tc.field)
		}
	}
	if _, _, err := e.st.CreateActivity(e.ctx, activity.Client{Text: "1234", Attachments: []json.RawMessage{json.RawMessage(`{"contentType":"x"}`)},
		Metadata: json.RawMessage(`{"k":"x"}`)}, sys); err != nil {
		t.Fatalf("at the limits: %v", err)
	}
}

func TestCreateActivityNotifies(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()
	conn, err := pgx.Connect(e.ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(e.ctx, "LISTEN "+store.NotifyActivities); err != nil {
		t.Fatal(err)
	}
	next := func() (string, bool) {
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return "", false
		}
		return n.Payload, true
	}
	if _, _, err := e.create(tenantID, c.ID, "a", "k"); err != nil {
		t.Fatal(err)
	}
	if p, ok := next(); !ok || p != c.ID+":1" {
		t.Fatalf("notification %q %v, want %s:1", p, ok, c.ID)
	}
	// A repeat creates nothing and announces nothing; the next activity is announced.
	if _, _, err := e.create(tenantID, c.ID, "a", "k"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.create(tenantID, c.ID, "b", ""); err != nil {
		t.Fatal(err)
	}
	if p, ok := next(); !ok || p != c.ID+":2" {
		t.Fatalf("notification %q %v, want %s:2", p, ok, c.ID)
	}
	// A refused write announces nothing.
	if _, _, err := e.create(tenantID, "00000000-0000-4000-8000-000000000000", "x", ""); err == nil {
		t.Fatal("write to a missing conversation")
	}
	if p, ok := next(); ok {
		t.Fatalf("notification %q for a refused write", p)
	}
}

func TestListActivities(t *testing.T) {
	t.Parallel()
	e := newDataEnv(t, activity.DefaultLimits)
	tenantID, c := e.conversation()
	for i := 1; i <= 5; i++ {
		if _, _, err := e.create(tenantID, c.ID, fmt.Sprint(i), ""); err != nil {
			t.Fatal(err)
		}
	}
	list, more, err := e.st.ListActivities(e.ctx, tenantID, c.ID, 0, 2)
	if err != nil || len(list) != 2 || !more || list[0].Seq != 1 || list[1].Seq != 2 {
		t.Fatalf("page 1: %d %v %v", len(list), more, err)
	}
	list, more, err = e.st.ListActivities(e.ctx, tenantID, c.ID, 2, 3)
	if err != nil || len(list) != 3 || more || list[0].Text != "3" || list[2].Seq != 5 {
		t.Fatalf("page 2: %d %v %v", len(list), more, err)
	}
	list, more, err = e.st.ListActivities(e.ctx, tenantID, c.ID, 5, 10)
	if err != nil || len(list) != 0 || more {
		t.Fatalf("after the end: %d %v %v", len(list), more, err)
	}
	other, _ := e.conversation()
	if _, _, err := e.st.ListActivities(e.ctx, other, c.ID, 0, 10); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's list: %v", err)
	}
}
