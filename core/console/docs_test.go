package console_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/console"
	"github.com/converger/edge/docs/openapi"
)

// consoleDoc is the console's reference in the repository.
const consoleDoc = "../../docs/admin-api.md"

// TestOpenAPIDocumentCoversEveryRoute: every route of the admin API is an operation of
// docs/openapi/admin-api.yaml, and every operation of it is served.
func TestOpenAPIDocumentCoversEveryRoute(t *testing.T) {
	doc, err := openapi.Load(openapi.AdminAPI)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, op := range openapi.Operations(doc) {
		documented[op] = true
	}
	served := map[string]bool{}
	for r := range servedRoutes(t) {
		if strings.HasPrefix(r[strings.Index(r, " ")+1:], "/admin/api/") {
			served[r] = true
		}
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("%s is served but not in docs/openapi/admin-api.yaml", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("docs/openapi/admin-api.yaml has %s, which the console does not serve", r)
		}
	}
	if len(served) < 10 {
		t.Fatalf("only %d API routes found", len(served))
	}
}

// TestReferenceCoversEveryRoute: every API route of the console has its section in
// docs/admin-api.md ("### `METHOD /path`"), every page its row in the pages' table
// ("| `METHOD /path` |"), and each of those is served.
func TestReferenceCoversEveryRoute(t *testing.T) {
	doc, err := os.ReadFile(consoleDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^### `([A-Z]+ /admin/api/v1[^`]*)`$").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z]+ /admin/[^`]*)` \\|").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	served := servedRoutes(t)
	for r := range served {
		if !documented[r] {
			t.Errorf("%s is served but not documented in docs/admin-api.md", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("docs/admin-api.md documents %s, which the console does not serve", r)
		}
	}
	if len(served) < 15 {
		t.Fatalf("only %d routes found", len(served))
	}
}

// TestReferenceCoversEveryError: every error code the console answers, and the 429 of
// the sidecar in front of it, is in the reference's table.
func TestReferenceCoversEveryError(t *testing.T) {
	doc, err := os.ReadFile(consoleDoc)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("*.go")
	codes := map[string]bool{"not_found": true, "bad_request": true, "rate_limited": true}
	re := regexp.MustCompile(`Code:\s*"([a-z_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			codes[m[1]] = true
		}
	}
	if len(codes) < 10 {
		t.Fatalf("found only the error codes %v", codes)
	}
	var missing []string
	for c := range codes {
		if !strings.Contains(string(doc), "| `"+c+"` |") {
			missing = append(missing, c)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("error codes not in the table of docs/admin-api.md: %v", missing)
	}
}

// servedRoutes are the console's routes as "METHOD /path" (fiber answers HEAD for every
// GET, so HEAD is left out).
func servedRoutes(t *testing.T) map[string]bool {
	t.Helper()
	e := newEnv(t, envOptions{noSidecar: true})
	cons, err := console.New(console.Options{Store: e.st, Pages: e.pages})
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	cons.Register(app)
	served := map[string]bool{}
	for _, r := range app.GetRoutes(true) {
		if r.Method != "HEAD" {
			served[r.Method+" "+r.Path] = true
		}
	}
	return served
}
