package activity

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzLimits are small limits, so that the fuzzer reaches every bound with short
// inputs, beside the defaults.
var fuzzLimits = []Limits{
	{MaxTextBytes: 16, MaxAttachments: 2, MaxAttachmentBytes: 24, MaxMetadataBytes: 32},
	DefaultLimits,
}

// FuzzFromBody feeds arbitrary bytes to the untrusted entry points (FromBody,
// FromDirectLine, then Validate under several limits, and the sender readers). None
// may panic; whatever is accepted respects every limit and what PostgreSQL stores
// (no NUL, valid UTF-8, jsonb numbers); and an accepted activity, encoded as a body
// again, decodes and validates to the same activity.
func FuzzFromBody(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		`{"type":"message","text":"hi"}`,
		`{"type":"event","text":"hi","attachments":[{"a":1}],"metadata":{"m":true},"id":"x","seq":9,` +
			`"inserted_at":"1999-01-01T00:00:00Z","idempotency_key":"k","sender":"bot"}`,
		`{"type":null,"text":null,"attachments":null,"metadata":null}`,
		`{"type":"bogus","text":"` + strings.Repeat("x", 20) + `"}`,
		`{"attachments":[{},{},{}]}`,
		`{"attachments":[{"k":"` + strings.Repeat("a", 30) + `"}]}`,
		`{"attachments":[[1],"s",null]}`,
		`{"metadata":{"k":"\u0000"}}`,
		`{"metadata":{"\u0000":1}}`,
		`{"metadata":{"n":1e99999}}`,
		`{"metadata":{"n":-0.5E-999}}`,
		`{"metadata":{"s":"\ud800\udc00\u2028<&>"}}`,
		`{"metadata":{"b":1,"a":{"b":[1,2,{"c":null}]}}}`,
		`{"metadata":{"a":1,"a":2}}`,
		`{"metadata":[]}`,
		`{"text":"a\u0000b"}`,
		`{"text":"\ud800"}`,
		`{"channelData":{"clientActivityID":"x"},"from":{"id":"u1"},"sender":"agent"}`,
		`{"channelData":null,"metadata":{"m":1}}`,
		`{"sender":"a","Sender":"b"}`, `{"SENDER":"b","sender":"a"}`, `{"ſender":"b"}`, `{"sender":"\u0061\n"}`,
		`{"type":"message","text":"caf\u00e9 \ud83d\ude00 \"q\"","sender":"\xff"}`, "{\"text\":\"\xff\"}",
		`[]`, `null`, `"s"`, `1`, ``, `{`, `{"text":"x"} trailing`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, from := range []struct {
			name string
			read func([]byte) (Client, FieldErrors)
		}{{"FromBody", FromBody}, {"FromDirectLine", FromDirectLine}} {
			c, errs := from.read(body)
			if errs != nil {
				checkErrors(t, from.name, errs, "body", "type", "text", "attachments")
				if c.Type != "" || c.Text != "" || c.Attachments != nil || c.Metadata != nil {
					t.Fatalf("%s: a client %+v beside errors %v", from.name, c, errs)
				}
				continue
			}
			for _, l := range fuzzLimits {
				v := clone(c)
				if errs := v.Validate(l); errs != nil {
					checkErrors(t, "Validate", errs, "type", "text", "attachments", "metadata")
					continue
				}
				checkAccepted(t, v, l)
				checkStable(t, v, l)
			}
		}
		// One reading of a tenant body gives what FromBody and BodySender give.
		c, errs := FromBody(body)
		tc, sender, terrs := FromTenantBody(body, "def")
		if !reflect.DeepEqual(c, tc) || !reflect.DeepEqual(errs, terrs) || (errs == nil && sender != BodySender(body, "def")) {
			t.Fatalf("FromTenantBody: %+v %q %v, want %+v %q %v", tc, sender, terrs, c, BodySender(body, "def"), errs)
		}
		for _, s := range []string{BodySender(body, "def"), Sender(body, "def")} {
			if s != "def" && !(s != "" && len(s) <= 256 && utf8.ValidString(s) && !strings.ContainsRune(s, 0)) {
				t.Fatalf("sender %q", s)
			}
		}
	})
}

// clone copies a client, so that one Validate does not change what the next sees.
func clone(c Client) Client {
	c.Attachments = slices.Clone(c.Attachments)
	c.Metadata = bytes.Clone(c.Metadata)
	return c
}

func checkErrors(t *testing.T, where string, errs FieldErrors, fields ...string) {
	t.Helper()
	if len(errs) == 0 {
		t.Fatalf("%s: empty errors", where)
	}
	for field, msgs := range errs {
		if !slices.Contains(fields, field) || len(msgs) == 0 || slices.Contains(msgs, "") {
			t.Fatalf("%s: errors %v", where, errs)
		}
	}
}

// checkAccepted checks an accepted client against the limits and what PostgreSQL
// stores.
func checkAccepted(t *testing.T, c Client, l Limits) {
	t.Helper()
	if !slices.Contains(Types, c.Type) {
		t.Fatalf("type %q accepted", c.Type)
	}
	if len(c.Text) > l.MaxTextBytes || !utf8.ValidString(c.Text) || strings.ContainsRune(c.Text, 0) {
		t.Fatalf("text %q accepted under %+v", c.Text, l)
	}
	if len(c.Attachments) > l.MaxAttachments {
		t.Fatalf("%d attachments accepted under %+v", len(c.Attachments), l)
	}
	for _, a := range c.Attachments {
		checkStoredObject(t, "attachment", a, l.MaxAttachmentBytes)
	}
	checkStoredObject(t, "metadata", c.Metadata, l.MaxMetadataBytes)
	all := c.AttachmentsJSON()
	var list []json.RawMessage
	if json.Unmarshal(all, &list) != nil || len(list) != len(c.Attachments) {
		t.Fatalf("attachments JSON %s", all)
	}
}

// checkStoredObject checks an object as it is stored: compact JSON of at most max
// bytes, valid UTF-8, with neither NUL characters nor numbers beyond jsonb's range.
func checkStoredObject(t *testing.T, what string, raw json.RawMessage, max int) {
	t.Helper()
	if len(raw) > max {
		t.Fatalf("%s of %d bytes stored under a limit of %d: %s", what, len(raw), max, raw)
	}
	if !utf8.Valid(raw) || !json.Valid(raw) {
		t.Fatalf("%s is not valid UTF-8 JSON: %q", what, raw)
	}
	var compacted bytes.Buffer
	if json.Compact(&compacted, raw) != nil || compacted.Len() != len(raw) {
		t.Fatalf("%s is not compact: %s", what, raw)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if dec.Decode(&obj) != nil || obj == nil {
		t.Fatalf("%s is not an object: %s", what, raw)
	}
	walkJSON(t, what, obj)
}

// walkJSON checks the strings and numbers of a decoded value for what jsonb refuses:
// NUL characters, and numbers whose exponent is beyond ±1000, with more than 16383
// digits after the decimal point, or more than 131072 before it (PostgreSQL's numeric).
func walkJSON(t *testing.T, what string, v any) {
	t.Helper()
	switch v := v.(type) {
	case string:
		if strings.ContainsRune(v, 0) {
			t.Fatalf("%s holds a NUL character", what)
		}
	case json.Number:
		mantissa, exp := strings.ToLower(string(v)), 0
		if i := strings.IndexByte(mantissa, 'e'); i >= 0 {
			var err error
			if exp, err = strconv.Atoi(strings.TrimPrefix(mantissa[i+1:], "+")); err != nil || exp > 1000 || exp < -1000 {
				t.Fatalf("%s holds the number %.40s…, out of jsonb's range", what, v)
			}
			mantissa = mantissa[:i]
		}
		intPart, frac, _ := strings.Cut(strings.TrimPrefix(mantissa, "-"), ".")
		if scale := len(frac) - exp; scale > 16383 {
			t.Fatalf("%s holds a number with %d digits after the point", what, scale)
		}
		if intPart != "0" && len(intPart)+exp > 131072 {
			t.Fatalf("%s holds a number with %d digits before the point", what, len(intPart)+exp)
		}
	case []any:
		for _, e := range v {
			walkJSON(t, what, e)
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, 0) {
				t.Fatalf("%s holds a NUL character in a key", what)
			}
			walkJSON(t, what, e)
		}
	}
}

// checkStable encodes an accepted client as a body again (as the APIs answer it) and
// checks that it decodes and validates to the same client.
func checkStable(t *testing.T, c Client, l Limits) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"type": c.Type, "text": c.Text, "attachments": c.AttachmentsJSON(), "metadata": c.Metadata})
	if err != nil {
		t.Fatalf("encoding %+v: %v", c, err)
	}
	again, errs := FromBody(body)
	if errs != nil {
		t.Fatalf("re-encoded %s: %v", body, errs)
	}
	if errs := again.Validate(l); errs != nil {
		t.Fatalf("re-encoded %s: %v", body, errs)
	}
	if again.Type != c.Type || again.Text != c.Text || !bytes.Equal(again.Metadata, c.Metadata) ||
		!bytes.Equal(again.AttachmentsJSON(), c.AttachmentsJSON()) {
		t.Fatalf("unstable: %+v became %+v", c, again)
	}
}

// Numbers at PostgreSQL's numeric bounds (checked against PostgreSQL 15): too long for
// the fuzzer's inputs, within the default metadata limit.
func TestNumbersWithinJSONB(t *testing.T) {
	digits := func(n int) string { return strings.Repeat("9", n) }
	for number, ok := range map[string]bool{
		"0." + digits(16383):             true,
		"0." + digits(16384):             false,
		"0." + digits(15383) + "e-1000":  true,
		"0." + digits(15384) + "e-1000":  false,
		"-0." + digits(15384) + "E-1000": false,
		"0." + digits(17383) + "e1000":   true,
		"0." + digits(17384) + "e1000":   false,
		digits(131072):                   true,
		digits(131073):                   false,
		digits(130072) + "e1000":         true,
		digits(130073) + "e+1000":        false,
		"1." + digits(16384) + "e1":      true,
		"1e1000":                         true,
		"1e1001":                         false,
		"1e-1001":                        false,
		"1e99999999999999999999":         false,
		"0e1000":                         true,
	} {
		_, msg := CheckObject(json.RawMessage(`{"n":`+number+`}`), 1<<20)
		if (msg == "") != ok {
			t.Errorf("CheckObject of %.12s…%s (%d bytes): %q, want accepted %v", number, number[max(0, len(number)-8):], len(number), msg, ok)
		}
	}
}
