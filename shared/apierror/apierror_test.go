package apierror

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBody(t *testing.T) {
	got := string(RateLimited.Body(RateLimitDetails{RetryAfterMS: 1000}, "F8n2kQx1c9ZQAAAB"))
	want := `{"error":{"code":"rate_limited","message":"Too many requests. Please try again later.","details":{"retry_after_ms":1000},"request_id":"F8n2kQx1c9ZQAAAB"}}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	var v map[string]map[string]any
	if err := json.Unmarshal(Unauthorized.Body(nil, `a"b`), &v); err != nil {
		t.Fatal(err)
	}
	if d, ok := v["error"]["details"].(map[string]any); !ok || len(d) != 0 || v["error"]["request_id"] != `a"b` {
		t.Fatalf("nil details / escaping: %v", v)
	}
	if b := string(BadRequest.Body(func() {}, "r")); !strings.Contains(b, `"details":{}`) {
		t.Fatalf("unencodable details: %s", b)
	}
}

func TestRequestID(t *testing.T) {
	if RequestID("abc-123") != "abc-123" {
		t.Fatal("a good x-request-id was replaced")
	}
	seen := map[string]bool{}
	for _, bad := range []string{"", "has space", "tab\t", "ü", strings.Repeat("a", MaxRequestIDLength+1)} {
		id := RequestID(bad)
		if id == bad || len(id) != 16 || seen[id] {
			t.Fatalf("RequestID(%q) = %q", bad, id)
		}
		seen[id] = true
	}
}

// The envelope is JSON for programs, not HTML: "<", ">" and "&" are not escaped.
func TestBodyDoesNotEscapeHTML(t *testing.T) {
	got := string(BadRequest.WithMessage("a < b & c > d").Body(map[string]string{"q": "x=1&y=<2>"}, "r&1"))
	want := `{"error":{"code":"bad_request","message":"a < b & c > d","details":{"q":"x=1&y=<2>"},"request_id":"r&1"}}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// AppendBody writes Body's bytes, whatever the strings hold.
func TestAppendBody(t *testing.T) {
	for _, s := range []string{"", "plain", `q"b\s/`, "ctl \x00\x01\b\f\n\r\t\x1f\x7f", "a < b & c > d", "ü€𝄞", "bad \xff\xfe utf8 \xe2\x82", "sep \u2028 \u2029", strings.Repeat("x", 300)} {
		e := Error{429, "code " + s, "message " + s}
		for _, d := range []*RateLimitDetails{nil, {RetryAfterMS: 0}, {RetryAfterMS: 1234567}} {
			var details any
			if d != nil {
				details = *d
			}
			want := e.Body(details, "id "+s)
			if got := e.AppendBody([]byte("prefix"), d, "id "+s); string(got) != "prefix"+string(want) {
				t.Errorf("%q %v:\ngot  %s\nwant %s", s, d, got[6:], want)
			}
		}
	}
}

func FuzzAppendBody(f *testing.F) {
	f.Add("rate_limited", "Too many requests.", "F8n2kQx1c9ZQAAAB", int64(1000))
	f.Add("a\"\\\x00", "\u2028\xff", "<&>", int64(-1))
	f.Fuzz(func(t *testing.T, code, msg, id string, ms int64) {
		e := Error{400, code, msg}
		if got, want := e.AppendBody(nil, nil, id), e.Body(nil, id); string(got) != string(want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
		if got, want := e.AppendBody(nil, &RateLimitDetails{RetryAfterMS: ms}, id), e.Body(RateLimitDetails{RetryAfterMS: ms}, id); string(got) != string(want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
}
