package activity

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// The allowlist is exactly the four client fields; anything else is server-only.
func TestClientFieldsAllowlist(t *testing.T) {
	if !slices.Equal(ClientFields, []string{"type", "text", "attachments", "metadata"}) {
		t.Fatalf("ClientFields = %v", ClientFields)
	}
}

func TestFromBodyIgnoresServerFields(t *testing.T) {
	body := []byte(`{"type":"event","text":"hi","attachments":[{"a":1}],"metadata":{"m":true},
		"id":"x","seq":9,"inserted_at":"1999-01-01T00:00:00Z","tenant_id":"t","conversation_id":"c",
		"idempotency_key":"k","sender":"bot","channelData":{"c":1}}`)
	c, errs := FromBody(body)
	if errs != nil {
		t.Fatal(errs)
	}
	if c.Type != "event" || c.Text != "hi" || len(c.Attachments) != 1 || string(c.Metadata) != `{"m":true}` {
		t.Fatalf("client %+v", c)
	}
	// Nulls are absent fields.
	c, errs = FromBody([]byte(`{"type":null,"text":null,"attachments":null,"metadata":null}`))
	if errs != nil || c.Type != "" || c.Text != "" || c.Attachments != nil || c.Metadata != nil {
		t.Fatalf("nulls: %+v %v", c, errs)
	}
	for _, tc := range []struct{ body, field string }{
		{`[]`, "body"}, {`null`, "body"}, {`x`, "body"}, {`"s"`, "body"},
		{`{"type":1}`, "type"}, {`{"text":{}}`, "text"}, {`{"attachments":{}}`, "attachments"},
	} {
		if _, errs := FromBody([]byte(tc.body)); errs[tc.field] == nil {
			t.Errorf("%s: errors %v, want %s", tc.body, errs, tc.field)
		}
	}
}

func TestFromDirectLine(t *testing.T) {
	// channelData is the metadata, and wins over metadata.
	c, errs := FromDirectLine([]byte(`{"type":"message","text":"hi","channelData":{"clientActivityID":"a1"},"metadata":{"m":1},
		"from":{"id":"u"},"timestamp":"1999-01-01T00:00:00Z","conversationId":"c","id":"x"}`))
	if errs != nil || string(c.Metadata) != `{"clientActivityID":"a1"}` || c.Text != "hi" {
		t.Fatalf("%+v %v", c, errs)
	}
	// metadata when channelData is absent.
	c, errs = FromDirectLine([]byte(`{"type":"message","metadata":{"m":1}}`))
	if errs != nil || string(c.Metadata) != `{"m":1}` {
		t.Fatalf("%+v %v", c, errs)
	}
	// A null channelData is no metadata (not the metadata key's).
	c, errs = FromDirectLine([]byte(`{"type":"message","channelData":null,"metadata":{"m":1}}`))
	if errs != nil || c.Metadata != nil {
		t.Fatalf("%+v %v", c, errs)
	}
}

func TestSenders(t *testing.T) {
	for body, want := range map[string]string{
		`{"from":{"id":"alice"}}`:    "alice",
		`{"from":{"id":""}}`:         "def",
		`{"from":{"id":5}}`:          "def",
		`{"from":"alice"}`:           "def",
		`{}`:                         "def",
		`nope`:                       "def",
		`{"from":{"id":"a\u0000b"}}`: "def",
		`{"from":{"id":"` + strings.Repeat("x", 257) + `"}}`: "def",
		`{"from":{"id":"` + strings.Repeat("x", 256) + `"}}`: strings.Repeat("x", 256),
	} {
		if got := Sender([]byte(body), "def"); got != want {
			t.Errorf("Sender(%.40s) = %.40q, want %.40q", body, got, want)
		}
	}
	for body, want := range map[string]string{
		`{"sender":"agent"}`:                            "agent",
		`{"sender":""}`:                                 "user",
		`{"sender":["a"]}`:                              "user",
		`{"sender":"a\u0000"}`:                          "user",
		`{"from":{"id":"x"}}`:                           "user",
		`{"sender":"` + strings.Repeat("x", 300) + `"}`: "user",
	} {
		if got := BodySender([]byte(body), "user"); got != want {
			t.Errorf("BodySender(%.40s) = %.40q, want %.40q", body, got, want)
		}
	}
	// FromTenantBody reads the sender as BodySender does, also the keys that differ in
	// case only (the last one wins).
	for body, want := range map[string]string{
		`{"sender":"agent"}`:             "agent",
		`{"text":"hi"}`:                  "user",
		`{"sender":"a","SENDER":"b"}`:    "b",
		`{"Sender":"b","sender":"a"}`:    "a",
		`{"ſender":"c"}`:                 BodySender([]byte(`{"ſender":"c"}`), "user"),
		`{"sender":"\u0061\u0062"}`:      "ab",
		`{"sender":"a\u0000"}`:           "user",
		`{"sender":7,"text":"x"}`:        "user",
		`{"type":"message","sender":""}`: "user",
	} {
		_, got, errs := FromTenantBody([]byte(body), "user")
		if errs != nil || got != want {
			t.Errorf("FromTenantBody(%s) sender %q (%v), want %q", body, got, errs, want)
		}
	}
}

func TestValidateDefaultsAndLimits(t *testing.T) {
	c := Client{}
	if errs := c.Validate(DefaultLimits); errs != nil || c.Type != "message" || string(c.Metadata) != "{}" || string(c.AttachmentsJSON()) != "[]" {
		t.Fatalf("defaults: %+v %v", c, errs)
	}
	for _, typ := range Types {
		c := Client{Type: typ}
		if errs := c.Validate(DefaultLimits); errs != nil {
			t.Fatalf("type %s: %v", typ, errs)
		}
	}
	l := Limits{MaxTextBytes: 4, MaxAttachments: 2, MaxAttachmentBytes: 32, MaxMetadataBytes: 15}
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	for _, tc := range []struct {
		name  string
		c     Client
		field string
	}{
		{"unknown type", Client{Type: "invoke"}, "type"},
		{"text bytes", Client{Text: "éé1"}, "text"}, // 5 bytes, 3 characters
		{"NUL in text", Client{Text: "a\x00"}, "text"},
		{"attachment count", Client{Attachments: []json.RawMessage{raw(`{"contentType":"a"}`), raw(`{"contentType":"a"}`),
			raw(`{"contentType":"a"}`)}}, "attachments"},
		{"attachment size", Client{Attachments: []json.RawMessage{raw(`{"contentType":"a","k":"12345678"}`)}}, "attachments"},
		{"attachment not an object", Client{Attachments: []json.RawMessage{raw(`[1]`)}}, "attachments"},
		{"NUL in an attachment", Client{Attachments: []json.RawMessage{raw(`{"contentType":"a","k":"\u0000"}`)}}, "attachments"},
		{"attachment without contentType", Client{Attachments: []json.RawMessage{raw(`{"k":"1"}`)}}, "attachments"},
		{"attachment with a contenttype", Client{Attachments: []json.RawMessage{raw(`{"contenttype":"a"}`)}}, "attachments"},
		{"attachment with a null contentType", Client{Attachments: []json.RawMessage{raw(`{"contentType":null}`)}}, "attachments"},
		{"attachment with a blank contentType", Client{Attachments: []json.RawMessage{raw(`{"contentType":" "}`)}}, "attachments"},
		{"attachment with a number contentType", Client{Attachments: []json.RawMessage{raw(`{"contentType":1}`)}}, "attachments"},
		{"metadata size", Client{Metadata: raw(`{"k":"12345678"}`)}, "metadata"},
		{"metadata not an object", Client{Metadata: raw(`[]`)}, "metadata"},
		{"metadata null", Client{Metadata: raw(`null`)}, "metadata"},
		{"NUL in a metadata key", Client{Metadata: raw(`{"\u0000":1}`)}, "metadata"},
		{"huge exponent", Client{Metadata: raw(`{"n":1e99999}`)}, "metadata"},
	} {
		errs := tc.c.Validate(l)
		if errs[tc.field] == nil || len(errs) != 1 {
			t.Errorf("%s: errors %v, want only %s", tc.name, errs, tc.field)
		}
	}
	// Sizes are of compacted JSON: spacing does not count.
	c = Client{Text: "1234", Attachments: []json.RawMessage{raw(`{ "contentType" : "a", "k" : "1234" }`), raw(`{"contentType":"b"}`)},
		Metadata: raw(`{ "k" : "1234567" }`)}
	if errs := c.Validate(l); errs != nil {
		t.Fatalf("at the limits: %v", errs)
	}
	if string(c.Metadata) != `{"k":"1234567"}` || string(c.AttachmentsJSON()) != `[{"contentType":"a","k":"1234"},{"contentType":"b"}]` {
		t.Fatalf("normalised %s %s", c.Metadata, c.AttachmentsJSON())
	}
}

// Every attachment carries a contentType; the 422 names the attachment by its index.
func TestAttachmentContentType(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	c := Client{Attachments: []json.RawMessage{raw(`{"contentType":"image/png","contentUrl":"https://x/a.png"}`),
		raw(`{"contentUrl":"https://x/b.png"}`), raw(`{"contentType":7}`)}}
	errs := c.Validate(DefaultLimits)
	want := []string{"attachment 1: contentType can't be blank", "attachment 2: contentType must be a string"}
	if len(errs) != 1 || !slices.Equal(errs["attachments"], want) {
		t.Fatalf("errors %v, want attachments %q", errs, want)
	}
}

func TestCheckObject(t *testing.T) {
	for in, want := range map[string]string{
		`{"b":1,"a":"<&>"}`:          `{"a":"<&>","b":1}`,
		`{"n":12345678901234567890}`: `{"n":12345678901234567890}`,
		`{"s":"\ud800"}`:             `{"s":"` + "\uFFFD" + `"}`,
		`{"e":1.5e300}`:              `{"e":1.5e300}`,
	} {
		got, msg := CheckObject(json.RawMessage(in), 1000)
		if msg != "" || string(got) != want {
			t.Errorf("CheckObject(%s) = %s %q, want %s", in, got, msg, want)
		}
	}
	for _, in := range []string{`[]`, `1`, `null`, `"s"`, `{"a":"\u0000"}`, `{"a":[{"\u0000":1}]}`, `{"n":1E-5000}`} {
		if _, msg := CheckObject(json.RawMessage(in), 1000); msg == "" {
			t.Errorf("CheckObject(%s) accepted", in)
		}
	}
}

func TestFieldErrorsError(t *testing.T) {
	e := FieldErrors{"text": {"x"}, "attachments": {"y"}}
	if got := e.Error(); got != "invalid activity fields: [attachments text]" {
		t.Fatalf("Error() = %q", got)
	}
}
