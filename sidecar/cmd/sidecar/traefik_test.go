package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// traefikModule is the Traefik release whose documented dynamic configuration the shipped
// one is checked against.
const traefikModule = "github.com/traefik/traefik/v3@v3.6.12"

// traefikReference downloads Traefik's module (from the Go module proxy, into the module
// cache) and returns its reference of the file provider's dynamic configuration: every
// key Traefik documents, with a sample value of its type.
func traefikReference(t *testing.T) *yaml.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", traefikModule).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", traefikModule, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download %s: %s %v", traefikModule, mod.Error, err)
	}
	return readYAML(t, filepath.Join(mod.Dir, "docs", "content", "reference", "dynamic-configuration", "file.yaml"))
}

func readYAML(t *testing.T, path string) *yaml.Node {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return doc.Content[0]
}

// namedMaps are the keys of Traefik's dynamic configuration whose entries are named by
// the operator (routers, middlewares, services, headers): any name stands for all the
// documented entries.
var namedMaps = map[string]bool{
	"routers": true, "middlewares": true, "services": true, "serversTransports": true,
	"customRequestHeaders": true, "customResponseHeaders": true,
}

// conform reports the keys of got that the reference does not document, or whose value
// is not of the documented kind.
func conform(got, ref *yaml.Node, path string) []string {
	switch {
	case got.Kind == yaml.MappingNode && ref.Kind == yaml.MappingNode:
		var errs []string
		for i := 0; i+1 < len(got.Content); i += 2 {
			key, val := got.Content[i].Value, got.Content[i+1]
			var refs []*yaml.Node
			for j := 0; j+1 < len(ref.Content); j += 2 {
				if namedMaps[lastKey(path)] || ref.Content[j].Value == key {
					refs = append(refs, ref.Content[j+1])
				}
			}
			if len(refs) == 0 {
				errs = append(errs, fmt.Sprintf("%s.%s: not in Traefik's documented dynamic configuration", path, key))
				continue
			}
			// A named entry conforms when one documented entry fits it; else the errors
			// of the closest one are reported: the fewest, found deepest.
			var best []string
			score := func(e []string) int { return len(e)*1000 - len(e[0]) }
			for n, r := range refs {
				e := conform(val, r, path+"."+key)
				if len(e) == 0 {
					best = nil
					break
				}
				if n == 0 || score(e) < score(best) {
					best = e
				}
			}
			errs = append(errs, best...)
		}
		return errs
	case got.Kind == yaml.SequenceNode && ref.Kind == yaml.SequenceNode:
		var errs []string
		for i, item := range got.Content {
			if len(ref.Content) > 0 {
				errs = append(errs, conform(item, ref.Content[0], fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
		return errs
	case got.Kind == yaml.ScalarNode && ref.Kind == yaml.ScalarNode:
		if ref.ShortTag() != "!!str" && got.ShortTag() != ref.ShortTag() {
			return []string{fmt.Sprintf("%s: %s %q where Traefik documents a %s", path, got.ShortTag(), got.Value, ref.ShortTag())}
		}
		return nil
	}
	return []string{fmt.Sprintf("%s: a %v where Traefik documents a %v", path, kind(got), kind(ref))}
}

func lastKey(path string) string { return path[strings.LastIndexByte(path, '.')+1:] }

func kind(n *yaml.Node) string {
	return map[yaml.Kind]string{yaml.MappingNode: "mapping", yaml.SequenceNode: "list", yaml.ScalarNode: "value"}[n.Kind]
}

// The shipped Traefik configuration uses only documented keys and values of their
// documented kinds, and it wires the check in front of the core.
func TestTraefikConfigConformsToTheDocumentedSchema(t *testing.T) {
	path := repoFile(t, "deploy/traefik/converger.yml")
	got := readYAML(t, path)
	ref := traefikReference(t)
	if errs := conform(got, ref, ""); len(errs) > 0 {
		t.Errorf("%s:\n%s", path, strings.Join(errs, "\n"))
	}
	// A misspelt key is caught: the check can fail.
	bad := readYAML(t, path)
	bad.Content[1].Content[3].Content[3].Content[1].Content[0].Value = "adress" // http.middlewares.converger-check.forwardAuth.address
	if errs := conform(bad, ref, ""); len(errs) != 1 || !strings.Contains(errs[0], "adress") {
		t.Errorf("a misspelt address was not caught: %v", errs)
	}
	bad = readYAML(t, path)
	tfh := bad.Content[1].Content[3].Content[3].Content[1].Content[3] // trustForwardHeader's value
	tfh.Value, tfh.Tag = "no", "!!str"
	if errs := conform(bad, ref, ""); len(errs) != 1 || !strings.Contains(errs[0], "trustForwardHeader") {
		t.Errorf("a string for a boolean was not caught: %v", errs)
	}

	var cfg struct {
		HTTP struct {
			Routers map[string]struct {
				Middlewares []string `yaml:"middlewares"`
				Service     string   `yaml:"service"`
			} `yaml:"routers"`
			Middlewares map[string]struct {
				ForwardAuth *struct {
					Address            string `yaml:"address"`
					TrustForwardHeader *bool  `yaml:"trustForwardHeader"`
				} `yaml:"forwardAuth"`
				Headers *struct {
					CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
				} `yaml:"headers"`
			} `yaml:"middlewares"`
			Services map[string]any `yaml:"services"`
		} `yaml:"http"`
	}
	if err := got.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	checked := false
	for name, r := range cfg.HTTP.Routers {
		if _, ok := cfg.HTTP.Services[r.Service]; !ok {
			t.Errorf("router %s: service %q is not defined", name, r.Service)
		}
		stripped := false
		for _, m := range r.Middlewares {
			mw, ok := cfg.HTTP.Middlewares[m]
			if !ok {
				t.Errorf("router %s: middleware %q is not defined", name, m)
				continue
			}
			if h := mw.Headers; h != nil {
				if v, ok := h.CustomRequestHeaders["X-Converger-Forward-Auth"]; ok && v == "" {
					stripped = true
				}
			}
			if fa := mw.ForwardAuth; fa != nil {
				checked = true
				if !strings.HasSuffix(fa.Address, "/check") {
					t.Errorf("middleware %s: address %q is not the sidecar's /check", m, fa.Address)
				}
				if fa.TrustForwardHeader == nil || *fa.TrustForwardHeader {
					t.Errorf("middleware %s: trustForwardHeader must be false, so that clients cannot choose X-Forwarded-For", m)
				}
				if !stripped {
					t.Errorf("router %s: the client's X-Converger-Forward-Auth is not removed before %s", name, m)
				}
			}
		}
	}
	if !checked {
		t.Error("no router runs a forwardAuth middleware")
	}
}
