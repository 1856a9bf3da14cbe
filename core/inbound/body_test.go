package inbound

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/converger/edge/core/activity"
)

func TestDecodeMessage(t *testing.T) {
	m, err := DecodeMessage([]byte(`{"text":"hi","sender":"+15550001","type":"event","attachments":[{"a":1}],
		"metadata":{"k":"v"},"idempotency_key":"wamid.1","conversation_id":"c","seq":9,"inserted_at":"1999-01-01T00:00:00Z","tenant_id":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Client.Text != "hi" || m.Client.Type != "event" || len(m.Client.Attachments) != 1 || string(m.Client.Metadata) != `{"k":"v"}` ||
		m.Sender != "+15550001" || m.ProviderMessageID != "wamid.1" || m.ConversationID != "c" {
		t.Fatalf("%+v", m)
	}

	m, err = DecodeMessage([]byte(`{"sender":null,"idempotency_key":"","conversation_id":null}`))
	if err != nil || m.Sender != DefaultSender || m.ProviderMessageID != "" || m.ConversationID != "" {
		t.Fatalf("defaults: %+v %v", m, err)
	}
}

func TestDecodeMessageErrors(t *testing.T) {
	for _, body := range []string{``, ` `, `null`, `[]`, `"x"`, `1`, `{`, `{"text":"a"} x`, `{"text":"a"}{}`, "\x00"} {
		if _, err := DecodeMessage([]byte(body)); !errors.Is(err, ErrNotObject) {
			t.Errorf("%q: %v, want ErrNotObject", body, err)
		}
	}
	long := `"` + strings.Repeat("a", 300) + `"`
	for body, fields := range map[string][]string{
		`{"text":1}`:                                   {"text"},
		`{"type":false}`:                               {"type"},
		`{"attachments":{}}`:                           {"attachments"},
		`{"sender":7}`:                                 {"sender"},
		`{"sender":` + long + `}`:                      {"sender"},
		`{"sender":"a\u0000b"}`:                        {"sender"},
		`{"sender":"line\nbreak"}`:                     {"sender"},
		`{"idempotency_key":12345}`:                    {"idempotency_key"},
		`{"idempotency_key":` + long + `}`:             {"idempotency_key"},
		`{"conversation_id":{}}`:                       {"conversation_id"},
		`{"text":[],"sender":[],"idempotency_key":[]}`: {"idempotency_key", "sender", "text"},
	} {
		_, err := DecodeMessage([]byte(body))
		var fe activity.FieldErrors
		if !errors.As(err, &fe) {
			t.Errorf("%s: %v, want field errors", body, err)
			continue
		}
		got := make([]string, 0, len(fe))
		for k := range fe {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, fields) {
			t.Errorf("%s: fields %v, want %v", body, got, fields)
		}
	}
}

func TestDecodeStatus(t *testing.T) {
	u, err := DecodeStatus([]byte(`{"provider_message_id":"wamid.1","status":"delivered","extra":1}`))
	if err != nil || u != (StatusUpdate{IDField: ProviderMessageIDField, ID: "wamid.1", Status: Delivered}) {
		t.Fatalf("%+v %v", u, err)
	}
	u, err = DecodeStatus([]byte(`{"delivery_id":"d-1","status":"failed"}`))
	if err != nil || u != (StatusUpdate{IDField: DeliveryIDField, ID: "d-1", Status: Failed}) {
		t.Fatalf("%+v %v", u, err)
	}
	if _, err := DecodeStatus([]byte(`[]`)); !errors.Is(err, ErrNotObject) {
		t.Fatalf("[]: %v", err)
	}
	for _, body := range []string{
		`{"status":"sent"}`,
		`{"provider_message_id":"a","delivery_id":"b","status":"sent"}`,
		`{"provider_message_id":"a"}`,
		`{"provider_message_id":"a","status":"Sent"}`,
		`{"provider_message_id":"a","status":"seen"}`,
		`{"provider_message_id":"a","status":3}`,
		`{"provider_message_id":1,"status":"sent"}`,
		`{"delivery_id":"","status":"sent"}`,
	} {
		var fe activity.FieldErrors
		if _, err := DecodeStatus([]byte(body)); !errors.As(err, &fe) {
			t.Errorf("%s: %v, want field errors", body, err)
		}
	}
}

func TestMessageCheck(t *testing.T) {
	for body, want := range map[string]string{
		`{}`: "text", `{"text":" \t"}`: "text", `{"type":"message"}`: "text",
		`{"text":"hi"}`: "", `{"attachments":[{"contentType":"a"}]}`: "", `{"type":"event"}`: "",
		`{"text":"hi","metadata":[]}`: "metadata", `{"metadata":[]}`: "metadata",
	} {
		m, err := DecodeMessage([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		errs := m.Check(activity.DefaultLimits)
		switch {
		case want == "" && errs != nil:
			t.Errorf("%s: %v", body, errs)
		case want != "" && (len(errs) != 1 || errs[want] == nil):
			t.Errorf("%s: %v, want an error on %s", body, errs, want)
		case want == "text" && errs["text"][0] != MsgEmpty:
			t.Errorf("%s: %v", body, errs)
		}
	}
}
