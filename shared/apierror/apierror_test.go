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
