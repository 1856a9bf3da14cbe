// Package openapi holds the OpenAPI 3.1 documents of the core's HTTP APIs (the client,
// tenant and admin APIs and the inbound webhooks) and checks real exchanges against them,
// so that the documents and the core cannot drift apart.
package openapi

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"embed"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// The documents, one file each in this folder.
const (
	ClientAPI = "client-api.yaml"
	TenantAPI = "tenant-api.yaml"
	Webhooks  = "webhooks.yaml"
	AdminAPI  = "admin-api.yaml"
)

//go:embed *.yaml
var files embed.FS

// Load reads and validates one document.
func Load(name string) (*openapi3.T, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, err
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("%s is not a valid OpenAPI document: %w", name, err)
	}
	return doc, nil
}

// Operations lists a document's operations as "METHOD /path" with the core's (fiber's)
// parameter syntax: "GET /api/v1/conversations/:id".
func Operations(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		fiberPath := path
		for {
			i := strings.IndexByte(fiberPath, '{')
			j := strings.IndexByte(fiberPath, '}')
			if i < 0 || j < i {
				break
			}
			fiberPath = fiberPath[:i] + ":" + fiberPath[i+1:j] + fiberPath[j+1:]
		}
		for method := range item.Operations() {
			out = append(out, method+" "+fiberPath)
		}
	}
	sort.Strings(out)
	return out
}

// apiPrefixes are the paths the documents speak for: a request below them that no
// document has must be answered as an unknown route (404 or 405 with the envelope).
// Everything else (the login pages, the admin pages) is not an API and is not checked.
var apiPrefixes = []string{"/api/v1/", "/admin/api/", "/socket/websocket"}

// Checker checks HTTP exchanges against the documents:
//   - an answer must be one the matched operation documents (its status, and its body
//     against the schema);
//   - a request the documents call invalid (a body or parameter off its schema) must be
//     refused with a 4xx: the core never takes what its contract rules out;
//   - a request below the API's prefixes that no document has must be answered 404 or
//     405 with the error envelope.
//
// CORS preflights and bodies the client did not make replayable (a pipe) are not
// checked; multipart bodies are checked for their operation and status, not part by part.
type Checker struct {
	routers []routers.Router
	docs    []*openapi3.T

	mu       sync.Mutex
	failures []string
	checked  int
}

// NewChecker loads the named documents.
func NewChecker(names ...string) (*Checker, error) {
	c := &Checker{}
	for _, n := range names {
		doc, err := Load(n)
		if err != nil {
			return nil, err
		}
		doc.Servers = nil // match any host: the tests' servers listen on free ports
		r, err := gorillamux.NewRouter(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		c.routers = append(c.routers, r)
		c.docs = append(c.docs, doc)
	}
	return c, nil
}

// maxBody bounds what the checker reads of a body to check it.
const maxBody = 64 << 20

// Transport returns a RoundTripper that sends through next and checks each exchange.
func (c *Checker) Transport(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err != nil || !c.inScope(req) {
			return resp, err
		}
		// The answer's body is read whole and given back to the caller unchanged; an
		// upgraded connection (101) is left alone.
		var body []byte
		if resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			body, err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if err != nil {
				return resp, nil // the caller sees the short body; nothing to check
			}
		}
		if problem := c.check(req, resp, body); problem != "" {
			c.mu.Lock()
			c.failures = append(c.failures, problem)
			c.mu.Unlock()
		}
		return resp, nil
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *Checker) inScope(req *http.Request) bool {
	if req.Method == http.MethodOptions && req.Header.Get("Access-Control-Request-Method") != "" {
		return false // a CORS preflight (docs/api.md, "CORS")
	}
	for _, p := range apiPrefixes {
		if strings.HasPrefix(req.URL.Path, p) {
			return true
		}
	}
	return false
}

// check returns what is wrong with one exchange, or "".
func (c *Checker) check(req *http.Request, resp *http.Response, body []byte) string {
	c.mu.Lock()
	c.checked++
	c.mu.Unlock()
	what := fmt.Sprintf("%s %s → %d", req.Method, req.URL.Path, resp.StatusCode)
	match := req
	if req.Method == http.MethodHead { // fiber answers HEAD for every GET
		match = req.Clone(req.Context())
		match.Method = http.MethodGet
	}
	var route *routers.Route
	var params map[string]string
	for _, r := range c.routers {
		if rt, p, err := r.FindRoute(match); err == nil {
			route, params = rt, p
			break
		}
	}
	if route == nil {
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			return what + ": no document has this operation, and the answer is not 404 or 405"
		}
		if problem := envelope(resp, body); problem != "" {
			return what + ": " + problem
		}
		return ""
	}
	ctx := context.Background()
	opts := &openapi3filter.Options{
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
		IncludeResponseStatus: true,
		MultiError:            true,
	}
	// The request, on a copy whose body is the client's bytes (inflated as the core
	// inflates them).
	in := &openapi3filter.RequestValidationInput{Request: match.Clone(ctx), PathParams: params, Route: route, Options: opts}
	reqBody, replayable := requestBody(req)
	if !replayable || strings.HasPrefix(req.Header.Get("Content-Type"), "multipart/") || req.Method == http.MethodHead {
		o := *opts
		o.ExcludeRequestBody = true
		in.Options = &o
		reqBody = nil
	}
	in.Request.Body = io.NopCloser(bytes.NewReader(reqBody))
	in.Request.ContentLength = int64(len(reqBody))
	in.Request.Header.Del("Content-Encoding")
	if reqErr := openapi3filter.ValidateRequest(ctx, in); reqErr != nil && resp.StatusCode < 400 {
		return fmt.Sprintf("%s: the documents call the request invalid (%v), yet it was taken", what, oneLine(reqErr))
	} else if reqErr != nil && resp.StatusCode >= 500 {
		return fmt.Sprintf("%s: the documents call the request invalid (%v): expected a 4xx", what, oneLine(reqErr))
	}
	respIn := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                opts,
	}
	if req.Method == http.MethodHead || resp.StatusCode == http.StatusSwitchingProtocols {
		o := *opts
		o.ExcludeResponseBody = true
		respIn.Options = &o
	}
	if err := openapi3filter.ValidateResponse(ctx, respIn); err != nil {
		return fmt.Sprintf("%s: the answer is not the documented one: %v (body %.300s)", what, oneLine(err), body)
	}
	return ""
}

// requestBody returns the bytes the client sent, inflated when Content-Encoding says
// so, without consuming the request's own body; false when it cannot be had again.
func requestBody(req *http.Request) ([]byte, bool) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	rc, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	defer rc.Close()
	var r io.Reader = rc
	switch strings.ToLower(req.Header.Get("Content-Encoding")) {
	case "":
	case "gzip":
		zr, err := gzip.NewReader(rc)
		if err != nil {
			return nil, false
		}
		r = zr
	case "deflate":
		r = flate.NewReader(rc)
	default:
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(r, maxBody))
	if err != nil {
		return nil, false
	}
	return b, true
}

// envelope checks that an answer is the JSON error envelope.
func envelope(resp *http.Response, body []byte) string {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return "an error that is not the JSON envelope (Content-Type " + resp.Header.Get("Content-Type") + ")"
	}
	if !bytes.HasPrefix(body, []byte(`{"error":{"code":`)) {
		return fmt.Sprintf("an error that is not the envelope: %.200s", body)
	}
	return ""
}

func oneLine(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if len(s) > 600 {
		s = s[:600] + "…"
	}
	return s
}

// Failures are the exchanges that broke the documents so far.
func (c *Checker) Failures() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.failures...)
}

// Checked is how many exchanges were checked.
func (c *Checker) Checked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checked
}

// CheckDefaultTransport checks every exchange of http.DefaultTransport (which
// http.DefaultClient and clients without a Transport use) while run runs — a test
// binary's TestMain — against the named documents. It returns run's exit code, or 1
// when an exchange broke a document, after printing each.
func CheckDefaultTransport(run func() int, names ...string) int {
	c, err := NewChecker(names...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "openapi:", err)
		return 1
	}
	saved := http.DefaultTransport
	http.DefaultTransport = c.Transport(saved)
	code := run()
	http.DefaultTransport = saved
	if f := c.Failures(); len(f) > 0 {
		fmt.Fprintf(os.Stderr, "--- FAIL: %d of %d exchanges break the OpenAPI documents (docs/openapi):\n", len(f), c.Checked())
		for _, p := range f {
			fmt.Fprintln(os.Stderr, "    "+p)
		}
		return 1
	}
	return code
}
