package inbound

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/converger/edge/core/activity"
)

// FuzzParseSignature: any header parses to a well-formed signature or to ErrMissing /
// ErrMalformed, never anything else and never a panic; what parses re-encodes to a
// header that parses to the same; and Verify agrees with ParseSignature.
func FuzzParseSignature(f *testing.F) {
	valid := Sign(testNow, testBody, testSecret)
	for _, seed := range []string{
		valid,
		Sign(testNow, testBody, testSecret, []byte("second")),
		"",
		"t=1800000000",
		"v1=" + strings.Repeat("ab", 32),
		"t=1,t=2,v1=" + strings.Repeat("ab", 32),
		"t=1800000000, v1=" + strings.Repeat("0", 64),
		"sha256=" + strings.Repeat("0", 64),
		"t=01,v1=" + strings.Repeat("0", 64),
		"t=1,v1=" + strings.Repeat("0", 64) + ",v2=x,",
		"=,=,=",
		"t==1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		sig, err := ParseSignature(header)
		if err != nil {
			if !errors.Is(err, ErrMissing) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseSignature(%q) = %v", header, err)
			}
			if (header == "") != errors.Is(err, ErrMissing) {
				t.Fatalf("ParseSignature(%q) = %v: ErrMissing is for the empty header only", header, err)
			}
			if verr := Verify(header, testSecret, testBody, testNow); !errors.Is(verr, err) {
				t.Fatalf("Verify(%q) = %v, ParseSignature %v", header, verr, err)
			}
			return
		}
		if len(header) > MaxSignatureHeader || strings.ContainsAny(header, " \t\r\n") || !utf8.ValidString(header) {
			t.Fatalf("accepted %q", header)
		}
		if sig.Timestamp < 0 || len(sig.V1) == 0 || len(sig.V1) > MaxSignatures {
			t.Fatalf("ParseSignature(%q) = %+v", header, sig)
		}
		// The header named t in its canonical form: HMAC input and header agree.
		if !strings.Contains(","+header+",", ",t="+strconv.FormatInt(sig.Timestamp, 10)+",") {
			t.Fatalf("t=%d is not in %q as sent", sig.Timestamp, header)
		}
		re := "t=" + strconv.FormatInt(sig.Timestamp, 10)
		for _, v := range sig.V1 {
			if len(v) != 32 {
				t.Fatalf("v1 of %d bytes in %q", len(v), header)
			}
			re += ",v1=" + hex.EncodeToString(v)
		}
		again, err := ParseSignature(re)
		if err != nil || again.Timestamp != sig.Timestamp || len(again.V1) != len(sig.V1) {
			t.Fatalf("re-encoded %q: %+v %v", re, again, err)
		}
		for i := range sig.V1 {
			if !bytes.Equal(again.V1[i], sig.V1[i]) {
				t.Fatalf("re-encoded %q: v1 %d differs", re, i)
			}
		}
		// Verify never accepts a header unless one of its v1 is the real HMAC.
		verr := Verify(header, testSecret, testBody, testNow)
		want := mac(testSecret, sig.Timestamp, testBody)
		matches := false
		for _, v := range sig.V1 {
			matches = matches || bytes.Equal(v, want)
		}
		if verr == nil && !matches {
			t.Fatalf("Verify accepted %q without a matching v1", header)
		}
		if verr != nil && !errors.Is(verr, ErrStale) && !errors.Is(verr, ErrMismatch) {
			t.Fatalf("Verify(%q) = %v after a successful parse", header, verr)
		}
	})
}

// FuzzDecodeMessage: any body decodes to a message whose server fields are in bounds,
// or to ErrNotObject (exactly when it is not a JSON object) or field errors; never a
// panic. What decodes goes through the activity validation without a panic, and what
// that accepts is valid JSON for the store.
func FuzzDecodeMessage(f *testing.F) {
	for _, seed := range []string{
		`{"text":"hello","sender":"+15550001","idempotency_key":"wamid.1"}`,
		`{"type":"event","attachments":[{"contentType":"image/png","contentUrl":"https://x"}],"metadata":{"a":[1,2,{"b":null}]}}`,
		`{"conversation_id":"2f1c1a8e-2b7e-4d39-9c1b-0d6a1f7c9e10","text":"x"}`,
		`{"sender":null,"type":null,"attachments":null,"metadata":null}`,
		`{"text":1,"sender":[],"idempotency_key":{}}`,
		`{"metadata":{"n":1e400}}`,
		`{"text":"a\u0000b","sender":"\ud800"}`,
		`{"attachments":[1,"x",null]}`,
		`[]`,
		`null`,
		`{"a":1} {"b":2}`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := DecodeMessage(body)
		var probe map[string]json.RawMessage
		isObject := json.Unmarshal(body, &probe) == nil && probe != nil
		if errors.Is(err, ErrNotObject) {
			if isObject {
				t.Fatalf("ErrNotObject for the object %q", body)
			}
			return
		}
		if !isObject {
			t.Fatalf("%q is no object, yet DecodeMessage = %v", body, err)
		}
		if err != nil {
			var fe activity.FieldErrors
			if !errors.As(err, &fe) || len(fe) == 0 {
				t.Fatalf("DecodeMessage(%q) = %v", body, err)
			}
			return
		}
		for _, f := range []struct {
			name, value string
			max         int
		}{
			{"sender", m.Sender, MaxSenderBytes},
			{"idempotency_key", m.ProviderMessageID, MaxMessageIDBytes},
			{"conversation_id", m.ConversationID, MaxMessageIDBytes},
		} {
			if len(f.value) > f.max || !utf8.ValidString(f.value) || strings.ContainsFunc(f.value, isControl) {
				t.Fatalf("%s %q out of bounds in %q", f.name, f.value, body)
			}
		}
		if m.Sender == "" {
			t.Fatalf("no sender for %q", body)
		}
		c := m.Client
		if errs := c.Validate(activity.DefaultLimits); errs != nil {
			return
		}
		if !json.Valid(c.AttachmentsJSON()) || !json.Valid(c.Metadata) || !utf8.ValidString(c.Text) || strings.ContainsRune(c.Text, 0) {
			t.Fatalf("validated activity of %q is not storable: %+v", body, c)
		}
	})
}
