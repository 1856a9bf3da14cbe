package api

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// appendJSON must write the activity answer byte for byte as marshalJSON does.
func checkActivityJSON(t *testing.T, d tenantActivityData) {
	t.Helper()
	want, wantErr := marshalJSON(d)
	got, ok := d.appendJSON(nil)
	if ok != (wantErr == nil) {
		t.Fatalf("%+v: appendJSON ok %v, marshalJSON error %v", d, ok, wantErr)
	}
	if ok && !bytes.Equal(got, want) {
		t.Fatalf("%+v:\nappendJSON  %s\nmarshalJSON %s", d, got, want)
	}
}

func TestActivityAnswerJSON(t *testing.T) {
	base := tenantActivityJSON{ID: "0b6c2b5e-6c3e-4c1e-9d4a-2f1f3b7a9e01", Type: "message", Sender: "user", Text: "hello",
		Attachments: json.RawMessage(`[]`), Metadata: json.RawMessage(`{}`), Seq: 42,
		ConversationID: "c", TenantID: "t", InsertedAt: jsonTime(time.Date(2026, 12, 1, 14, 0, 0, 123e6, time.UTC))}
	for _, text := range []string{
		"", `a "quoted" \ backslash`, "<b>&amp;</b>", "tab\there\nnew\rline\b\f", "\x00\x01\x1f\x7f",
		"héllo wörld ☃ 𝄞", "\u2028 and \u2029", "bad \xff\xfe utf-8 \xc3", "\xe2\x82", strings2k(),
	} {
		a := base
		a.Text, a.Sender = text, text
		checkActivityJSON(t, tenantActivityData{Data: a})
	}
	for _, raw := range []string{`[ {"contentType": "image/png", "contentUrl" : "https://x/y?a=1&b=2"} ]`,
		`{"k": [1, 2.50, true, null, "\u00e9\n"], "": {}}`, "{\n\t\"a\":\r 1 }", `{"a":`, `nope`} {
		a := base
		a.Metadata, a.Attachments = json.RawMessage(raw), json.RawMessage(`[`+raw+`]`)
		checkActivityJSON(t, tenantActivityData{Data: a})
	}
	a := base
	a.Seq = -1 << 63
	checkActivityJSON(t, tenantActivityData{Data: a})
}

func strings2k() string {
	b := make([]byte, 2048)
	for i := range b {
		b[i] = byte(i)
	}
	return string(b)
}

func FuzzActivityAnswerJSON(f *testing.F) {
	f.Add("hello", "user", `{}`, `[]`, int64(1))
	f.Add("\u2028<\x00>\xff", "bot\"", `{"a": [1, {"b": null}]}`, `[{"contentType":"x"}]`, int64(-7))
	f.Fuzz(func(t *testing.T, text, sender, meta, att string, seq int64) {
		checkActivityJSON(t, tenantActivityData{Data: tenantActivityJSON{ID: text, Type: sender, Sender: sender, Text: text,
			Attachments: json.RawMessage(att), Metadata: json.RawMessage(meta), Seq: seq,
			ConversationID: sender, TenantID: text, InsertedAt: text}})
	})
}
