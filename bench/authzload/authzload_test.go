package authzload

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/clientip"
	"github.com/converger/edge/shared/token"
	"github.com/converger/edge/sidecar/routes"
)

func TestPopulationKeyCounts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n    int
		over float64
	}{{10_000, 0.1}, {1_234, 0.1}, {100, 0.5}, {500, 0}} {
		p, err := NewPopulation(c.n, c.over, 7, time.Now())
		if err != nil {
			t.Fatalf("NewPopulation(%d, %v): %v", c.n, c.over, err)
		}
		if len(p.Keys) != c.n {
			t.Errorf("NewPopulation(%d): %d keys", c.n, len(p.Keys))
		}
		distinct := map[string]bool{}
		for _, k := range p.Keys {
			distinct[k.Value] = true
		}
		if len(distinct) != c.n {
			t.Errorf("NewPopulation(%d): %d distinct key values", c.n, len(distinct))
		}
		hot := p.HotKeys()
		if lo, hi := int(c.over*float64(c.n))-int(numKinds), int(c.over*float64(c.n))+2*int(numKinds); hot < lo || hot > hi {
			t.Errorf("NewPopulation(%d, %v): %d hot keys, want about %v", c.n, c.over, hot, c.over*float64(c.n))
		}
		for k := range numKinds {
			if total, _ := p.KindCount(k); total == 0 {
				t.Errorf("NewPopulation(%d): no %s", c.n, k)
			}
		}
	}
	if _, err := NewPopulation(99, 0.1, 1, time.Now()); err == nil {
		t.Error("NewPopulation(99) should refuse so few keys")
	}
}

// TestMix checks the pre-built requests against the sidecar's own route table and
// identity rules: every limited route is covered, the keys are as many as asked, hot keys
// come in bursts over their limit, and the requests look like Envoy's.
func TestMix(t *testing.T) {
	t.Parallel()
	const n = 456
	p, err := NewPopulation(n, 0.1, 3, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m, err := BuildMix(p, 3, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if m.Prologue != n {
		t.Errorf("prologue of %d requests, want %d", m.Prologue, n)
	}
	table, err := routes.New(routes.BuiltIn())
	if err != nil {
		t.Fatal(err)
	}
	proxies, err := clientip.Parse(TrustedProxies)
	if err != nil {
		t.Fatal(err)
	}
	hit := map[int]int{}
	unlimited := 0
	keys := map[string]bool{}
	perKey := make([]int, n)
	refreshSrc := map[string]int{}
	for pos := range m.Len() {
		req, err := m.Request(pos)
		if err != nil {
			t.Fatalf("request %d: %v", pos, err)
		}
		h := req.GetAttributes().GetRequest().GetHttp()
		hd := h.GetHeaders()
		for name := range hd {
			if name != strings.ToLower(name) {
				t.Fatalf("request %d: header %q is not lower case", pos, name)
			}
		}
		for _, name := range []string{"x-request-id", "x-forwarded-for", "user-agent", ":path", ":method", ":authority"} {
			if hd[name] == "" {
				t.Fatalf("request %d (%s %s): no %s header", pos, h.GetMethod(), h.GetPath(), name)
			}
		}
		if h.GetMethod() == "POST" && hd["content-type"] == "" && m.Class(pos) != cRefresh {
			t.Fatalf("request %d (%s): no content-type", pos, h.GetPath())
		}
		src := req.GetAttributes().GetSource().GetAddress().GetSocketAddress()
		if src.GetAddress() == "" || src.GetPortValue() == 0 {
			t.Fatalf("request %d: no source socket address", pos)
		}
		client, ok := proxies.Resolve(src.GetAddress(), hd["x-forwarded-for"])
		if !ok {
			t.Fatalf("request %d: client address %q / %q does not resolve", pos, src.GetAddress(), hd["x-forwarded-for"])
		}
		keys[client.String()] = true

		r, channelID, ok := table.Match(h.GetMethod(), h.GetPath())
		switch {
		case !ok:
			unlimited++
		case r.Core:
			t.Fatalf("request %d: %s %s is a login route, not in the mix", pos, h.GetMethod(), h.GetPath())
		default:
			hit[r.Index]++
			if channelID != "" {
				keys[channelID] = true
			}
		}
		if v := hd["x-api-key"]; v != "" {
			keys[v] = true
		}
		if v, ok := strings.CutPrefix(hd["authorization"], "Bearer "); ok {
			keys[v] = true
		}
		k := m.Key(pos)
		perKey[k]++
		if m.Class(pos) == cRefresh {
			refreshSrc[p.Keys[k].Src]++
		}
		if want := classes[m.Class(pos)].Method; h.GetMethod() != want {
			t.Fatalf("request %d: method %s, want %s", pos, h.GetMethod(), want)
		}
	}
	for _, r := range table.Routes() {
		if !r.Core && hit[r.Index] == 0 {
			t.Errorf("limited route %s %s is not in the mix", r.Method, r.Pattern)
		}
	}
	if share := float64(unlimited) / float64(m.Len()); share < 0.2 || share > 0.5 {
		t.Errorf("unlimited requests are %.0f%% of the mix, want a realistic share (20%% to 50%%)", 100*share)
	}
	if len(keys) != n {
		t.Errorf("the requests carry %d distinct keys, want %d", len(keys), n)
	}
	if refreshSrc[token.SrcSecret] == 0 || refreshSrc[token.SrcPublishable] == 0 {
		t.Errorf("token refreshes by src: %v, want both secret and publishable tokens", refreshSrc)
	}
	for k, key := range p.Keys {
		if perKey[k] == 0 {
			t.Errorf("key %d (%s) is never sent", k, key.Kind)
		}
	}
	// Each hot key's burst exceeds its bucket's limit; its prologue request adds one.
	for kind := range numKinds {
		for i, k := range p.Hot[kind] {
			c := hotClass(kind, i)
			if want := burstSize(c) + 1; perKey[k] < want {
				t.Errorf("hot %s %d: %d requests, want at least %d (%s)", kind, k, perKey[k], want, classes[c].Name)
			}
		}
	}
	if m.Position(uint64(m.Len())) != m.Prologue {
		t.Errorf("after the last request the mix goes on at %d, want the body's start %d", m.Position(uint64(m.Len())), m.Prologue)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, f := range map[string]func(*Config){
		"keys":        func(c *Config) { c.Keys = 10 },
		"over":        func(c *Config) { c.Over = 0.9 },
		"concurrency": func(c *Config) { c.Concurrency = 0 },
		"conns":       func(c *Config) { c.Conns = 0 },
		"duration":    func(c *Config) { c.Duration = time.Millisecond },
		"rounds":      func(c *Config) { c.Rounds = 0 },
		"too long":    func(c *Config) { c.Duration = 10 * time.Minute },
		"max":         func(c *Config) { c.MaxRequests = 1 },
	} {
		c := DefaultConfig()
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
}

func TestForwardAuthConfigValidate(t *testing.T) {
	if err := DefaultForwardAuthConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, f := range map[string]func(*Config){
		"unknown proxy":     func(c *Config) { c.Proxies = "caddy,apache" },
		"proxies with gRPC": func(c *Config) { c.Interface = "grpc" },
		"interface":         func(c *Config) { c.Interface = "udp" },
		"too long":          func(c *Config) { c.Duration = 2 * time.Minute },
	} {
		c := DefaultForwardAuthConfig()
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
}

// The forward-auth checks and the clients' requests built from the mix describe the
// same requests as its CheckRequests: method, URI, credentials, and the client the
// sidecar resolves from X-Forwarded-For behind the proxy.
func TestHTTPRequestsOfTheMix(t *testing.T) {
	t.Parallel()
	p, err := NewPopulation(100, 0, 5, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m, err := BuildMix(p, 5, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	checks, err := forwardAuthRequests(m)
	if err != nil {
		t.Fatal(err)
	}
	clients, err := clientRequests(m)
	if err != nil {
		t.Fatal(err)
	}
	proxies, err := clientip.Parse(TrustedProxies + ",127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// Every class and key comes up in a sample of the sequence; the race detector makes
	// the whole of it slow to parse.
	for pos := 0; pos < m.Len(); pos += 3 {
		cr, err := m.Request(pos)
		if err != nil {
			t.Fatal(err)
		}
		h := cr.GetAttributes().GetRequest().GetHttp()
		want, _ := proxies.Resolve(cr.GetAttributes().GetSource().GetAddress().GetSocketAddress().GetAddress(), h.GetHeaders()["x-forwarded-for"])
		check, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(checks[pos])))
		if err != nil {
			t.Fatalf("check %d: %v\n%s", pos, err, checks[pos])
		}
		if check.Method != "GET" || check.URL.Path != "/check" || check.Header.Get("X-Forwarded-Method") != h.GetMethod() ||
			check.Header.Get("X-Forwarded-Uri") != h.GetPath() || check.ContentLength != 0 {
			t.Fatalf("check %d: %s %s %v for %s %s", pos, check.Method, check.URL, check.Header, h.GetMethod(), h.GetPath())
		}
		if got, _ := proxies.Resolve("127.0.0.1:4000", check.Header.Get("X-Forwarded-For")); got != want {
			t.Fatalf("check %d: the sidecar resolves client %v, the CheckRequest %v", pos, got, want)
		}
		client, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(clients[pos])))
		if err != nil {
			t.Fatalf("client request %d: %v", pos, err)
		}
		if client.Method != h.GetMethod() || client.RequestURI != h.GetPath() || client.ContentLength != 0 {
			t.Fatalf("client request %d: %s %s for %s %s", pos, client.Method, client.RequestURI, h.GetMethod(), h.GetPath())
		}
		for _, name := range []string{"authorization", "x-api-key", "x-request-id"} {
			if v := h.GetHeaders()[name]; check.Header.Get(name) != v || client.Header.Get(name) != v {
				t.Fatalf("request %d: %s not copied", pos, name)
			}
		}
	}
}
