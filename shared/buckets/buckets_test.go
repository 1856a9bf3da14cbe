package buckets

import (
	"strings"
	"testing"
	"time"
)

func TestParseOverrides(t *testing.T) {
	o, err := ParseOverrides([]byte(`{"activity_create":{"limit":200,"scale_ms":1000},"inbound":{"scale_ms":60000,"limit":2000}}`))
	if err != nil {
		t.Fatal(err)
	}
	if o[ActivityCreate] != (Limit{200, time.Second}) || o[Inbound] != (Limit{2000, time.Minute}) || len(o) != 2 {
		t.Fatalf("parsed %v", o)
	}
	if got := string(o.JSON()); got != `{"activity_create":{"limit":200,"scale_ms":1000},"inbound":{"limit":2000,"scale_ms":60000}}` {
		t.Fatalf("JSON() = %s", got)
	}
	if o, err := ParseOverrides([]byte(`{}`)); err != nil || len(o) != 0 {
		t.Fatalf("{}: %v %v", o, err)
	}
	for doc, want := range map[string]string{
		`null`:                                             "JSON object",
		`[]`:                                               "JSON object",
		`{"login_ip":{"limit":1,"scale_ms":1}}`:            "limits.login_ip: not an overridable bucket",
		`{"nope":{"limit":1,"scale_ms":1}}`:                "limits.nope",
		`{"upload":5}`:                                     "limits.upload",
		`{"upload":{"limit":1}}`:                           "scale_ms is required",
		`{"upload":{"scale_ms":1}}`:                        "limit is required",
		`{"upload":{"limit":0,"scale_ms":1}}`:              "limit must be a positive integer",
		`{"upload":{"limit":-1,"scale_ms":1}}`:             "limit must be a positive integer",
		`{"upload":{"limit":1.5,"scale_ms":1}}`:            "limit must be a positive integer",
		`{"upload":{"limit":"5","scale_ms":1}}`:            "limit must be a positive integer",
		`{"upload":{"limit":1e3,"scale_ms":1}}`:            "limit must be a positive integer",
		`{"upload":{"limit":5,"scale_ms":true}}`:           "scale_ms must be a positive integer",
		`{"upload":{"limit":4294967296,"scale_ms":1}}`:     "limit must be at most",
		`{"upload":{"limit":5,"scale_ms":86400001}}`:       "scale_ms must be at most",
		`{"upload":{"limit":5,"scale_ms":1000,"burst":3}}`: `unknown field "burst"`,
		`{"upload":{"limit":5,"scale_ms":1000}, "x": 1}`:   "limits.x",
	} {
		if _, err := ParseOverrides([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one containing %q", doc, err, want)
		}
	}
}

func TestBuiltInTable(t *testing.T) {
	want := map[string]Limit{
		ActivityCreate: {100, time.Second}, Upload: {10, time.Second}, Inbound: {500, time.Second},
		TokenGenerate: {10, time.Minute}, PublishableTokenIP: {10, time.Minute}, PublishableToken: {300, time.Minute},
		TokenCreate: {10, time.Minute}, LoginIP: {5, time.Minute}, LoginAccount: {5, time.Minute},
		PasswordResetIP: {5, time.Minute}, PasswordResetAccount: {3, time.Hour}, AdminWrite: {60, time.Minute},
	}
	if len(BuiltIn) != len(want) {
		t.Fatalf("%d built-in buckets, want %d", len(BuiltIn), len(want))
	}
	for name, l := range want {
		b, ok := Lookup(name)
		if !ok || b.Default != l {
			t.Errorf("%s: %+v", name, b)
		}
	}
	if got := strings.Join(OverridableNames(), ","); got != "activity_create,upload,inbound,token_generate,publishable_token" {
		t.Errorf("overridable: %s", got)
	}
	for _, b := range BuiltIn {
		if want := map[Per]string{PerTenant: "tenant:", PerChannel: "channel:", PerIP: "ip:"}[b.Per]; b.KeyPrefix != want && b.Name != LoginIP {
			t.Errorf("%s: key prefix %q, want %q", b.Name, b.KeyPrefix, want)
		}
	}
	for s, ok := range map[string]bool{"a": true, "conversation_create": true, "": false, "A": false, "a-b": false, strings.Repeat("a", 65): false} {
		if ValidName(s) != ok {
			t.Errorf("ValidName(%q) != %v", s, ok)
		}
	}
}

func TestLimitSpec(t *testing.T) {
	for l, want := range map[Limit]string{
		{2000, time.Second}: "2000/1s", {10, time.Minute}: "10/1m", {3, time.Hour}: "3/1h",
		{5, 1500 * time.Millisecond}: "5/1.5s", {7, 500 * time.Millisecond}: "7/500ms", {1, 90 * time.Minute}: "1/1h30m",
	} {
		if got := l.Spec(); got != want {
			t.Errorf("%v.Spec() = %q, want %q", l, got, want)
		}
	}
}
