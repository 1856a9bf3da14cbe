package api_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/converger/edge/core/api"
	"github.com/converger/edge/docs/openapi"
)

// apiDoc is the API reference in the repository.
const apiDoc = "../../docs/api.md"

// TestAPIReferenceCoversEveryRoute: every route the core serves has its section in
// docs/api.md ("### `METHOD /path`"), and every section is a route it serves.
func TestAPIReferenceCoversEveryRoute(t *testing.T) {
	doc, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^### `([A-Z]+ /[^`]*)`$").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	app, _ := api.New(api.Deps{})
	served := map[string]bool{}
	for _, r := range app.GetRoutes(true) {
		if r.Method == "HEAD" { // fiber answers HEAD for every GET
			continue
		}
		served[r.Method+" "+r.Path] = true
	}
	for _, r := range keysOf(served) {
		if !documented[r] {
			t.Errorf("%s is served but has no section \"### `%s`\" in docs/api.md", r, r)
		}
	}
	for _, r := range keysOf(documented) {
		if !served[r] {
			t.Errorf("docs/api.md documents %s, which the core does not serve", r)
		}
	}
	if len(served) < 20 {
		t.Fatalf("only %d routes found: %v", len(served), keysOf(served))
	}
	// The console (core/console) registers its own routes, documented and checked in
	// docs/admin-api.md; this reference points there.
	for r := range served {
		if strings.HasPrefix(r[strings.Index(r, " ")+1:], "/admin/api/") {
			t.Errorf("%s is served by the API itself, not the console", r)
		}
	}
	if !strings.Contains(string(doc), "(admin-api.md)") {
		t.Error("docs/api.md does not point to admin-api.md, the console's reference")
	}
}

// TestOpenAPIDocumentsCoverEveryRoute: every route the core serves is an operation of
// the client API's, the tenant API's or the inbound webhooks' OpenAPI document
// (docs/openapi), and every operation of those is a route it serves.
func TestOpenAPIDocumentsCoverEveryRoute(t *testing.T) {
	documented := map[string]string{}
	for _, name := range []string{openapi.ClientAPI, openapi.TenantAPI, openapi.Webhooks} {
		doc, err := openapi.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range openapi.Operations(doc) {
			if other, ok := documented[op]; ok {
				t.Errorf("%s is in both %s and %s", op, other, name)
			}
			documented[op] = name
		}
	}
	app, _ := api.New(api.Deps{})
	served := map[string]bool{}
	for _, r := range app.GetRoutes(true) {
		if r.Method != "HEAD" {
			served[r.Method+" "+r.Path] = true
		}
	}
	for _, r := range keysOf(served) {
		if documented[r] == "" {
			t.Errorf("%s is served but is in no OpenAPI document of docs/openapi", r)
		}
	}
	for r, name := range documented {
		if !served[r] {
			t.Errorf("docs/openapi/%s has %s, which the core does not serve", name, r)
		}
	}
	if len(documented) < 20 {
		t.Fatalf("only %d operations documented", len(documented))
	}
}

// TestAPIReferenceCoversEveryError: every error code the API can answer is in the
// reference's table.
func TestAPIReferenceCoversEveryError(t *testing.T) {
	doc, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("*.go")
	shared, _ := filepath.Glob("../../shared/apierror/*.go")
	codes := map[string]bool{}
	re := regexp.MustCompile(`Code:\s*"([a-z_]+)"|Error\{\d+,\s*"([a-z_]+)"`)
	for _, f := range append(files, shared...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			codes[m[1]+m[2]] = true
		}
	}
	if len(codes) < 8 {
		t.Fatalf("found only the error codes %v", keysOf(codes))
	}
	for _, c := range keysOf(codes) {
		if !strings.Contains(string(doc), "| `"+c+"` |") {
			t.Errorf("error code %q is not in the table of docs/api.md", c)
		}
	}
	// The legacy socket's error reasons.
	b, err := os.ReadFile("legacyws.go")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)// The reasons of error replies\.\nconst \((.*?)\n\)`).FindSubmatch(b)
	if block == nil {
		t.Fatal("legacyws.go has no block \"The reasons of error replies\"")
	}
	for _, m := range regexp.MustCompile(`=\s*"([a-z_]+)"`).FindAllStringSubmatch(string(block[1]), -1) {
		if !strings.Contains(string(doc), "| `"+m[1]+"` |") {
			t.Errorf("legacy socket reason %q is not in docs/api.md", m[1])
		}
	}
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return slices.Clip(out)
}
