package openapi

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every document loads and is a valid OpenAPI 3.1 document with the error envelope and
// the operations it speaks for.
func TestDocumentsAreValid(t *testing.T) {
	for _, name := range []string{ClientAPI, TenantAPI, Webhooks, AdminAPI} {
		doc, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		if doc.OpenAPI != "3.1.0" {
			t.Errorf("%s: openapi %q, want 3.1.0", name, doc.OpenAPI)
		}
		if doc.Components.Schemas["Error"] == nil {
			t.Errorf("%s has no Error envelope", name)
		}
		if len(Operations(doc)) < 2 {
			t.Errorf("%s: operations %v", name, Operations(doc))
		}
	}
}

// The checker itself must be able to fail: a fake core answers what the documents rule
// out, and each such exchange is reported; the documented exchanges are not.
func TestCheckerCatchesWhatTheDocumentsRuleOut(t *testing.T) {
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-request-id", "r1")
		switch r.URL.Path {
		case "/api/v1/conversations/c1":
			w.Header().Set("Content-Type", "application/json")
			if r.URL.Query().Get("bad") != "" {
				w.Write([]byte(`{"data":{"id":"c1"}}`)) // fields missing
				return
			}
			w.Write([]byte(`{"data":{"id":"7d0e9a3c-2a64-4c1a-9a55-8f9b1a3e0c11","tenant_id":"7d0e9a3c-2a64-4c1a-9a55-8f9b1a3e0c11",` +
				`"channel_id":"7d0e9a3c-2a64-4c1a-9a55-8f9b1a3e0c11","status":"active","last_seq":0,"metadata":{},` +
				`"inserted_at":"2026-12-01T00:00:00.000Z","updated_at":"2026-12-01T00:00:00.000Z"}}`))
		case "/api/v1/conversations":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTeapot) // a status no operation has
			w.Write([]byte(`{}`))
		case "/api/v1/tokens":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"token":"t","expires_in":3600}`))
		case "/api/v1/undocumented":
			w.Write([]byte("ok"))
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"not_found","message":"Not found.","details":{},"request_id":"r1"}}`))
		}
	}))
	defer fake.Close()
	c, err := NewChecker(TenantAPI)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: c.Transport(http.DefaultTransport)}
	send := func(method, path, body string, header map[string]string) {
		t.Helper()
		req, _ := http.NewRequest(method, fake.URL+path, strings.NewReader(body))
		if body == "" {
			req, _ = http.NewRequest(method, fake.URL+path, nil)
		}
		req.Header.Set("x-api-key", "k")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"user_id":7}`))
	zw.Close()

	send("GET", "/api/v1/conversations/c1", "", nil)                                                                               // documented
	send("GET", "/nope", "", nil)                                                                                                  // not the API
	send("GET", "/api/v1/nope", "", nil)                                                                                           // unknown, 404 envelope
	send("GET", "/api/v1/conversations/c1?bad=1", "", nil)                                                                         // 1: body off its schema
	send("POST", "/api/v1/conversations", `{"channel_id":"x"}`, map[string]string{"content-type": "application/json"})             // 2: undocumented status
	send("POST", "/api/v1/tokens", `{"user_id":7}`, map[string]string{"content-type": "application/json"})                         // 3: invalid request taken
	send("POST", "/api/v1/tokens", gz.String(), map[string]string{"content-type": "application/json", "content-encoding": "gzip"}) // 4: the same, compressed
	send("GET", "/api/v1/undocumented", "", nil)                                                                                   // 5: an operation no document has

	got := c.Failures()
	if len(got) != 5 || c.Checked() != 7 {
		t.Fatalf("checked %d, failures %d, want 7 and 5:\n%s", c.Checked(), len(got), strings.Join(got, "\n"))
	}
	for i, want := range []string{"conversations/c1 → 200: the answer is not the documented one", "conversations → 418",
		"tokens → 201: the documents call the request invalid", "tokens → 201: the documents call the request invalid",
		"undocumented → 200: no document has this operation"} {
		if !strings.Contains(got[i], want) {
			t.Errorf("failure %d: %s, want it to say %q", i, got[i], want)
		}
	}
}
