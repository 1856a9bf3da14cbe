// Package docs holds the project's documentation; its test keeps the links between the
// pages working.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

var (
	headingRe = regexp.MustCompile(`^#{1,6} (.*)$`)
	anchorRe  = regexp.MustCompile(`<a id="([^"]+)">`)
	linkRe    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// TestLinks: every relative link of the README and the other Markdown pages names a file
// that exists and, after #, a heading (or <a id>) of it, as GitHub renders them.
func TestLinks(t *testing.T) {
	const root = ".."
	var pages []string
	for _, pattern := range []string{"*.md", "docs/*.md", "*/README.md", "deploy/*/README.md", "bench/results/*.md"} {
		found, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			rel, _ := filepath.Rel(root, f)
			pages = append(pages, rel)
		}
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[page] = a
		return a
	}
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRe.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := page
			if file != "" {
				dest = filepath.Clean(filepath.Join(filepath.Dir(page), file))
				info, err := os.Stat(filepath.Join(root, dest))
				if err != nil {
					t.Errorf("%s links to %s, which does not exist", page, target)
					continue
				}
				if info.IsDir() || !strings.HasSuffix(dest, ".md") {
					checked++
					continue
				}
			}
			if anchor != "" && !anchorsOf(dest)[anchor] {
				t.Errorf("%s links to %s: %s has no heading #%s", page, target, dest, anchor)
			}
			checked++
		}
	}
	if checked < 50 {
		t.Fatalf("only %d links checked in %d pages: the pages were not found", checked, len(pages))
	}
}

// headingAnchors are the anchors of a Markdown page: its headings outside code blocks
// (a repeated heading gets -1, -2, … as on GitHub) and its <a id> tags.
func headingAnchors(page string) map[string]bool {
	a := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode {
			continue
		}
		if m := headingRe.FindStringSubmatch(line); m != nil {
			slug := githubSlug(m[1])
			if n := seen[slug]; n > 0 {
				a[slug+"-"+strconv.Itoa(n)] = true
			} else {
				a[slug] = true
			}
			seen[slug]++
		}
		for _, m := range anchorRe.FindAllStringSubmatch(line, -1) {
			a[m[1]] = true
		}
	}
	return a
}

// githubSlug is the anchor GitHub gives a heading: lower case, punctuation dropped,
// spaces as hyphens.
func githubSlug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestHeadingAnchors: the anchors of a page are what the check compares with,
// so a link to a heading that is not there is found.
func TestHeadingAnchors(t *testing.T) {
	a := headingAnchors("# Title\n\n## The `make run` walk-through: a 429\n```\n# not a heading\n```\n## Title\n<a id=\"x\"></a>\n")
	for _, want := range []string{"title", "the-make-run-walk-through-a-429", "title-1", "x"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a comment in a code block taken for a heading")
	}
}
