package browsertest

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// page is a browser tab on the core's pages; every step is bounded by stepTimeout and
// fails the test with what it was doing.
type page struct {
	t    *testing.T
	ctx  context.Context // a chromedp tab
	base string          // the core's base URL
}

// run runs one action in the tab within stepTimeout.
func run[T any](p *page, what string, a chromedp.Action[T]) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// open navigates to path on the core and checks the status and the final path.
func (p *page) open(path string, status int64) {
	p.t.Helper()
	resp := run(p, "opening "+path, chromedp.NavigateResponse(p.base+path))
	p.expectResponse("GET "+path, resp, status, path)
}

// click clicks the element with the id, a submit button or a link, and returns the
// response of the page it leads to (after redirects).
func (p *page) click(id string) *network.Response {
	p.t.Helper()
	p.mustHave("#" + id)
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.ID(id)))
	if err != nil {
		p.t.Fatalf("clicking #%s: %v", id, err)
	}
	return resp
}

// fill types value into the input with the id, replacing what it held.
func (p *page) fill(id, value string) {
	p.t.Helper()
	p.mustHave("#" + id)
	// chromedp's SetValue runs a function in the page, which fails with scripts off.
	eval[chromedp.Void](p, "clearing #"+id, "document.getElementById("+jsString(id)+").value = \"\"")
	run(p, "typing into #"+id, chromedp.SendKeys(chromedp.ID(id), value))
}

// expectResponse checks the status and the path of a response of the browser.
func (p *page) expectResponse(what string, resp *network.Response, status int64, path string) {
	p.t.Helper()
	if resp == nil {
		p.t.Fatalf("%s: the browser got no response", what)
	}
	u, err := url.Parse(resp.URL)
	if err != nil {
		p.t.Fatalf("%s: response URL %q: %v", what, resp.URL, err)
	}
	if resp.Status != status || u.Path != path {
		p.t.Fatalf("%s: got %d at %s, want %d at %s (error on the page: %q)",
			what, resp.Status, u.Path, status, path, p.errorText())
	}
}

// eval evaluates a JavaScript expression in the page (as DevTools does: it works with
// the page's scripts turned off) and decodes its JSON value into T.
func eval[T any](p *page, what, expr string) T {
	p.t.Helper()
	return run(p, what, chromedp.EvaluateAsDevTools[T](expr))
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// has reports whether the page has an element that matches the CSS selector.
func (p *page) has(selector string) bool {
	p.t.Helper()
	return eval[bool](p, "looking for "+selector, "document.querySelector("+jsString(selector)+") !== null")
}

func (p *page) mustHave(selector string) {
	p.t.Helper()
	if !p.has(selector) {
		p.t.Fatalf("the page at %s has no %s", p.location(), selector)
	}
}

// prop returns the property name of the first element that matches the CSS selector,
// as a string (href and action are absolute URLs).
func (p *page) prop(selector, name string) string {
	p.t.Helper()
	v := eval[*string](p, "reading "+name+" of "+selector,
		"(e => e === null ? null : String(e["+jsString(name)+"]))(document.querySelector("+jsString(selector)+"))")
	if v == nil {
		p.t.Fatalf("the page at %s has no %s", p.location(), selector)
	}
	return *v
}

// text returns the trimmed text content of the first element that matches selector.
func (p *page) text(selector string) string {
	p.t.Helper()
	return strings.TrimSpace(p.prop(selector, "textContent"))
}

// errorText is the text of #error, or "" when the page has none.
func (p *page) errorText() string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.EvaluateAsDevTools[string](
		`(e => e === null ? "" : e.textContent.trim())(document.getElementById("error"))`))
	if err != nil {
		return ""
	}
	return v
}

// location is the path of the page's URL.
func (p *page) location() string {
	p.t.Helper()
	loc := run(p, "reading the location", chromedp.Location())
	if u, err := url.Parse(loc); err == nil {
		return u.Path
	}
	return loc
}

// expectPath checks that the absolute URL u has the path.
func (p *page) expectPath(what, u, path string) {
	p.t.Helper()
	parsed, err := url.Parse(u)
	if err != nil || parsed.Path != path || !strings.HasPrefix(u, p.base) {
		p.t.Errorf("%s: %q, want %s%s", what, u, p.base, path)
	}
}

// screenshot saves a full-page PNG of the tab under dir and logs its path.
func (p *page) screenshot(dir, name string) {
	p.t.Helper()
	png := run(p, "taking a screenshot", chromedp.FullScreenshot(100))
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		p.t.Fatalf("screenshot %s: not a PNG (%d bytes)", name, len(png))
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot of %s: %s (%d bytes)", p.location(), path, len(png))
}

// header returns the value of a response header, matching its name case-insensitively.
func header(resp *network.Response, name string) (string, bool) {
	for k, v := range resp.Headers {
		if strings.EqualFold(k, name) {
			s, ok := v.(string)
			return s, ok
		}
	}
	return "", false
}
