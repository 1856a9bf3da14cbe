package browsertest

import (
	"context"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/converger/edge/shared/npmci"
)

// webchatDir holds the pinned Web Chat package (package.json, package-lock.json); npm
// installs it into its node_modules.
const webchatDir = "testdata/webchat"

// webchatBundle is Web Chat's prebuilt bundle (React and everything else in one
// script), relative to webchatDir.
var webchatBundle = filepath.Join("node_modules", "botframework-webchat", "dist", "webchat.js")

// webchatPage is a customer's page that embeds Web Chat: it exchanges the channel's
// publishable key for a token with the core (a cross-origin fetch, so a preflight) and
// points Web Chat at the core's client API. window.webchatState says how far it got.
var webchatPage = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>A customer's site</title>
<style>body{font-family:sans-serif;margin:0}header{padding:12px 16px;background:#264653;color:#fff}
#webchat{height:640px;max-width:720px;margin:16px auto;border:1px solid #ccc}</style></head>
<body><header>A customer's site at {{.Site}}, talking to the core at {{.Core}}</header>
<div id="webchat" role="main"></div>
<script src="/webchat.js"></script>
<script>
window.webchatState = "loading";
(async () => {
  try {
    const res = await fetch({{.Core}} + "/api/v1/converger/tokens/publishable", {
      method: "POST",
      headers: {"Authorization": "Bearer " + {{.Key}}, "Content-Type": "application/json"},
      body: JSON.stringify({user: {id: "visitor"}})
    });
    if (!res.ok) throw new Error("token request answered " + res.status);
    const {token} = await res.json();
    const directLine = window.WebChat.createDirectLine({token, domain: {{.Core}} + "/api/v1/converger"});
    window.WebChat.renderWebChat({directLine, userID: "visitor", username: "Visitor"}, document.getElementById("webchat"));
    window.webchatState = "rendered";
  } catch (e) {
    window.webchatState = "error: " + e;
    document.getElementById("webchat").textContent = "Web Chat could not start: " + e;
  }
})();
</script></body></html>`))

// site serves the customer's page and Web Chat's bundle on its own loopback port: another
// origin than the core's.
type site struct {
	origin string
}

func startSite(t *testing.T, coreBase, publishableKey string) *site {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &site{origin: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /webchat.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		http.ServeFile(w, r, filepath.Join(webchatDir, webchatBundle))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = webchatPage.Execute(w, map[string]string{"Site": s.origin, "Core": coreBase, "Key": publishableKey})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// corsFailures records the requests the browser refused for CORS, by URL.
type corsFailures struct {
	mu       sync.Mutex
	requests map[network.RequestID]string
	failed   map[string]string // URL → CORS error
}

func watchCORS(t *testing.T, ctx context.Context) *corsFailures {
	t.Helper()
	f := &corsFailures{requests: map[network.RequestID]string{}, failed: map[string]string{}}
	err := chromedp.Listen(ctx, func(ev any) {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			f.requests[ev.RequestID] = ev.Request.URL
		case *network.EventLoadingFailed:
			if ev.CorsErrorStatus != nil {
				f.failed[f.requests[ev.RequestID]] = ev.CorsErrorStatus.CorsError.String()
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// String lists the failures.
func (f *corsFailures) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.failed)
}

func (f *corsFailures) of(url string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed[url]
}

// TestWebChatOnAnotherOrigin embeds the real Web Chat (the npm package's bundle, served by
// the test, no CDN) on a page of another origin than the core's — another loopback
// port — as a customer's site does, in headless Chromium: the tenant allows that origin
// (`core tenants origins set`), the page gets a token across origins, Web Chat connects
// (the stream's WebSocket) and shows a message typed into it and the echo channel's
// answer. The same page from an origin that is not listed fails its preflight. It keeps
// screenshots of both.
func TestWebChatOnAnotherOrigin(t *testing.T) {
	begin := time.Now()
	execPath := chromium(t)
	npmci.Install(t, webchatDir, webchatBundle)
	c := startCore(t, newAdmin(t))
	c.command(t, "tenants", "create", "--name", "webchat")
	out := c.command(t, "channels", "create", "--tenant", "webchat", "--name", "site", "--type", "echo")
	m := regexp.MustCompile(`(?m)^\s*publishable key:\s*(\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no publishable key in:\n%s", out)
	}
	allowed, unlisted := startSite(t, c.base, m[1]), startSite(t, c.base, m[1])
	c.command(t, "tenants", "origins", "set", "--name", "webchat", allowed.origin)
	artifacts := artifactsDir(t)

	tab := startBrowser(t, execPath)
	failures := watchCORS(t, tab)
	p := &page{t: t, ctx: tab, base: allowed.origin}
	p.open("/", 200)
	waitState(p, "rendered")
	const input = `[data-id="webchat-sendbox-input"]`
	waitFor(p, "Web Chat's send box", "document.querySelector("+jsString(input)+") !== null")
	// Not the origin itself: Web Chat would render it as a link.
	text := fmt.Sprintf("hello from port %s", allowed.origin[strings.LastIndexByte(allowed.origin, ':')+1:])
	run(p, "typing into the send box", chromedp.SendKeys(chromedp.CSS(input), text+kb.Enter))
	// The send box is an input, whose value is not in innerText: the texts are the
	// transcript's.
	transcript := `document.body.innerText`
	waitFor(p, "the message and its echo in the transcript",
		transcript+".includes("+jsString(text)+") && "+transcript+".includes("+jsString("echo: "+text)+")")
	p.screenshot(artifacts, "webchat-other-origin.png")
	if got := failures.String(); got != "map[]" {
		t.Errorf("CORS failures on the allowed origin: %s", got)
	}

	// The same page from an origin that neither CORS_ORIGINS nor the tenant lists: the
	// browser's preflight of the token request is refused, so Web Chat never starts.
	p.base = unlisted.origin
	p.open("/", 200)
	waitFor(p, "the token request to fail", `String(window.webchatState).startsWith("error:")`)
	tokenURL := c.base + "/api/v1/converger/tokens/publishable"
	if got := failures.of(tokenURL); !strings.HasPrefix(got, "Preflight") {
		t.Errorf("the token request from %s failed with CORS error %q, want a Preflight… error; state %q",
			unlisted.origin, got, eval[string](p, "reading the state", "String(window.webchatState)"))
	}
	if eval[bool](p, "looking for Web Chat", "document.querySelector("+jsString(input)+") !== null") {
		t.Error("Web Chat started on an origin that is not allowed")
	}
	p.screenshot(artifacts, "webchat-unlisted-origin.png")
	t.Logf("Web Chat on another origin: %v in all", time.Since(begin).Round(time.Millisecond))
}

// waitState waits for the page's window.webchatState.
func waitState(p *page, want string) {
	p.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for {
		got := eval[string](p, "reading the state", "String(window.webchatState)")
		if got == want {
			return
		}
		if strings.HasPrefix(got, "error:") || time.Now().After(deadline) {
			p.t.Fatalf("the page's Web Chat state is %q, want %q", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFor waits until a JavaScript condition holds in the page.
func waitFor(p *page, what, cond string) {
	p.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for !eval[bool](p, "waiting for "+what, "Boolean("+cond+")") {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s; the page says:\n%s", what,
				eval[string](p, "reading the page", "document.body.innerText.slice(0, 2000)"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
