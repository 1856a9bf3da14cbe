package browsertest

import (
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/sidecar/service"
)

// TestConsole drives the operators' console of a real core, in front of a real sidecar
// (LIMITER_ADDR and AUTHZ_ADDR), in headless Chromium: it signs in, opens a tenant from
// the tenants page, changes an override with the edit form, and opens "Limits" while it
// drives a client address over its token_create limit through the core, until the page,
// reloading itself, shows the key among the busiest and the denied line risen. It saves
// screenshots of the tenant and the Limits pages.
func TestConsole(t *testing.T) {
	begin := time.Now()
	execPath := chromium(t)
	a := newAdmin(t)
	sidecarAddr := freeAddr(t)
	c := startCore(t, a, "LIMITER_ADDR="+sidecarAddr, "AUTHZ_ADDR="+sidecarAddr)
	dbURL := ""
	for _, kv := range c.env {
		if v, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok {
			dbURL = v
		}
	}
	service.StartForTest(t, map[string]string{"SIDECAR_GRPC_ADDR": sidecarAddr, "DATABASE_URL": dbURL}, "",
		service.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	// The core started first and found no sidecar: its gRPC connection retries with
	// backoff, and until it is back the sign-in (a route that protects credentials) is
	// refused with 503. Wait for a check to come through (publishable_token_ip is a
	// budget nothing else here uses).
	for deadline := time.Now().Add(15 * time.Second); post(t, c.base+"/api/v1/converger/tokens/publishable") == 503; {
		if time.Now().After(deadline) {
			t.Fatal("the core's checks still fail 15 s after the sidecar started")
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := c.command(t, "tenants", "create", "--name", "acme")
	tenantID := regexp.MustCompile(`(?m)^\s*id:\s*(\S+)`).FindStringSubmatch(out)[1]
	apiKey := regexp.MustCompile(`(?m)^\s*api key:\s*(\S+)`).FindStringSubmatch(out)[1]

	tab := startBrowser(t, execPath)
	artifacts := artifactsDir(t)
	p := &page{t: t, ctx: tab, base: c.base}

	p.open("/admin/login", 200)
	p.expectResponse("signing in", signIn(p, a.email, a.password), 200, "/admin")
	p.expectResponse("opening the tenants", p.click("console-tenants"), 200, "/admin/tenants")
	p.expectResponse("opening the tenant", p.click("tenant-"+tenantID), 200, "/admin/tenants/"+tenantID)
	source := func(bucket string) string {
		return eval[string](p, "reading the source of "+bucket, `document.getElementById("limit-`+bucket+`").getAttribute("data-source")`)
	}
	if got := source("activity_create"); got != "built_in" {
		t.Fatalf("activity_create comes from %q before the change, want built_in", got)
	}
	p.fill("input-activity_create", "3/1s")
	p.expectResponse("saving the limits", p.click("save-limits"), 200, "/admin/tenants/"+tenantID)
	if got := source("activity_create"); got != "override" {
		t.Fatalf("activity_create comes from %q after the change (error %q), want override", got, p.errorText())
	}
	if got := p.text("#limit-activity_create .effective"); !strings.HasPrefix(got, "3/1s") {
		t.Errorf("the effective limit reads %q, want 3/1s", got)
	}
	if !strings.Contains(p.text("#notice"), "saved") {
		t.Errorf("no notice after saving: %q", p.text("#notice"))
	}
	p.screenshot(artifacts, "console-tenant.png")

	// The override holds at the sidecar: more than 3 activities in a second are refused.
	refused := false
	for try := 0; try < 5 && !refused; try++ {
		for range 5 {
			if post(t, c.base+"/api/v1/conversations/00000000-0000-4000-8000-000000000000/activities", "x-api-key", apiKey) == 429 {
				refused = true
			}
		}
	}
	if !refused {
		t.Error("the override of 3 a second set in the form did not apply at the sidecar")
	}

	p.expectResponse("opening Limits", p.click("nav-limits"), 200, "/admin/limits")
	if !strings.Contains(p.text("#admins-only"), "For admins only") {
		t.Errorf("the Limits page does not say it is for admins only: %q", p.text("#admins-only"))
	}
	// The test's address (the core's peer, 127.0.0.1) takes 10 legacy tokens a minute;
	// the sidecar counts them before the core refuses the missing key. The page lists
	// the busiest keys of their current windows, and token_create's is a minute of the
	// wall clock: begin early in one, so that it has not ended before the page shows it.
	if left := time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Minute)); left < 25*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	denied := 0
	for range 16 {
		if post(t, c.base+"/api/v1/tokens") == 429 {
			denied++
		}
	}
	if denied == 0 {
		t.Fatal("16 token requests in a row were never limited")
	}
	key := `[data-key="token_create:ip:127.0.0.1"]`
	deadline := time.Now().Add(20 * time.Second)
	for !p.has(key) {
		if time.Now().After(deadline) {
			p.screenshot(artifacts, "console-limits-missing.png")
			t.Fatalf("the page did not show %s among the busiest keys within 20 s (it reloads every 5 s)", key)
		}
		time.Sleep(250 * time.Millisecond)
	}
	row := p.text(key + " td.num")
	if m := regexp.MustCompile(`^(\d+) / 10$`).FindStringSubmatch(row); m == nil || atoi(m[1]) <= 10 {
		t.Errorf("the busiest key reads %q, want a count over its limit of 10", row)
	}
	if !p.has(key + ".over") {
		t.Error("the key over its limit is not marked over")
	}
	deniedNow := eval[string](p, "reading the chart", `document.getElementById("chart-token_create").getAttribute("data-denied-now")`)
	if atoi(deniedNow) == 0 {
		t.Errorf("the chart shows %s denied this minute after %d denials", deniedNow, denied)
	}
	// The denied line rose: its last point is above the chart's baseline.
	points := eval[string](p, "reading the denied line", `document.querySelector("#chart-token_create polyline.denied").getAttribute("points")`)
	baseline := eval[string](p, "reading the baseline", `document.querySelector("#chart-token_create line").getAttribute("y1")`)
	fields := strings.Fields(points)
	if len(fields) != 60 {
		t.Fatalf("the denied line has %d points, want 60", len(fields))
	}
	last := strings.Split(fields[len(fields)-1], ",")
	if y, _ := strconv.ParseFloat(last[1], 64); y >= float64(atoi(baseline)) {
		t.Errorf("the denied line ends at y=%s, not above the baseline %s", last[1], baseline)
	}
	p.screenshot(artifacts, "console-limits.png")
	t.Logf("the whole test took %v", time.Since(begin).Round(time.Millisecond))
}

// post sends a POST without a body and returns the status.
func post(t *testing.T, url string, headers ...string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
